"""The ``replicad`` PySpark Python Data Source: Arrow batches → ``INSERT … FORMAT ArrowStream``, and back.

Writing::

    replicad.spark.register(spark)
    df.write.format("replicad").option("url", "http://127.0.0.1:8123") \\
        .option("table", "db.events").mode("append").save()

Every Spark task re-cuts its partition's Arrow batches into request bodies of exactly ``batch_size`` rows
(the last one shorter) and POSTs each to ``<url>/?query=INSERT INTO <table> FORMAT ArrowStream`` with
``insert_deduplication_token=spark-<job>-p<partition>-b<batch>``.  The job id is drawn once on the driver
(in :meth:`ReplicadDataSource.writer`) and travels to the executors inside the pickled writer, so a retried
task — same partition, same rows in the same order — re-sends byte-identical batches under identical
tokens and the server's block deduplication drops what had already been written.  This relies on the
partition's rows being reproducible, as for any idempotent Spark sink (``spark.range``-derived data, files,
or a checkpointed/cached DataFrame; not an unordered shuffle of non-deterministic data), and on the retry
coming before the table has taken ``replicated_deduplication_window`` (default 100) newer blocks — one block
per batch and partition of the table — so very large jobs should raise that setting or the batch size.

Options: ``url`` (default ``http://127.0.0.1:8123``), ``table`` (required, ``db.t``), ``batch_size`` (rows per
request, default 100000), ``insert_quorum``, ``insert_quorum_timeout`` (ms), ``timeout`` (seconds per
request, default 300), ``retries`` (default 5: connection errors, timeouts, 429/502/503/504 and retriable
ClickHouse codes, with exponential backoff honouring ``Retry-After``), ``setting.<name>`` (any other URL
setting).  A 4xx answer fails the task with the server's message (which names the column and row).

Reading: ``spark.read.format("replicad").option("url", …).option("table", …).load()`` — one partition,
``SELECT * FROM <table> FORMAT ArrowStream``; the schema comes from a ``LIMIT 0`` query.  ClickHouse
``String`` is read as Spark ``string`` (option ``strings_as_binary=true`` keeps bytes), ``UInt64`` as
``decimal(20,0)``, smaller unsigned types as the next wider signed type, ``DateTime`` as ``timestamp``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

log = logging.getLogger("replicad.spark")

SHORT_NAME = "replicad"
DEFAULT_URL = "http://127.0.0.1:8123"
DEFAULT_BATCH_SIZE = 100_000
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# ClickHouse codes worth re-sending under the same token: UNKNOWN_STATUS_OF_INSERT, KEEPER_EXCEPTION,
# TABLE_IS_READ_ONLY, TOO_MANY_PARTS.
RETRY_CODES = frozenset({"319", "999", "242", "252"})
MAX_BACKOFF_S = 30.0


class ReplicadSparkError(RuntimeError):
    """A request the server refused (or that kept failing); the message carries the server's answer."""


class InjectedFailure(RuntimeError):
    """Raised by the test-only fault hook ``fail_after_batches_once``."""


