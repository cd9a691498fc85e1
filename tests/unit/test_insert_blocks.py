"""``Converter`` re-cuts parsed batches into insert blocks of exactly ``block_rows`` rows (the last one
shorter), whatever the sizes of the parsed batches: the same rows, in order, column by column."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import BadInputError
from replicad.server.input_columns import Converter, InputSpec
from replicad.storage.block import prepare_block

COLUMNS = [("k", parse_type("UInt64")), ("s", parse_type("String")), ("a", parse_type("Array(UInt32)"))]


@settings(deadline=None, max_examples=200)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 50))
def test_blocks_are_cut_exactly(sizes: list[int], block_rows: int) -> None:
    spec = InputSpec(format="ArrowStream", columns=COLUMNS, explicit_columns=False, block_rows=block_rows)
    conv = Converter([n for n, _ in COLUMNS], [t for _, t in COLUMNS], spec)
    out: list[pa.RecordBatch] = []
    start = 0
    for size in sizes:
        k = list(range(start, start + size))
        out += conv.feed([pa.array(k, pa.uint64()), pa.array([b"s%d" % i for i in k], pa.binary()),
                          pa.array([[i] * (i % 3) for i in k], pa.list_(pa.uint32()))])
        start += size
    out += conv.finish()
    total = sum(sizes)
    assert [b.num_rows for b in out] == [block_rows] * (total // block_rows) + (
        [total % block_rows] if total % block_rows else [])
    got = pa.Table.from_batches(out, schema=out[0].schema) if out else None
    if got is not None:
        assert got.column("k").to_pylist() == list(range(total))
        assert got.column("s").to_pylist() == [b"s%d" % i for i in range(total)]
        assert got.column("a").to_pylist() == [[i] * (i % 3) for i in range(total)]
    for b in out:
        b.validate(full=True)


def test_converted_columns_are_not_converted_again_unless_their_type_changed() -> None:
    """The parsers' blocks carry their columns' types: ``prepare_block`` takes such a column as it is, but
    converts (and checks) it when the table's column has another type now (an ALTER between parse and
    write), even with the same storage Arrow type: Int8 values 7 and 9 are not all values of an Enum8."""
    cols = [("k", parse_type("UInt64")), ("e", parse_type("Int8"))]
    spec = InputSpec(format="TabSeparated", columns=cols, explicit_columns=False)
    conv = Converter([n for n, _ in cols], [t for _, t in cols], spec)
    [batch] = [*conv.feed([pa.array([1, 2], pa.uint64()), pa.array([7, 9], pa.int8())]), *conv.finish()]
    table = pa.Table.from_batches([batch])
    same = prepare_block(table, cols)
    assert same.column("e").to_pylist() == [7, 9] and same.column("k").to_pylist() == [1, 2]
    enum = [("k", cols[0][1]), ("e", parse_type("Enum8('a' = 7, 'b' = 8)"))]
    assert enum[1][1].arrow_type == pa.int8()
    with pytest.raises(BadInputError):
        prepare_block(table, enum)
    unmarked = pa.Table.from_arrays([pa.array([1, 2], pa.uint64()), pa.array([7, 9], pa.int8())], ["k", "e"])
    with pytest.raises(BadInputError):
        prepare_block(unmarked, enum)
