"""Insert throughput for every input format replicad and ClickHouse 18.16 share: TSV, TSVWithNames, CSV,
CSVWithNames, JSONEachRow and Native.

The bodies are rendered by ClickHouse 18.16 itself (``SELECT … FORMAT <fmt>`` from a plain MergeTree on
server A holding the events rows), so each body is exactly what a ClickHouse client would send, and the
same body goes to both systems.  Each insert goes to a month of its own (the dates are shifted in the
SELECT): no merges between runs, no deduplicated blocks.  rows/s from sending the request to the
acknowledgement, and the inserting server's CPU seconds beside it (bench/insert.py's ``insert_once``).
The source is ``ORDER BY k`` like the target, so each body comes in runs of key order: 18.16 reads the
source's part with several threads, and 1 M rows come as 22 sorted runs (not one), which both systems sort
(replicad's stable sort merges such runs: replicad/storage/block.py); the insert section's bodies are in
random key order.
"""

from __future__ import annotations

import itertools
import urllib.parse

from bench import Context
from bench.cluster import EVENTS_COLUMNS, BenchCluster, make_events, to_tsv_fast
from bench.insert import Sample, insert_once
from bench.report import Figure

FORMATS = ("TSV", "TSVWithNames", "CSV", "CSVWithNames", "JSONEachRow", "Native")
TABLE = "bench.formats"
SOURCE = "bench.formats_source"


def _render(cluster: BenchCluster, fmt: str, month: int) -> bytes:
    """The source rows moved ``month`` months on, as ClickHouse 18.16 writes them in ``fmt``."""
    cols = ", ".join(f"addMonths({n}, {month}) AS {n}" if n in ("d", "ts") else n for n, _ in EVENTS_COLUMNS)
    sql = f"SELECT {cols} FROM {SOURCE} FORMAT {fmt}"
    return cluster.clickhouse.a.http.request("POST", "/?" + urllib.parse.urlencode({"query": sql}), b"")


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    n = max(1000, ctx.sizes.insert_rows // 2)
    pairs = (cluster.replicad, cluster.clickhouse)
    for pair in pairs:
        pair.create_table(TABLE)
    source = cluster.clickhouse.a.http
    cols = ", ".join(f"{c} {t}" for c, t in EVENTS_COLUMNS)
    source.query(f"CREATE TABLE IF NOT EXISTS {SOURCE} ({cols}) ENGINE = MergeTree ORDER BY k")
    source.query(f"INSERT INTO {SOURCE} FORMAT TSV", to_tsv_fast(make_events(n, seed=4242)))
    month = itertools.count(1)
    figures: list[Figure] = []
    for fmt in FORMATS:
        warm = _render(cluster, fmt, next(month))
        for pair in pairs:  # the format's first use (imports, caches) is not what we measure
            insert_once(pair, fmt, warm, n, TABLE)
        res: dict[str, list[Sample]] = {"replicad": [], "clickhouse": []}
        size_mb = len(warm) / 1e6
        del warm
        for i in range(ctx.sizes.runs):
            body = _render(cluster, fmt, next(month))
            for pair in (pairs if i % 2 == 0 else pairs[::-1]):
                s = insert_once(pair, fmt, body, n, TABLE)
                res[pair.system].append(s)
                ctx.say(f"format {fmt} run {i + 1}: {pair.system:<10} {n:,} rows "
                        f"({s.body_bytes / 1e6:.0f} MB) in {s.seconds:.2f}s = {s.mb_per_s:.1f} MB/s, "
                        f"server CPU {s.cpu_s:.2f}s")
            del body
        rd, ch = res["replicad"], res["clickhouse"]
        figures += [
            Figure(f"format_{fmt}_mb", f"Insert {n / 1e6:g} M rows {fmt} ({size_mb:.0f} MB body)", "MB/s",
                   [s.mb_per_s for s in rd], [s.mb_per_s for s in ch], target=1.0, decimals=1,
                   note="" if fmt != "TSV" else
                   "bodies rendered by ClickHouse 18.16 (SELECT … FORMAT) from the events rows; the same "
                   "body to both systems — bench/formats.py"),
            Figure(f"format_{fmt}_cpu", f"Insert {n / 1e6:g} M rows {fmt}: MB per server CPU-second", "MB/s",
                   [s.body_bytes / 1e6 / s.cpu_s for s in rd], [s.body_bytes / 1e6 / s.cpu_s for s in ch],
                   decimals=1),
        ]
    for pair in pairs:
        pair.drop_table(TABLE)
    source.query(f"DROP TABLE IF EXISTS {SOURCE}")
    return figures
