"""Date and time functions for the expression evaluator (vectorised with numpy civil-date arithmetic).

Date values are day numbers since 1970-01-01, DateTime values unix seconds.  Functions on DateTime work
on the local time of the column's time zone (``DateTime('tz')``), else of an explicit time-zone argument,
else of the evaluation time zone — like ClickHouse's DateLUT.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.sql.expressions_ast import Function
from replicad.sql.expressions_core import Context, Val, make_val, register, type_error
from replicad.sql.expressions_types import NDArray, dtype

# ---- civil calendar (proleptic Gregorian), vectorised ------------------------------------------------


#: below this many values the arithmetic is cheaper than building a table
_CIVIL_TABLE_MIN_VALUES = 64


def civil_from_days(days: NDArray) -> tuple[NDArray, NDArray, NDArray]:
    """Day numbers -> (year, month 1..12, day 1..31), int64 arrays.

    A block's dates usually span few days (a partition key's month, a day's inserts): when the min..max
    range is at most half the values, the calendar is computed once per day of that range and indexed.
    """
    if days.ndim == 1 and days.size and days.dtype.kind in "iu":
        lo, hi = int(days.min()), int(days.max())
        if lo >= 0 and hi < _CIVIL_LUT_DAYS:  # Date's whole range, DateTime's too: three lookups
            idx = days.astype(np.intp, copy=False)
            y, m, d = (np.take(t, idx).astype(np.int64) for t in _civil_lut())
            return y, m, d
        if days.size >= _CIVIL_TABLE_MIN_VALUES and hi - lo + 1 <= days.size // 2:
            table = _civil_from_days(np.arange(lo, hi + 1, dtype=np.int64))
            idx = np.subtract(days, lo, dtype=np.intp, casting="unsafe")
            y, m, d = (np.take(t, idx) for t in table)
            return y, m, d
    return _civil_from_days(days)


#: day numbers 0.. this - 1 (1970-01-01 .. 2149-06-06: every Date, and every DateTime's day) have their
#: (year, month, day) in a table made once (256 KiB): a small block's dates cost three lookups, not the
#: twenty-odd numpy calls of the arithmetic (most of a 100-row insert's partition key)
_CIVIL_LUT_DAYS = 1 << 16


@functools.cache
def _civil_lut() -> tuple[NDArray, NDArray, NDArray]:
    y, m, d = _civil_from_days(np.arange(_CIVIL_LUT_DAYS, dtype=np.int64))
    return y.astype(np.int16), m.astype(np.int8), d.astype(np.int8)


def _civil_from_days(days: NDArray) -> tuple[NDArray, NDArray, NDArray]:
    z = days.astype(np.int64) + 719468
    era = np.floor_divide(z, 146097)
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = np.where(mp < 10, mp + 3, mp - 9)
    y = yoe + era * 400 + (m <= 2)
    return y, m, d


def days_from_civil(y: NDArray, m: NDArray, d: NDArray) -> NDArray:
    y = y.astype(np.int64) - (m <= 2)
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    mp = np.where(m > 2, m - 3, m + 9)
    doy = (153 * mp + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return np.asarray(era * 146097 + doe - 719468, dtype=np.int64)


_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def days_in_month(y: NDArray, m: NDArray) -> NDArray:
    leap = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    return np.asarray(_MONTH_DAYS[m - 1] + ((m == 2) & leap), dtype=np.int64)


def add_months(days: NDArray, months: NDArray) -> NDArray:
    """Calendar month arithmetic with the day clamped to the target month (Jan 31 + 1 month = Feb 28)."""
    y, m, d = civil_from_days(days)
    total = y * 12 + (m - 1) + months.astype(np.int64)
    ny, nm = np.floor_divide(total, 12), np.mod(total, 12) + 1
    return days_from_civil(ny, nm, np.minimum(d, days_in_month(ny, nm)))


# ---- local time ----------------------------------------------------------------------------------------


def to_local_seconds(secs: NDArray, tz: str) -> NDArray:
    if tz == "UTC" or len(secs) == 0:
        return secs.astype(np.int64)
    ts = pa.array(secs.astype(np.int64), pa.int64()).cast(pa.timestamp("s", tz))
    return np.asarray(pc.local_timestamp(ts).cast(pa.int64()).to_numpy(zero_copy_only=False))


def from_local_seconds(local: NDArray, tz: str) -> NDArray:
    if tz == "UTC" or len(local) == 0:
        return local.astype(np.int64)
    naive = pa.array(local.astype(np.int64), pa.int64()).cast(pa.timestamp("s"))
    utc = pc.assume_timezone(naive, tz, ambiguous="earliest", nonexistent="earliest")
    return np.asarray(utc.cast(pa.int64()).to_numpy(zero_copy_only=False))


def tz_argument(ctx: Context, node: Function, first: Val, n_args: int) -> str:
    """Time zone of a date function call: explicit 'tz' argument, the column's, or the context's."""
    if len(node.args) > n_args:
        tz_val = ctx.evaluate(node.args[n_args])
        if tz_val.const is None or tz_val.const.kind != "string" or not isinstance(tz_val.const.value, str):
            raise type_error(f"The time zone argument of {node.name} must be a constant string")
        return tz_val.const.value
    return ctx.tz_of(first)


def local_days_and_seconds(v: Val, tz: str) -> tuple[NDArray, NDArray, NDArray | None]:
    """(local day number, seconds since local midnight, validity) of a Date or DateTime value."""
    values, valid = v.numpy()
    kind = v.info.kind
    if kind == "date":
        days = values.astype(np.int64)
        return days, np.zeros_like(days), valid
    if kind == "datetime":
        local = to_local_seconds(values.astype(np.int64), tz)
        days = np.floor_divide(local, 86400)
        return days, local - days * 86400, valid
    raise type_error(f"Illegal type {v.dtype.name}: Date or DateTime expected")


def _date_arg(ctx: Context, node: Function) -> tuple[Val, str]:
    if not 1 <= len(node.args) <= 2:
        raise type_error(f"Function {node.name} takes 1 or 2 arguments")
    v = ctx.evaluate(node.args[0])
    if v.info.kind == "string" and v.const is not None:
        v = Val(dtype("DateTime").to_storage(pa.array([v.const.value] * ctx.n, pa.string()), "argument",
                                             ctx.tz), dtype("DateTime"))
    return v, tz_argument(ctx, node, v, 1)


def _date_part(name: str, type_name: str, fn: Callable[[NDArray, NDArray], NDArray]) -> None:
    def impl(ctx: Context, node: Function) -> Val:
        v, tz = _date_arg(ctx, node)
        days, secs, valid = local_days_and_seconds(v, tz)
        return make_val(fn(days, secs), type_name, valid, v.info.nullable)

    register(name)(impl)


def _ymd(days: NDArray) -> tuple[NDArray, NDArray, NDArray]:
    return civil_from_days(days)


def _yyyymm(days: NDArray, _secs: NDArray) -> NDArray:
    y, m, _d = civil_from_days(days)
    return np.asarray(y * 100 + m)


_date_part("toYYYYMM", "UInt32", _yyyymm)


def _yyyymmdd(days: NDArray, _secs: NDArray) -> NDArray:
    y, m, d = civil_from_days(days)
    return np.asarray(y * 10000 + m * 100 + d)


_date_part("toYYYYMMDD", "UInt32", _yyyymmdd)
_date_part("toYear", "UInt16", lambda d, s: _ymd(d)[0])
_date_part("toQuarter", "UInt8", lambda d, s: (_ymd(d)[1] - 1) // 3 + 1)
_date_part("toMonth", "UInt8", lambda d, s: _ymd(d)[1])
_date_part("toDayOfMonth", "UInt8", lambda d, s: _ymd(d)[2])
_date_part("toDayOfWeek", "UInt8", lambda d, s: np.mod(d + 3, 7) + 1)


def _start_of_year(days: NDArray, _secs: NDArray) -> NDArray:
    return days_from_civil(civil_from_days(days)[0], np.ones_like(days), np.ones_like(days))


_date_part("toDayOfYear", "UInt16", lambda d, s: d - _start_of_year(d, s) + 1)
_date_part("toHour", "UInt8", lambda d, s: s // 3600)
_date_part("toMinute", "UInt8", lambda d, s: (s // 60) % 60)
_date_part("toSecond", "UInt8", lambda d, s: s % 60)
_date_part("toMonday", "Date", lambda d, s: d - np.mod(d + 3, 7))


def _start_of_month(days: NDArray, _secs: NDArray) -> NDArray:
    y, m, _d = civil_from_days(days)
    return days_from_civil(y, m, np.ones_like(days))


def _start_of_quarter(days: NDArray, _secs: NDArray) -> NDArray:
    y, m, _d = civil_from_days(days)
    return days_from_civil(y, ((m - 1) // 3) * 3 + 1, np.ones_like(days))


_date_part("toStartOfMonth", "Date", _start_of_month)
_date_part("toStartOfQuarter", "Date", _start_of_quarter)
_date_part("toStartOfYear", "Date", _start_of_year)
_date_part("toRelativeDayNum", "UInt32", lambda d, s: d)


def _start_of(name: str, unit: int) -> None:
    def impl(ctx: Context, node: Function) -> Val:
        v, tz = _date_arg(ctx, node)
        if v.info.kind != "datetime":
            raise type_error(f"Illegal type {v.dtype.name} of argument of function {name}: DateTime expected")
        values, valid = v.numpy()
        local = to_local_seconds(values.astype(np.int64), tz)
        floored = np.floor_divide(local, unit) * unit
        return make_val(from_local_seconds(floored, tz), v.info.name, valid, v.info.nullable)

    register(name)(impl)


_start_of("toStartOfDay", 86400)
_start_of("toStartOfHour", 3600)
_start_of("toStartOfMinute", 60)
_start_of("toStartOfFiveMinute", 300)


@register("toUnixTimestamp")
def _unix_timestamp(ctx: Context, node: Function) -> Val:
    v, _tz = _date_arg(ctx, node)
    if v.info.kind != "datetime":
        raise type_error("toUnixTimestamp needs a DateTime")
    values, valid = v.numpy()
    return make_val(values, "UInt32", valid, v.info.nullable)


@register("now")
def _now(ctx: Context, node: Function) -> Val:
    ctx.args(node, 0)
    return make_val(np.full(ctx.n, int(time.time()), dtype=np.int64), "DateTime", None)


@register("today")
def _today(ctx: Context, node: Function) -> Val:
    ctx.args(node, 0)
    local = to_local_seconds(np.array([int(time.time())], dtype=np.int64), ctx.tz)
    return make_val(np.full(ctx.n, local[0] // 86400, dtype=np.int64), "Date", None)


def to_datetime_val(ctx: Context, v: Val, tz: str, type_name: str = "DateTime") -> Val:
    """Conversion of a Date (local midnight in ``tz``), number (unix seconds) or text to DateTime."""
    kind = v.info.kind
    if kind == "date":
        days, valid = v.numpy()
        secs = from_local_seconds(days.astype(np.int64) * 86400, tz)
        return make_val(secs, type_name, valid, v.info.nullable)
    if kind in ("datetime", "int", "float"):
        values, valid = v.numpy()
        return make_val(np.trunc(values).astype(np.int64) if kind == "float" else values, type_name, valid,
                        v.info.nullable)
    if kind in ("string", "fixedstring"):
        arr = v.arr.cast(pa.binary()) if kind == "fixedstring" else v.arr
        return Val(dtype(type_name).to_storage(arr, "argument of toDateTime", tz), dtype(type_name))
    raise type_error(f"Illegal type {v.dtype.name} of argument of function toDateTime")


def to_date_val(ctx: Context, v: Val, tz: str) -> Val:
    """Conversion of a DateTime (its local date in ``tz``), day number or text to Date."""
    kind = v.info.kind
    if kind in ("int", "float"):
        values, valid = v.numpy()
        return make_val(np.trunc(values).astype(np.int64), "Date", valid, v.info.nullable)
    if kind in ("string", "fixedstring"):
        arr = v.arr.cast(pa.binary()) if kind == "fixedstring" else v.arr
        return Val(dtype("Date").to_storage(arr, "argument of toDate", tz), dtype("Date"))
    days, _secs, valid = local_days_and_seconds(v, tz)
    return make_val(days, "Date", valid, v.info.nullable)


@register("toDateTime")
def _to_datetime(ctx: Context, node: Function) -> Val:
    if not 1 <= len(node.args) <= 2:
        raise type_error("toDateTime takes 1 or 2 arguments")
    v = ctx.evaluate(node.args[0])
    tz = tz_argument(ctx, node, v, 1)
    return to_datetime_val(ctx, v, tz, "DateTime" if len(node.args) == 1 else f"DateTime('{tz}')")


@register("toDate")
def _to_date(ctx: Context, node: Function) -> Val:
    if not 1 <= len(node.args) <= 2:
        raise type_error("toDate takes 1 or 2 arguments")
    v = ctx.evaluate(node.args[0])
    return to_date_val(ctx, v, tz_argument(ctx, node, v, 1))


# ---- interval arithmetic (used by plus/minus) ----------------------------------------------------------

INTERVAL_SECONDS = {"toIntervalSecond": 1, "toIntervalMinute": 60, "toIntervalHour": 3600,
                    "toIntervalDay": 86400, "toIntervalWeek": 7 * 86400}
INTERVAL_MONTHS = {"toIntervalMonth": 1, "toIntervalYear": 12}


def add_interval(ctx: Context, v: Val, interval: Function, sign: int) -> Val:
    """``v + INTERVAL n UNIT`` (sign=-1 for minus) for Date and DateTime values."""
    (amount,) = ctx.args(interval, 1)
    if amount.info.kind != "int":
        raise type_error(f"{interval.name} needs an integer")
    n, valid_n = amount.numpy()
    n = n.astype(np.int64) * sign
    values, valid = v.numpy()
    valid = valid if valid_n is None else (valid_n if valid is None else valid & valid_n)
    kind = v.info.kind
    if interval.name in INTERVAL_MONTHS:
        months = n * INTERVAL_MONTHS[interval.name]
        if kind == "date":
            return make_val(add_months(values, months), v.info.name, valid, v.info.nullable)
        tz = ctx.tz_of(v)
        local = to_local_seconds(values.astype(np.int64), tz)
        days = np.floor_divide(local, 86400)
        moved = add_months(days, months) * 86400 + (local - days * 86400)
        return make_val(from_local_seconds(moved, tz), v.info.name, valid, v.info.nullable)
    unit = INTERVAL_SECONDS[interval.name]
    if kind == "date":
        if unit % 86400:
            raise type_error(f"Cannot add {interval.name} to a Date")
        return make_val(values.astype(np.int64) + n * (unit // 86400), "Date", valid, v.info.nullable)
    if unit >= 86400:  # calendar days keep the local wall time across DST changes
        tz = ctx.tz_of(v)
        local = to_local_seconds(values.astype(np.int64), tz) + n * unit
        return make_val(from_local_seconds(local, tz), v.info.name, valid, v.info.nullable)
    return make_val(values.astype(np.int64) + n * unit, v.info.name, valid, v.info.nullable)
