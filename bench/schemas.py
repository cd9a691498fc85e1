"""Insert throughput across table shapes: the same TSV rows into replicad and ClickHouse 18.16, for

* ``int_key``: ORDER BY a single UInt64;
* ``string_key``: ORDER BY (String, UInt64), the String from 50,000 distinct values;
* ``lowcard_key``: ORDER BY (LowCardinality(String), UInt64), 1,000 distinct values;
* ``wide``: 40 columns (20 UInt32, 10 Float64, 10 String), ORDER BY a UInt64;
* ``nullable_array``: Nullable(Int64), Nullable(String), Array(UInt32), Array(String) columns.

Each insert goes to a month of its own; the second replica catches up untimed between runs (as
bench/insert.py).  rows/s from sending the request to the acknowledgement; the inserting server's CPU
seconds are reported beside it.
"""

from __future__ import annotations

import itertools
import urllib.parse
from collections.abc import Callable, Sequence

import numpy as np

from bench import Context
from bench.cluster import BenchCluster, ReplicaPair
from bench.insert import Sample, insert_once
from bench.report import Figure

Schema = tuple[str, str, str, Callable[[int, int, int], bytes]]  # key, columns DDL, ORDER BY, rows maker


def _date(month: int) -> str:
    year, m = divmod(month, 12)
    return f"{2030 + year}-{m + 1:02d}-15"


def _lines(n: int, month: int, columns: Sequence[Sequence[str]]) -> bytes:
    d = _date(month)
    return "".join(f"{d}\t" + "\t".join(row) + "\n" for row in zip(*columns, strict=True)).encode()


def _ints(rng: np.random.Generator, n: int, hi: int) -> list[str]:
    return rng.integers(0, hi, n).astype(str).tolist()


def int_key(n: int, month: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return _lines(n, month, [_ints(rng, n, 1 << 40), np.round(rng.random(n), 6).astype(str).tolist(),
                             _ints(rng, n, 1000), [f"v{x}" for x in rng.integers(0, 100, n)]])


def string_key(n: int, month: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    users = [f"user_{x:06d}" for x in rng.integers(0, 50_000, n)]
    return _lines(n, month, [users, _ints(rng, n, 1 << 40), np.round(rng.random(n), 6).astype(str).tolist(),
                             _ints(rng, n, 1000)])


def lowcard_key(n: int, month: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return _lines(n, month, [[f"kind_{x}" for x in rng.integers(0, 1000, n)], _ints(rng, n, 1 << 40),
                             np.round(rng.random(n), 6).astype(str).tolist()])


def wide(n: int, month: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    cols = [_ints(rng, n, 1 << 40)]
    cols += [_ints(rng, n, 1 << 30) for _ in range(20)]
    cols += [np.round(rng.random(n) * 1000, 3).astype(str).tolist() for _ in range(10)]
    cols += [[f"t{x}" for x in rng.integers(0, 10_000, n)] for _ in range(10)]
    return _lines(n, month, cols)


def nullable_array(n: int, month: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    nv = [r"\N" if x % 7 == 0 else str(x) for x in rng.integers(0, 1 << 30, n)]
    ns = [r"\N" if x % 5 == 0 else f"s{x}" for x in rng.integers(0, 10_000, n)]
    arr = ["[" + ",".join(map(str, range(x, x + x % 5))) + "]" for x in rng.integers(0, 1000, n)]
    arrs = ["[" + ",".join(f"'w{y}'" for y in range(x % 4)) + "]" for x in rng.integers(0, 1000, n)]
    return _lines(n, month, [_ints(rng, n, 1 << 40), nv, ns, arr, arrs])


_WIDE_COLUMNS = ", ".join(["k UInt64", *(f"u{i} UInt32" for i in range(20)),
                           *(f"f{i} Float64" for i in range(10)), *(f"t{i} String" for i in range(10))])
SCHEMAS: list[Schema] = [
    ("int_key", "k UInt64, v Float64, n UInt32, s String", "k", int_key),
    ("string_key", "s String, k UInt64, v Float64, n UInt32", "(s, k)", string_key),
    ("lowcard_key", "c LowCardinality(String), k UInt64, v Float64", "(c, k)", lowcard_key),
    ("wide", _WIDE_COLUMNS, "k", wide),
    ("nullable_array", "k UInt64, nv Nullable(Int64), ns Nullable(String), arr Array(UInt32), "
                       "arrs Array(String)", "k", nullable_array),
]


def _create(pair: ReplicaPair, table: str, columns: str, order_by: str) -> None:
    zk = f"{pair.zk_prefix}/{table.replace('.', '_')}"
    ddl = (f"CREATE TABLE IF NOT EXISTS {table} (d Date, {columns}) ENGINE = ReplicatedMergeTree('{zk}', "
           f"'{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY {order_by}")
    for r in pair.replicas:
        if pair.system == "clickhouse":
            r.http.query(f"CREATE DATABASE IF NOT EXISTS {table.partition('.')[0]}")
            # 18.16 takes LowCardinality only with this setting
            path = "/?" + urllib.parse.urlencode({"query": ddl, "allow_experimental_low_cardinality_type": 1})
            r.http.request("POST", path, b"", 600.0)
        else:
            r.http.query(ddl)


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    n = max(1000, ctx.sizes.insert_rows // 2)
    figures: list[Figure] = []
    month = itertools.count()
    pairs = (cluster.replicad, cluster.clickhouse)
    for key, columns, order_by, make in SCHEMAS:
        table = f"bench.schema_{key}"
        for pair in pairs:
            _create(pair, table, columns, order_by)
            warm = make(max(100, n // 20), next(month), 7)
            insert_once(pair, "TSV", warm, max(100, n // 20), table)
        res: dict[str, list[Sample]] = {"replicad": [], "clickhouse": []}
        for i in range(ctx.sizes.runs):
            body = make(n, next(month), 100 + i)
            for pair in (pairs if i % 2 == 0 else pairs[::-1]):
                s = insert_once(pair, "TSV", body, n, table)
                res[pair.system].append(s)
                ctx.say(f"schema {key} run {i + 1}: {pair.system:<10} {n:,} rows in {s.seconds:.2f}s = "
                        f"{s.rows_per_s:,.0f} rows/s, server CPU {s.cpu_s:.2f}s")
        rd, ch = res["replicad"], res["clickhouse"]
        figures += [
            Figure(f"schema_{key}_rows", f"Insert {n / 1e6:g} M rows TSV, schema {key} (ORDER BY {order_by})",
                   "rows/s", [s.rows_per_s for s in rd], [s.rows_per_s for s in ch], target=1.0),
            Figure(f"schema_{key}_cpu", f"Insert {n / 1e6:g} M rows TSV, schema {key}: rows per server "
                   "CPU-second", "rows/s", [s.rows / s.cpu_s for s in rd], [s.rows / s.cpu_s for s in ch]),
        ]
        for pair in pairs:
            pair.drop_table(table)
    return figures
