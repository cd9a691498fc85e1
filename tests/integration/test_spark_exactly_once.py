"""Exactly-once Spark writes (two-phase) with real Spark (local[2,3]), three real replicad daemons and a real
ZooKeeper.  Every test checks the exact multiset of rows on every replica.

Faults: an upstream stage failing mid-partition (the writer's input ends early), a task failing after some
POSTs, a task failing after its last POST (before its commit message), the driver killed (-9, the whole
process group) before and after the commit decision, a re-run with the same ``job_id``, a streaming query
killed after a micro-batch's decision and restarted from its checkpoint.  The drivers of the process tests
are fresh SparkSessions that never register the data source.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.spark_job import rows_df
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import make_chroot, ok, query, start_daemon
from tests.support.spark import local_spark, staged_batch_dirs

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
ROWS = 300_000
TTL_S = 20  # the staging TTL of the tables whose tests wait for it to expire
# every other table's: longer than any job here takes from its first staged batch to its commit, on a loaded
# machine too (a streaming micro-batch once took over 20 s there and its run was aborted by the TTL)
LONG_TTL_S = 300


def ddl(table: str, ttl_s: int | None = None) -> str:
    name = table.split(".")[1]
    return (f"CREATE TABLE IF NOT EXISTS {table} (d Date, user_id UInt64, kind String) ENGINE = "
            f"ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{name}', '{{replica}}') "
            f"PARTITION BY toYYYYMM(d) ORDER BY (kind, user_id)"
            + (f" SETTINGS replicad_staging_ttl = {ttl_s}" if ttl_s is not None else ""))


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("replicad-exactly-once")


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Daemon]]:
    base = tmp_path_factory.mktemp("exactly_once")
    chroot = make_chroot(zookeeper, "exactly_once")
    with ThreadPoolExecutor(3) as pool:
        daemons = list(pool.map(lambda n: start_daemon(base, zookeeper, chroot, n,
                                                       settings={"replicad_staging_ttl": LONG_TTL_S}),
                                ["r1", "r2", "r3"]))
    try:
        yield daemons
    finally:
        for d in daemons:
            d.kill()


def create(cluster: list[Daemon], table: str, ttl_s: int | None = None) -> str:
    for d in cluster:
        ok(query(d.url, ddl(table, ttl_s), post=True))
    return table


def user_ids(d: Daemon, table: str) -> collections.Counter[int]:
    r = ok(query(d.url, f"SELECT user_id FROM {table}", timeout=120))
    return collections.Counter(int(x) for x in r.text.split())


def assert_exactly(cluster: list[Daemon], table: str, want: collections.Counter[int],
                   timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = [user_ids(d, table) for d in cluster]
        if all(g == want for g in got) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for d, g in zip(cluster, got, strict=True):
        missing, extra = sum((want - g).values()), sum((g - want).values())
        assert (missing, extra) == (0, 0), \
            f"{d.name}: {sum(g.values())} rows: {missing} missing, {extra} extra"


def staged_batches(cluster: list[Daemon]) -> list[str]:
    out = []
    for d in cluster:
        out += [str(p) for p in staged_batch_dirs(d.data_path / "staging")]
    return out


def all_ids(n: int) -> collections.Counter[int]:
    return collections.Counter(range(n))


def run_job(table: str, opts: dict[str, str], *, rows: int = ROWS, partitions: int = 4,
            wait: bool = True, extra: list[str] | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "replicad.devtools.spark_job", "--table", table, "--rows", str(rows),
            "--partitions", str(partitions), *(f"--opt={k}={v}" for k, v in opts.items()), *(extra or [])]
    proc = subprocess.Popen(argv, cwd=REPO, start_new_session=True, env={**os.environ},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if wait:
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    return proc


def kill_when(proc: subprocess.Popen[bytes], marker: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else b""
            raise AssertionError(f"the driver exited: {out.decode(errors='replace')[-3000:]}")
        assert time.monotonic() < deadline, "the driver never reached the pause point"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# ---- in-process driver: task faults ------------------------------------------------------------------------


def test_upstream_stage_failing_mid_partition_loses_no_row(spark: Any, cluster: list[Daemon],
                                                          tmp_path: Path) -> None:
    table = create(cluster, "db.upstream")
    marker = tmp_path / "upstream-failed"

    def flaky(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, b in enumerate(batches):
            yield b
            if ctx is not None and ctx.partitionId() == 1 and i == 1:
                try:
                    os.close(os.open(str(marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    continue
                raise RuntimeError("upstream UDF failed mid-partition (injected)")

    df = rows_df(spark, ROWS, 4)
    (df.mapInArrow(flaky, df.schema).write.format("replicad").mode("append")
     .option("url", cluster[0].url).option("table", table).option("batch_size", "20000").save())
    assert marker.exists(), "the upstream failure never happened"
    assert_exactly(cluster, table, all_ids(ROWS))
    assert staged_batches(cluster) == []


@pytest.mark.parametrize("hook", ["fail_after_batches_once", "fail_after_last_batch_once"])
def test_task_failing_after_posting_is_retried_and_counted_once(spark: Any, cluster: list[Daemon],
                                                                tmp_path: Path, hook: str) -> None:
    table = create(cluster, f"db.retry_{hook[:14]}")
    marker = tmp_path / "failed-once"
    (rows_df(spark, ROWS, 4).write.format("replicad").mode("append")
     .option("url", cluster[1].url).option("table", table).option("batch_size", "30000")
     .option(hook, "2").option("fail_marker", str(marker)).save())
    assert marker.exists(), "the injected task failure never happened"
    assert_exactly(cluster, table, all_ids(ROWS))
    assert staged_batches(cluster) == []


# ---- the driver in its own process: no registration, job ids, driver death --------------------------------


def test_fresh_session_without_registration_and_a_rerun_of_the_same_job_id(spark: Any, cluster: list[Daemon]
                                                                           ) -> None:
    table = create(cluster, "db.rerun")
    opts = {"url": cluster[2].url, "table": table, "job_id": "orchestrator-run-42"}
    run_job(table, opts)
    assert_exactly(cluster, table, all_ids(ROWS))
    run_job(table, opts)  # the orchestrator retries the finished job: a new driver process
    time.sleep(1.0)
    assert_exactly(cluster, table, all_ids(ROWS))
    # another job does write (this process's driver: a third driver process would add ~20 s of JVM start)
    rows_df(spark, 1000, 4).write.format("replicad").mode("append").options(
        **{**opts, "job_id": "orchestrator-run-43"}).save()
    assert_exactly(cluster, table, all_ids(ROWS) + all_ids(1000))
    assert staged_batches(cluster) == []


def test_driver_killed_before_the_decision_leaves_nothing(cluster: list[Daemon], tmp_path: Path) -> None:
    table = create(cluster, "db.killed_before", ttl_s=TTL_S)
    marker = tmp_path / "paused"
    proc = run_job(table, {"url": cluster[0].url, "table": table, "pause_before_decision": str(marker)},
                   wait=False)
    kill_when(proc, marker)
    assert staged_batches(cluster), "the tasks staged nothing"
    assert user_ids(cluster[0], table) == collections.Counter()
    deadline = time.monotonic() + TTL_S + 30
    while staged_batches(cluster):  # the staging TTL aborts the run and removes its parts
        assert time.monotonic() < deadline, staged_batches(cluster)
        time.sleep(0.5)
    assert_exactly(cluster, table, collections.Counter(), timeout=2)


def test_driver_killed_after_the_decision_loses_nothing(cluster: list[Daemon], tmp_path: Path) -> None:
    table = create(cluster, "db.killed_after", ttl_s=TTL_S)
    marker = tmp_path / "paused"
    proc = run_job(table, {"url": cluster[0].url, "table": table, "pause_after_decision": str(marker)},
                   wait=False)
    kill_when(proc, marker)
    assert_exactly(cluster, table, all_ids(ROWS))
    time.sleep(TTL_S + 2)  # nothing staged is left to the TTL, and the TTL takes nothing published
    assert_exactly(cluster, table, all_ids(ROWS), timeout=2)
    assert staged_batches(cluster) == []


def test_streaming_query_replayed_from_its_checkpoint_commits_nothing_twice(cluster: list[Daemon],
                                                                           tmp_path: Path) -> None:
    table = create(cluster, "db.stream")
    src, ckpt = tmp_path / "src", tmp_path / "ckpt"
    src.mkdir()
    for f in range(3):
        (src / f"part-{f}.json").write_text("".join(json.dumps({"user_id": f * 1000 + i}) + "\n"
                                                    for i in range(1000)))
    marker = tmp_path / "paused"
    stream = ["--stream", "--checkpoint", str(ckpt), "--source-dir", str(src)]
    opts = {"url": cluster[0].url, "table": table}
    proc = run_job(table, {**opts, "pause_after_decision": str(marker)}, wait=False, extra=stream)
    kill_when(proc, marker)  # micro-batch 0 is decided, Spark's commit log does not know it yet
    assert_exactly(cluster, table, all_ids(1000))
    run_job(table, opts, extra=stream)  # restart: batch 0 is replayed, then batches 1 and 2
    assert_exactly(cluster, table, all_ids(3000))
    assert staged_batches(cluster) == []


# ---- a mixed replica set: ClickHouse 18.16 fetches the published parts ----------------------------------


@pytest.mark.clickhouse
def test_mixed_set_with_clickhouse_18_ends_with_the_same_rows(spark: Any, zookeeper: ZooKeeperServer,
                                                              zk_root: str, tmp_path: Path,
                                                              clickhouse_factory: Any) -> None:
    table = "db.mixed"
    with ThreadPoolExecutor(2) as pool:
        daemons = list(pool.map(lambda n: start_daemon(tmp_path, zookeeper, zk_root, n, tables=[ddl(table)],
                                                       wait_table=table), ["r1", "r2"]))
    try:
        ch = clickhouse_factory("ch3")
        ch.query("CREATE DATABASE IF NOT EXISTS db")
        ch.query(ddl(table))
        marker = tmp_path / "failed-once"
        (rows_df(spark, 100_000, 4).write.format("replicad").mode("append")
         .option("url", daemons[0].url).option("table", table).option("batch_size", "15000")
         .option("fail_after_batches_once", "2").option("fail_marker", str(marker)).save())
        assert marker.exists()
        assert_exactly(daemons, table, all_ids(100_000))
        ch.sync_replica(table)
        got = collections.Counter(int(x) for x in ch.query(f"SELECT user_id FROM {table}").split())
        assert got == all_ids(100_000)
        # 18.16 holds the published parts as fetched parts (no local insert happened there)
        assert int(ch.query("SELECT count() FROM system.parts WHERE database = 'db' AND table = 'mixed' "
                            "AND active").strip()) > 0
    finally:
        for d in daemons:
            d.kill()


# ---- speculative execution, at the data source API --------------------------------------------------------


class _FakeTaskContext:
    def __init__(self, partition: int, attempt: int, task_attempt_id: int) -> None:
        self._p, self._a, self._t = partition, attempt, task_attempt_id

    def partitionId(self) -> int:
        return self._p

    def attemptNumber(self) -> int:
        return self._a

    def taskAttemptId(self) -> int:
        return self._t


def test_speculative_attempts_on_two_nodes_only_the_winner_counts(cluster: list[Daemon],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's speculation, as the data source sees it: two attempts of one partition run at once (here on
    two different nodes), the original is killed half-way, and the driver's ``commit()`` gets only the
    speculative copy's message.  (A local Spark never launches speculative copies: all its executors are on
    one host, and Spark does not speculate on the host the original runs on; so the test plays the
    scheduler.)"""
    import dataclasses
    import threading

    import pyarrow as pa

    from replicad.spark import writer as writer_mod
    from replicad.spark.datasource import ReplicadDataSource, ReplicadWriter

    table = create(cluster, "db.speculative")
    per_part = 50_000
    contexts = threading.local()
    monkeypatch.setattr(writer_mod, "_task_context", lambda: contexts.ctx)

    def batches(part: int, upto: int) -> Iterator[pa.RecordBatch]:
        for start in range(0, upto, 10_000):
            ids = list(range(part * per_part + start, part * per_part + min(upto, start + 10_000)))
            yield pa.record_batch({"d": pa.array([19_000 + i % 40 for i in ids], pa.date32()),
                                   "user_id": pa.array(ids, pa.uint64()),
                                   "kind": pa.array(["view"] * len(ids))})

    writer = ReplicadDataSource({"url": cluster[0].url, "table": table}).writer(None, False)  # type: ignore[arg-type]
    # the original attempt runs on another node: it posts to that node's replicad
    on_r2 = ReplicadWriter(dataclasses.replace(writer.options, url=cluster[1].url), writer.job_id, writer.run)
    messages: dict[str, Any] = {}

    def attempt(key: str, w: Any, part: int, number: int, tid: int, upto: int) -> None:
        contexts.ctx = _FakeTaskContext(part, number, tid)
        messages[key] = w.write(batches(part, upto))

    threads = [threading.Thread(target=attempt, args=a) for a in (
        # the original is killed half-way: its message never reaches the driver
        ("p0-original", on_r2, 0, 0, 1, per_part // 2),
        ("p0-speculative", writer, 0, 1, 3, per_part),
        ("p1", writer, 1, 0, 2, per_part))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(messages) == {"p0-original", "p0-speculative", "p1"}
    assert messages["p0-original"].stages.keys() == {"r2"}  # it did stage, on the other node
    writer.commit([messages["p0-speculative"], messages["p1"]])
    assert_exactly(cluster, table, all_ids(2 * per_part))
    deadline = time.monotonic() + 60
    while staged_batches(cluster):  # the loser's batches on r2 are dropped at commit
        assert time.monotonic() < deadline, staged_batches(cluster)
        time.sleep(0.3)
