"""Reading a replicad table into Spark: one input partition per ClickHouse partition, streamed.

``partitions()`` lists the table's active partitions (``/tables/<t>/parts``); each Spark task reads
``SELECT <columns> FROM t WHERE _partition_id = '<id>' FORMAT ArrowStream`` and decodes the answer as it
arrives, batch by batch, so no executor holds more than a batch of it.  Only the columns of the reader's
schema are asked for (``columns`` option, or a user schema given with ``spark.read.schema(...)``).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc
from pyspark.sql.datasource import DataSourceReader, InputPartition
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

from replicad.spark.http import ReplicadSparkError, get_json, open_url, query_url
from replicad.spark.options import ReadOptions


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


def _quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _quote_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def select_sql(opts: ReadOptions, columns: list[str] | None, where: str = "", suffix: str = "") -> str:
    cols = ", ".join(_quote_ident(c) for c in columns) if columns else "*"
    return f"SELECT {cols} FROM {opts.table}{where}{suffix} FORMAT ArrowStream"


def schema_of(opts: ReadOptions) -> pa.Schema:
    with open_url(query_url(opts.url, select_sql(opts, list(opts.columns or []) or None, suffix=" LIMIT 0")),
                  None, timeout_s=opts.timeout_s, retries=opts.retries, what=f"schema of {opts.table}",
                  headers=opts.headers) as resp:
        return pa_ipc.open_stream(resp).schema


def partition_ids(opts: ReadOptions) -> list[str]:
    rows = get_json(f"{opts.url}/tables/{urllib.parse.quote(opts.table)}/parts", timeout_s=opts.timeout_s,
                    retries=opts.retries, what=f"partitions of {opts.table}", headers=opts.headers)
    return sorted({str(r["partition_id"]) for r in rows if r.get("active")})


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
        if not self.options.split_by_partition:
            return [InputPartition(None)]
        ids = partition_ids(self.options)
        return [InputPartition(p) for p in ids] or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_schema

        opts = self.options
        target = to_arrow_schema(self.schema, timezone="UTC")
        pid = partition.value
        where = f" WHERE _partition_id = {_quote_string(pid)}" if pid is not None else ""
        url = query_url(opts.url, select_sql(opts, [f.name for f in target], where))
        with open_url(url, None, timeout_s=opts.timeout_s, retries=opts.retries,
                      what=f"SELECT from {opts.table} (partition {pid})", headers=opts.headers) as resp:
            for batch in pa_ipc.open_stream(resp):
                if batch.num_rows == 0:
                    continue
                arrays = [_cast(batch.column(batch.schema.get_field_index(f.name)), f.type) for f in target]
                yield pa.RecordBatch.from_arrays(arrays, schema=target)
