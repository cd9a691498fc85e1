"""The ``replicad`` Spark data source against a fake ClickHouse-style HTTP server on loopback.

The fake server records every INSERT (its ``insert_deduplication_token`` and a hash of the body) and, like
replicad, drops a block whose token it has already seen.  A local[2,3] Spark job (3 attempts per task) writes
100k rows; one task fails after sending some batches, is retried, re-sends the same batches under the same
tokens, and the server ends with exactly the 100k rows.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as pa_ipc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.spark.datasource import (
    ReplicadSparkError,
    WriteOptions,
    dedup_token,
    rebatch,
    request,
    spark_schema,
)
from tests.support.spark import local_spark

pytestmark = pytest.mark.spark
TOKEN_RE = re.compile(r"^spark-([0-9a-f]{32})-p(\d+)-b(\d+)$")


# ---- the fake server ---------------------------------------------------------------------------------------


@dataclass
class Insert:
    table: str
    token: str | None
    sha: str
    rows: int
    deduplicated: bool


@dataclass
class FakeServer:
    """Deduplicates INSERT blocks by token; serves SELECT * [LIMIT 0] FORMAT ArrowStream from ``tables``."""

    inserts: list[Insert] = field(default_factory=list)
    stored: dict[str, list[pa.RecordBatch]] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    reject: dict[str, tuple[int, str]] = field(default_factory=dict)  # table -> (status, message)
    fail_next: list[tuple[int, dict[str, str]]] = field(default_factory=list)  # queued transient answers
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rows(self, table: str) -> pa.Table:
        batches = self.stored.get(table, [])
        return pa.Table.from_batches(batches) if batches else pa.table({})

    def answer(self, method: str, query: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self.lock:
            if self.fail_next:
                status, headers = self.fail_next.pop(0)
                return status, headers, b"Code: 242. DB::Exception: Table is in readonly mode\n"
        text = query.get("query", "")
        m = re.match(r"INSERT INTO (\S+) FORMAT ArrowStream$", text)
        if m and method == "POST":
            table = m.group(1)
            if table in self.reject:
                status, message = self.reject[table]
                payload = f"Code: 27. DB::Exception: {message}\n".encode()
                return status, {"X-ClickHouse-Exception-Code": "27"}, payload
            batch = pa_ipc.open_stream(body).read_all()
            token = query.get("insert_deduplication_token")
            with self.lock:
                dup = token is not None and any(i.token == token and i.table == table for i in self.inserts)
                sha = hashlib.sha256(body).hexdigest()
                self.inserts.append(Insert(table, token, sha, batch.num_rows, dup))
                if not dup:
                    self.stored.setdefault(table, []).extend(batch.to_batches())
            summary = {"written_rows": 0 if dup else batch.num_rows, "deduplicated_blocks": int(dup)}
            return 200, {"Content-Type": "application/json"}, json.dumps(summary).encode()
        m = re.match(r"SELECT (.+?) FROM (\S+)( LIMIT 0)? FORMAT ArrowStream$", text)
        if m and m.group(2) in self.tables:
            data = self.tables[m.group(2)]
            if m.group(1) != "*":
                data = data.select([c.strip().strip("`") for c in m.group(1).split(",")])
            if m.group(3):
                data = data.slice(0, 0)
            sink = io.BytesIO()
            with pa_ipc.new_stream(sink, data.schema) as w:
                for b in data.to_batches(max_chunksize=3):
                    w.write_batch(b)
            return 200, {"Content-Type": "application/octet-stream"}, sink.getvalue()
        return 404, {}, f"Code: 60. DB::Exception: unknown query {text!r}\n".encode()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    state = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parsed.query))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, headers, payload = state.answer(self.command, query, body)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("replicad-spark-unit")


def _events(spark: Any, rows: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    return spark.range(0, rows, 1, partitions).select(
        F.col("id").alias("user_id"),
        F.date_add(F.lit("2024-01-20").cast("date"), (F.col("id") % 20).cast("int")).alias("d"),
        F.timestamp_seconds(F.lit(1_705_708_800) + F.col("id")).alias("ts"),
        F.element_at(F.array(*[F.lit(k) for k in ("click", "view", "buy")]),
                     (F.col("id") % 3 + 1).cast("int")).alias("kind"))


# ---- Spark jobs --------------------------------------------------------------------------------------------


def test_retried_task_resends_identical_tokens_and_rows_land_once(spark: Any, fake: FakeServer,
                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "failed-once"
    (_events(spark, 100_000, 4).write.format("replicad").mode("append")
     .option("write_mode", "batch_tokens")
     .option("url", fake.url).option("table", "db.events").option("batch_size", "7000")
     .option("fail_after_batches_once", "2").option("fail_marker", str(marker)).save())

    assert marker.exists(), "the fault hook never fired"
    sent = [i for i in fake.inserts if i.table == "db.events"]
    tokens = [TOKEN_RE.match(i.token or "") for i in sent]
    assert all(tokens), [i.token for i in sent]
    assert len({t.group(1) for t in tokens if t}) == 1  # one job id for every task and attempt
    # 4 partitions of 25,000 rows → batches of 7000, 7000, 7000, 4000
    unique = {(int(t.group(2)), int(t.group(3))) for t in tokens if t}
    assert unique == {(p, b) for p in range(4) for b in range(4)}
    by_token: dict[str, set[str]] = {}
    for i in sent:
        by_token.setdefault(i.token or "", set()).add(i.sha)
    assert all(len(shas) == 1 for shas in by_token.values()), "a re-sent batch differed from the first"
    resent = [i for i in sent if i.deduplicated]
    assert len(resent) == 2  # the failed attempt had sent two batches; the retry sent them again
    assert sorted(i.rows for i in sent if not i.deduplicated) == sorted([7000] * 12 + [4000] * 4)

    table = fake.rows("db.events")
    assert table.num_rows == 100_000
    ids = pc.sort_indices(table.column("user_id"))
    assert pc.take(table.column("user_id"), ids).to_pylist() == list(range(100_000))
    assert table.schema.field("kind").type == pa.string()
    assert table.schema.field("d").type == pa.date32()
    assert pa.types.is_timestamp(table.schema.field("ts").type)

    # a second job draws a new job id: its tokens never collide with the first job's
    (_events(spark, 1000, 1).write.format("replicad").mode("append")
     .option("write_mode", "batch_tokens")
     .option("url", fake.url).option("table", "db.events").save())
    jobs = {m.group(1) for i in fake.inserts if (m := TOKEN_RE.match(i.token or ""))}
    assert len(jobs) == 2
    assert fake.rows("db.events").num_rows == 101_000


def test_server_rejection_reaches_the_driver_with_the_server_message(spark: Any, fake: FakeServer) -> None:
    fake.reject["db.bad"] = (400, "Cannot parse input: value -1 out of range for UInt64 "
                                  "(column user_id, row 7)")
    with pytest.raises(Exception) as info:
        (_events(spark, 100, 1).write.format("replicad").mode("append")
         .option("write_mode", "batch_tokens")
         .option("url", fake.url).option("table", "db.bad").option("retries", "0").save())
    text = str(info.value)
    assert "HTTP 400" in text and "column user_id, row 7" in text


def test_overwrite_and_bad_options_are_refused(spark: Any, fake: FakeServer) -> None:
    with pytest.raises(Exception, match="only mode"):
        _events(spark, 10, 1).write.format("replicad").mode("overwrite").option("url", fake.url) \
            .option("table", "db.events").save()
    with pytest.raises(Exception, match="option table: required"):
        _events(spark, 10, 1).write.format("replicad").mode("append").option("url", fake.url).save()


def test_reader_maps_clickhouse_output_types(spark: Any, fake: FakeServer) -> None:
    fake.tables["db.src"] = pa.table({
        "u64": pa.array([0, 2**64 - 1, 5], pa.uint64()),
        "u8": pa.array([1, 255, 0], pa.uint8()),
        "s": pa.array([b"a", b"\xc3\xa9t\xc3\xa9", b""], pa.binary()),
        "ts": pa.array([0, 1_700_000_000, 86_400], pa.timestamp("s", "UTC")),
        "d": pa.array([0, 19_000, 1], pa.date32()),
        "arr": pa.array([[b"x"], [], [b"y", b"z"]], pa.list_(pa.binary())),
        "n": pa.array([1.5, None, 2.0], pa.float64()),
    })
    df = spark.read.format("replicad").option("url", fake.url).option("table", "db.src") \
        .option("split_by_partition", "false").load()
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "decimal(20,0)", "smallint", "string", "timestamp", "date", "array<string>", "double"]
    rows = sorted(df.collect(), key=lambda r: r.u8)
    assert [r.u64 for r in rows] == [Decimal(5), Decimal(0), Decimal(2**64 - 1)]
    assert [r.s for r in rows] == ["", "a", "été"]
    assert [r.arr for r in rows] == [["y", "z"], ["x"], []]
    assert [r.n for r in rows] == [2.0, 1.5, None]
    assert df.count() == 3


# ---- without Spark -----------------------------------------------------------------------------------------


def test_request_retries_transient_answers_honouring_retry_after(fake: FakeServer) -> None:
    fake.fail_next = [(503, {"Retry-After": "0"}), (429, {"Retry-After": "0"})]
    body = io.BytesIO()
    with pa_ipc.new_stream(body, pa.schema([("user_id", pa.int64())])) as w:
        w.write_batch(pa.record_batch([pa.array([1, 2, 3])], names=["user_id"]))
    url = f"{fake.url}/?" + urllib.parse.urlencode({"query": "INSERT INTO db.retry FORMAT ArrowStream",
                                                    "insert_deduplication_token": "t1"})
    answer = request(url, body.getvalue(), timeout_s=5, retries=3, what="test insert")
    assert json.loads(answer)["written_rows"] == 3 and not fake.fail_next
    fake.fail_next = [(503, {"Retry-After": "0"})] * 2
    with pytest.raises(ReplicadSparkError, match=r"HTTP 503.*readonly"):
        request(url, body.getvalue(), timeout_s=5, retries=1, what="test insert")
    fake.fail_next = []


def test_request_gives_up_on_a_closed_port() -> None:
    from replicad.devtools.ports import free_port

    with pytest.raises(ReplicadSparkError, match="after 1 retries"):
        request(f"http://127.0.0.1:{free_port()}/?query=x", b"", timeout_s=1, retries=1, what="x")


def test_options() -> None:
    o = WriteOptions.parse({"URL": "http://h:1/", "Table": "db.t", "insert_quorum": "2", "setting.x": "y",
                            "write_mode": "batch_tokens"})
    assert (o.url, o.table, o.batch_size, o.commit_url) == ("http://h:1", "db.t", 100_000, "http://h:1")
    assert o.settings == (("insert_quorum", "2"), ("x", "y"))
    two = WriteOptions.parse({"table": "db.t", "job_id": "run-7", "user": "w", "password": "p"})
    assert (two.mode, two.job_id, two.headers) == ("two_phase", "run-7", {"X-ClickHouse-User": "w",
                                                                          "X-ClickHouse-Key": "p"})
    for bad in ({"insert_quorum": "2"}, {"setting.replicad_stage_run": "ab"}, {"write_mode": "magic"}):
        with pytest.raises(ValueError):
            WriteOptions.parse({"table": "db.t", **bad})
    with pytest.raises(ValueError) as info:
        WriteOptions.parse({"url": "ftp://x", "batch_size": "0", "timeout": "soon",
                            "fail_after_batches_once": "1"})
    for needle in ("option table", "option url", "option batch_size", "option timeout", "fail_marker"):
        assert needle in str(info.value)
    assert dedup_token("ab", 3, 7) == "spark-ab-p3-b7"


def test_schema_mapping_rejects_unknown_types() -> None:
    assert spark_schema(pa.schema([("x", pa.binary())]), strings_as_binary=True).simpleString() == \
        "struct<x:binary>"
    with pytest.raises(ReplicadSparkError, match="cannot map"):
        spark_schema(pa.schema([("x", pa.map_(pa.string(), pa.int8()))]))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), size=st.integers(1, 50), cuts1=st.lists(st.integers(0, 300), max_size=8),
       cuts2=st.lists(st.integers(0, 300), max_size=8))
def test_rebatch_depends_only_on_the_rows(n: int, size: int, cuts1: list[int], cuts2: list[int]) -> None:
    table = pa.table({"a": pa.array(range(n), pa.int64()),
                      "s": pa.array([str(i) * (i % 3) for i in range(n)], pa.large_string())})

    def chunked(cuts: list[int]) -> list[pa.RecordBatch]:
        bounds = sorted({0, n, *(c for c in cuts if c <= n)})
        return [b for lo, hi in itertools.pairwise(bounds) for b in table.slice(lo, hi - lo).to_batches()]

    out1, out2 = list(rebatch(chunked(cuts1), size)), list(rebatch(chunked(cuts2), size))
    assert [b.num_rows for b in out1] == [min(size, n - i) for i in range(0, n, size)]
    assert len(out1) == len(out2) and all(a.equals(b) for a, b in zip(out1, out2, strict=True))
    assert all(b.schema.field("s").type == pa.string() for b in out1)
    if out1:
        assert pa.Table.from_batches(out1).column("a").to_pylist() == list(range(n))
