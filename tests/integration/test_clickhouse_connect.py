"""clickhouse-connect — the HTTP client most Python users use for ClickHouse — against ONE real daemon.

* connecting: ``SELECT version(), timezone()`` (18.16.1, the configured zone), ``system.settings`` (only
  the settings replicad honours), the ``client_protocol_version`` probe (protocol 0 kept);
* ``insert`` (rows), ``insert_df`` (pandas), ``insert_arrow`` (Arrow IPC file) of Date, DateTime, UInt64,
  Int32, Float64, String, Nullable(String), LowCardinality(String), Array, Decimal and Enum8 columns, read
  back with ``query``/``query_df``/``query_arrow`` and compared exactly — also as TabSeparated text, so the
  stored values are checked, not just the round trip;
* every compression the client offers (lz4, zstd, gzip, none) for insert bodies and answers;
* ``command`` for OPTIMIZE and ALTER DELETE (``mutations_sync``);
* hostile input: a DataFrame with a wrong type, garbage Native bodies, truncated or unknown
  ``Content-Encoding`` bodies, an lz4 "bomb" past ``api.max_body_bytes``: a clear error, nothing inserted.
"""

from __future__ import annotations

import datetime as dt
import decimal
import urllib.parse
import zlib
from collections.abc import Iterator
from typing import Any

import lz4.frame
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import zstandard

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import (
    make_chroot,
    ok,
    query,
    query_path,
    request,
    start_daemon,
    stop_cleanly,
)

clickhouse_connect = pytest.importorskip("clickhouse_connect")
from clickhouse_connect.driver.client import Client  # noqa: E402
from clickhouse_connect.driver.exceptions import ClickHouseError  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MAX_BODY = 16 << 20
COLUMNS = [("d", "Date"), ("ts", "DateTime"), ("id", "UInt64"), ("i", "Int32"), ("f", "Float64"),
           ("s", "String"), ("ns", "Nullable(String)"), ("lc", "LowCardinality(String)"),
           ("a", "Array(Int32)"), ("dec", "Decimal(12, 3)"), ("e", "Enum8('x' = 1, 'y' = 2)")]
SIMPLE = ["d", "ts", "id", "i", "f", "s", "ns"]
NAMES = [n for n, _ in COLUMNS]


def ddl(table: str) -> str:
    cols = ", ".join(f"{n} {t}" for n, t in COLUMNS)
    return (f"CREATE TABLE {table} ({cols}) ENGINE = ReplicatedMergeTree("
            f"'/clickhouse/tables/{{shard}}/{table}', '{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY id")


def make_rows(start: int, n: int) -> list[list[Any]]:
    out = []
    for k in range(start, start + n):
        out.append([dt.date(2024, 1 + k % 3, 1 + k % 28),
                    dt.datetime(2024, 3, 1, 12, 0, 0) + dt.timedelta(seconds=k * 37),
                    k, (-1) ** k * k * 1000, k / 8, f"s{k}\t'\\", None if k % 3 == 0 else f"n{k}",
                    f"lc{k % 4}", list(range(k % 4)), decimal.Decimal(k) / 1000, "x" if k % 2 else "y"])
    return out


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("clickhouse_connect")
    chroot = make_chroot(zookeeper, "clickhouse_connect")
    d = start_daemon(base, zookeeper, chroot, "r1", api={"max_body_bytes": MAX_BODY})
    try:
        yield d
    finally:
        stop_cleanly(d)


def connect(daemon: Daemon, **kw: Any) -> Client:
    u = urllib.parse.urlsplit(daemon.url)
    return clickhouse_connect.get_client(host=u.hostname, port=u.port, **kw)


@pytest.fixture
def client(daemon: Daemon) -> Client:
    # one client (connection pool) per test: a keep-alive connection the server closed after an earlier
    # error answer was once reused and reset (1 run in 8; see the closing note)
    return connect(daemon)


def fresh_table(client: Client, name: str) -> str:
    table = f"db.{name}"
    client.command(ddl(table))
    return table


def count(daemon: Daemon, table: str) -> int:
    return int(ok(query(daemon.url, f"SELECT count() FROM {table}")).text)


def tsv(daemon: Daemon, table: str, cols: str = "*") -> str:
    return ok(query(daemon.url, f"SELECT {cols} FROM {table} ORDER BY id FORMAT TabSeparated")).text


