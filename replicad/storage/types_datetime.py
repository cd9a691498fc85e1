"""Date (UInt16 days since 1970-01-01) and DateTime / DateTime('tz') (UInt32 unix seconds)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.storage.types_base import (
    FIELD_UINT64,
    DataType,
    checked,
    first_true,
    is_stringlike,
)
from replicad.storage.types_numeric import FixedWidthType, convert_integers, strip_text

_DATE_MAX = 0xFFFF
_DATETIME_MAX = 0xFFFFFFFF


def _check_range(dt: DataType, orig: pa.Array, values: pa.Array, hi: int) -> None:
    """Reject the first of ``values`` (int64 or temporal) outside ``0..hi``."""
    ints = values.cast(pa.int64()) if not pa.types.is_int64(values.type) else values
    bad = first_true(pc.or_(pc.less(ints, 0), pc.greater(ints, hi)))
    if bad >= 0:
        raise dt.reject(orig, bad, "is out of range")


def localize(local: pa.Array, tz: str) -> pa.Array:
    """Naive local ``timestamp('s')`` wall-clock times in ``tz`` -> int64 unix seconds, as ClickHouse does:
    an ambiguous time (clocks going back) takes its first occurrence; a time inside a gap (clocks going
    forward) is read with the UTC offset in force after the gap (02:30 in a 02:00->03:00 gap = 03:30)."""
    if tz == "UTC":
        return local.cast(pa.int64())
    first = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="earliest")
    after = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="latest")
    in_gap = pc.not_equal(first, after)
    if not pc.any(in_gap).as_py():
        return first.cast(pa.int64())
    offset_after = pc.subtract(pc.local_timestamp(after).cast(pa.int64()), after.cast(pa.int64()))
    shifted = pc.subtract(local.cast(pa.int64()), offset_after)
    return pc.if_else(in_gap, shifted, first.cast(pa.int64()))


def _text_to_unix(dt: DataType, arr: pa.Array, tz: str) -> pa.Array:
    """DateTime text (``YYYY-MM-DD hh:mm:ss`` in ``tz``, ISO ``T``/offsets, a bare date, unix seconds)."""
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
        return super().storage_numpy(arr.cast(pa.int32()))

    def storage_from_numpy(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values.astype(np.int32), type=pa.int32()).cast(pa.date32())

    @property
    def default_value(self) -> Any:
        return pa.scalar(0, pa.int32()).cast(pa.date32()).as_py()

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_UINT64]) + struct.pack("<Q", arr.slice(i, 1).cast(pa.int32())[0].as_py())

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        if pa.types.is_date(t):
            days = arr.cast(pa.date32()).cast(pa.int32())
        elif pa.types.is_timestamp(t) or is_stringlike(t) or pa.types.is_dictionary(t):
            if is_stringlike(t) or pa.types.is_dictionary(t):
                plain = arr.dictionary_decode() if pa.types.is_dictionary(t) else arr
                text = checked(plain, strip_text, self, "is not valid UTF-8 text")
                iso = pc.match_substring_regex(text, r"^\d{4}-\d{2}-\d{2}$")
                bad = first_true(pc.and_(plain.is_valid(), pc.invert(iso)))
                if bad >= 0:
                    raise self.reject(plain, bad, "cannot be parsed as YYYY-MM-DD")
                days = checked(text, lambda a: a.cast(pa.date32()), self, "is not a valid date")
                days = days.cast(pa.int32())
                arr = plain
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
        return super().storage_numpy(arr.cast(pa.int64()))

    def storage_from_numpy(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values.astype(np.int64), type=pa.int64()).cast(self.arrow_type)

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
