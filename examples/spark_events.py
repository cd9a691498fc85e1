"""Write demo events into a replicad table from Spark (local mode) through the ``replicad`` data source.

    python examples/spark_events.py --url http://127.0.0.1:18123 --table db.events --rows 1000000

The table is the demo ``db.events (d Date, ts DateTime, user_id UInt64, kind String)`` of the example
configs.  The rows are a pure function of their number (no random generator), so a retried Spark task
produces the same batches and the server deduplicates the re-sent ones by their tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

KINDS = ("view", "click", "add_to_cart", "purchase", "search", "share")


def events_frame(spark: Any, rows: int, partitions: int, start: str = "2024-01-01", days: int = 90) -> Any:
    """``rows`` events spread over ``days`` days from ``start`` (3 monthly partitions by default)."""
    from pyspark.sql import functions as F

    n = F.col("id")
    day = F.date_add(F.lit(start).cast("date"), (n % days).cast("int"))
    second_of_day = F.pmod(F.xxhash64(n, F.lit("ts")), F.lit(86_400))
    return spark.range(0, rows, 1, partitions).select(
        day.alias("d"),
        F.timestamp_seconds(F.unix_date(day).cast("long") * 86_400 + second_of_day).alias("ts"),
        F.pmod(F.xxhash64(n, F.lit("user")), F.lit(100_000)).alias("user_id"),
        F.element_at(F.array(*[F.lit(k) for k in KINDS]),
                     (F.pmod(F.xxhash64(n, F.lit("kind")), F.lit(len(KINDS))) + 1).cast("int")).alias("kind"),
    )


def spark_session(master: str = "local[2]", app: str = "replicad-events") -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import replicad.spark

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    replicad.spark.register(spark)
    return spark


def count_rows(url: str, table: str, timeout: float = 60.0) -> int:
    query = urllib.parse.urlencode({"query": f"SELECT count() FROM {table}"})
    with urllib.request.urlopen(f"{url.rstrip('/')}/?{query}", timeout=timeout) as resp:
        return int(resp.read().decode().strip())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8123", help="a replica's HTTP API")
    p.add_argument("--table", default="db.events")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=4, help="Spark partitions (= write tasks)")
    p.add_argument("--batch-size", type=int, default=100_000, help="rows per INSERT request")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra data source option (e.g. insert_quorum=2)")
    args = p.parse_args(argv)

    spark = spark_session(args.master)
    try:
        writer = (events_frame(spark, args.rows, args.partitions).write.format("replicad").mode("append")
                  .option("url", args.url).option("table", args.table)
                  .option("batch_size", str(args.batch_size)))
        for kv in args.option:
            key, _, value = kv.partition("=")
            writer = writer.option(key, value)
        t0 = time.monotonic()
        writer.save()
        elapsed = time.monotonic() - t0
    finally:
        spark.stop()
    total = count_rows(args.url, args.table)
    print(json.dumps({"table": args.table, "url": args.url, "rows_written": args.rows,
                      "seconds": round(elapsed, 1), "rows_per_second": round(args.rows / max(elapsed, 1e-9)),
                      "count_on_target": total}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
