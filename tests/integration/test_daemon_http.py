"""Acceptance of the HTTP API against ONE real ``python -m replicad run`` daemon on the test ZooKeeper.

* every input format inserts the same rows (a table with Date, DateTime, UInt64, Int8, Float64, String,
  Nullable, Array, Decimal, Enum8, LowCardinality columns), read back as TabSeparated, CSV, JSONEachRow and
  ArrowStream and compared with the rows sent (the text outputs byte for byte with our own encoding);
* bad input — malformed bodies, wrong types, out-of-range values, unknown tables/columns/settings/formats,
  oversized bodies — gets the documented status, ``X-ClickHouse-Exception-Code`` and a message naming the
  problem (column and row for data errors), and creates no part (neither in ``/parts`` nor on disk);
* ``/ping``, ``/replicas_status``, ``/status``, ``/tables/<t>/parts``, ``/tables/<t>/queue``, ``/metrics``
  (parsed by prometheus_client), ``replicad status``, CREATE/DROP TABLE (``metadata/``), SYSTEM SYNC REPLICA.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from replicad.devtools.daemon import Daemon, daemon_env
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import Reply, make_chroot, ok, query, request, start_daemon, stop_cleanly

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
MAX_BODY = 1 << 20
COLUMNS = [
    ("d", "Date"), ("ts", "DateTime"), ("id", "UInt64"), ("i8", "Int8"), ("f", "Float64"), ("s", "String"),
    ("ns", "Nullable(String)"), ("n", "Nullable(Int32)"), ("a", "Array(UInt16)"), ("sa", "Array(String)"),
    ("dec", "Decimal(12, 3)"), ("e", "Enum8('a' = 1, 'b' = 2, 'c d' = -3)"), ("lc", "LowCardinality(String)"),
]
NAMES = [n for n, _ in COLUMNS]
FORMATS = ["JSONEachRow", "TabSeparated", "TSV", "CSV", "CSVWithNames", "ArrowStream", "Parquet"]


def ddl(table: str, order_by: str = "id") -> str:
    cols = ", ".join(f"{n} {t}" for n, t in COLUMNS)
    engine = f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{table}', '{{replica}}')"
    return f"CREATE TABLE {table} ({cols}) ENGINE = {engine} PARTITION BY toYYYYMM(d) ORDER BY {order_by}"


# ---- the rows ----------------------------------------------------------------------------------------------

STRINGS = ["plain", "", "tab\there", "new\nline", "back\\slash", "it's", 'say "hi"', "a,b;c", "é✓ unicode",
           "\\N", "[1,2]", "  spaced  "]


def make_rows(n: int = 36) -> list[dict[str, Any]]:
    """Deterministic rows covering the awkward values of every type (no 1970 zero dates: ClickHouse prints
    them as 0000-00-00)."""
    rows = []
    days = [dt.date(2019, 12, 31), dt.date(2020, 2, 29), dt.date(2020, 3, 1), dt.date(2038, 1, 19)]
    floats = [0.1, -2.5, 1234.5678, 0.0, 3.0, -0.001, 1e15]
    decs = ["-123456789.125", "0.001", "0.000", "42.500", "999999999.999", "-0.010"]
    for i in range(n):
        d = days[i % len(days)]
        rows.append({
            "d": d,
            "ts": dt.datetime(d.year, d.month, d.day, i % 24, (7 * i) % 60, (13 * i) % 60),
            "id": 18446744073709551615 - i if i % 5 == 0 else i,
            "i8": [-128, 127, 0, -1, 5][i % 5],
            "f": floats[i % len(floats)],
            "s": STRINGS[i % len(STRINGS)],
            "ns": None if i % 3 == 0 else STRINGS[(i + 4) % len(STRINGS)],
            "n": None if i % 4 == 0 else (i - 18) * 1000003,
            "a": [[], [0, 65535], [i], [1, 2, 3]][i % 4],
            "sa": [[], ["x"], ["it's", "a,b", "tab\there"], ["[", "]"]][i % 4],
            "dec": decimal.Decimal(decs[i % len(decs)]),
            "e": ["a", "b", "c d"][i % 3],
            "lc": ["low", "card", STRINGS[i % len(STRINGS)]][i % 3],
        })
    return rows


ROWS = make_rows()


def _date(v: dt.date) -> str:
    return v.isoformat()


def _ts(v: dt.datetime) -> str:
    return v.strftime("%Y-%m-%d %H:%M:%S")


def _float(v: float) -> str:
    text = repr(v)
    return text[:-2] if text.endswith(".0") else text


def _quoted(s: str) -> str:
    """A string inside an array literal: single quotes, backslash escapes (ClickHouse's quoted form)."""
    esc = s.replace("\\", "\\\\").replace("'", "\\'").replace("\t", "\\t").replace("\n", "\\n")
    return f"'{esc}'"


def _array(v: list[Any]) -> str:
    return "[" + ",".join(_quoted(x) if isinstance(x, str) else str(x) for x in v) + "]"


def _tsv_escape(s: str) -> str:
    """TabSeparated escaping as ClickHouse writes it (a single quote is escaped too)."""
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("'", "\\'")


def _text(name: str, v: Any) -> str | None:
    """A value as ClickHouse's text (None for NULL)."""
    if v is None:
        return None
    if name == "d":
        return _date(v)
    if name == "ts":
        return _ts(v)
    if name == "f":
        return _float(v)
    if name in ("a", "sa"):
        return _array(v)
    return str(v)


def encode_tsv(rows: list[dict[str, Any]]) -> bytes:
    lines = []
    for r in rows:
        fields = []
        for n in NAMES:
            t = _text(n, r[n])
            fields.append("\\N" if t is None else t if n in ("a", "sa") else _tsv_escape(t))
        lines.append("\t".join(fields))
    return ("\n".join(lines) + "\n").encode()


def encode_csv(rows: list[dict[str, Any]], names: list[str] = NAMES, header: bool = False) -> bytes:
    """CSV as ClickHouse writes it: strings, dates, enums and arrays double-quoted, numbers bare, NULL \\N."""
    bare = {"id", "i8", "f", "n", "dec"}
    out = io.StringIO()
    if header:
        out.write(",".join(f'"{n}"' for n in names) + "\n")
    for r in rows:
        fields = []
        for n in names:
            t = _text(n, r[n])
            if t is None:
                fields.append("\\N")
            elif n in bare:
                fields.append(t)
            else:
                fields.append('"' + t.replace('"', '""') + '"')
        out.write(",".join(fields) + "\n")
    return out.getvalue().encode()


def encode_json(rows: list[dict[str, Any]]) -> bytes:
    lines = []
    for r in rows:
        obj = {n: (_text(n, r[n]) if n in ("d", "ts", "dec") else r[n]) for n in NAMES}
        lines.append(json.dumps(obj, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def arrow_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows with the types an Arrow/Parquet producer (Spark, pandas) would use."""
    types = {"d": pa.date32(), "ts": pa.timestamp("s"), "id": pa.uint64(), "i8": pa.int8(), "f": pa.float64(),
             "s": pa.string(), "ns": pa.string(), "n": pa.int32(), "a": pa.list_(pa.uint16()),
             "sa": pa.list_(pa.string()), "dec": pa.decimal128(12, 3), "e": pa.string(), "lc": pa.string()}
    return pa.table({n: pa.array([r[n] for r in rows], types[n]) for n in NAMES})


def encode(fmt: str, rows: list[dict[str, Any]]) -> bytes:
    if fmt == "JSONEachRow":
        return encode_json(rows)
    if fmt in ("TabSeparated", "TSV"):
        return encode_tsv(rows)
    if fmt == "CSV":
        return encode_csv(rows)
    if fmt == "CSVWithNames":  # columns in another order than the table's: mapped by name
        return encode_csv(rows, list(reversed(NAMES)), header=True)
    sink = io.BytesIO()
    table = arrow_table(rows)
    if fmt == "ArrowStream":
        with ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=10)  # several record batches
    else:
        pq.write_table(table, sink, row_group_size=10)
    return sink.getvalue()


def normalize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows read back from ArrowStream (bytes, tz-aware timestamps) in the form of ROWS."""
    out = []
    for r in rows:
        row = {}
        for n, v in r.items():
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, list):
                v = [x.decode() if isinstance(x, bytes) else x for x in v]
            elif isinstance(v, dt.datetime):
                v = v.replace(tzinfo=None)
            row[n] = v
        out.append(row)
    return out


def sort_key(r: dict[str, Any]) -> int:
    return int(r["id"])


# ---- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("daemon_http")
    chroot = make_chroot(zookeeper, "daemon_http")
    d = start_daemon(base, zookeeper, chroot, "r1", tables=[ddl("db.err")], api={"max_body_bytes": MAX_BODY},
                     wait_table="db.err")
    try:
        yield d
    finally:
        stop_cleanly(d)


def parts(d: Daemon, table: str) -> list[dict[str, Any]]:
    r = ok(request(d.url, f"/tables/{table}/parts"))
    rows: list[dict[str, Any]] = r.json()
    return rows


def part_dirs(d: Daemon, db: str, table: str) -> list[str]:
    path = d.data_path / "data" / db / table
    if not path.exists():
        return []
    return sorted(p.name for p in path.iterdir() if p.is_dir() and p.name != "detached")


# ---- inserts in every format -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def format_tables(daemon: Daemon) -> dict[str, str]:
    """One table per input format, each filled with ROWS in that format."""
    tables = {}
    for fmt in FORMATS:
        table = f"db.fmt_{fmt.lower()}"
        ok(query(daemon.url, ddl(table), post=True))
        r = ok(query(daemon.url, f"INSERT INTO {table} FORMAT {fmt}", encode(fmt, ROWS)))
        summary = r.json()
        assert summary["written_rows"] == len(ROWS), (fmt, summary)
        assert json.loads(r.headers["X-ClickHouse-Summary"])["written_rows"] == str(len(ROWS))
        assert summary["written_parts"] == len({(d.year, d.month) for d in (r_["d"] for r_ in ROWS)})
        tables[fmt] = table
    return tables


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_input_format_stores_the_same_rows(daemon: Daemon, format_tables: dict[str, str],
                                                 fmt: str) -> None:
    table = format_tables[fmt]
    r = ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id FORMAT ArrowStream"))
    got = ipc.open_stream(r.body).read_all()
    assert got.column_names == NAMES
    assert normalize(got.to_pylist()) == sorted(ROWS, key=sort_key)
    # the text outputs are exactly ClickHouse's text of the rows we sent
    ordered = sorted(ROWS, key=sort_key)
    assert ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id")).body == encode_tsv(ordered)
    assert ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id FORMAT TSV")).body == encode_tsv(ordered)
    assert ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id FORMAT CSV")).body == encode_csv(ordered)
    lines = ok(query(daemon.url, f"SELECT * FROM {table} ORDER BY id FORMAT JSONEachRow")).text.splitlines()
    expected_json = [json.loads(x) for x in encode_json(ordered).decode().splitlines()]
    for line, want in zip(lines, expected_json, strict=True):
        obj = json.loads(line)
        assert obj["id"] == str(want["id"])  # 64-bit integers quoted, as ClickHouse
        assert decimal.Decimal(str(obj["dec"])) == decimal.Decimal(want["dec"])
        assert {k: v for k, v in obj.items() if k not in ("id", "dec")} == \
            {k: v for k, v in want.items() if k not in ("id", "dec")}
    assert ok(query(daemon.url, f"SELECT count() FROM {table}")).text == f"{len(ROWS)}\n"
    assert ok(query(daemon.url, f"SELECT count() FROM {table} WHERE i8 < 0")).text == \
        f"{sum(1 for r_ in ROWS if r_['i8'] < 0)}\n"


def test_formats_agree_with_each_other(daemon: Daemon, format_tables: dict[str, str]) -> None:
    outputs = {fmt: ok(query(daemon.url, f"SELECT * FROM {t} ORDER BY id FORMAT ArrowStream")).body
               for fmt, t in format_tables.items()}
    first = ipc.open_stream(outputs["JSONEachRow"]).read_all()
    for fmt, body in outputs.items():
        assert ipc.open_stream(body).read_all().equals(first), fmt


def test_insert_with_column_list_fills_defaults(daemon: Daemon, format_tables: dict[str, str]) -> None:
    ok(query(daemon.url, ddl("db.partial"), post=True))
    ok(query(daemon.url, "INSERT INTO db.partial (id, d, s) FORMAT CSV", b'7,2020-05-05,"x"\n'))
    r = ok(query(daemon.url, "SELECT * FROM db.partial FORMAT JSONEachRow"))
    # the zero DateTime is printed as the epoch, like modern ClickHouse (18.16 wrote 0000-00-00 00:00:00);
    # an Enum's default is its smallest value, as in ClickHouse
    assert r.json() == {"d": "2020-05-05", "ts": "1970-01-01 00:00:00", "id": "7", "i8": 0, "f": 0,
                        "s": "x", "ns": None, "n": None, "a": [], "sa": [], "dec": 0, "e": "c d", "lc": ""}


# ---- bad input ---------------------------------------------------------------------------------------------

GOOD_TSV = encode_tsv(ROWS[:3])
GOOD_JSON_LINE = encode_json(ROWS[:1]).decode().strip()


def _json_with(**changes: Any) -> bytes:
    obj = json.loads(GOOD_JSON_LINE)
    obj.update(changes)
    return (GOOD_JSON_LINE + "\n" + json.dumps(obj) + "\n").encode()  # the bad row is row 2


def _tsv_with(row: int, column: str, value: str) -> bytes:
    lines = GOOD_TSV.decode().splitlines()
    fields = lines[row - 1].split("\t")
    fields[NAMES.index(column)] = value
    lines[row - 1] = "\t".join(fields)
    return ("\n".join(lines) + "\n").encode()


def _arrow_with(column: str, array: pa.Array) -> bytes:
    table = arrow_table(ROWS[:3])
    table = table.set_column(NAMES.index(column), column, array)
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


# (id, query, body, URL settings, HTTP status, ClickHouse code, fragments of the message)
BAD: list[tuple[str, str, bytes, dict[str, str], int, int, list[str]]] = [
    ("json_malformed", "INSERT INTO db.err FORMAT JSONEachRow", (GOOD_JSON_LINE + '\n{"id": 1,\n').encode(),
     {}, 400, 27, ["row 2", "invalid JSON"]),
    ("json_not_an_object", "INSERT INTO db.err FORMAT JSONEachRow", (GOOD_JSON_LINE + "\n[1, 2]\n").encode(),
     {}, 400, 27, ["row 2"]),
    ("json_wrong_type", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(id="abc"), {}, 400, 27,
     ["column id", "row 2", "abc", "UInt64"]),
    ("json_negative_unsigned", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(id=-1), {}, 400, 27,
     ["column id", "row 2", "out of range"]),
    ("json_int8_out_of_range", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(i8=128), {}, 400, 27,
     ["column i8", "row 2", "128"]),
    ("json_array_element_out_of_range", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(a=[1, 70000]),
     {}, 400, 27, ["column a", "row 2", "70000"]),
    ("json_unknown_enum", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(e="zz"), {}, 400, 27,
     ["column e", "row 2", "zz"]),
    ("json_decimal_overflow", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(dec="1234567890.5"), {},
     400, 27, ["column dec", "row 2", "Decimal(12, 3)"]),
    ("json_bad_date", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(d="2020-02-30"), {}, 400, 27,
     ["column d", "row 2", "2020-02-30"]),
    ("json_unknown_field", "INSERT INTO db.err FORMAT JSONEachRow", _json_with(nope=1), {}, 400, 117,
     ["nope", "row 2"]),
    ("tsv_null_in_not_nullable", "INSERT INTO db.err FORMAT TSV", _tsv_with(3, "s", "\\N"), {}, 400, 27,
     ["column s", "row 3", "NULL"]),
    ("tsv_bad_datetime", "INSERT INTO db.err FORMAT TSV", _tsv_with(2, "ts", "2020-01-01 25:00:00"), {}, 400,
     27, ["column ts", "row 2"]),
    ("tsv_missing_fields", "INSERT INTO db.err FORMAT TSV",
     GOOD_TSV + b"2020-01-01\t2020-01-01 00:00:00\t1\n", {}, 400, 27, ["row 4", "column i8"]),
    ("tsv_bad_array", "INSERT INTO db.err FORMAT TSV", _tsv_with(1, "a", "[1,2"), {}, 400, 27,
     ["column a", "row 1"]),
    ("csv_wrong_type", "INSERT INTO db.err FORMAT CSV", encode_csv(ROWS[:2]).replace(b",-128,", b",x,"), {},
     400, 27, ["column i8", "row 1"]),
    ("csvwithnames_unknown_column", "INSERT INTO db.err FORMAT CSVWithNames", b"id,nope\n1,2\n", {}, 400, 16,
     ["nope"]),
    ("arrow_wrong_type", "INSERT INTO db.err FORMAT ArrowStream",
     _arrow_with("id", pa.array(["1", "2", "x"])), {}, 400, 27, ["column id", "row 3"]),
    ("arrow_out_of_range", "INSERT INTO db.err FORMAT ArrowStream",
     _arrow_with("i8", pa.array([1, 2, 300], pa.int64())), {}, 400, 27, ["column i8", "row 3", "300"]),
    ("arrow_null_in_not_nullable", "INSERT INTO db.err FORMAT ArrowStream",
     _arrow_with("s", pa.array(["a", None, "c"])), {}, 400, 27, ["column s", "row 2"]),
    ("arrow_garbage", "INSERT INTO db.err FORMAT ArrowStream", b"not an arrow stream", {}, 400, 27, []),
    ("parquet_garbage", "INSERT INTO db.err FORMAT Parquet", b"PAR1 garbage", {}, 400, 27, ["Parquet"]),
    ("unknown_format", "INSERT INTO db.err FORMAT Protobuf", GOOD_TSV, {}, 400, 73, ["Protobuf"]),
    ("unknown_table", "INSERT INTO db.nope FORMAT TSV", GOOD_TSV, {}, 404, 60, ["db.nope"]),
    ("unknown_column", "INSERT INTO db.err (id, nope) FORMAT TSV", b"1\t2\n", {}, 400, 16, ["nope"]),
    ("unknown_setting", "INSERT INTO db.err FORMAT TSV", GOOD_TSV, {"no_such_setting": "1"}, 400, 115,
     ["no_such_setting"]),
    ("bad_setting_value", "INSERT INTO db.err FORMAT TSV", GOOD_TSV, {"insert_quorum": "many"}, 400, 26,
     ["insert_quorum"]),
    ("insert_values", "INSERT INTO db.err VALUES (1)", b"", {}, 400, 73, ["VALUES"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_refused_and_writes_nothing(daemon: Daemon,
                                                 case: tuple[str, str, bytes, dict[str, str], int, int,
                                                             list[str]]) -> None:
    _, sql, body, settings, status, code, fragments = case
    r = query(daemon.url, sql, body, post=True, **settings)
    assert r.status == status, r.text
    assert r.exception_code == code, r.text
    assert r.text.startswith(f"Code: {code}. DB::Exception: ")
    for f in fragments:
        assert f in r.text, (f, r.text)
    assert parts(daemon, "db.err") == []
    assert part_dirs(daemon, "db", "err") == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_oversized_body_is_413_and_writes_nothing(daemon: Daemon, chunked: bool) -> None:
    body = encode_tsv(ROWS) * (MAX_BODY // len(encode_tsv(ROWS)) + 2)
    assert len(body) > MAX_BODY
    r = query(daemon.url, "INSERT INTO db.err FORMAT TSV", body, chunked=chunked)
    assert r.status == 413 and r.exception_code == 307, r.text
    assert "max_body_bytes" in r.text
    assert parts(daemon, "db.err") == [] and part_dirs(daemon, "db", "err") == []
    assert ok(query(daemon.url, "SELECT count() FROM db.err")).text == "0\n"


def test_select_and_statement_errors(daemon: Daemon) -> None:
    cases: list[tuple[Reply, int, int, str]] = [
        (query(daemon.url, "SELECT nope FROM db.err"), 400, 47, "nope"),
        (query(daemon.url, "SELECT * FROM db.missing"), 404, 60, "db.missing"),
        (query(daemon.url, "SELEKT 1"), 400, 62, "SELEKT"),
        (query(daemon.url, "INSERT INTO db.err FORMAT TSV"), 400, 164, "POST"),  # GET may only read
        (query(daemon.url, "DROP TABLE db.missing", post=True), 404, 60, "db.missing"),
        (query(daemon.url, "SYSTEM SYNC REPLICA db.missing", post=True), 404, 60, "db.missing"),
        (query(daemon.url, "CREATE TABLE db.plain (k UInt8) ENGINE = MergeTree ORDER BY k", post=True), 400,
         48, "ReplicatedMergeTree"),
        (query(daemon.url, ddl("db.err"), post=True), 400, 57, "already exists"),
        # a comment on a plain column: a columns znode line 18.16 reads as no column (alter_columns)
        (query(daemon.url, "CREATE TABLE db.cm (k UInt8, s String COMMENT 'x') ENGINE = "
               "ReplicatedMergeTree('/clickhouse/tables/cm', '{replica}') ORDER BY k", post=True), 400, 48,
         "column s, which has no DEFAULT"),
        (query(daemon.url, "SELECT count() FROM db.cm"), 404, 60, "db.cm"),  # the refused CREATE made nothing
        (query(daemon.url, "SELECT 1", no_such_setting=1), 400, 115, "no_such_setting"),
    ]
    for r, status, code, fragment in cases:
        assert (r.status, r.exception_code) == (status, code), r.text
        assert fragment in r.text, r.text


# ---- endpoints ---------------------------------------------------------------------------------------------


def test_ping_and_replicas_status(daemon: Daemon) -> None:
    assert ok(request(daemon.url, "/ping")).body == b"Ok.\n"
    assert ok(request(daemon.url, "/replicas_status")).body == b"Ok.\n"
    assert request(daemon.url, "/no/such/path").status == 404


REPLICAS_FIELDS = [  # 18.16's system.replicas columns, in its order
    "database", "table", "engine", "is_leader", "is_readonly", "is_session_expired", "future_parts",
    "parts_to_check", "zookeeper_path", "replica_name", "replica_path", "columns_version", "queue_size",
    "inserts_in_queue", "merges_in_queue", "queue_oldest_time", "inserts_oldest_time", "merges_oldest_time",
    "oldest_part_to_get", "oldest_part_to_merge_to", "log_max_index", "log_pointer", "last_queue_update",
    "absolute_delay", "total_replicas", "active_replicas"]


def test_status_has_system_replicas_fields_and_task_health(daemon: Daemon,
                                                           format_tables: dict[str, str]) -> None:
    table = format_tables["TSV"]
    ok(query(daemon.url, f"SYSTEM SYNC REPLICA {table}", post=True))
    status = ok(request(daemon.url, "/status")).json()
    assert status["replica"] == "r1" and status["state"] == "running"
    assert status["zookeeper"]["state"] == "connected" and status["zookeeper"]["session_id"]
    t = status["tables"][table]
    assert list(t)[:len(REPLICAS_FIELDS)] == REPLICAS_FIELDS  # ClickHouse's columns, in its order
    n_parts = len(parts(daemon, table))
    assert (t["database"], t["table"], t["engine"]) == ("db", table.split(".")[1], "ReplicatedMergeTree")
    assert t["is_leader"] is True and t["is_readonly"] is False and t["is_session_expired"] is False
    assert t["replica_name"] == "r1" and t["zookeeper_path"] == f"/clickhouse/tables/01/{table}"
    assert t["replica_path"] == t["zookeeper_path"] + "/replicas/r1"
    assert t["queue_size"] == t["inserts_in_queue"] == t["merges_in_queue"] == 0
    # one insert, one log entry per part: the log's last index and the pointer past it
    assert t["log_max_index"] == n_parts - 1 and t["log_pointer"] == n_parts
    assert t["total_replicas"] == 1 and t["active_replicas"] == 1 and t["absolute_delay"] == 0
    assert t["active_parts"] == n_parts
    tasks = {x["name"]: x for x in status["tasks"]}
    for kind in ("queue_updating", "queue_executing", "cleanup", "restarting"):
        h = tasks[f"{table}:{kind}"]
        assert h["state"] == "running" and h["restarts"] == 0 and h["last_error"] is None, h
        assert h["runs"] >= 1 and h["last_outcome"]["name"]


def test_parts_endpoint_has_system_parts_fields(daemon: Daemon, format_tables: dict[str, str]) -> None:
    table = format_tables["CSV"]
    rows = parts(daemon, table)
    assert {r["name"] for r in rows} == set(part_dirs(daemon, "db", table.split(".")[1]))
    assert sum(r["rows"] for r in rows if r["active"]) == len(ROWS)
    months = {f"{d.year}{d.month:02d}" for d in (r_["d"] for r_ in ROWS)}
    assert {r["partition_id"] for r in rows} == months
    for r in rows:
        path = Path(r["path"])
        assert path.is_dir() and path.name == r["name"]
        assert r["database"] == "db" and r["table"] == table.split(".")[1] and r["active"] is True
        blocks = f"{r['min_block_number']}_{r['max_block_number']}"
        assert r["name"] == f"{r['partition_id']}_{blocks}_{r['level']}"
        assert r["bytes_on_disk"] == sum(f.stat().st_size for f in path.iterdir())
        assert 0 < r["data_compressed_bytes"] < r["bytes_on_disk"]
        assert r["data_uncompressed_bytes"] > 0 and r["marks"] == 1 and r["marks_bytes"] > 0
        assert r["modification_time"] > 0


def test_queue_endpoint(daemon: Daemon, format_tables: dict[str, str]) -> None:
    assert ok(request(daemon.url, f"/tables/{format_tables['CSV']}/queue")).json() == []
    assert request(daemon.url, "/tables/db.missing/queue").status == 404
    assert request(daemon.url, "/tables/db.missing/parts").status == 404


def test_metrics_parse_as_prometheus_text(daemon: Daemon, format_tables: dict[str, str]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    # what the counters below count, made here (the test passes alone, not only after the error tests)
    ok(request(daemon.url, "/ping"))
    bad = query(daemon.url, "INSERT INTO db.err FORMAT JSONEachRow", _json_with(id="abc"))
    assert bad.status == 400 and bad.exception_code == 27, bad.text
    r = ok(request(daemon.url, "/metrics"))
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    table = format_tables["Parquet"]

    def value(family: str, **labels: str) -> float:
        for s in families[family].samples:
            if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created"):
                return float(s.value)
        raise AssertionError(f"no sample {family}{labels}")

    assert value("replicad_inserted_rows", table=table) == len(ROWS)
    assert value("replicad_active_parts", table=table) == len(parts(daemon, table))
    assert value("replicad_replica_is_leader", table=table) == 1
    assert value("replicad_replica_active_replicas", table=table) == 1
    assert value("replicad_keeper_session_connected") == 1
    assert value("replicad_task_state", task=f"{table}:cleanup", state="running") == 1
    assert value("replicad_http_requests", handler="/ping", code="200") >= 1
    assert value("replicad_insert_errors", table="db.err", code="27") >= 1


def test_dashboard_and_alerts_use_only_metrics_a_daemon_exports(daemon: Daemon,
                                                               format_tables: dict[str, str]) -> None:
    """deploy/grafana-dashboard.json and deploy/prometheus-alerts.yml: every metric name in their expressions
    is exported by a running daemon (ClickHouse's names included), so a renamed metric breaks this test."""
    import re

    import yaml
    from prometheus_client.parser import text_string_to_metric_families

    ok(query(daemon.url, f"SELECT count() FROM {format_tables['CSV']}"))
    exported: set[str] = set()
    for fam in text_string_to_metric_families(ok(request(daemon.url, "/metrics")).text):
        exported.add(fam.name)
        exported.update(s.name for s in fam.samples)
    for line in ok(request(daemon.url, "/metrics")).text.splitlines():  # families with no sample yet
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            exported.update({name, f"{name}_total"} if kind == "counter" else
                            {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram"
                            else {name})
    dashboard = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((REPO / "deploy" / "prometheus-alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    name = re.compile(r"\b((?:replicad_|ClickHouse[A-Za-z]+_|process_|python_)[A-Za-z0-9_]+)")
    used = {m for e in exprs for m in name.findall(e)}
    assert len(used) >= 15
    assert sorted(used - exported) == []


def test_status_cli(daemon: Daemon, format_tables: dict[str, str]) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "replicad", "status", *args], cwd=REPO, env=daemon_env(),
                              capture_output=True, text=True, timeout=60)

    r = run("--url", daemon.url)
    assert r.returncode == 0, r.stderr
    table = format_tables["ArrowStream"]
    assert r.stdout.startswith("replica   r1  (running")
    assert "zookeeper connected" in r.stdout
    n_parts = len(parts(daemon, table))
    assert f"  {table}  [is_leader]\n    parts {n_parts}  queue 0 (inserts 0, merges 0)" in r.stdout
    assert f"{table}:queue_executing" in r.stdout and "restarts 0" in r.stdout
    raw = run("--url", daemon.url, "--json")
    assert raw.returncode == 0 and json.loads(raw.stdout)["tables"][table]["active_parts"] == n_parts
    by_config = run("--config", str(daemon.data_path.parent / "replicad.yaml"))  # the API address from it
    assert by_config.returncode == 0 and by_config.stdout.startswith("replica   r1  (running")
    down = run("--url", "http://127.0.0.1:9", "--timeout", "2")
    assert down.returncode == 2 and "cannot reach" in down.stderr


# ---- DDL and SYNC ------------------------------------------------------------------------------------------


def test_create_and_drop_table_persist_under_metadata(daemon: Daemon) -> None:
    meta = daemon.data_path / "metadata" / "db" / "ddl_t.sql"
    text = ddl("db.ddl_t")
    ok(query(daemon.url, text, post=True))
    assert meta.read_text().strip() == text
    ok(query(daemon.url, "INSERT INTO db.ddl_t FORMAT TSV", GOOD_TSV))
    assert ok(query(daemon.url, "SELECT count() FROM db.ddl_t")).text == "3\n"
    ok(query(daemon.url, text.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"), post=True))
    ok(query(daemon.url, "DROP TABLE db.ddl_t", post=True))
    assert not meta.exists() and not (daemon.data_path / "data" / "db" / "ddl_t").exists()
    assert query(daemon.url, "SELECT count() FROM db.ddl_t").status == 404
    ok(query(daemon.url, "DROP TABLE IF EXISTS db.ddl_t", post=True))
    tasks = [t["name"] for t in ok(request(daemon.url, "/status")).json()["tasks"]]
    assert not [t for t in tasks if t.startswith("db.ddl_t:")]  # the dropped table's tasks are gone
    # created again: empty (the replica and the table were removed from ZooKeeper too)
    ok(query(daemon.url, text, post=True))
    assert ok(query(daemon.url, "SELECT count() FROM db.ddl_t")).text == "0\n"
    tasks = [t["name"] for t in ok(request(daemon.url, "/status")).json()["tasks"]]
    assert "db.ddl_t:queue_updating" in tasks and not [t for t in tasks if "#" in t]
    ok(query(daemon.url, "DROP TABLE db.ddl_t", post=True))


def test_sync_replica_and_deduplication(daemon: Daemon) -> None:
    ok(query(daemon.url, ddl("db.sync_t"), post=True))
    body = encode_json(ROWS[:10])
    first = ok(query(daemon.url, "INSERT INTO db.sync_t FORMAT JSONEachRow", body)).json()
    again = ok(query(daemon.url, "INSERT INTO db.sync_t FORMAT JSONEachRow", body)).json()
    assert first["written_rows"] == 10 and again["written_rows"] == 0
    assert again["deduplicated_blocks"] == first["written_parts"]
    forced = ok(query(daemon.url, "INSERT INTO db.sync_t FORMAT JSONEachRow", body, insert_deduplicate=0))
    assert forced.json()["written_rows"] == 10
    r = ok(query(daemon.url, "SYSTEM SYNC REPLICA db.sync_t", post=True))
    assert r.body == b""
    status = ok(request(daemon.url, "/status")).json()["tables"]["db.sync_t"]
    assert status["queue_size"] == 0 and status["log_pointer"] == status["log_max_index"] + 1
    assert ok(query(daemon.url, "SELECT count() FROM db.sync_t")).text == "20\n"


def test_fault_injection_is_off_without_its_environment_variable(daemon: Daemon) -> None:
    r = request(daemon.url, "/_fault/crash_task?task=x", b"")
    assert r.status == 404
