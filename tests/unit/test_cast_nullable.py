"""``CAST(NULL, 'Nullable(T)')`` and casts of Nullable values into Nullable(T) for the types the evaluator
converts through the storage type (Decimal, FixedString, UUID, Enum): the NULL rows stay NULL, so
``DEFAULT NULL`` and ``ALTER … UPDATE c = NULL`` work on such columns."""

from __future__ import annotations

import decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from replicad.datatypes import DataType, parse_type
from replicad.datatypes.composite import values_under_nulls
from replicad.errors import BadInputError
from replicad.replication.sink import TableSchema, column_defaults
from replicad.sql.ddl import parse_create_table
from replicad.sql.expressions import compile_expression
from replicad.storage.block import prepare_block
from replicad.storage.merge import PartSchema, TableKeys
from replicad.storage.mutate import MutationCommand, iter_mutated
from replicad.storage.writer import WriterSettings

TYPES = ["Decimal(9, 2)", "Decimal(18, 4)", "Decimal(38, 10)", "FixedString(3)", "UUID",
         "Enum8('a' = 1, 'b' = 2)", "Enum16('x' = -300, 'y' = 1000)"]

UUIDS = ["01234567-89ab-cdef-0123-456789abcdef", "00000000-0000-0001-0000-000000000002"]

BASE = pa.table({"k": pa.array([1, 2, 3], pa.uint64())})
BASE_TYPES = {"k": parse_type("UInt64")}


def run(text: str, table: pa.Table = BASE, types: dict[str, DataType] | None = None) -> tuple[pa.Array, str]:
    arr, dt = compile_expression(text).evaluate(table, types or BASE_TYPES)
    return arr, dt.name


def quoted(type_name: str) -> str:
    return type_name.replace("'", "\\'")


@pytest.mark.parametrize("type_name", TYPES)
def test_cast_null_into_nullable(type_name: str) -> None:
    target = parse_type(f"Nullable({type_name})")
    for text in (f"CAST(NULL, '{quoted(target.name)}')", f"CAST(NULL AS Nullable({type_name}))"):
        arr, name = run(text)
        assert name == target.name
        assert arr.type == target.arrow_type
        assert arr.to_pylist() == [None, None, None]


@pytest.mark.parametrize("type_name", TYPES)
def test_cast_null_into_non_nullable_is_still_refused(type_name: str) -> None:
    # ClickHouse: "Cannot convert NULL value to non-Nullable type"
    with pytest.raises(BadInputError, match="Cannot convert"):
        run(f"CAST(NULL AS {type_name})")


def test_nullable_values_into_nullable_keep_their_nulls() -> None:
    types = {"s": parse_type("Nullable(String)"), "u": parse_type("Nullable(String)"),
             "e": parse_type("Nullable(String)"), "m": parse_type("Nullable(String)")}
    t = pa.table({"s": pa.array([b"ab", None, b"xyz"]),
                  "u": pa.array([UUIDS[0].encode(), None, UUIDS[1].encode()]),
                  "e": pa.array([b"b", None, b"a"]), "m": pa.array([b"1.25", None, b"-3"])})
    arr, name = run("CAST(s AS Nullable(FixedString(3)))", t, types)
    assert name == "Nullable(FixedString(3))" and arr.to_pylist() == [b"ab\x00", None, b"xyz"]
    arr, name = run("CAST(u AS Nullable(UUID))", t, types)
    assert name == "Nullable(UUID)"
    assert arr.to_pylist() == [bytes.fromhex(UUIDS[0].replace("-", "")), None,
                               bytes.fromhex(UUIDS[1].replace("-", ""))]
    arr, name = run("CAST(e AS Nullable(Enum8('a' = 1, 'b' = 2)))", t, types)
    assert name == "Nullable(Enum8('a' = 1, 'b' = 2))" and arr.to_pylist() == [2, None, 1]
    arr, name = run("CAST(m AS Nullable(Decimal(9, 2)))", t, types)
    assert name == "Nullable(Decimal(9, 2))"
    assert arr.to_pylist() == [decimal.Decimal("1.25"), None, decimal.Decimal("-3.00")]
    # into the non-Nullable type the NULL row is refused as before
    with pytest.raises(BadInputError, match="not Nullable"):
        run("CAST(s AS FixedString(3))", t, types)


def test_default_null_on_such_columns() -> None:
    ddl = ("CREATE TABLE t (a UInt32, dm Nullable(Decimal(9, 2)) DEFAULT NULL, "
           "fs Nullable(FixedString(3)) DEFAULT NULL, uu Nullable(UUID) DEFAULT NULL, "
           "en Nullable(Enum8('a' = 1, 'b' = 2)) DEFAULT NULL) ENGINE = MergeTree ORDER BY a")
    table = parse_create_table(ddl)
    columns = tuple((c.name, c.type) for c in table.columns if c.is_physical)
    schema = TableSchema(columns, table.partition_by, table.order_by, table.primary_key,
                         defaults=column_defaults(table.columns_text()))
    out = prepare_block(pa.table({"a": pa.array([1, 2], pa.uint32())}), list(schema.columns),
                        defaults=schema.column_defaults)
    for name, dt in columns[1:]:
        col = out.column(name).combine_chunks()
        assert col.type == dt.arrow_type and col.to_pylist() == [None, None], name
    # a given value still goes in
    given = prepare_block(pa.table({"a": pa.array([1], pa.uint32()), "fs": pa.array([b"ab"])}),
                          list(schema.columns), defaults=schema.column_defaults)
    assert given.column("fs").to_pylist() == [b"ab\x00"]


def test_update_to_null_on_such_columns_keeps_the_values_underneath(tmp_path: Path) -> None:
    n = 40
    columns = (("k", parse_type("UInt64")), ("dm", parse_type("Nullable(Decimal(9, 2))")),
               ("fs", parse_type("Nullable(FixedString(3))")), ("uu", parse_type("Nullable(UUID)")),
               ("en", parse_type("Nullable(Enum8('a' = 1, 'b' = 2))")))
    schema = PartSchema(columns, None, "k")
    table = pa.table({
        "k": pa.array(np.arange(n, dtype=np.uint64)),
        "dm": pa.array([decimal.Decimal(i).scaleb(-2) for i in range(n)], pa.decimal128(9, 2)),
        "fs": pa.array([b"%03d" % i for i in range(n)], pa.binary(3)),
        "uu": pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16)),
        "en": pa.array([1 + i % 2 for i in range(n)], pa.int8()),
    })
    keys = TableKeys(schema)
    settings = WriterSettings(index_granularity=16, fsync=False, threads=1)
    with keys.writer(tmp_path / "src", settings, []) as w:
        w.write(table)
        w.finish()
    update = MutationCommand.update([("dm", "NULL"), ("fs", "NULL"), ("uu", "NULL"), ("en", "NULL")],
                                    "k % 3 = 0")
    batches = list(iter_mutated(tmp_path / "src", schema, [update], index_granularity=16))
    for name in ("dm", "fs", "uu", "en"):
        col = pa.concat_arrays([b.column(name).combine_chunks() for b in batches])
        before = table.column(name).to_pylist()
        assert col.to_pylist() == [None if i % 3 == 0 else before[i] for i in range(n)], name
        # as 18.16, the old values stay under the new NULLs
        assert values_under_nulls(col).to_pylist() == before, name
