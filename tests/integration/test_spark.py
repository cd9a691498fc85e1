"""Spark → replicad end to end: three real ``replicad run`` daemons on the test ZooKeeper, a local[2,3] Spark
job (3 attempts per task) writing 1 M rows into replica r1 through the ``replicad`` data source, one task
failing after it has sent some batches and being retried — and exactly 1 M rows on every replica (the
two-phase writer publishes only the winning attempts' staged batches).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicad.devtools.daemon import Daemon, replica_config, wait_in_sync
from replicad.devtools.ports import free_port
from tests.support.spark import local_spark

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]

ROWS = 1_000_000
TABLE = "db.events"
DDL = ("CREATE TABLE IF NOT EXISTS db.events (d Date, ts DateTime, user_id UInt64, kind String) "
       "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
       "PARTITION BY toYYYYMM(d) ORDER BY (kind, user_id, ts)")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("replicad-spark-integration")


@pytest.fixture
def cluster(zk_hosts: str, tmp_path: Path) -> Iterator[list[Daemon]]:
    daemons = []
    for name in ("r1", "r2", "r3"):
        cfg = replica_config(name, str(tmp_path / name), zk_hosts, free_port(), free_port(), tables=[DDL])
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        daemons.append(Daemon(path, cwd=tmp_path, log_path=tmp_path / f"{name}.log"))
    try:
        for d in daemons:
            d.start()
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda d: d.wait_ready(TABLE, timeout=120), daemons))
        yield daemons
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is not None:
                print(f"\n--- {d.name} exited with {d.proc.returncode}; log tail ---\n{d.log_tail()}")
        with ThreadPoolExecutor(3) as pool:
            codes = list(pool.map(lambda d: d.stop(), daemons))
        print(f"replica exit codes: {codes}")


def _events(spark: Any, rows: int, partitions: int) -> Any:
    """Deterministic rows (user_id = row number, so duplicates would show) over two months."""
    from pyspark.sql import functions as F

    n = F.col("id")
    day = F.date_add(F.lit("2024-02-15").cast("date"), (n % 30).cast("int"))
    return spark.range(0, rows, 1, partitions).select(
        day.alias("d"),
        F.timestamp_seconds(F.unix_date(day).cast("long") * 86_400 + n % 86_400).alias("ts"),
        n.alias("user_id"),
        F.element_at(F.array(F.lit("view"), F.lit("click"), F.lit("buy")),
                     (n % 3 + 1).cast("int")).alias("kind"))


def _deduplicated_blocks(d: Daemon) -> float:
    total = 0.0
    for line in d.http("/metrics").splitlines():
        m = re.match(r"replicad_insert_deduplicated_blocks(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", line)
        if m:
            total += float(m.group(1))
    return total


def test_spark_job_with_a_retried_task_lands_exactly_once_on_every_replica(
        spark: Any, cluster: list[Daemon], tmp_path: Path) -> None:
    r1, r2, r3 = cluster
    marker = tmp_path / "task-failed-once"
    (_events(spark, ROWS, 4).write.format("replicad").mode("append")
     .option("url", r1.url).option("table", TABLE).option("batch_size", "100000")
     .option("fail_after_batches_once", "2").option("fail_marker", str(marker)).save())
    assert marker.exists(), "the injected task failure never happened"
    assert r1.count(TABLE) == ROWS
    # two-phase: the failed attempt's staged batches were dropped, not deduplicated
    assert _deduplicated_blocks(r1) == 0

    counts = wait_in_sync(cluster, TABLE, ROWS, timeout=600)
    assert counts == {"r1": ROWS, "r2": ROWS, "r3": ROWS}

    # read back from another replica through the data source: every row exactly once
    from pyspark.sql import functions as F

    df = spark.read.format("replicad").option("url", r3.url).option("table", TABLE).load()
    assert [f.name for f in df.schema.fields] == ["d", "ts", "user_id", "kind"]
    agg = df.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("user_id").alias("ids"),
                 F.min("user_id").alias("lo"), F.max("user_id").alias("hi")).collect()[0]
    assert (agg.n, agg.ids, int(agg.lo), int(agg.hi)) == (ROWS, ROWS, 0, ROWS - 1)
    assert r2.count(TABLE) == ROWS
