"""The insert sort permutation: the packed (key, row) sort equals numpy's stable argsort; rows already in
ORDER BY order are recognised without sorting (and only those)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from replicad.storage.block import _stable_argsort, in_order, sort_indices

DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64]


@given(st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, st.integers(0, 300))))
def test_matches_numpy_stable_argsort(key: npt.NDArray[Any]) -> None:
    assert _stable_argsort(key).tolist() == np.argsort(key, kind="stable").tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_duplicates_and_extremes(dtype: type) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    for values in ([info.min, info.max, 0, info.min, info.max], [info.max - 1, info.max, info.max - 1]):
        key: npt.NDArray[Any] = np.array(values * 50, dtype=dtype)
        assert (_stable_argsort(key) == np.argsort(key, kind="stable")).all()
    key = rng.integers(0, 5, 100_000).astype(dtype)  # many ties: the packed path
    assert (_stable_argsort(key) == np.argsort(key, kind="stable")).all()



@settings(deadline=None, max_examples=60)  # pyarrow's first sort_indices call loads its kernels
@given(st.sampled_from([*DTYPES, np.float64]), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_few_sorted_runs_match_numpy_stable_argsort(dtype: type, runs: int, seed: int) -> None:
    """Keys made of a few sorted runs (as a multi-threaded SELECT from a MergeTree table renders them) take
    the timsort path; its permutation is the stable one, ties between and within runs included."""
    rng = np.random.default_rng(seed)
    n = 3000 * runs
    key: npt.NDArray[Any] = rng.integers(0, 50, n).astype(dtype)  # many ties
    bounds = np.linspace(0, n, runs + 1).astype(int)
    for a, b in itertools.pairwise(bounds):
        key[a:b].sort()
    assert int(np.count_nonzero(key[1:] < key[:-1])) * 1024 < n  # the runs path is the one tested
    assert (_stable_argsort(key) == np.argsort(key, kind="stable")).all()
    keys = [pa.array(key), pa.array(rng.integers(0, 3, n).astype(np.uint8))]
    assert sort_indices(keys).tolist() == _reference(keys)

def _reference(keys: list[pa.Array]) -> list[int]:
    """pyarrow's stable multi-key sort (what sort_indices must equal)."""
    table = pa.table({f"k{i}": k for i, k in enumerate(keys)})
    order = [(f"k{i}", "ascending") for i in range(len(keys))]
    return [int(i) for i in pc.sort_indices(table, order).to_numpy()]


_VALUES = [b"", b"a", b"ab", b"b", b"\x00", b"\xff", b"\x7f\x80"]


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(
    st.lists(st.sampled_from(_VALUES), min_size=n, max_size=n),
    st.lists(st.integers(0, 3), min_size=n, max_size=n),
    st.lists(st.binary(max_size=4), min_size=n, max_size=n))))
def test_string_led_keys_match_a_multi_key_sort(case: tuple[list[bytes], list[int], list[bytes]]) -> None:
    s, k, t = case
    keys = [pa.array(s, pa.binary()), pa.array(k, pa.uint64()), pa.array(t, pa.binary())]
    assert sort_indices(keys).tolist() == _reference(keys)
    assert sort_indices(keys[:2]).tolist() == _reference(keys[:2])
    assert sort_indices([keys[2]]).tolist() == _reference([keys[2]])


def test_many_distinct_strings_and_dictionary_keys() -> None:
    rng = np.random.default_rng(3)
    n = 30_000
    s = pa.array([rng.bytes(int(x)) for x in rng.integers(0, 12, n)], pa.binary())  # mostly distinct
    k = pa.array(rng.integers(0, 10, n), pa.int32())
    assert sort_indices([s, k]).tolist() == _reference([s, k])
    d = pa.array(rng.choice(["x", "y", "", "ü"], n)).dictionary_encode()
    assert sort_indices([d, k]).tolist() == _reference([d.cast(pa.string()), k])


@given(st.integers(0, 40).flatmap(lambda n: st.lists(
    st.lists(st.integers(0, 2), min_size=n, max_size=n), min_size=1, max_size=3)), st.booleans())
def test_in_order_is_the_lexicographic_row_order(columns: list[list[int]], presort: bool) -> None:
    rows = list(zip(*columns, strict=True))
    if presort:
        rows.sort()
    keys = [np.array([r[i] for r in rows], np.int64) for i in range(len(columns))]
    assert in_order(keys) == all(rows[i] <= rows[i + 1] for i in range(len(rows) - 1))
    assert sort_indices([pa.array(k) for k in keys]).tolist() == _reference([pa.array(k) for k in keys])


def test_in_order_traps() -> None:
    # sorted on the leading key, out of order on the second within a tie: must still be sorted
    lead, second = np.array([1, 1, 2]), np.array([5, 4, 0])
    assert not in_order([lead, second])
    assert sort_indices([pa.array(lead), pa.array(second)]).tolist() == [1, 0, 2]
    # out of order on the second key only where the leading key rises: already in order
    assert in_order([np.array([1, 2, 2]), np.array([9, 0, 1])])
    assert not in_order([np.array([1.0, np.nan, 2.0])])  # NaN goes last: the sort must run
    assert sort_indices([pa.array([1.0, float("nan"), 2.0])]).tolist() == [0, 2, 1]
    assert in_order([np.array([], np.int64)]) and in_order([np.array([7])])