# ---- options ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    url: str
    table: str
    batch_size: int = DEFAULT_BATCH_SIZE
    timeout_s: float = 300.0
    retries: int = 5
    settings: tuple[tuple[str, str], ...] = ()  # extra URL settings (insert_quorum, …)
    fail_after_batches_once: int | None = None  # test hook: fail one task once after N batches
    fail_marker: str | None = None  # … the file whose creation marks that the failure happened

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Validate the data source options (keys are case-insensitive); ValueError lists every problem."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        problems: list[str] = []

        def number(key: str, default: float, kind: type = int, minimum: float = 0) -> Any:
            raw = opts.get(key)
            if raw is None or raw == "":
                return default
            try:
                value = kind(raw)
            except ValueError:
                problems.append(f"option {key}: not a number: {raw!r}")
                return default
            if value < minimum:
                problems.append(f"option {key}: must be >= {minimum}, got {raw}")
            return value

        table = opts.get("table", "").strip()
        if not table:
            problems.append("option table: required (e.g. db.events)")
        url = opts.get("url", DEFAULT_URL).rstrip("/")
        if not url.startswith(("http://", "https://")):
            problems.append(f"option url: must be an http(s) URL, got {url!r}")
        settings: list[tuple[str, str]] = []
        for key in ("insert_quorum", "insert_quorum_timeout", "insert_deduplicate"):
            if opts.get(key):
                settings.append((key, opts[key]))
        settings += sorted((k.split(".", 1)[1], v) for k, v in opts.items()
                           if k.startswith(("setting.", "settings.")) and "." in k)
        if any(k == "insert_deduplication_token" for k, _ in settings):
            problems.append("option setting.insert_deduplication_token: the writer sets the tokens itself")
        fail_after = number("fail_after_batches_once", 0, int, 0) or None
        marker = opts.get("fail_marker") or None
        if fail_after is not None and marker is None:
            problems.append("option fail_after_batches_once needs option fail_marker (a file path)")
        parsed = cls(url=url, table=table, batch_size=number("batch_size", DEFAULT_BATCH_SIZE, int, 1),
                     timeout_s=number("timeout", 300.0, float, 0.001), retries=number("retries", 5, int, 0),
                     settings=tuple(settings), fail_after_batches_once=fail_after, fail_marker=marker)
        if problems:
            raise ValueError("replicad data source: " + "; ".join(problems))
        return parsed


def dedup_token(job_id: str, partition_id: int, batch_no: int) -> str:
    """The ``insert_deduplication_token`` of one batch: the same on every attempt of the task."""
    return f"spark-{job_id}-p{partition_id}-b{batch_no}"


# ---- HTTP -------------------------------------------------------------------------------------------------


def query_url(base: str, query: str, settings: Iterable[tuple[str, str]] = ()) -> str:
    return f"{base}/?" + urllib.parse.urlencode([("query", query), *settings])


def _retry_after(headers: Any) -> float | None:
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


def request(url: str, body: bytes | None, *, timeout_s: float, retries: int, what: str) -> bytes:
    """POST ``body`` (GET when None) with retries on transient failures; the answer's body.

    Non-retriable HTTP errors raise :class:`ReplicadSparkError` with the status and the server's message.
    """
    attempt = 0
    while True:
        req = urllib.request.Request(url, data=body, method="GET" if body is None else "POST")
        if body is not None:
            req.add_header("Content-Type", "application/octet-stream")
        wait: float | None = None
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace").strip()
            code = e.headers.get("X-ClickHouse-Exception-Code", "") if e.headers is not None else ""
            transient = e.code in RETRY_STATUSES or (e.code >= 500 and code in RETRY_CODES)
            if not transient or attempt >= retries:
                raise ReplicadSparkError(f"{what}: HTTP {e.code}: {text}") from None
            wait = _retry_after(e.headers)
            reason = f"HTTP {e.code}: {text[:200]}"
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            if attempt >= retries:
                raise ReplicadSparkError(f"{what}: {type(e).__name__}: {e} (after {attempt} retries)") from e
            reason = f"{type(e).__name__}: {e}"
        attempt += 1
        if wait is None:
            wait = min(MAX_BACKOFF_S, 0.25 * 2 ** attempt) * (0.5 + random.random() / 2)
        log.warning("replicad request %s failed (%s); retry %d/%d in %.1fs", what, reason, attempt, retries,
                    wait)
        time.sleep(min(wait, 2 * MAX_BACKOFF_S))


# ---- batching ---------------------------------------------------------------------------------------------


