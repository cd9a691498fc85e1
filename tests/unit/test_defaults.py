"""Column defaults on insert (prepare_block / ColumnDefaults / the sink's TableSchema / the HTTP column
mapping) and the values a Nullable column keeps under its NULLs."""

from __future__ import annotations

import asyncio
import decimal
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.datatypes.composite import filter_rows, take_rows, values_under_nulls
from replicad.errors import BadInputError
from replicad.replication.sink import InsertContext, TableSchema, column_defaults, write_block
from replicad.server.insert_input import insert_columns as _insert_columns
from replicad.sql.ddl import parse_create_table
from replicad.storage.block import ColumnDefaults, prepare_block, zero_under_nulls
from replicad.storage.layout import TableDataLayout
from replicad.storage.reader import PartReader
from replicad.storage.writer import WriterSettings

FIXTURES = Path(__file__).parent.parent / "fixtures"

DDL = (
    "CREATE TABLE t (a UInt32, b UInt32 DEFAULT a + 1, m String MATERIALIZED toString(b), "
    "c UInt64 DEFAULT b * 10, d UInt64 ALIAS a * 2, e String, f DEFAULT 5, g UInt16 DEFAULT e_len, "
    "e_len UInt8 MATERIALIZED length(e), x UInt8 DEFAULT a + 300, h UInt64 DEFAULT d + 1, "
    "n Nullable(Int32) DEFAULT NULL) ENGINE = MergeTree ORDER BY a"
)


def schema_of(ddl: str = DDL) -> TableSchema:
    table = parse_create_table(ddl)
    columns = tuple((c.name, c.type) for c in table.columns if c.is_physical)
    return TableSchema(columns, table.partition_by, table.order_by, table.primary_key,
                       defaults=column_defaults(table.columns_text()))


def prepare(rows: dict[str, list[object]], schema: TableSchema | None = None) -> dict[str, list[object]]:
    schema = schema or schema_of()
    out = prepare_block(pa.table(rows), list(schema.columns), defaults=schema.column_defaults)
    result: dict[str, list[object]] = out.to_pydict()
    return result


# ---- DEFAULT / MATERIALIZED / ALIAS --------------------------------------------------------------------


def test_schema_orders_columns_like_clickhouse_and_drops_alias() -> None:
    schema = schema_of()
    assert [n for n, _t in schema.columns] == ["a", "b", "c", "e", "f", "g", "x", "h", "n", "m", "e_len"]
    assert [n for n, _t in schema.insertable_columns] == ["a", "b", "c", "e", "f", "g", "x", "h", "n"]
    assert ("d", "ALIAS", "a * 2") in schema.defaults


def test_missing_defaults_computed_in_dependency_order() -> None:
    got = prepare({"a": [1, 2], "e": ["abc", "hello"]})
    assert got["b"] == [2, 3]
    assert got["c"] == [20, 30]  # reads b, itself a DEFAULT
    assert got["m"] == [b"2", b"3"]  # MATERIALIZED reading a DEFAULT
    assert got["g"] == [3, 5]  # DEFAULT reading a MATERIALIZED
    assert got["e_len"] == [3, 5]
    assert got["f"] == [5, 5]  # constant
    assert got["x"] == [(1 + 300) % 256, (2 + 300) % 256]  # CAST(a + 300, 'UInt8') wraps
    assert got["h"] == [3, 5]  # reads an ALIAS column (computed, never stored)
    assert got["n"] == [None, None]
    assert "d" not in got


def test_given_default_column_wins_and_feeds_the_others() -> None:
    got = prepare({"a": [1], "b": [100], "e": ["x"]})
    assert got["b"] == [100] and got["c"] == [1000] and got["m"] == [b"100"]


def test_missing_ordinary_column_reads_as_type_default() -> None:
    got = prepare({"e": ["xy"]})  # 18.16: a = 0 then b = a + 1
    assert got["a"] == [0] and got["b"] == [1] and got["c"] == [10] and got["g"] == [2]


def test_materialized_in_input_is_refused() -> None:
    message = r"^Cannot insert column m, because it is MATERIALIZED column\.$"
    with pytest.raises(BadInputError, match=message) as e:
        prepare({"a": [1], "m": ["x"]})
    assert e.value.code == 44


def test_alias_in_input_is_no_such_column() -> None:
    with pytest.raises(BadInputError, match="d: no such column") as e:
        prepare({"a": [1], "d": [2]})
    assert e.value.code == 16


