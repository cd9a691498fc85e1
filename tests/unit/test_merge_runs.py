"""The C k-way merge of a round's sorted runs (replicad.native._kmerge via merge_runs) against its reference,
the stable sort of the runs laid end to end: the same order for every key kind it takes (ties: lower run
first, then row order; NaN last; -0.0 equal to 0.0; strings byte-wise), the same merged columns, and
bad input refused instead of read past."""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes.composite import take_rows
from replicad.native import _kmerge
from replicad.storage.merge_runs import BufferPool, merge_runs, merged_order, reference_order

_INT_TYPES = [pa.int8(), pa.uint8(), pa.int16(), pa.uint16(), pa.int32(), pa.uint32(), pa.int64(),
              pa.uint64()]


def _ints(t: pa.DataType) -> st.SearchStrategy[int]:
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    else:
        lo, hi = 0, (1 << bits) - 1
    # few distinct values too: ties across runs are where the order is decided by the run number
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, lo + 1, hi - 1]))


_FLOATS = st.one_of(st.floats(allow_nan=True, width=64),
                    st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf, 1.5]))
_BYTES = st.one_of(st.binary(max_size=12),
                   st.sampled_from([b"", b"a", b"ab", b"abcdefgh", b"abcdefgh\x00", b"abcdefghi", b"\xff",
                                    b"\x00", b"\x7f\x80"]))


@st.composite
def _column_kind(draw: st.DrawFn) -> tuple[pa.DataType, st.SearchStrategy[Any]]:
    choice = draw(st.sampled_from(["int", "float64", "float32", "binary", "string", "date", "timestamp"]))
    if choice == "int":
        t = draw(st.sampled_from(_INT_TYPES))
        return t, _ints(t)
    if choice == "float64":
        return pa.float64(), _FLOATS
    if choice == "float32":
        return pa.float32(), _FLOATS.map(lambda f: struct.unpack("<f", struct.pack("<f", f))[0]
                                         if math.isfinite(f) and abs(f) < 3e38 else f)
    if choice == "binary":
        return pa.binary(), _BYTES
    if choice == "string":
        return pa.string(), st.text(max_size=6)
    if choice == "date":
        return pa.date32(), st.integers(0, 70000)
    return pa.timestamp("s"), st.integers(0, 4_000_000_000)


def _sorted_run(columns: list[list[Any]], types: list[pa.DataType]) -> list[pa.Array]:
    """The run's key columns, sorted by the reference order."""
    arrays = [pa.array(c, t) for c, t in zip(columns, types, strict=True)]
    order = reference_order(arrays) if arrays and len(arrays[0]) else np.zeros(0, np.int64)
    return [a.take(pa.array(order, pa.int64())) for a in arrays]


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[pa.DataType], list[list[pa.Array]]]:
    kinds = draw(st.lists(_column_kind(), min_size=1, max_size=3))
    types = [t for t, _ in kinds]
    runs = []
    for _ in range(draw(st.integers(1, 7))):
        n = draw(st.integers(0, 40))
        columns = [draw(st.lists(values, min_size=n, max_size=n)) for _, values in kinds]
        runs.append(_sorted_run(columns, types))
    return types, runs


@settings(max_examples=300, deadline=None)
@given(_runs())
def test_merged_order_is_the_stable_sort_of_the_runs(
        case: tuple[list[pa.DataType], list[list[pa.Array]]]) -> None:
    types, runs = case
    got = merged_order(runs)
    assert got is not None
    whole = [pa.concat_arrays([r[c] for r in runs]) for c in range(len(types))]
    assert got.indices.to_pylist() == reference_order(whole).tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=6), st.data())
def test_merged_columns_equal_concatenate_and_take(sizes: list[int], data: st.DataObject) -> None:
    """Every column kind of a round: gathered in C (fixed width, strings) or taken (Nullable, bool, lists)."""
    tables, keys = [], []
    for i, n in enumerate(sizes):
        k = sorted(data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)))
        t = pa.table({
            "k": pa.array(k, pa.uint64()),
            "s": pa.array([f"s{i}-{j}" * (j % 4) for j in range(n)], pa.binary()),
            "fs": pa.array([bytes([i, j % 256, 7]) for j in range(n)], pa.binary(3)),
            "n": pa.array([None if j % 3 == 0 else j for j in range(n)], pa.int32()),
            "b": pa.array([j % 2 == 0 for j in range(n)], pa.bool_()),
            "l": pa.array([[j] * (j % 3) for j in range(n)], pa.list_(pa.int16())),
            "ts": pa.array(range(n), pa.timestamp("s")),
        })
        tables.append(t.slice(0))
        keys.append([t.column("k")])
    nonempty = [i for i, n in enumerate(sizes) if n]
    if not nonempty:
        return
    tables = [tables[i] for i in nonempty]
    keys = [keys[i] for i in nonempty]
    done = merge_runs(tables, keys)
    assert done is not None
    merged, order = done
    whole = pa.concat_tables(tables).combine_chunks()
    want = take_rows(whole, reference_order([whole.column("k").chunk(0)]))
    assert merged.equals(want)
    assert order.indices.to_pylist() == reference_order([whole.column("k").chunk(0)]).tolist()