# ---- hostile input first -------------------------------------------------------------------------------


def test_dataframe_with_a_wrong_type_fails_clearly_and_inserts_nothing(client: Client,
                                                                        daemon: Daemon) -> None:
    table = fresh_table(client, "wrong_type")
    df = pd.DataFrame({"d": [dt.date(2024, 1, 1)] * 3, "ts": [dt.datetime(2024, 1, 1)] * 3, "id": [1, 2, 3],
                       "i": ["not", "a", "number"], "f": [1.0, 2.0, 3.0], "s": ["a", "b", "c"],
                       "ns": [None, "x", None]})
    with pytest.raises(Exception) as err:
        client.insert_df(table, df, column_names=SIMPLE)
    assert "i" in str(err.value) or "int" in str(err.value).lower(), str(err.value)
    assert count(daemon, table) == 0
    # a value out of the column's range does not get in either (the server checks)
    with pytest.raises(ClickHouseError):
        client.insert(table, [[dt.date(2024, 1, 1), dt.datetime(2024, 1, 1), 1, 0, 0.0, "", None, "", [],
                               decimal.Decimal("1"), "z"]], column_names=NAMES)
    assert count(daemon, table) == 0


@pytest.mark.parametrize("body", [
    b"\x01\x01\x01i\x06UInt64",  # ends inside the block
    b"\x01\x01\x01i\x0bNoSuchType1\x00",  # unknown type
    b"\x01\x02\x01s\x06String\x05ab",  # a string running past the end
    b"\x01\x01\x02zz\x06UInt64" + bytes(8),  # unknown column
    b"\x01\xff\xff\xff\xff\xff\xff\xff\xff\x7f\x01i\x06UInt64",  # absurd row count
    # array offsets going back
    b"\x01\x02\x01a\x0cArray(Int32)" + (5).to_bytes(8, "little") + (2).to_bytes(8, "little"),
])
def test_garbage_native_bodies_are_400_and_insert_nothing(daemon: Daemon, client: Client,
                                                           body: bytes) -> None:
    table = "db.garbage_native"
    if count_or_none(daemon, table) is None:
        client.command(f"CREATE TABLE {table} (i UInt64, s String, a Array(Int32)) ENGINE = "
                       f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{table}', '{{replica}}') "
                       "ORDER BY i")
    r = query(daemon.url, f"INSERT INTO {table} FORMAT Native", body)
    assert r.status == 400, r.text
    assert r.text.startswith("Code: "), r.text
    assert count(daemon, table) == 0


def count_or_none(daemon: Daemon, table: str) -> int | None:
    r = query(daemon.url, f"SELECT count() FROM {table}")
    return int(r.text) if r.status == 200 else None


def test_bad_content_encodings_are_refused(daemon: Daemon, client: Client) -> None:
    table = fresh_table(client, "bad_encoding")
    path = query_path(f"INSERT INTO {table} (id) FORMAT TabSeparated")
    frame = lz4.frame.compress(b"1\n2\n")
    for headers, body in [({"Content-Encoding": "lz4"}, frame[:-6]),  # truncated frame
                          ({"Content-Encoding": "lz4"}, b"not lz4 at all"),
                          ({"Content-Encoding": "snappy"}, b"1\n"),
                          ({"Content-Encoding": "lz4"}, frame + b"trailing garbage")]:
        r = request(daemon.url, path, body, headers=headers)
        assert r.status == 400, (headers, r.status, r.text)
        assert r.headers.get("X-ClickHouse-Exception-Code") == "89", r.text
    assert count(daemon, table) == 0
    # several concatenated frames are one body (clickhouse-connect sends one frame per block)
    body = lz4.frame.compress(b"1\n2\n") + lz4.frame.compress(b"3\n")
    ok(request(daemon.url, path, body, headers={"Content-Encoding": "lz4"}))
    assert count(daemon, table) == 3


