"""Type facts the expression evaluator needs: a classification of each ClickHouse type (from its
canonical name), ClickHouse 18.16's result-type rules for arithmetic (DataTypes/NumberTraits.h), and
the values -> storage Arrow glue (numpy arrays with a validity mask)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.datatypes import DataType, parse_type
from replicad.sql.expressions_lexer import unquote

NDArray = npt.NDArray[Any]


@dataclass(frozen=True)
class TypeInfo:
    """What kind of values a type holds.  ``kind``: int, float, date, datetime, string, fixedstring,
    uuid, enum, decimal, nothing (the NULL literal), or other (arrays, tuples...)."""

    kind: str
    name: str  # canonical name of the non-Nullable type
    nullable: bool = False
    bits: int = 0  # int / float / enum width; date 16, datetime 32
    signed: bool = False
    tz: str | None = None
    size: int = 0  # FixedString(N)
    precision: int = 0
    scale: int = 0
    enum_values: tuple[tuple[str, int], ...] = field(default=())

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    @property
    def np_dtype(self) -> np.dtype[Any]:
        if self.kind == "float":
            return np.dtype(f"f{self.bits // 8}")
        if self.kind == "date":
            return np.dtype("u2")
        if self.kind == "datetime":
            return np.dtype("u4")
        return np.dtype(f"{'i' if self.signed else 'u'}{max(self.bits, 8) // 8}")


_ENUM_ITEM = re.compile(r"\s*('(?:[^'\\]|\\.|'')*')\s*=\s*(-?\d+)\s*,?")


def _enum_values(body: str) -> tuple[tuple[str, int], ...]:
    items = []
    pos = 0
    while pos < len(body):
        m = _ENUM_ITEM.match(body, pos)
        if not m:
            break
        items.append((unquote(m.group(1)), int(m.group(2))))
        pos = m.end()
    return tuple(items)


@lru_cache(maxsize=512)
def info_of_name(name: str) -> TypeInfo:
    nullable = False
    if name.startswith("Nullable(") and name.endswith(")"):
        nullable = True
        name = name[len("Nullable(") : -1]
    if name.startswith("LowCardinality(") and name.endswith(")"):
        inner = info_of_name(name[len("LowCardinality(") : -1])
        return TypeInfo(inner.kind, inner.name, nullable or inner.nullable, inner.bits, inner.signed,
                        inner.tz, inner.size, inner.precision, inner.scale, inner.enum_values)
    m = re.fullmatch(r"(U?)Int(8|16|32|64)", name)
    if m:
        return TypeInfo("int", name, nullable, int(m.group(2)), signed=not m.group(1))
    if name in ("Float32", "Float64"):
        return TypeInfo("float", name, nullable, int(name[5:]), signed=True)
    if name == "Date":
        return TypeInfo("date", name, nullable, 16)
    m = re.fullmatch(r"DateTime(?:\('(.*)'\))?", name)
    if m:
        return TypeInfo("datetime", name, nullable, 32, tz=m.group(1))
    if name == "String":
        return TypeInfo("string", name, nullable)
    m = re.fullmatch(r"FixedString\((\d+)\)", name)
    if m:
        return TypeInfo("fixedstring", name, nullable, size=int(m.group(1)))
    if name == "UUID":
        return TypeInfo("uuid", name, nullable)
    m = re.fullmatch(r"Enum(8|16)\((.*)\)", name, re.S)
    if m:
        return TypeInfo("enum", name, nullable, int(m.group(1)), signed=True,
                        enum_values=_enum_values(m.group(2)))
    m = re.fullmatch(r"Decimal(?:32|64|128)?\((\d+),\s*(\d+)\)", name)
    if m:
        return TypeInfo("decimal", name, nullable, precision=int(m.group(1)), scale=int(m.group(2)))
    if name == "Nothing":
        return TypeInfo("nothing", name, True)
    return TypeInfo("other", name, nullable)


def info(dt: DataType) -> TypeInfo:
    return info_of_name(dt.name)


@lru_cache(maxsize=512)
def dtype(name: str) -> DataType:
    return parse_type(name)


def with_nullable(dt: DataType, nullable: bool) -> DataType:
    """``Nullable(dt)`` when ``nullable`` (and dt is not already), else dt."""
    if not nullable or dt.name.startswith("Nullable("):
        return dt
    return dtype(f"Nullable({dt.name})")


# ---- NumberTraits (ClickHouse 18.16) ---------------------------------------------------------------


def construct(signed: bool, floating: bool, size: int) -> str:
    """NumberTraits::Construct: the type name for (signed, floating, size in bytes)."""
    if floating:
        return "Float64" if size >= 8 else "Float32"
    return f"{'Int' if signed else 'UInt'}{size * 8}"


def _next_size(size: int) -> int:
    return min(size * 2, 8)


def _parts(t: TypeInfo) -> tuple[bool, bool, int]:
    """(signed, floating, size) of a numeric-ish type; Date counts as UInt16, DateTime as UInt32."""
    if t.kind == "float":
        return True, True, t.bits // 8
    if t.kind in ("date", "datetime"):
        return False, False, t.bits // 8
    return t.signed, False, t.bits // 8


def arithmetic_result(op: str, a: TypeInfo, b: TypeInfo) -> str:
    """Result type name of ``op`` (plus, minus, multiply, divide, intDiv, modulo) on two numbers."""
    sa, fa, za = _parts(a)
    sb, fb, zb = _parts(b)
    if op in ("plus", "multiply"):
        return construct(sa or sb, fa or fb, _next_size(max(za, zb)))
    if op == "minus":
        return construct(True, fa or fb, _next_size(max(za, zb)))
    if op == "divide":
        return "Float64"
    if op == "intDiv":
        return construct(sa or sb, False, za)
    if op == "modulo":
        return construct(sa or sb, False, zb)
    raise ValueError(op)


def negate_result(a: TypeInfo) -> str:
    s, f, z = _parts(a)
    return construct(True, f, z if s else _next_size(z))


def if_result(a: TypeInfo, b: TypeInfo) -> str | None:
    """NumberTraits::ResultOfIf for two numbers; None when ClickHouse has no common type."""
    sa, fa, za = _parts(a)
    sb, fb, zb = _parts(b)
    has_float = fa or fb
    has_int = not fa or not fb
    has_signed, has_unsigned = sa or sb, not sa or not sb
    max_unsigned = max(0 if sa else za, 0 if sb else zb)
    max_signed = max(za if sa else 0, zb if sb else 0)
    max_int = max(0 if fa else za, 0 if fb else zb)
    max_float = max(za if fa else 0, zb if fb else 0)
    size = max(za, zb)
    if (has_float and has_int and max_int >= max_float) or (
        has_signed and has_unsigned and max_unsigned >= max_signed
    ):
        size *= 2
    if size > 8:
        return None
    return construct(has_signed, has_float, size)


def literal_int_type(v: int) -> str:
    """FieldToDataType: the smallest type holding an integer literal (UInt8 for 5, Int16 for -200)."""
    if v >= 0:
        for bits in (8, 16, 32, 64):
            if v < 1 << bits:
                return f"UInt{bits}"
    for bits in (8, 16, 32, 64):
        if v >= -(1 << (bits - 1)):
            return f"Int{bits}"
    raise ValueError(v)


# ---- numpy <-> storage Arrow -------------------------------------------------------------------------


def to_numpy(arr: pa.Array, t: TypeInfo) -> tuple[NDArray, NDArray | None]:
    """Values (nulls -> 0) in the type's numpy dtype, and the validity mask (None if no nulls)."""
    valid: NDArray | None = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        arr = arr.fill_null(pa.scalar(0, arr.type)) if not pa.types.is_date32(arr.type) else arr.cast(
            pa.int32()).fill_null(0)
    # date32 -> int32 and timestamp -> int64 are the same buffers: viewed, as the casts did (a view needs no
    # compute kernel: a zero-row evaluation, the key checks of CREATE TABLE, leaves pyarrow.compute unloaded)
    if pa.types.is_date32(arr.type):
        values = np.asarray(arr.view(pa.int32()).to_numpy(zero_copy_only=False))
    elif pa.types.is_timestamp(arr.type):
        values = np.asarray(arr.view(pa.int64()).to_numpy(zero_copy_only=False))
    else:
        values = np.asarray(arr.to_numpy(zero_copy_only=False))
    return values, valid


def from_numpy(values: NDArray, dt: DataType, valid: NDArray | None = None) -> pa.Array:
    """Numeric numpy values -> storage Arrow of ``dt`` (ints wrap like C++ casts)."""
    t = info(dt)
    mask = None if valid is None else ~valid
    if t.kind == "date":  # Date is UInt16 in ClickHouse: results wrap (toMonday('1970-01-02') = 65533)
        days = np.mod(values.astype(np.int64), 1 << 16).astype(np.int32)
        return pa.array(days, type=pa.int32(), mask=mask).view(pa.date32())
    if t.kind == "datetime":  # DateTime is UInt32
        secs = np.mod(values.astype(np.int64), 1 << 32)
        return pa.array(secs, type=pa.int64(), mask=mask).view(pa.timestamp("s"))
    target = t.np_dtype
    if t.kind in ("int", "enum") and values.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            values = np.where(np.isfinite(values), values, 0).astype(np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(target)
    return pa.array(cast, type=pa.from_numpy_dtype(target), mask=mask)


def and_valid(*masks: NDArray | None) -> NDArray | None:
    out: NDArray | None = None
    for m in masks:
        if m is not None:
            out = m if out is None else out & m
    return out
