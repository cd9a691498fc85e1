"""Date (UInt16 days since 1970-01-01) and DateTime / DateTime('tz') (UInt32 unix seconds).

Text input: rows of the common fixed-width shapes (``YYYY-MM-DD``, ``YYYY-MM-DD hh:mm:ss`` / ``…Thh:mm:ss``
with in-range fields) are parsed by numpy straight from the Arrow data buffer; only the other rows go
through the general parsers (regex / strptime / offsets / unix seconds), and errors name the original row.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import (
    FIELD_UINT64,
    BadValue,
    DataType,
    checked,
    first_true,
    is_stringlike,
)
from replicad.datatypes.numeric import FixedWidthType, convert_integers, strip_text
from replicad.native import _textints

I64 = npt.NDArray[np.int64]

_DATE_MAX = 0xFFFF
_DATETIME_MAX = 0xFFFFFFFF


def _check_range(dt: DataType, orig: pa.Array, values: pa.Array, hi: int) -> None:
    """Reject the first of ``values`` (int64 or temporal) outside ``0..hi``."""
    ints = values.cast(pa.int64()) if not pa.types.is_int64(values.type) else values
    lo_hi = pc.min_max(ints)  # one kernel call: every value in range is the usual case
    lo, top = lo_hi["min"].as_py(), lo_hi["max"].as_py()
    if lo is None or (lo >= 0 and top <= hi):
        return
    bad = first_true(pc.or_(pc.less(ints, 0), pc.greater(ints, hi)))
    if bad >= 0:
        raise dt.reject(orig, bad, "is out of range")


def localize(local: pa.Array, tz: str) -> pa.Array:
    """Naive local ``timestamp('s')`` wall-clock times in ``tz`` -> int64 unix seconds, as ClickHouse does:
    an ambiguous time (clocks going back) takes its first occurrence; a time inside a gap (clocks going
    forward) is read with the UTC offset in force after the gap (02:30 in a 02:00->03:00 gap = 03:30)."""
    if tz == "UTC":
        return local.cast(pa.int64())
    try:  # the usual case: no time falls into a gap, one conversion does
        return pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="raise").cast(pa.int64())
    except pa.ArrowInvalid:
        pass
    first = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="earliest")
    gap = pc.fill_null(pc.not_equal(pc.local_timestamp(first), local), False)  # no instant shows that time
    local_gap = local.filter(gap)  # few rows
    after = pc.assume_timezone(local_gap, tz, ambiguous="earliest", nonexistent="latest")
    offset_after = pc.subtract(pc.local_timestamp(after).cast(pa.int64()), after.cast(pa.int64()))
    shifted = pc.subtract(local_gap.cast(pa.int64()), offset_after)
    return pc.replace_with_mask(first.cast(pa.int64()), gap, shifted)


# ---- fixed-width text ----------------------------------------------------------------------------------

_DATE_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9])
_TIME_DIGITS = np.array([0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18])


def _fixed_width_rows(arr: pa.Array, width: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.uint8]]:
    """(mask of the non-null rows exactly ``width`` bytes long, those rows' bytes as an (m, width) array)."""
    n = len(arr)
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if large else np.int32, count=n + 1,
                            offset=arr.offset * (8 if large else 4))
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    ok = np.diff(offsets) == width
    if arr.null_count:
        ok &= np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    if ok.all():
        start = int(offsets[0])
        return ok, data[start:start + n * width].reshape(n, width)
    starts = offsets[:-1][ok].astype(np.int64)
    return ok, data[starts[:, None] + np.arange(width)]


