"""The writers of the ``replicad`` data source: two-phase (default) and per-batch tokens.

**Two-phase** (``write_mode=two_phase``). The driver draws a run id (fresh hex per run) and the job id
(option ``job_id``, or a fresh one). Every task attempt stages its batches on the replicad it posts to
(``INSERT … FORMAT ArrowStream`` with ``replicad_stage_run``/``_task``/``_batch``): written, not published.
Its commit message says which batches went to which replica. Spark hands the driver's ``commit()`` exactly
one message per partition — the winning attempts'; the driver posts them to ``/staging/commit``, which
decides the run once in ZooKeeper, and waits until every replica has published its part of it. Everything
else staged by the run (failed, partial, speculative attempts) is dropped. ``abort()`` aborts the run. A job
id that was committed before makes the commit a no-op.

**Per-batch tokens** (``write_mode=batch_tokens``, the old mode).  Each batch is inserted at once under
``insert_deduplication_token=spark-<job>-p<partition>-b<batch>``: a retried task re-sending identical batches
is deduplicated, but a task whose input ended early (an upstream failure) and was retried can lose rows,
and nothing can be rolled back.  Kept for servers without staging (plain ClickHouse).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from replicad.spark.batches import ipc_stream, rebatch
from replicad.spark.http import ReplicadSparkError, get_json, log, post_json, query_url, request
from replicad.spark.options import TWO_PHASE, WriteOptions

STATUS_POLL_S = 0.1


class InjectedFailure(RuntimeError):
    """Raised by the test-only fault hooks ``fail_after_batches_once`` / ``fail_after_last_batch_once``."""


@dataclass
class ReplicadCommitMessage(WriterCommitMessage):
    partition_id: int
    attempt: int
    rows: int
    batches: int
    deduplicated_blocks: int = 0
    tokens: list[str] = field(default_factory=list)  # batch_tokens mode
    task: str = ""  # two-phase: the staging task id of this attempt
    stages: dict[str, list[int]] = field(default_factory=dict)  # two-phase: replica -> batch numbers
    stage_rows: dict[str, int] = field(default_factory=dict)  # two-phase: replica -> rows
    run: str = ""  # two-phase: the run staged into


def dedup_token(job_id: str, partition_id: int, batch_no: int) -> str:
    """The ``insert_deduplication_token`` of one batch in batch_tokens mode."""
    return f"spark-{job_id}-p{partition_id}-b{batch_no}"


def stream_run(job_id: str, nonce: str) -> str:
    """The run id of one micro-batch, computed alike by every task from the job id and the nonce of the writer
    instance the executors were given (new when the query restarts): a micro-batch replayed after a restart is
    a new run of the same job.  The driver learns the run from the commit messages."""
    return hashlib.sha256(f"{job_id}:{nonce}".encode()).hexdigest()[:32]


def _fail_once(opts: WriteOptions, hook: str, now: bool) -> None:
    """Test hook: the first task to reach the point creates the marker file and fails; later attempts (and
    other tasks) find the marker and carry on."""
    marker = opts.hook("fail_marker")
    if marker is None or not now:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFailure(f"injected failure ({hook})")


def _pause(opts: WriteOptions, hook: str) -> None:
    """Test hook: mark the point with a file and hang (the test kills the driver there)."""
    path = opts.hook(hook)
    if path:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)


def _task_context() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise ReplicadSparkError("replicad writer: no Spark TaskContext (not running in a Spark task?)")
    return ctx


def write_partition(opts: WriteOptions, iterator: Iterator[pa.RecordBatch], job_id: str,
                    run: str | None) -> ReplicadCommitMessage:
    """One task attempt: stage (``run`` given) or insert with tokens every batch of its input."""
    ctx = _task_context()
    partition, attempt = int(ctx.partitionId()), int(ctx.attemptNumber())
    # unique even across driver restarts (task attempt ids start again at 0 in a new SparkContext)
    task = f"p{partition}-a{attempt}-t{int(ctx.taskAttemptId())}-{uuid.uuid4().hex[:8]}"
    insert = f"INSERT INTO {opts.table} FORMAT ArrowStream"
    msg = ReplicadCommitMessage(partition, attempt, 0, 0, task=task if run else "", run=run or "")
    fail_after = int(opts.hook("fail_after_batches_once") or 0)
    for batch in rebatch(iterator, opts.batch_size):
        n = msg.batches
        if run is not None:
            extra = [("replicad_stage_run", run), ("replicad_stage_task", task),
                     ("replicad_stage_batch", str(n))]
        else:
            extra = [("insert_deduplication_token", dedup_token(job_id, partition, n))]
            msg.tokens.append(extra[0][1])
        url = query_url(opts.url, insert, [*opts.settings, *extra])
        what = f"INSERT into {opts.table} (partition {partition}, batch {n}, {batch.num_rows} rows)"
        answer = _summary(request(url, ipc_stream(batch), timeout_s=opts.timeout_s, retries=opts.retries,
                                  what=what, headers=opts.headers))
        msg.deduplicated_blocks += int(answer.get("deduplicated_blocks", 0) or 0)
        if run is not None:
            replica = str(answer.get("staged_on") or "")
            if not replica:
                raise ReplicadSparkError(f"{what}: the server did not stage the batch (a replicad without "
                                         f"two-phase writes?); use option write_mode=batch_tokens")
            msg.stages.setdefault(replica, []).append(n)
            msg.stage_rows[replica] = msg.stage_rows.get(replica, 0) + batch.num_rows
        msg.rows += batch.num_rows
        msg.batches += 1
        _fail_once(opts, "fail_after_batches_once", msg.batches == fail_after)
    _fail_once(opts, "fail_after_last_batch_once", opts.hook("fail_after_last_batch_once") is not None)
    log.info("replicad task partition=%d attempt=%d sent %d rows in %d batches", partition, attempt, msg.rows,
             msg.batches)
    return msg


def _summary(answer: bytes) -> dict[str, Any]:
    try:
        summary = json.loads(answer or b"{}")
    except ValueError:
        return {}
    return summary if isinstance(summary, dict) else {}


def _messages(messages: list[Any]) -> list[ReplicadCommitMessage]:
    return [m for m in messages if isinstance(m, ReplicadCommitMessage)]


def commit_run(opts: WriteOptions, job_id: str, run: str, messages: list[Any]) -> dict[str, Any]:
    """The driver's commit: decide the run with exactly these (winning) messages, wait for publishing."""
    done = _messages(messages)
    tasks = [{"r": replica, "t": m.task, "b": batches, "n": m.stage_rows.get(replica, 0)}
             for m in done for replica, batches in sorted(m.stages.items())]
    _pause(opts, "pause_before_decision")
    answer = post_json(f"{opts.commit_url}/staging/commit",
                       {"table": opts.table, "job_id": job_id, "run": run, "tasks": tasks},
                       timeout_s=opts.timeout_s, retries=opts.retries, what=f"commit of job {job_id!r}",
                       headers=opts.headers)
    _pause(opts, "pause_after_decision")
    if answer.get("state") == "already_committed":
        print(f"replicad: job {job_id!r} was committed before (run {answer.get('committed_run')}): this run "
              f"adds nothing", file=sys.stderr, flush=True)
        return answer
    status = wait_published(opts, job_id, run)
    print(f"replicad: job {job_id!r} into {opts.table} committed and published: {answer.get('rows')} rows "
          f"from {len(done)} tasks ({len(tasks)} staged task parts)", file=sys.stderr, flush=True)
    return {**answer, "status": status}