@pytest.mark.parametrize("encoding", ["lz4", "zstd", "gzip"])
def test_a_compressed_bomb_stops_at_max_body_bytes(daemon: Daemon, client: Client, encoding: str) -> None:
    table = fresh_table(client, f"bomb_{encoding}")
    raw = b"1\n" * ((MAX_BODY + (4 << 20)) // 2)  # 20 MiB of rows in a few dozen KiB
    body = {"lz4": lz4.frame.compress, "zstd": zstandard.ZstdCompressor().compress,
            "gzip": lambda b: zlib.compress(b, wbits=31)}[encoding](raw)
    assert len(body) < MAX_BODY // 8
    path = query_path(f"INSERT INTO {table} (id) FORMAT TabSeparated", max_insert_block_size=20_000_000)
    r = request(daemon.url, path, body, headers={"Content-Encoding": encoding})
    assert r.status == 413, (r.status, r.text[:300])
    assert "max_body_bytes" in r.text
    assert count(daemon, table) == 0


# ---- connecting ------------------------------------------------------------------------------------------


def test_connect_time_queries_are_answered_as_clickhouse(client: Client, daemon: Daemon) -> None:
    assert client.server_version == "18.16.1"
    assert client.command("SELECT version(), timezone()") == ["18.16.1", "UTC"]
    assert client.protocol_version == 0  # the probe's answer has no block info: the client keeps protocol 0
    raw = client.raw_query("SELECT 1 AS check", settings={"client_protocol_version": 54405}, fmt="Native")
    assert raw == b"\x01\x01\x05check\x05UInt8\x01"
    settings = client.server_settings
    assert {"insert_quorum", "insert_deduplicate", "max_insert_block_size", "mutations_sync",
            "enable_http_compression"} <= set(settings)
    assert "max_threads" not in settings and "index_granularity" not in settings  # not honoured per query
    assert settings["insert_quorum"].value == "0" and settings["insert_quorum"].readonly == 0
    row = client.query("SELECT currentDatabase(), user(), hostName() AS h, 1 + 2 AS three, 'a' AS s, "
                       "today(), uptime(), now()")
    assert row.result_rows[0][:2] == ("default", "default") and row.result_rows[0][3:5] == (3, "a")
    assert row.column_names[3:5] == ("three", "s")
    one = client.query("SELECT count() FROM system.settings WHERE name = 'insert_quorum'")
    assert one.result_rows == [(1,)]
    top = client.query("SELECT name FROM system.settings ORDER BY name DESC LIMIT 2").result_rows
    assert top == sorted(((n,) for n in settings), reverse=True)[:2]


def test_describe_table(client: Client) -> None:
    table = fresh_table(client, "described")
    r = client.query(f"DESCRIBE TABLE {table}")
    assert r.column_names == ("name", "type", "default_type", "default_expression", "comment",
                              "codec_expression", "ttl_expression")
    assert [(row[0], row[1]) for row in r.result_rows] == COLUMNS
    with pytest.raises(ClickHouseError) as err:
        client.query("DESCRIBE TABLE db.no_such_table")
    assert err.value.code == 60  # type: ignore[attr-defined]


# ---- inserts and selects ---------------------------------------------------------------------------------


def expected_tsv(rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "\\N"
        if isinstance(v, str):
            return v.replace("\\", "\\\\").replace("\t", "\\t").replace("'", "\\'")
        if isinstance(v, list):
            return "[" + ",".join(map(str, v)) + "]"
        if isinstance(v, dt.datetime):
            return v.strftime("%Y-%m-%d %H:%M:%S")
        if isinstance(v, decimal.Decimal):
            return f"{v:.3f}"
        if isinstance(v, float):
            return repr(v).removesuffix(".0")
        return str(v)
    return "".join("\t".join(cell(v) for v in r) + "\n" for r in sorted(rows, key=lambda r: r[2]))


@pytest.mark.parametrize("compress", [True, "zstd", "gzip", False])
def test_insert_rows_dataframe_and_arrow_read_back_exactly(daemon: Daemon, compress: Any) -> None:
    client = connect(daemon, compress=compress)
    table = fresh_table(client, f"rt_{str(compress).lower()}")
    rows = make_rows(0, 300)
    client.insert(table, rows, column_names=NAMES)
    got = client.query(f"SELECT * FROM {table} ORDER BY id")
    assert [list(r) for r in got.result_rows] == rows
    assert tsv(daemon, table) == expected_tsv(rows)  # the stored values, not just the round trip

    df = client.query_df(f"SELECT * FROM {table} ORDER BY id")
    assert list(df.columns) == NAMES and len(df) == 300
    df["id"] = df["id"] + 1000
    client.insert_df(table, df)
    arrow = client.query_arrow(f"SELECT * FROM {table} WHERE id < 1000 ORDER BY id")
    assert arrow.num_rows == 300
    arrow = arrow.set_column(NAMES.index("id"), "id", pa.array(np.arange(2000, 2300, dtype=np.uint64)))
    client.insert_arrow(table, arrow)

    everything = client.query(f"SELECT * FROM {table} ORDER BY id").result_rows
    expected = rows + [[*r[:2], r[2] + plus, *r[3:]] for plus in (1000, 2000) for r in rows]
    assert [list(r) for r in everything] == expected
    assert tsv(daemon, table) == expected_tsv(expected)
    by_arrow = client.query_arrow(f"SELECT id, ns FROM {table} WHERE id >= 2000 ORDER BY id LIMIT 5")
    assert by_arrow.column("id").to_pylist() == [2000, 2001, 2002, 2003, 2004]
    assert by_arrow.column("ns").to_pylist() == [None, b"n1", b"n2", None, b"n4"]
    assert client.query(f"SELECT count() FROM {table}").result_rows == [(900,)]


def test_large_dataframe_in_many_blocks(daemon: Daemon, client: Client) -> None:
    table = fresh_table(client, "large")
    n = 300_000
    rng = np.random.default_rng(7)
    df = pd.DataFrame({
        "d": pd.to_datetime("2024-01-01") + pd.to_timedelta(rng.integers(0, 60, n), unit="D"),
        "ts": pd.to_datetime("2024-01-01") + pd.to_timedelta(rng.integers(0, 10**7, n), unit="s"),
        "id": np.arange(n, dtype=np.uint64), "i": rng.integers(-2**31, 2**31, n, dtype=np.int32),
        "f": rng.standard_normal(n), "s": [f"v{k}" for k in range(n)],
        "ns": [None if k % 5 == 0 else f"n{k}" for k in range(n)],
    })
    client.insert_df(table, df, column_names=SIMPLE)
    back = client.query_df(f"SELECT {', '.join(SIMPLE)} FROM {table} ORDER BY id")
    assert len(back) == n
    for c in ("id", "i", "f", "s"):
        assert (back[c].to_numpy() == df[c].to_numpy()).all(), c
    assert back["ns"].isna().sum() == n // 5
    assert (back["ts"].to_numpy() == df["ts"].to_numpy().astype("datetime64[s]")).all()
    assert (pd.to_datetime(back["d"]).to_numpy() == df["d"].to_numpy()).all()


def test_commands_optimize_and_alter_delete(client: Client, daemon: Daemon) -> None:
    table = fresh_table(client, "commands")
    client.insert(table, make_rows(0, 10), column_names=NAMES)
    client.insert(table, make_rows(10, 10), column_names=NAMES)
    client.command(f"OPTIMIZE TABLE {table} FINAL")
    client.command(f"ALTER TABLE {table} DELETE WHERE id < 5", settings={"mutations_sync": 2})
    assert client.query(f"SELECT count() FROM {table}").result_rows == [(15,)]
    assert client.query(f"SELECT id FROM {table} ORDER BY id LIMIT 2").result_rows == [(5,), (6,)]


def test_answers_are_compressed_when_asked(daemon: Daemon, client: Client) -> None:
    table = fresh_table(client, "answers")
    client.insert(table, make_rows(0, 50), column_names=NAMES)
    plain = ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id FORMAT Native")).body
    decoders = {"lz4": lz4.frame.decompress, "zstd": lambda b: zstandard.ZstdDecompressor().decompressobj()
                .decompress(b), "gzip": lambda b: zlib.decompress(b, wbits=31), "deflate": zlib.decompress}
    for encoding, decode in decoders.items():
        path = query_path(f"SELECT * FROM {table} ORDER BY id FORMAT Native", enable_http_compression=1)
        r = ok(request(daemon.url, path, headers={"Accept-Encoding": f"{encoding}, gzip"}))
        assert r.headers.get("Content-Encoding") == encoding
        assert decode(r.body) == plain
    # without enable_http_compression the answer is plain whatever Accept-Encoding says
    r = ok(request(daemon.url, query_path(f"SELECT * FROM {table} ORDER BY id FORMAT Native"),
                   headers={"Accept-Encoding": "lz4"}))
    assert r.headers.get("Content-Encoding") is None and r.body == plain
    # each compressor flushed once: aiohttp's own closing write_eof used to raise in the lz4/zstd/zlib ones
    log_text = daemon.log_path.read_text(errors="replace")
    assert "already finished" not in log_text and "Error handling request" not in log_text