def _days_from_civil(y: npt.NDArray[np.int64], m: npt.NDArray[np.int64], d: npt.NDArray[np.int64]) -> I64:
    """Days since 1970-01-01 of proleptic Gregorian dates (year >= 1)."""
    y = y - (m <= 2)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * np.where(m > 2, m - 3, m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    result: I64 = era * 146097 + doe - 719468
    return result


def _month_tables() -> tuple[I64, npt.NDArray[np.int32]]:
    """Day number of the first day, and length, of every month of the years the fast path takes."""
    year = np.repeat(np.arange(_FIRST_YEAR, _FIRST_YEAR + _YEARS, dtype=np.int64), 12)
    month = np.tile(np.arange(1, 13, dtype=np.int64), _YEARS)
    start = _days_from_civil(year, month, np.ones_like(month))
    following = _days_from_civil(year + (month == 12), month % 12 + 1, np.ones_like(month))
    return start, (following - start).astype(np.int32)


_FIRST_YEAR, _YEARS = 1900, 400
_MONTH_START, _MONTH_LENGTH = _month_tables()


def _parse_fixed(rows: npt.NDArray[np.uint8], with_time: bool) -> tuple[npt.NDArray[np.bool_], I64]:
    """Rows ``YYYY-MM-DD`` (``with_time``: ``YYYY-MM-DD[ T]hh:mm:ss``) -> (well-formed mask, days or local
    seconds).  Only in-range fields count as well-formed (years 1900..2299, real calendar days, hh < 24,
    mm and ss < 60); every other row is left to the general parser."""
    d = rows - np.uint8(48)  # digits become 0..9, anything else wraps to a larger value
    digits = _TIME_DIGITS if with_time else _DATE_DIGITS
    good = (d[:, digits] <= 9).all(axis=1) & (rows[:, 4] == 45) & (rows[:, 7] == 45)
    if with_time:
        good &= ((rows[:, 10] == 32) | (rows[:, 10] == 84)) & (rows[:, 13] == 58) & (rows[:, 16] == 58)

    def num(i: int, k: int) -> npt.NDArray[np.int32]:
        v = d[:, i].astype(np.int32)
        for j in range(i + 1, i + k):
            v *= 10
            v += d[:, j]
        return v

    year, month, day = num(0, 4), num(5, 2), num(8, 2)
    year_month = (year - _FIRST_YEAR) * 12 + month - 1
    in_table = (year >= _FIRST_YEAR) & (year < _FIRST_YEAR + _YEARS) & (month >= 1) & (month <= 12)
    year_month[~in_table] = 0
    good &= in_table & (day >= 1) & (day <= _MONTH_LENGTH[year_month])
    days: I64 = _MONTH_START[year_month] + (day - 1)
    if not with_time:
        return good, days
    hour, minute, sec = num(11, 2), num(14, 2), num(17, 2)
    good &= (hour < 24) & (minute < 60) & (sec < 60)
    days *= 86400
    days += hour * 3600 + minute * 60 + sec
    return good, days


def _with_fixed_width(arr: pa.Array, width: int, fixed: Callable[[I64], I64],
                      general: Callable[[pa.Array], pa.Array]) -> pa.Array:
    """int64 values of a text column: ``fixed(rows, mask)`` for the rows of the fixed-width shape,
    ``general(sub_array)`` for the rest (its BadValue rows mapped back); nulls stay null."""
    if pa.types.is_dictionary(arr.type) or len(arr) == 0:
        return general(arr)
    if not arr.null_count and (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
        bufs = arr.buffers()  # the usual case, every row of the common shape: parsed in C, one pass
        got = _textints.dates(bufs[1], bufs[2] if bufs[2] is not None else b"", arr.offset, len(arr),
                              width == 19)
        if got is not None:
            return pa.array(fixed(np.frombuffer(got, dtype=np.int64)))
    ok, rows = _fixed_width_rows(arr, width)
    if ok.any():
        good, values = _parse_fixed(rows, width == 19)
        if good.all() and len(values) == len(arr):  # the usual case: every row has the common shape
            return pa.array(fixed(values))
        ok[ok] = good
        values = fixed(values[good])
    else:
        values = np.zeros(0, np.int64)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False)) if arr.null_count else None
    rest = np.flatnonzero(~ok if valid is None else valid & ~ok)
    if len(rest) == len(arr):
        return general(arr)
    out = np.zeros(len(arr), dtype=np.int64)
    out[ok] = values
    if len(rest):
        try:
            slow = general(arr.take(pa.array(rest)))
        except BadValue as e:
            raise BadValue(int(rest[e.row]), e.value, e.reason) from None
        out[rest] = np.asarray(slow.fill_null(0).to_numpy(zero_copy_only=False))
    return pa.array(out, mask=None if valid is None else ~valid)


def _localized(local: I64, tz: str) -> I64:
    if tz == "UTC" or len(local) == 0:
        return local
    result: I64 = np.asarray(localize(pa.array(local, pa.timestamp("s")), tz).to_numpy())
    return result


def _text_to_unix(dt: DataType, arr: pa.Array, tz: str) -> pa.Array:
    """DateTime text (``YYYY-MM-DD hh:mm:ss`` in ``tz``, ISO ``T``/offsets, a bare date, unix seconds)."""
    return _with_fixed_width(arr, 19, lambda local: _localized(local, tz),
                             lambda sub: _text_to_unix_general(dt, sub, tz))


def _text_to_unix_general(dt: DataType, arr: pa.Array, tz: str) -> pa.Array:
    text = checked(arr, strip_text, dt, "is not valid UTF-8 text")
    norm = pc.replace_substring_regex(text, r"^(\d{4}-\d{2}-\d{2})[T ]", r"\1 ")
    local = pc.coalesce(
        pc.strptime(norm, format="%Y-%m-%d %H:%M:%S", unit="s", error_is_null=True),
        pc.strptime(norm, format="%Y-%m-%d", unit="s", error_is_null=True),
    )
    local_utc = localize(local, tz)
    with_offset = pc.strptime(norm, format="%Y-%m-%d %H:%M:%S%z", unit="s", error_is_null=True)
    digits = pc.match_substring_regex(text, r"^[0-9]{1,10}$")
    unix = pc.if_else(digits, text, None).cast(pa.int64())
    out = pc.coalesce(local_utc.cast(pa.int64()), with_offset.cast(pa.int64()), unix)
    bad = first_true(pc.and_(arr.is_valid(), out.is_null()))
    if bad >= 0:
        raise dt.reject(arr, bad, "cannot be parsed")
    return out


