"""A Spark driver in its own process, as a user runs one: a fresh local[2,3] SparkSession that never calls
``replicad.spark.register`` (the data source must be found because the package is installed).

    python -m replicad.devtools.spark_job --table db.t --rows 300000 --partitions 4 --opt url=… --opt k=v
    python -m replicad.devtools.spark_job --stream --checkpoint DIR --source-dir DIR --table db.t --opt url=…

Batch mode writes ``_rows(rows, partitions)`` (user_id = 0..rows-1); stream mode runs a file stream over
``--source-dir`` (JSON lines with ``user_id``) until it has processed every file present, then stops.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def session(app: str, master: str = "local[2,3]", conf: dict[str, str] | None = None) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    return (builder.master(master).appName(app)
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate())


def rows_df(spark: Any, rows: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    n = F.col("id")
    return spark.range(0, rows, 1, partitions).select(
        F.date_add(F.lit("2024-02-15").cast("date"), (n % 30).cast("int")).alias("d"),
        n.alias("user_id"),
        F.element_at(F.array(F.lit("view"), F.lit("click"), F.lit("buy")),
                     (n % 3 + 1).cast("int")).alias("kind"))


def _slow_first_attempt(seconds: float) -> Any:
    def slow(batches: Any) -> Any:
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        for b in batches:
            if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                time.sleep(seconds)
            yield b
    return slow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--opt", action="append", default=[])
    p.add_argument("--stream", action="store_true")
    p.add_argument("--checkpoint")
    p.add_argument("--source-dir")
    p.add_argument("--master", default="local[2,3]")
    p.add_argument("--conf", action="append", default=[])
    p.add_argument("--slow-first-attempt", type=float, default=0.0,
                   help="seconds the first attempt of partition 0 sleeps per input batch (speculation tests)")
    args = p.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.opt)
    spark = session("replicad-spark-job", args.master, dict(c.split("=", 1) for c in args.conf))
    try:
        if args.stream:
            from pyspark.sql.types import LongType, StructField, StructType

            schema = StructType([StructField("user_id", LongType())])
            src = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(args.source_dir)
            from pyspark.sql import functions as F

            df = src.select(F.lit("2024-02-15").cast("date").alias("d"), F.col("user_id"),
                            F.lit("stream").alias("kind"))
            q = (df.writeStream.format("replicad").options(**options)
                 .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
            q.awaitTermination()
        else:
            df = rows_df(spark, args.rows, args.partitions)
            if args.slow_first_attempt:
                df = df.mapInArrow(_slow_first_attempt(args.slow_first_attempt), df.schema)
            df.write.format("replicad").options(**options).mode("append").save()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