def _narrow(t: pa.DataType) -> pa.DataType:
    """Large (64-bit offset) Arrow types → the regular ones (a batch is far below 2 GiB)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_narrow(t.value_type))
    return t


def _normalise(arr: pa.Array) -> pa.Array:
    t = _narrow(arr.type)
    return arr if t == arr.type else arr.cast(t)


def rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of batches into single-chunk batches of exactly ``rows`` rows (the last shorter).

    The cut depends only on the sequence of rows, not on how the input was chunked, so a retried task
    produces the same batches.
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        pending.append(b)
        count += b.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending)
            yield _one_batch(table.slice(0, rows))
            rest = table.slice(rows)
            pending = rest.combine_chunks().to_batches() if rest.num_rows else []
            count -= rows
    if count:
        yield _one_batch(pa.Table.from_batches(pending))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    table = table.combine_chunks()
    arrays = [_normalise(table.column(i).chunk(0) if table.column(i).num_chunks else
                         pa.array([], table.schema.field(i).type)) for i in range(table.num_columns)]
    return pa.RecordBatch.from_arrays(arrays, names=table.schema.names)


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa_ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


# ---- writer -----------------------------------------------------------------------------------------------


@dataclass
class ReplicadCommitMessage(WriterCommitMessage):
    partition_id: int
    attempt: int
    rows: int
    batches: int
    deduplicated_blocks: int = 0
    tokens: list[str] = field(default_factory=list)


def _fail_once(opts: WriteOptions, sent: int) -> None:
    """Test hook: the first task to have sent ``fail_after_batches_once`` batches creates the marker file
    and fails; every later attempt (and every other task) finds the marker and carries on."""
    if opts.fail_marker is None or sent != opts.fail_after_batches_once:
        return
    try:
        fd = os.open(opts.fail_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFailure(f"injected failure after {sent} batches (fail_after_batches_once)")


class ReplicadWriter(DataSourceArrowWriter):
    """Created on the driver (one per write job, holding the job id) and pickled to the executors."""

    def __init__(self, options: WriteOptions, job_id: str) -> None:
        self.options = options
        self.job_id = job_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplicadCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise ReplicadSparkError("replicad writer: no Spark TaskContext (not running in a Spark task?)")
        partition, attempt = int(ctx.partitionId()), int(ctx.attemptNumber())
        opts = self.options
        insert = f"INSERT INTO {opts.table} FORMAT ArrowStream"
        rows = sent = deduplicated = 0
        tokens: list[str] = []
        for batch in rebatch(iterator, opts.batch_size):
            token = dedup_token(self.job_id, partition, sent)
            url = query_url(opts.url, insert, [*opts.settings, ("insert_deduplication_token", token)])
            what = f"INSERT into {opts.table} (partition {partition}, batch {sent}, {batch.num_rows} rows)"
            answer = request(url, ipc_stream(batch), timeout_s=opts.timeout_s, retries=opts.retries,
                             what=what)
            deduplicated += _deduplicated_blocks(answer)
            rows += batch.num_rows
            sent += 1
            tokens.append(token)
            _fail_once(opts, sent)
        log.info("replicad task partition=%d attempt=%d sent %d rows in %d batches (%d blocks deduplicated)",
                 partition, attempt, rows, sent, deduplicated)
        return ReplicadCommitMessage(partition, attempt, rows, sent, deduplicated, tokens)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, ReplicadCommitMessage)]
        # commit() runs in a Python worker beside the driver: its stderr is the driver's console
        print(f"replicad: write job {self.job_id} into {self.options.table} committed: "
              f"{sum(m.rows for m in done)} rows in {sum(m.batches for m in done)} batches from {len(done)} "
              f"tasks ({sum(m.deduplicated_blocks for m in done)} blocks deduplicated on retries)",
              file=sys.stderr, flush=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, ReplicadCommitMessage)]
        log.warning("replicad write job %s into %s aborted: %d rows were already inserted by %d finished "
                    "tasks (inserts are not transactional)", self.job_id, self.options.table,
                    sum(m.rows for m in done), len(done))


def _deduplicated_blocks(answer: bytes) -> int:
    try:
        summary = json.loads(answer or b"{}")
    except ValueError:
        return 0
    value = summary.get("deduplicated_blocks", 0) if isinstance(summary, dict) else 0
    return int(value) if isinstance(value, int | str) and str(value).isdigit() else 0


# ---- reader -----------------------------------------------------------------------------------------------


def spark_type(t: pa.DataType, strings_as_binary: bool = False) -> DataType:
    """The Spark type a column of the server's ArrowStream output is read as."""
    simple: list[tuple[Any, DataType]] = [
        (pa.types.is_boolean, BooleanType()), (pa.types.is_int8, ByteType()),
        (pa.types.is_int16, ShortType()), (pa.types.is_int32, IntegerType()),
        (pa.types.is_int64, LongType()), (pa.types.is_uint8, ShortType()),
        (pa.types.is_uint16, IntegerType()), (pa.types.is_uint32, LongType()),
        (pa.types.is_uint64, DecimalType(20, 0)), (pa.types.is_float32, FloatType()),
        (pa.types.is_float64, DoubleType()), (pa.types.is_date32, DateType()),
        (pa.types.is_timestamp, TimestampType()), (pa.types.is_fixed_size_binary, BinaryType()),
    ]
    for test, st in simple:
        if test(t):
            return st
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType() if strings_as_binary else StringType()
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ArrayType(spark_type(t.value_type, strings_as_binary), True)
    raise ReplicadSparkError(f"replicad reader: cannot map Arrow type {t} to a Spark type")


