"""The Spark write path: the two-phase ``replicad`` writer against a plain HTTP insert of the same rows into
the same replica, and the publish latency of a many-task job.

* rows/s of a ``sizes.spark_rows`` job (4 tasks, batches of 100,000 rows, from a cached DataFrame so
  Spark's own source is not measured) through the two-phase writer, versus one ``INSERT … FORMAT
  ArrowStream`` POST of the same rows (goal: ratio ≥ 0.9), and versus the same job through the one-phase
  writer (``write_mode=batch_tokens``: same Spark work, no staging), which separates Spark's own cost from
  the cost of two-phase;
* publish latency of a ``sizes.spark_tasks``-task job: from the commit decision (``staged_job_committed``) to
  the run published on the replica (``staged_run_published``), read from the daemon's log.

Both sides are replicad (ClickHouse has no staged inserts); the figures go into their own report section.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench import Context
from bench.cluster import BenchCluster, to_arrow_stream
from bench.report import Figure

DDL = ("CREATE TABLE IF NOT EXISTS {t} (d Date, k UInt64, kind String, v Float64) ENGINE = "
       "ReplicatedMergeTree('/bench_spark/{name}', '{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY k")
KINDS = ["view", "click", "buy"]


def arrow_rows(n: int) -> pa.Table:
    k = np.arange(n, dtype=np.int64)
    days = (np.datetime64("2024-01-01", "D") + (k % 60)).astype("datetime64[D]")
    return pa.table({"d": pa.array(days, pa.date32()), "k": pa.array(k.astype(np.uint64), pa.uint64()),
                     "kind": pa.array(np.array(KINDS, dtype=object)[k % 3], pa.string()),
                     "v": pa.array(k * 0.5, pa.float64())})


def spark_rows(spark: Any, n: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    i = F.col("id")
    return spark.range(0, n, 1, partitions).select(
        F.date_add(F.lit("2024-01-01").cast("date"), (i % 60).cast("int")).alias("d"), i.alias("k"),
        F.element_at(F.array(*[F.lit(x) for x in KINDS]), (i % 3 + 1).cast("int")).alias("kind"),
        (i * 0.5).alias("v"))


def _events(log_path: Path, names: set[str]) -> list[dict[str, Any]]:
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and any(n in line for n in names):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("event") in names:
                out.append(e)
    return out


def _publish_latency_ms(log_path: Path, wait_s: float = 30.0) -> float:
    """Commit decision → run published, of the last committed run in the log.  The daemon logs the run
    published after the driver saw it done (and its stdout is buffered), so wait for the line."""
    deadline = time.monotonic() + wait_s
    while True:
        events = _events(log_path, {"staged_job_committed", "staged_run_published"})
        committed = [e for e in events if e["event"] == "staged_job_committed"][-1]
        published = [e for e in events
                     if e["event"] == "staged_run_published" and e.get("run") == committed["run"]]
        if published:
            return (max(_ts(e) for e in published) - _ts(committed)) * 1000
        if time.monotonic() > deadline:
            raise AssertionError(f"run {committed['run']}: no staged_run_published in {log_path.name}")
        time.sleep(0.5)


def _ts(e: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(e["ts"]).replace("Z", "+00:00")).timestamp()


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    from replicad.devtools.spark_job import session

    s = ctx.sizes
    a = cluster.replicad.a
    url = f"http://127.0.0.1:{a.http.port}"
    body = to_arrow_stream(arrow_rows(s.spark_rows))
    spark = session("replicad-bench", "local[2]")
    plain, staged, one_phase, latency = [], [], [], []
    try:
        df = spark_rows(spark, s.spark_rows, 4).cache()
        df.count()
        # warm-up: the session's first write of each mode pays one-time costs (Python workers, imports)
        for mode in ("two_phase", "batch_tokens"):
            name = f"spark_warmup_{mode}"
            for r in cluster.replicad.replicas:
                r.http.query(DDL.format(t=f"bench.{name}", name=name))
            spark_rows(spark, 1000, 4).write.format("replicad").option("url", url) \
                .option("table", f"bench.{name}").option("write_mode", mode).mode("append").save()
            cluster.replicad.drop_table(f"bench.{name}")
        for i in range(s.runs):
            for kind in ("plain", "two_phase", "one_phase"):
                name = f"spark_{kind}_{i}"
                table = f"bench.{name}"
                for r in cluster.replicad.replicas:
                    r.http.query(DDL.format(t=table, name=name))
                if kind == "plain":
                    seconds = a.insert(f"INSERT INTO {table} FORMAT ArrowStream", body)
                    plain.append(s.spark_rows / seconds)
                else:
                    mode = "two_phase" if kind == "two_phase" else "batch_tokens"
                    t0 = time.perf_counter()
                    df.write.format("replicad").option("url", url).option("table", table) \
                        .option("batch_size", "100000").option("write_mode", mode).mode("append").save()
                    (staged if kind == "two_phase" else one_phase).append(
                        s.spark_rows / (time.perf_counter() - t0))
                assert a.count(table) == s.spark_rows, f"{table}: {a.count(table)} rows"
                cluster.replicad.drop_table(table)
            name = f"spark_publish_{i}"
            table = f"bench.{name}"
            for r in cluster.replicad.replicas:
                r.http.query(DDL.format(t=table, name=name))
            spark_rows(spark, s.spark_tasks * 100, s.spark_tasks).write.format("replicad") \
                .option("url", url).option("table", table).mode("append").save()
            log_path = a.server.log_path
            assert isinstance(log_path, Path)
            latency.append(_publish_latency_ms(log_path))
            cluster.replicad.drop_table(table)
    finally:
        spark.stop()
    ratio = statistics.median(staged) / statistics.median(plain)
    spark_ratio = statistics.median(staged) / statistics.median(one_phase)
    def runs(xs: list[float], fmt: str) -> str:
        return f"{', '.join(format(x, fmt) for x in xs)} | {format(statistics.median(xs), fmt)}"

    body_md = (f"| figure | runs | median |\n|---|---|---|\n"
               f"| two-phase Spark job, {s.spark_rows:,} rows, rows/s | {runs(staged, ',.0f')} |\n"
               f"| plain HTTP insert (ArrowStream, one POST), rows/s | {runs(plain, ',.0f')} |\n"
               f"| one-phase Spark job (write_mode=batch_tokens), rows/s | {runs(one_phase, ',.0f')} |\n"
               f"| ratio two-phase / plain (goal ≥ 0.9) | | {ratio:.2f}x |\n"
               f"| ratio two-phase / one-phase Spark (the cost of staging) | | {spark_ratio:.2f}x |\n"
               f"| publish latency of a {s.spark_tasks}-task job, ms (decision → run published) | "
               f"{runs(latency, '.0f')} |\n")
    ctx.sections.append(("Spark write path (replicad only: two-phase writer vs plain insert)", body_md))
    ctx.notes.append(f"Spark two-phase write {ratio:.2f}x a plain insert, {spark_ratio:.2f}x the one-phase "
                     f"Spark writer; publish latency of "
                     f"{s.spark_tasks} tasks {statistics.median(latency):.0f} ms")
    return []