def wait_published(opts: WriteOptions, job_id: str, run: str) -> dict[str, Any]:
    url = f"{opts.commit_url}/staging/status?" + urllib.parse.urlencode({"table": opts.table, "run": run})
    deadline = time.monotonic() + opts.publish_timeout_s
    while True:
        status = get_json(url, timeout_s=opts.timeout_s, retries=opts.retries,
                          what=f"status of job {job_id!r}", headers=opts.headers)
        if not status.get("pending"):
            return dict(status)
        if time.monotonic() > deadline:
            raise ReplicadSparkError(
                f"job {job_id!r} is committed (the decision is durable) but {len(status['pending'])} task(s) "
                f"are not published yet on {status.get('pending_replicas')} after "
                f"{opts.publish_timeout_s:.0f}s; those replicas publish them when they are back")
        time.sleep(STATUS_POLL_S)


def abort_run(opts: WriteOptions, job_id: str, run: str) -> None:
    try:
        post_json(f"{opts.commit_url}/staging/abort", {"table": opts.table, "job_id": job_id, "run": run},
                  timeout_s=opts.timeout_s, retries=opts.retries, what=f"abort of job {job_id!r}",
                  headers=opts.headers)
    except ReplicadSparkError as e:  # the staging TTL removes what is left
        log.warning("replicad: abort of job %s failed: %s", job_id, e)