def _to_unix_seconds(dt: DataType, arr: pa.Array, tz: str) -> pa.Array:
    """Any supported input -> int64 unix seconds (nulls propagate)."""
    t = arr.type
    if pa.types.is_timestamp(t):
        return arr.cast(pa.timestamp("s", t.tz), safe=False).cast(pa.int64())
    if pa.types.is_date(t):
        local = arr.cast(pa.date32()).cast(pa.timestamp("s"))
        return localize(local, tz)
    if pa.types.is_dictionary(t):
        return _to_unix_seconds(dt, arr.dictionary_decode(), tz)
    if is_stringlike(t):
        return _text_to_unix(dt, arr, tz)
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return convert_integers(dt, arr, pa.int64())
    raise dt.wrong_input(arr)


class DateType(FixedWidthType):
    name = "Date"
    arrow_type = pa.date32()
    np_dtype = np.dtype("<u2")
    field_type = FIELD_UINT64
    field_kind = "uint64"
    is_integer_like = True
    is_date = True

    def storage_numpy(self, arr: pa.Array) -> npt.NDArray[Any]:
        # date32 is int32 underneath: a view, not a compute call
        days = arr.view(pa.int32()) if arr.type == pa.date32() else arr.cast(pa.int32())
        return super().storage_numpy(days)

    def storage_from_numpy(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values.astype(np.int32), type=pa.int32()).view(pa.date32())

    @property
    def default_value(self) -> Any:
        return pa.scalar(0, pa.int32()).cast(pa.date32()).as_py()

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_UINT64]) + struct.pack("<Q", arr.slice(i, 1).cast(pa.int32())[0].as_py())

    def _text_to_days(self, plain: pa.Array) -> pa.Array:
        text = checked(plain, strip_text, self, "is not valid UTF-8 text")
        iso = pc.match_substring_regex(text, r"^\d{4}-\d{2}-\d{2}$")
        bad = first_true(pc.and_(plain.is_valid(), pc.invert(iso)))
        if bad >= 0:
            raise self.reject(plain, bad, "cannot be parsed as YYYY-MM-DD")
        days = checked(text, lambda a: a.cast(pa.date32()), self, "is not a valid date")
        return days.cast(pa.int32()).cast(pa.int64())

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        if pa.types.is_date(t):
            days = arr.cast(pa.date32()).cast(pa.int32())
        elif pa.types.is_timestamp(t) or is_stringlike(t) or pa.types.is_dictionary(t):
            if is_stringlike(t) or pa.types.is_dictionary(t):
                arr = arr.dictionary_decode() if pa.types.is_dictionary(t) else arr
                days = _with_fixed_width(arr, 10, lambda days: days, self._text_to_days)
            else:
                secs = _to_unix_seconds(self, arr, tz)
                local = pc.local_timestamp(secs.cast(pa.timestamp("s", tz))) if tz != "UTC" else secs.cast(
                    pa.timestamp("s"))
                days = local.cast(pa.date32()).cast(pa.int32())
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_null(t):
            days = convert_integers(self, arr, pa.int64())
        else:
            raise self.wrong_input(arr)
        _check_range(self, arr, days, _DATE_MAX)
        return days.cast(pa.int32()).cast(pa.date32())


class DateTimeType(FixedWidthType):
    arrow_type = pa.timestamp("s")
    np_dtype = np.dtype("<u4")
    field_type = FIELD_UINT64
    field_kind = "uint64"
    is_integer_like = True

    def __init__(self, tz: str | None = None) -> None:
        self.tz = tz
        self.name = "DateTime" if tz is None else f"DateTime('{tz}')"

    def storage_numpy(self, arr: pa.Array) -> npt.NDArray[Any]:
        # timestamp[s] is int64 underneath: a view, not a compute call
        secs = arr.view(pa.int64()) if arr.type == self.arrow_type else arr.cast(pa.int64())
        return super().storage_numpy(secs)

    def storage_from_numpy(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values.astype(np.int64), type=pa.int64()).view(self.arrow_type)

    @property
    def default_value(self) -> Any:
        return pa.scalar(0, pa.int64()).cast(self.arrow_type).as_py()

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_UINT64]) + struct.pack("<Q", arr.slice(i, 1).cast(pa.int64())[0].as_py())

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        secs = _to_unix_seconds(self, arr, self.tz or tz)
        _check_range(self, arr, secs, _DATETIME_MAX)
        return secs.cast(self.arrow_type)

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        return a.cast(pa.int64()).cast(pa.timestamp("s", self.tz or tz))