def spark_schema(schema: pa.Schema, strings_as_binary: bool = False) -> StructType:
    return StructType([StructField(f.name, spark_type(f.type, strings_as_binary), True) for f in schema])


@dataclass(frozen=True)
class ReadOptions:
    url: str
    table: str
    timeout_s: float
    retries: int
    strings_as_binary: bool

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        w = WriteOptions.parse(options)
        flag = str({str(k).lower(): v for k, v in options.items()}.get("strings_as_binary", "false"))
        return cls(w.url, w.table, w.timeout_s, w.retries, flag.lower() in ("1", "true", "yes"))

    def select(self, suffix: str = "") -> bytes:
        url = query_url(self.url, f"SELECT * FROM {self.table}{suffix} FORMAT ArrowStream")
        return request(url, None, timeout_s=self.timeout_s, retries=self.retries,
                       what=f"SELECT from {self.table}")


def _cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    if arr.type == target:
        return arr
    if pa.types.is_timestamp(arr.type) and arr.type.tz is None:  # naive = UTC seconds
        arr = arr.cast(pa.timestamp(arr.type.unit, "UTC"))
    return arr.cast(target)


class ReplicadReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        target = to_arrow_schema(self.schema, timezone="UTC")
        reader = pa_ipc.open_stream(self.options.select())
        for batch in reader:
            if batch.num_rows == 0:
                continue
            arrays = [_cast(batch.column(batch.schema.get_field_index(f.name)), f.type) for f in target]
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


# ---- the data source --------------------------------------------------------------------------------------


class ReplicadDataSource(DataSource):
    """``format("replicad")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        opts = ReadOptions.parse(self.options)
        return spark_schema(pa_ipc.open_stream(opts.select(" LIMIT 0")).schema, opts.strings_as_binary)

    def reader(self, schema: StructType) -> ReplicadReader:
        return ReplicadReader(ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ReplicadWriter:
        if overwrite:
            raise ReplicadSparkError("replicad data source: only mode('append') is supported (TRUNCATE TABLE "
                                     "first if you mean to replace the data)")
        return ReplicadWriter(WriteOptions.parse(self.options), uuid.uuid4().hex)


def register(spark: Any) -> None:
    """Make ``format("replicad")`` available in this SparkSession."""
    spark.dataSource.register(ReplicadDataSource)