def test_slices_and_chunked_runs() -> None:
    a = pa.array(range(0, 100, 2), pa.int64()).slice(10, 20)  # an offset into its buffer
    b = pa.chunked_array([pa.array([25, 27], pa.int64()), pa.array([29, 100], pa.int64())])
    s_a = pa.array([str(i) for i in range(50)]).slice(10, 20)
    ta = pa.table({"k": a, "s": s_a})
    tb = pa.Table.from_batches([pa.record_batch([pa.array([25, 27], pa.int64()), pa.array(["x", "y"])],
                                                names=["k", "s"]),
                                pa.record_batch([pa.array([29, 100], pa.int64()), pa.array(["z", "w"])],
                                                names=["k", "s"])])
    done = merge_runs([ta, tb], [[a], [b]])
    assert done is not None
    merged, _order = done
    assert merged.column("k").to_pylist() == sorted([*a.to_pylist(), 25, 27, 29, 100])
    assert merged.column("s").to_pylist()[:8] == ["10", "11", "12", "x", "13", "y", "14", "z"]


def test_keys_it_cannot_compare_fall_back() -> None:
    assert merged_order([[pa.array([1, None], pa.int64())]]) is None  # NULLs
    assert merged_order([[pa.array([b"ab"], pa.binary(2))]]) is None  # FixedString
    assert merged_order([[pa.array([1], pa.decimal128(10, 2))]]) is None


def test_bad_input_is_refused() -> None:
    q = np.arange(4, dtype=np.uint64)
    with pytest.raises(ValueError):
        _kmerge.merge("Q", [(q, q)])  # two buffers for one column
    with pytest.raises(ValueError):
        _kmerge.merge("Z", [(q,)])
    with pytest.raises(ValueError):
        _kmerge.merge("Q", [(b"1234567",)])  # not whole values
    with pytest.raises(ValueError):  # offsets past the data
        _kmerge.merge("s", [(np.array([0, 5], np.int32), b"abc")])
    with pytest.raises(ValueError):  # offsets out of order
        _kmerge.merge("s", [(np.array([0, 2, 1], np.int32), b"abc")])
    src = np.array([0, 1], np.int32).tobytes()
    with pytest.raises(ValueError):  # run 1 does not exist
        _kmerge.gather_fixed(8, [q], src, np.array([0, 0], np.int32).tobytes())
    with pytest.raises(ValueError):  # row 4 of a 4-row run
        _kmerge.gather_fixed(8, [q, q], src, np.array([0, 4], np.int32).tobytes())
    with pytest.raises(ValueError):
        _kmerge.gather_binary([(np.array([0, 1], np.int32), b"a")], np.zeros(2, np.int32).tobytes(),
                              np.array([0, 1], np.int32).tobytes())
    with pytest.raises(ValueError):  # offsets of different widths
        _kmerge.gather_binary([(np.array([0, 1], np.int32), b"a"), (np.array([0, 1], np.int64), b"b")],
                              np.zeros(1, np.int32).tobytes(), np.zeros(1, np.int32).tobytes())


def test_gathering_a_row_twice_is_refused() -> None:
    offsets, data = np.array([0, 3, 5], np.int32), b"abcde"
    with pytest.raises(ValueError):
        _kmerge.gather_binary([(offsets, data)], np.zeros(3, np.int32).tobytes(),
                              np.array([0, 0, 1], np.int32).tobytes())
    got_offsets, got_data = _kmerge.gather_binary([(offsets, data)], np.zeros(2, np.int32).tobytes(),
                                                  np.array([1, 0], np.int32).tobytes())
    assert np.frombuffer(got_offsets, np.int32).tolist() == [0, 2, 5]
    assert got_data[:5] == b"deabc"


def test_buffer_pool_hands_out_only_buffers_nothing_refers_to() -> None:
    pool = BufferPool()
    first = pool.get(100)
    first[:3] = b"abc"
    held = pa.py_buffer(first.toreadonly())
    del first
    second = pool.get(100)  # the first is still referred to (by ``held``): another one
    second[:3] = b"xyz"
    assert held.to_pybytes()[:3] == b"abc"
    view = memoryview(held)[:2]  # a view of the Arrow buffer, as a stream writer holds one
    del held, second
    third = pool.get(90)
    third[:3] = b"123"
    assert bytes(view) == b"ab"
    del view, third
    pool.get(10)[:3] = b"zzz"  # everything free again: buffers are reused, no new ones made
    assert len(pool._buffers) == 2


def test_rounds_sharing_a_pool_keep_earlier_rounds_intact() -> None:
    pool = BufferPool()
    rng = np.random.default_rng(5)
    kept = []
    for _ in range(30):
        runs = [np.sort(rng.integers(0, 1000, int(rng.integers(1, 50)))).astype(np.uint64) for _ in range(3)]
        tables = [pa.table({"k": r, "s": pa.array([str(v).encode() for v in r], pa.binary())}) for r in runs]
        done = merge_runs(tables, [[t.column("k")] for t in tables], pool)
        assert done is not None
        merged, _order = done
        want = sorted(v for r in runs for v in r.tolist())
        assert merged.column("k").to_pylist() == want
        if len(kept) < 10:
            kept.append((merged, want))  # held: their buffers must not be handed out again
    for merged, want in kept:
        assert merged.column("k").to_pylist() == want
        assert merged.column("s").to_pylist() == [str(v).encode() for v in want]
