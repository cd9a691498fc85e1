"""Date/DateTime text: the fixed-width numpy fast path gives exactly what the general parser gives
(values, NULLs, and the error's row, value and reason), in UTC and in zones with DST gaps/overlaps."""

from __future__ import annotations

import contextlib
from typing import Any
from unittest.mock import patch

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import dates as types_datetime
from replicad.datatypes import parse_type
from replicad.datatypes.base import BadValue

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "Europe/Moscow"]
# days with DST changes (or odd offsets) in the zones above, to aim the generated times at the edges
EDGE_DAYS = ["2024-03-31", "2024-10-27", "2024-03-10", "2024-11-03", "2024-04-07", "2024-10-06",
             "2011-03-27", "2014-10-26", "1970-01-01", "2106-02-07", "2000-02-29", "1900-03-01"]


def general_only() -> Any:
    """Route every row through the general parser (the behaviour before the fast path)."""

    def nothing_fixed(arr: pa.Array, width: int) -> tuple[Any, Any]:
        return np.zeros(len(arr), dtype=bool), np.zeros((0, width), dtype=np.uint8)

    stack = contextlib.ExitStack()
    stack.enter_context(patch.object(types_datetime, "_fixed_width_rows", nothing_fixed))
    stack.enter_context(patch.object(types_datetime, "_textints", _NoCDates()))  # nor the C one-pass path
    return stack


class _NoCDates:
    @staticmethod
    def dates(*args: Any) -> None:
        return None


def numpy_fixed_only() -> Any:
    """The fast path without its C one-pass parser: the numpy one (the C parser's reference)."""
    return patch.object(types_datetime, "_textints", _NoCDates())


def outcome(type_name: str, arr: pa.Array, tz: str) -> Any:
    try:
        return parse_type(type_name).convert(arr, tz).to_pylist()
    except BadValue as e:
        return ("error", e.row, e.value, e.reason)


def same_as_general(type_name: str, arr: pa.Array, tz: str) -> None:
    fast = outcome(type_name, arr, tz)
    with general_only():
        slow = outcome(type_name, arr, tz)
    assert fast == slow




def field(*boundaries: int) -> st.SearchStrategy[str]:
    return (st.sampled_from(boundaries) | st.integers(0, 99)).map(lambda v: f"{v:02d}")


year = st.sampled_from([1899, 1900, 1969, 1970, 2000, 2024, 2038, 2100, 2106, 2107, 2299, 2300, 9999]) | \
    st.integers(0, 9999)
fields = st.tuples(year, field(0, 1, 2, 12, 13), field(0, 1, 28, 29, 30, 31, 32), field(0, 23, 24),
                   field(0, 59, 60), field(0, 59, 60, 61))
edge = st.tuples(st.sampled_from(EDGE_DAYS), st.integers(0, 4), st.sampled_from([0, 15, 29, 30, 45, 59]),
                 st.integers(0, 59)).map(lambda t: f"{t[0]} {t[1]:02d}:{t[2]:02d}:{t[3]:02d}")
datetime_text = st.one_of(
    fields.map(lambda f: f"{f[0]:04d}-{f[1]}-{f[2]} {f[3]}:{f[4]}:{f[5]}"),
    st.integers(0, 2**32 + 10).map(str),
    edge,
    edge.map(lambda s: s.replace(" ", "T")),
    edge.map(lambda s: s + "+03:00"),
    edge.map(lambda s: s[:10]),
    edge.map(lambda s: f" {s}"),
    st.sampled_from(["0", "4294967295", "4294967296", "", "abc", "2024-01-01 10:00", "2024-1-1 10:00:00",
                     "2024-01-01X10:00:00", "2024/01/01 10:00:00", "２０２４-01-01 10:00:00"]),
)


def mutate(text: str, pos: int, byte: int) -> bytes:
    raw = bytearray(text.encode())
    if raw:
        raw[pos % len(raw)] = byte
    return bytes(raw)


values = st.one_of(
    datetime_text.map(str.encode),
    st.tuples(edge, st.integers(0, 18), st.integers(0, 255)).map(lambda t: mutate(*t)),
    st.none(),
)


@given(st.lists(fields, min_size=1, max_size=40), st.booleans(), st.sampled_from(ZONES))
@settings(max_examples=300, deadline=None)
def test_c_dates_match_the_numpy_fast_path(rows: list[tuple[int, str, str, str, str, str]], t: bool,
                                           tz: str) -> None:
    """Columns whose every row has the fixed shape (in range or not): the C parser (all rows well formed,
    else None) against the numpy fast path and the general parser, values and errors alike."""
    sep = "T" if t else " "
    times = pa.array([f"{f[0]:04d}-{f[1]}-{f[2]}{sep}{f[3]}:{f[4]}:{f[5]}".encode() for f in rows],
                     pa.binary())
    dates = pa.array([f"{f[0]:04d}-{f[1]}-{f[2]}".encode() for f in rows], pa.binary())
    for type_name, arr in (("DateTime", times), ("Date", dates), ("Date", dates.slice(1))):
        fast = outcome(type_name, arr, tz)
        with numpy_fixed_only():
            assert fast == outcome(type_name, arr, tz)
        same_as_general(type_name, arr, tz)


