"""The ``replicad`` PySpark Python Data Source.

Found by Spark without a registration call once the package is installed (the top-level module
``pyspark_replicad`` exports it as ``DefaultSource``, which Spark 4 looks up among installed packages)::

    df.write.format("replicad").option("url", "http://127.0.0.1:8123") \\
        .option("table", "db.events").mode("append").save()

Writing is two-phase by default, exactly once per job (:mod:`replicad.spark.writer`); reading streams one
input partition per ClickHouse partition (:mod:`replicad.spark.reader`).  Options: ``url`` (default
``http://127.0.0.1:8123``, the replicad on the executor's host), ``table`` (required, ``db.t``), ``job_id``
(a re-run of a committed job id adds nothing), ``write_mode`` (``two_phase`` | ``batch_tokens``),
``commit_url`` (where the driver commits; default ``url``), ``publish_timeout`` (seconds the driver waits for
the replicas to publish, default 600), ``batch_size`` (rows per request, default 100000), ``user``,
``password``, ``timeout`` (seconds per request, default 300), ``retries`` (default 5), ``insert_quorum``
(batch_tokens mode), ``setting.<name>`` (any other URL setting); reading: ``columns`` (``a,b``),
``split_by_partition`` (default true), ``strings_as_binary``.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from replicad.spark.batches import ipc_stream, rebatch
from replicad.spark.http import ReplicadSparkError, query_url, request
from replicad.spark.options import ReadOptions, WriteOptions
from replicad.spark.reader import ReplicadReader, schema_of, spark_schema, spark_type
from replicad.spark.writer import (
    ReplicadCommitMessage,
    ReplicadStreamWriter,
    ReplicadWriter,
    dedup_token,
)

SHORT_NAME = "replicad"

__all__ = ["SHORT_NAME", "ReadOptions", "ReplicadCommitMessage", "ReplicadDataSource", "ReplicadReader",
           "ReplicadSparkError", "ReplicadStreamWriter", "ReplicadWriter", "WriteOptions", "dedup_token",
           "ipc_stream", "query_url", "rebatch", "register", "request", "spark_schema", "spark_type"]


class ReplicadDataSource(DataSource):
    """``format("replicad")``: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        opts = ReadOptions.parse(self.options)
        return spark_schema(schema_of(opts), opts.strings_as_binary)

    def reader(self, schema: StructType) -> ReplicadReader:
        return ReplicadReader(ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> ReplicadWriter:
        if overwrite:
            raise ReplicadSparkError("replicad data source: only mode('append') is supported (TRUNCATE TABLE "
                                     "first if you mean to replace the data)")
        opts = WriteOptions.parse(self.options)
        return ReplicadWriter(opts, opts.job_id or uuid.uuid4().hex, uuid.uuid4().hex)

    def streamWriter(self, schema: StructType, overwrite: bool) -> ReplicadStreamWriter:
        opts = WriteOptions.parse(self.options)
        checkpoint = {str(k).lower(): str(v) for k, v in self.options.items()}.get("checkpointlocation")
        if opts.job_id:
            base = opts.job_id
        elif checkpoint:
            base = "stream-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:32]
        else:  # the driver and the executors get writers of their own: the identity must be derivable
            raise ReplicadSparkError("replicad stream writer: give option checkpointLocation (or job_id): "
                                     "the micro-batches' identity is derived from it")
        return ReplicadStreamWriter(opts, base)


def register(spark: Any) -> None:
    """Register the data source explicitly (not needed when the package is installed: Spark finds it)."""
    spark.dataSource.register(ReplicadDataSource)