class ReplicadWriter(DataSourceArrowWriter):
    """Created on the driver (one per write job: job and run ids) and pickled to the executors."""

    def __init__(self, options: WriteOptions, job_id: str, run: str) -> None:
        self.options = options
        self.job_id = job_id
        self.run = run

    @property
    def two_phase(self) -> bool:
        return self.options.mode == TWO_PHASE

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplicadCommitMessage:
        return write_partition(self.options, iterator, self.job_id, self.run if self.two_phase else None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.two_phase:
            commit_run(self.options, self.job_id, self.run, list(messages))
            return
        done = _messages(list(messages))
        print(f"replicad: write job {self.job_id} into {self.options.table} committed: "
              f"{sum(m.rows for m in done)} rows in {sum(m.batches for m in done)} batches from {len(done)} "
              f"tasks ({sum(m.deduplicated_blocks for m in done)} blocks deduplicated on retries)",
              file=sys.stderr, flush=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.two_phase:
            abort_run(self.options, self.job_id, self.run)
            return
        done = _messages(list(messages))
        log.warning("replicad write job %s into %s aborted: %d rows were already inserted by %d finished "
                    "tasks (batch_tokens mode is not transactional)", self.job_id, self.options.table,
                    sum(m.rows for m in done), len(done))


class ReplicadStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("replicad")``: each micro-batch is one two-phase job ``<base>:batch-<id>``.

    ``base`` is stable across restarts of the query (option ``job_id``, else the checkpoint location), so a
    micro-batch replayed from the checkpoint after a restart finds its job committed and adds nothing."""

    def __init__(self, options: WriteOptions, base_job_id: str) -> None:
        self.options = options
        self.base = base_job_id
        self.nonce = uuid.uuid4().hex

    def job_id(self, batch_id: int | str) -> str:
        return f"{self.base}:batch-{batch_id}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplicadCommitMessage:
        batch_id = _task_context().getLocalProperty("streaming.sql.batchId")
        if batch_id is None:
            raise ReplicadSparkError("replicad stream writer: the micro-batch id is unknown in this task")
        job_id = self.job_id(batch_id)
        return write_partition(self.options, iterator, job_id, stream_run(job_id, self.nonce))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        runs = {m.run for m in _messages(list(messages))}
        if len(runs) > 1:
            raise ReplicadSparkError(f"replicad stream writer: tasks of micro-batch {batchId} staged into "
                                     f"different runs {sorted(runs)}")
        if runs:  # an empty micro-batch has nothing to commit
            commit_run(self.options, self.job_id(batchId), runs.pop(), list(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for run in {m.run for m in _messages(list(messages))}:
            abort_run(self.options, self.job_id(batchId), run)
