"""civil_from_days: the per-day table path (a block whose dates span few days) gives exactly what the plain
arithmetic gives, and both agree with Python's proleptic Gregorian calendar."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.sql import expressions_dates as dates
from replicad.sql.expressions import compile_expression

EPOCH = dt.date(1970, 1, 1).toordinal()


def assert_same(days: np.ndarray) -> None:
    fast = dates.civil_from_days(days)
    plain = dates._civil_from_days(days)
    for a, b in zip(fast, plain, strict=True):
        assert a.dtype == b.dtype == np.int64
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(-800_000, 2_900_000),
    span=st.integers(1, 400),
    n=st.integers(0, 3000),
    dtype=st.sampled_from([np.int32, np.int64, np.uint16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_table_path_equals_arithmetic(start: int, span: int, n: int, dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if dtype is np.uint16:
        start = start % (65536 - span)
    days: np.ndarray = (start + rng.integers(0, span, n)).astype(dtype)
    assert_same(days)
    assert_same(days[::3])  # strided views


def test_wide_ranges_and_small_blocks_take_the_arithmetic() -> None:
    assert_same(np.array([0, 10**6], np.int64).repeat(100))  # two far apart days, many values
    assert_same(np.arange(-1000, 1000, dtype=np.int32))  # every value distinct
    assert_same(np.array([19000] * 10, np.int32))  # below the table threshold
    assert_same(np.array([], np.int32))


def test_lookup_table_covers_its_range_exactly() -> None:
    """The (year, month, day) table of days 0..65535: every entry, and its edges, as the arithmetic."""
    assert_same(np.arange(0, 65536, dtype=np.int64))
    assert_same(np.array([65535, 0, 65536], np.int64))  # one day past the table: the arithmetic
    assert_same(np.array([-1, 0], np.int32))
    assert_same(np.arange(0, 65536, 1000, dtype=np.uint16))


def test_matches_python_calendar() -> None:
    days = np.concatenate([np.arange(-1_000, 60_000, 7, dtype=np.int64),
                           np.full(1000, 19_783, np.int64), np.arange(19_700, 19_800, dtype=np.int64)])
    y, m, d = dates.civil_from_days(days)
    for i in range(0, len(days), 97):
        expected = dt.date.fromordinal(int(days[i]) + EPOCH)
        assert (y[i], m[i], d[i]) == (expected.year, expected.month, expected.day)


def test_partition_key_functions_unchanged() -> None:
    rng = np.random.default_rng(7)
    raw = (19_000 + rng.integers(0, 90, 5000)).astype(np.int32)
    table = pa.table({"d": pa.array(raw, pa.int32()).cast(pa.date32())})
    types = {"d": parse_type("Date")}
    expected = [dt.date.fromordinal(int(x) + EPOCH) for x in raw]
    got = compile_expression("toYYYYMM(d)").evaluate(table, types)[0].to_pylist()
    assert got == [e.year * 100 + e.month for e in expected]
    got = compile_expression("toStartOfMonth(d)").evaluate(table, types)[0].to_pylist()
    assert got == [e.replace(day=1) for e in expected]
    got = compile_expression("toStartOfQuarter(d)").evaluate(table, types)[0].to_pylist()
    assert got == [e.replace(month=(e.month - 1) // 3 * 3 + 1, day=1) for e in expected]
    got = compile_expression("toYYYYMMDD(d)").evaluate(table, types)[0].to_pylist()
    assert got == [e.year * 10000 + e.month * 100 + e.day for e in expected]