@given(st.lists(values, max_size=40), st.sampled_from(ZONES), st.booleans())
@settings(max_examples=300, deadline=None)
def test_datetime_matches_general_parser(rows: list[bytes | None], tz: str, as_string: bool) -> None:
    arr = pa.array(rows, pa.binary())
    if as_string:
        try:
            arr = arr.cast(pa.string())
        except pa.ArrowInvalid:
            pass
    same_as_general("DateTime", arr, tz)
    same_as_general("Nullable(DateTime)", arr, tz)
    dates = pa.array([None if r is None else r[:10] for r in rows], pa.binary())
    same_as_general("Date", dates, tz)
    for i in range(len(rows)):  # row by row too: in a whole column, the first bad row hides the others
        same_as_general("DateTime", arr.slice(i, 1), tz)
        same_as_general("Date", dates.slice(i, 1), tz)


@pytest.mark.parametrize("tz", ZONES)
def test_every_hour_around_dst_edges(tz: str) -> None:
    rows = [f"{day} {h:02d}:{m:02d}:{s:02d}".encode() for day in EDGE_DAYS for h in range(24)
            for m in (0, 29, 30, 59) for s in (0, 59)]
    same_as_general("DateTime", pa.array(rows, pa.binary()), tz)
    same_as_general("Date", pa.array([r[:10] for r in rows], pa.binary()), tz)


def test_error_names_the_original_row() -> None:
    rows = [b"2024-01-01 00:00:00"] * 5 + [b"2024-02-30 00:00:00"] + [b"2024-01-01 00:00:00"] * 3 + [b"x"]
    assert outcome("DateTime", pa.array(rows), "UTC") == ("error", 9, "'x'", "cannot be parsed for DateTime")
    rows[9] = b"1969-12-31 23:59:59"
    # Feb 30 goes to the general parser (strptime rolls it over to March 1st); 1969 is out of range
    assert outcome("DateTime", pa.array(rows), "UTC") == ("error", 9, "'1969-12-31 23:59:59'",
                                                          "is out of range for DateTime")
    dates = [b"2024-01-01", b"2024-01-02", b"2024-13-01"]
    assert outcome("Date", pa.array(dates), "UTC")[:2] == ("error", 2)


def test_fast_path_values() -> None:
    rows = pa.array([b"2024-03-31 02:30:00", b"2024-10-27T02:30:00", None, b"2024-07-01 12:00:00"])
    out = parse_type("Nullable(DateTime)").convert(rows, "Europe/Berlin").cast(pa.int64()).to_pylist()
    assert out == [1711845000, 1729989000, None, 1719828000]  # gap: offset after; overlap: first
    utc = parse_type("DateTime").convert(pa.array([b"2106-02-07 06:28:15", b"2000-02-29 12:00:00"]), "UTC")
    assert utc.cast(pa.int64()).to_pylist() == [4294967295, 951825600]
    assert parse_type("Date").convert(pa.array(["2149-06-06", "1970-01-01"]), "UTC").cast(
        pa.int32()).to_pylist() == [65535, 0]


def test_fast_rows_agree_with_the_general_parser_on_a_boundary_grid() -> None:
    """Every row the fast path takes must parse to the same value through the general parser."""
    years, months = [1899, 1900, 1969, 1970, 2000, 2024, 2100, 2106, 2299, 2300], range(14)
    days, hours, mins = [0, 1, 28, 29, 30, 31, 32], [0, 9, 23, 24], [0, 59, 60]
    rows = [f"{y:04d}-{m:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}".encode()
            for y in years for m in months for d in days for h in hours for mi in mins for s in mins
            for sep in (" ", "T")]
    arr = pa.array(rows, pa.binary())
    ok, fixed = types_datetime._fixed_width_rows(arr, 19)
    assert ok.all()
    good, local = types_datetime._parse_fixed(fixed, True)
    assert 0 < good.sum() < len(rows)
    dt = parse_type("DateTime")
    general = types_datetime._text_to_unix_general(dt, arr.filter(pa.array(good)), "UTC")
    assert general.to_pylist() == local[good].tolist()
    dates = pa.array(sorted({r[:10] for r in rows}), pa.binary())
    ok, fixed = types_datetime._fixed_width_rows(dates, 10)
    good, day_numbers = types_datetime._parse_fixed(fixed, False)
    general = parse_type("Date")._text_to_days(dates.filter(pa.array(good)))  # type: ignore[attr-defined]
    assert general.to_pylist() == day_numbers[good].tolist()


def reference_localize(local: pa.Array, tz: str) -> pa.Array:
    """The straightforward version: both resolutions of a gap for every row."""
    first = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="earliest")
    after = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="latest")
    in_gap = pc.not_equal(first, after)
    offset_after = pc.subtract(pc.local_timestamp(after).cast(pa.int64()), after.cast(pa.int64()))
    shifted = pc.subtract(local.cast(pa.int64()), offset_after)
    return pc.if_else(in_gap, shifted, first.cast(pa.int64()))


@pytest.mark.parametrize("tz", ZONES)
def test_localize_matches_reference(tz: str) -> None:
    edges = np.array([np.datetime64(d, "s").astype(np.int64) for d in EDGE_DAYS])
    local = (edges[:, None] + np.arange(0, 5 * 3600, 450)[None, :]).ravel()
    for rows in (local, local[::7], np.array([1_700_000_000, 1_600_000_000])):
        arr = pa.array(rows, pa.timestamp("s"))
        with_null = pa.array([*rows.tolist(), None], pa.timestamp("s"))
        for a in (arr, with_null):
            assert types_datetime.localize(a, tz).to_pylist() == reference_localize(a, tz).to_pylist()