def test_cyclic_defaults_are_refused() -> None:
    cols = [("p", parse_type("UInt8")), ("q", parse_type("UInt8")), ("r", parse_type("UInt8"))]
    rules = ColumnDefaults([("q", "DEFAULT", "r + 1"), ("r", "MATERIALIZED", "q + 1")])
    with pytest.raises(BadInputError) as e:
        prepare_block(pa.table({"p": [1]}), cols, defaults=rules)
    assert e.value.code == 174
    # with q given the cycle is never entered
    out = prepare_block(pa.table({"p": [1], "q": [5]}), cols, defaults=rules)
    assert out.column("r").to_pylist() == [6]


def test_bad_default_value_names_the_column() -> None:
    cols = [("a", parse_type("String")), ("b", parse_type("UInt8"))]
    with pytest.raises(BadInputError, match="column b"):
        prepare_block(pa.table({"a": ["zz"]}), cols, defaults=[("b", "DEFAULT", "CAST(a, 'UInt8')")])


def test_strict_mode_still_computes_defaults() -> None:
    schema = schema_of()
    out = prepare_block(pa.table({"a": [1], "e": ["q"]}), list(schema.columns), fill_missing=False,
                        defaults=schema.defaults)
    assert out.column("b").to_pylist() == [2]


def test_column_defaults_from_18_16_columns_znode() -> None:
    fixture = json.loads((FIXTURES / "ch18_metadata.json").read_text())
    tables = {t["name"]: t for t in fixture["cases"]}
    defaults = column_defaults(tables["defaults_comments"]["columns"])
    assert ("b", "DEFAULT", "CAST(a + 1, 'UInt32')") in defaults
    assert ("c", "MATERIALIZED", "toString(a)") in defaults
    assert ("d", "ALIAS", "a * 2") in defaults
    assert ("f", "DEFAULT", "5") in defaults


def test_write_block_stores_defaults_and_no_alias(tmp_path: Path) -> None:
    schema = schema_of(DDL.replace("ORDER BY a", "PARTITION BY b % 2 ORDER BY (c, a)"))
    layout = TableDataLayout(tmp_path, "db", "t")
    rows = pa.table({"a": pa.array([3, 1, 2], pa.uint32()), "e": ["x", "yy", "zzz"]})
    parts = asyncio.run(write_block(rows, schema, layout, WriterSettings(fsync=False), InsertContext()))
    assert sorted(p.partition_id for p in parts) == ["0", "1"]  # partitioned by a DEFAULT column
    for p in parts:
        text = (Path(p.path) / "columns.txt").read_text()
        assert text.splitlines()[2:] == [
            "`a` UInt32", "`b` UInt32", "`c` UInt64", "`e` String", "`f` UInt8", "`g` UInt16", "`x` UInt8",
            "`h` UInt64", "`n` Nullable(Int32)", "`m` String", "`e_len` UInt8"]
        assert not (Path(p.path) / "d.bin").exists()
    got = pa.concat_tables(PartReader(Path(p.path)).read() for p in parts).sort_by("a").to_pydict()
    assert got["c"] == [20, 30, 40] and got["m"] == [b"2", b"3", b"4"] and got["e_len"] == [2, 3, 1]


def test_api_insert_columns_skip_and_refuse_materialized() -> None:
    schema = schema_of()
    table = SimpleNamespace(name="db.t", columns=schema.columns, schema=schema)
    assert [n for n, _t in _insert_columns(table, None)] == [n for n, _t in schema.insertable_columns]
    assert [n for n, _t in _insert_columns(table, ("e", "a"))] == ["e", "a"]
    with pytest.raises(BadInputError, match="because it is MATERIALIZED column") as e:
        _insert_columns(table, ("a", "e_len"))
    assert e.value.code == 44
    with pytest.raises(BadInputError, match="No such column d") as e:
        _insert_columns(table, ("a", "d"))
    assert e.value.code == 16
    plain = SimpleNamespace(name="db.p", columns=schema.columns)  # an engine without defaults
    assert len(_insert_columns(plain, None)) == len(schema.columns)


# ---- values under NULL ----------------------------------------------------------------------------------

NULLABLE_TYPES = ["Nullable(Int32)", "Nullable(UInt8)", "Nullable(Float64)", "Nullable(String)",
                  "Nullable(FixedString(3))", "Nullable(Date)", "Nullable(DateTime)",
                  "Nullable(Decimal(9, 2))"]


def _with_garbage(dtype_name: str, values: list[int], nulls: list[bool]) -> pa.Array:
    """A storage array of ``dtype_name`` with ``values`` stored under every row, NULL where ``nulls``."""
    dt = parse_type(dtype_name)
    t = dt.arrow_type
    if pa.types.is_binary(t):
        plain = pa.array([str(v).encode() for v in values], t)
    elif pa.types.is_fixed_size_binary(t):
        plain = pa.array([str(v % 1000).rjust(3, "0").encode() for v in values], t)
    elif pa.types.is_decimal(t):
        plain = pa.array([decimal.Decimal(v % 10**6).scaleb(-2) for v in values], t)
    elif pa.types.is_date32(t):
        plain = pa.array([v % 40000 for v in values], pa.int32()).cast(t)
    elif pa.types.is_timestamp(t):
        plain = pa.array([v % 2**31 for v in values], pa.int64()).cast(t)
    else:
        plain = pa.array(np.asarray(values, dtype=np.int64) % 100, pa.int64()).cast(t)
    validity = pa.py_buffer(np.packbits(~np.asarray(nulls, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(t, len(plain), [validity, *plain.buffers()[1:]])


rows_strategy = st.lists(st.tuples(st.integers(0, 10**9), st.booleans()), min_size=0, max_size=60)


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, type_name=st.sampled_from(NULLABLE_TYPES), start=st.integers(0, 5))
def test_nullable_writes_the_values_under_null(
    rows: list[tuple[int, bool]], type_name: str, start: int
) -> None:
    dt = parse_type(type_name)
    arr = _with_garbage(type_name, [v for v, _n in rows], [n for _v, n in rows])
    arr = arr.slice(min(start, len(arr)))
    back = dt.deserialize(dt.serialize(arr), len(arr))
    assert back.is_null().to_pylist() == arr.is_null().to_pylist()
    assert values_under_nulls(back).to_pylist() == values_under_nulls(arr).to_pylist()


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, type_name=st.sampled_from(NULLABLE_TYPES))
def test_inserts_store_zero_under_null(rows: list[tuple[int, bool]], type_name: str) -> None:
    dt = parse_type(type_name)
    arr = _with_garbage(type_name, [v for v, _n in rows], [n for _v, n in rows])
    zeroed = zero_under_nulls(arr)
    assert zeroed.to_pylist() == arr.to_pylist()
    plain = values_under_nulls(zeroed)
    zero = dt.inner.deserialize(dt.inner.serialize(dt.inner.defaults(1)), 1)[0]  # type: ignore[attr-defined]
    for value, is_null in zip(plain.to_pylist(), arr.is_null().to_pylist(), strict=True):
        if is_null:
            assert value == zero.as_py()
    # through prepare_block (the insert path) the bytes under NULL are the type's zero
    out = prepare_block(pa.table({"c": arr}), [("c", dt)])
    assert values_under_nulls(out.column("c").combine_chunks()).to_pylist() == plain.to_pylist()


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, type_name=st.sampled_from(NULLABLE_TYPES), seed=st.integers(0, 2**32 - 1))
def test_take_and_filter_rows_keep_values_under_null(
    rows: list[tuple[int, bool]], type_name: str, seed: int
) -> None:
    arr = _with_garbage(type_name, [v for v, _n in rows], [n for _v, n in rows])
    table = pa.table({"c": arr, "k": pa.array(range(len(arr)), pa.int64())})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(arr))
    taken = take_rows(table, order)
    assert taken.column("c").to_pylist() == table.column("c").take(order).to_pylist()
    under = values_under_nulls(arr).to_pylist()
    assert values_under_nulls(taken.column("c").combine_chunks()).to_pylist() == [under[i] for i in order]
    mask = rng.random(len(arr)) < 0.5
    kept = filter_rows(table, mask)
    assert kept.column("k").to_pylist() == [i for i in range(len(arr)) if mask[i]]
    assert kept.column("c").is_null().to_pylist() == [bool(arr[i].as_py() is None) for i in range(len(arr))
                                                      if mask[i]]
    assert values_under_nulls(kept.column("c").combine_chunks()).to_pylist() == [
        under[i] for i in range(len(arr)) if mask[i]]
