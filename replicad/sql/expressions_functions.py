"""Arithmetic, conversion, string and hash functions for the expression evaluator.

Arithmetic follows ClickHouse 18.16: result types from NumberTraits (see expressions_types), integer
operations computed with C++ semantics (wrap-around, division truncating towards zero, remainder with the
sign of the dividend, operands converted by C++'s usual arithmetic conversions) and ``Division by zero``
errors for intDiv / modulo.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError
from replicad.sql import expressions_dates as dates
from replicad.sql.expressions_ast import Function, Literal
from replicad.sql.expressions_core import (
    Context,
    Val,
    any_nullable,
    arrow_val,
    bool_val,
    make_val,
    register,
    type_error,
    validity,
)
from replicad.sql.expressions_types import (
    NDArray,
    TypeInfo,
    and_valid,
    arithmetic_result,
    dtype,
    info_of_name,
    negate_result,
    with_nullable,
)

ILLEGAL_DIVISION = 153
NUMBER_KINDS = ("int", "float")

# ---- arithmetic ---------------------------------------------------------------------------------------


def _cpp_common(ta: TypeInfo, tb: TypeInfo) -> np.dtype[np.generic]:
    """C++ usual arithmetic conversions of two integer operands (int is 32 bits, long 64)."""

    def promoted(t: TypeInfo) -> tuple[bool, int]:
        signed = t.kind in ("int", "enum") and t.signed
        return (True, 32) if t.bits < 32 else (signed, t.bits)

    (s1, b1), (s2, b2) = promoted(ta), promoted(tb)
    if s1 == s2:
        signed, bits = s1, max(b1, b2)
    else:
        bu, bs = (b1, b2) if not s1 else (b2, b1)
        signed, bits = (False, bu) if bu >= bs else (True, bs)
    return np.dtype(f"{'i' if signed else 'u'}{bits // 8}")


def _trunc_div(a: NDArray, b: NDArray) -> NDArray:
    if a.dtype.kind == "u":
        return np.asarray(a // b)
    q = a // b
    fix = ((a % b) != 0) & ((a < 0) != (b < 0))
    return np.asarray(q + fix.astype(q.dtype))


def _check_divisor(b: NDArray, valid: NDArray | None) -> None:
    zero = b == 0
    if valid is not None:
        zero &= valid
    if zero.any():
        raise BadInputError("Division by zero", code=ILLEGAL_DIVISION)


def _as_integer(v: NDArray, t: TypeInfo) -> tuple[NDArray, TypeInfo]:
    """NumberTraits::ToInteger: floats become Int64 (truncated) before % and intDiv-like operations."""
    if t.kind != "float":
        return v, t
    with np.errstate(invalid="ignore"):
        return np.trunc(v).astype(np.int64), TypeInfo("int", "Int64", bits=64, signed=True)


def binary_arithmetic(op: str, a: Val, b: Val) -> Val:
    ta, tb = a.info, b.info
    ok = ("int", "float", "date", "datetime")
    if ta.kind not in ok or tb.kind not in ok:
        raise type_error(f"Illegal types {a.dtype.name} and {b.dtype.name} of arguments of function {op}")
    result = arithmetic_result(op, ta, tb)
    av, va = a.numpy()
    bv, vb = b.numpy()
    valid = and_valid(va, vb)
    rt = np.dtype(info_of_name(result).np_dtype)
    with np.errstate(all="ignore"):
        if op == "divide":
            out = av.astype(np.float64) / bv.astype(np.float64)
        elif op in ("plus", "minus", "multiply"):
            x, y = av.astype(rt), bv.astype(rt)
            out = x + y if op == "plus" else x - y if op == "minus" else x * y
        elif op == "intDiv" and (ta.kind == "float" or tb.kind == "float"):
            bf = bv.astype(np.float64)
            _check_divisor(bf, vb)
            out = np.trunc(av.astype(np.float64) / np.where(bf == 0, 1, bf))
        else:
            if op == "modulo":
                av, ta = _as_integer(av, ta)
                bv, tb = _as_integer(bv, tb)
            common = _cpp_common(ta, tb)
            x, y = av.astype(common), bv.astype(common)
            _check_divisor(y, vb)
            y = np.where(y == 0, 1, y).astype(common)
            if common.kind == "i" and ((x == np.iinfo(common.name).min) & (y == -1)).any():
                raise BadInputError("Division of minimal signed number by minus one", code=ILLEGAL_DIVISION)
            out = _trunc_div(x, y) if op == "intDiv" else np.fmod(x, y)
    return make_val(out, result, valid, any_nullable(a, b))


def _date_arithmetic(ctx: Context, op: str, node: Function) -> Val | None:
    """Date/DateTime + - integer or INTERVAL; Date - Date.  None if no Date/DateTime is involved."""
    left_node, right_node = node.args
    for interval_side, other_side in ((right_node, left_node), (left_node, right_node)):
        if isinstance(interval_side, Function) and interval_side.name in (
            *dates.INTERVAL_SECONDS, *dates.INTERVAL_MONTHS
        ):
            if op == "minus" and interval_side is left_node:
                raise type_error("Cannot subtract a date from an interval")
            sign = -1 if op == "minus" else 1
            return dates.add_interval(ctx, ctx.evaluate(other_side), interval_side, sign)
    a, b = ctx.evaluate(left_node), ctx.evaluate(right_node)
    ka, kb = a.info.kind, b.info.kind
    if ka not in ("date", "datetime") and kb not in ("date", "datetime"):
        return binary_arithmetic(op, a, b)
    av, va = a.numpy()
    bv, vb = b.numpy()
    valid = and_valid(va, vb)
    nullable = any_nullable(a, b)
    if op == "minus" and ka == kb:
        return make_val(av.astype(np.int64) - bv.astype(np.int64), "Int32", valid, nullable)
    if op == "plus" and kb in ("date", "datetime") and ka == "int":
        a, b, av, bv, ka, kb = b, a, bv, av, kb, ka
    if ka in ("date", "datetime") and kb == "int":
        sign = -1 if op == "minus" else 1
        return make_val(av.astype(np.int64) + sign * bv.astype(np.int64), a.info.name, valid, nullable)
    raise type_error(f"Illegal types {a.dtype.name} and {b.dtype.name} of arguments of function {op}")


def _arith_impl(op: str) -> Callable[[Context, Function], Val]:
    def impl(ctx: Context, node: Function) -> Val:
        if len(node.args) != 2:
            raise type_error(f"Function {node.name} takes 2 arguments")
        if op in ("plus", "minus"):
            v = _date_arithmetic(ctx, op, node)
            assert v is not None
            return v
        a, b = ctx.args(node, 2)
        return binary_arithmetic(op, a, b)

    return impl


for _op in ("plus", "minus", "multiply", "divide", "intDiv", "modulo"):
    register(_op)(_arith_impl(_op))


@register("negate")
def _negate(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    if a.info.kind not in NUMBER_KINDS:
        raise type_error(f"Illegal type {a.dtype.name} of argument of function negate")
    result = negate_result(a.info)
    values, valid = a.numpy()
    with np.errstate(all="ignore"):
        out = -values.astype(info_of_name(result).np_dtype)
    return make_val(out, result, valid, a.info.nullable)


@register("abs")
def _abs(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    t = a.info
    if t.kind not in NUMBER_KINDS:
        raise type_error(f"Illegal type {a.dtype.name} of argument of function abs")
    result = t.name if t.kind == "float" else f"UInt{t.bits}"
    values, valid = a.numpy()
    with np.errstate(all="ignore"):
        return make_val(np.abs(values), result, valid, t.nullable)


# ---- conversions --------------------------------------------------------------------------------------


def convert(ctx: Context, v: Val, target: str) -> Val:
    """``CAST(v AS target)`` / ``toT(v)`` for the supported targets."""
    t = info_of_name(target)
    nullable = v.info.nullable or target.startswith("Nullable(")
    kind = v.info.kind
    if t.kind in NUMBER_KINDS:
        if kind in ("int", "float", "date", "datetime", "enum"):
            values, valid = v.numpy()
            if t.kind == "int" and values.dtype.kind == "f":
                with np.errstate(invalid="ignore"):
                    values = np.trunc(values).astype(np.int64 if t.signed else np.uint64)
            return make_val(values, t.name, valid, nullable)
        if kind in ("string", "fixedstring", "nothing"):
            base = dtype(t.name)
            arr = v.arr.cast(pa.binary()) if kind == "fixedstring" else v.arr
            stored = base.to_storage(arr, "argument of conversion", ctx.tz) if kind != "nothing" else (
                pa.nulls(len(v.arr), base.arrow_type))
            return Val(stored, with_nullable(base, nullable or kind == "nothing"))
    elif t.kind == "string":
        return to_string(ctx, v)
    elif t.kind == "date":
        return dates.to_date_val(ctx, v, ctx.tz_of(v))
    elif t.kind == "datetime":
        return dates.to_datetime_val(ctx, v, t.tz or ctx.tz_of(v), t.name)
    base = dtype(t.name)
    result = with_nullable(base, nullable)
    # into Nullable(T) the NULL rows stay NULL (CAST(NULL, 'Nullable(T)') has no value to convert); T itself
    # refuses them, as ClickHouse's "Cannot convert NULL value to non-Nullable type"
    into_nullable = target.startswith("Nullable(")
    into = result if into_nullable else base
    if into_nullable and v.arr.null_count == len(v.arr):
        return Val(pa.nulls(len(v.arr), base.arrow_type), result)
    try:
        return Val(into.to_storage(v.arr, "argument of CAST", ctx.tz), result)
    except BadInputError as e:
        raise type_error(f"Cannot convert {v.dtype.name} to {target}: {e}") from None


def _conversion(target: str) -> Callable[[Context, Function], Val]:
    def impl(ctx: Context, node: Function) -> Val:
        (a,) = ctx.args(node, 1)
        return convert(ctx, a, target)

    return impl


for _bits in (8, 16, 32, 64):
    register(f"toUInt{_bits}")(_conversion(f"UInt{_bits}"))
    register(f"toInt{_bits}")(_conversion(f"Int{_bits}"))
register("toFloat32")(_conversion("Float32"))
register("toFloat64")(_conversion("Float64"))


@register("CAST")
def _cast(ctx: Context, node: Function) -> Val:
    if len(node.args) != 2 or not isinstance(node.args[1], Literal) or node.args[1].kind != "string":
        raise type_error("CAST needs an expression and a constant type name")
    target = dtype(str(node.args[1].value))
    value = ctx.evaluate(node.args[0])
    out = convert(ctx, value, target.name)
    if target.name.startswith("Nullable(") and not out.dtype.name.startswith("Nullable("):
        out = Val(out.arr, with_nullable(out.dtype, True))
    return out


def to_string(ctx: Context, v: Val) -> Val:
    kind = v.info.kind
    if kind == "string":
        return v
    if kind == "fixedstring":  # toString drops the trailing zero bytes
        return arrow_val(strip_trailing_zeros(v.arr, v.info.size), "String", v.info.nullable)
    if kind == "int":
        return arrow_val(v.arr.cast(pa.string()).cast(pa.binary()), "String", v.info.nullable)
    if kind == "float":
        text = v.arr.cast(pa.float64()).cast(pa.string()).cast(pa.binary())
        return arrow_val(text, "String", v.info.nullable)
    if kind == "decimal":
        return arrow_val(v.arr.cast(pa.string()).cast(pa.binary()), "String", v.info.nullable)
    if kind == "date":  # day 0 prints as 0000-00-00 in 18.16
        zero = pc.equal(v.arr.cast(pa.int32()), 0)
        text = pc.if_else(zero, pa.scalar("0000-00-00"), v.arr.cast(pa.string()))
        return arrow_val(text.cast(pa.binary()), "String", v.info.nullable)
    if kind == "datetime":
        values, valid = v.numpy()
        local = dates.to_local_seconds(values.astype(np.int64), ctx.tz_of(v))
        ts = pa.array(local, pa.int64(), mask=None if valid is None else ~valid).cast(pa.timestamp("s"))
        text = pc.strftime(ts, format="%Y-%m-%d %H:%M:%S")
        text = pc.if_else(pa.array(values == 0), pa.scalar("0000-00-00 00:00:00"), text)
        return arrow_val(text.cast(pa.binary()), "String", v.info.nullable)
    if kind == "enum":
        names = dict((code, name) for name, code in v.info.enum_values)
        codes, valid = v.numpy()
        keys = np.array(sorted(names), dtype=np.int64)
        idx = np.searchsorted(keys, codes.astype(np.int64))
        table = pa.array([names[int(k)].encode() for k in keys], pa.binary())
        out = table.take(pa.array(np.minimum(idx, len(keys) - 1), mask=None if valid is None else ~valid))
        return arrow_val(out, "String", v.info.nullable)
    if kind == "uuid":
        raw = np.frombuffer(v.arr.cast(pa.binary(16)).buffers()[1], dtype=np.uint8,
                            count=16 * len(v.arr), offset=16 * v.arr.offset).reshape(-1, 16)
        hexd = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
        chars = np.stack([hexd[raw >> 4], hexd[raw & 15]], axis=2).reshape(-1, 32)
        dashed = np.full((len(raw), 36), ord("-"), dtype=np.uint8)
        for src, dst, width in ((0, 0, 8), (8, 9, 4), (12, 14, 4), (16, 19, 4), (20, 24, 12)):
            dashed[:, dst : dst + width] = chars[:, src : src + width]
        arr = pa.Array.from_buffers(pa.binary(36), len(raw), [None, pa.py_buffer(dashed.tobytes())])
        if v.arr.null_count:
            arr = pc.if_else(v.arr.is_valid(), arr, pa.scalar(None, pa.binary(36)))
        return arrow_val(arr.cast(pa.binary()), "String", v.info.nullable)
    raise type_error(f"toString of {v.dtype.name} is not supported")


def strip_trailing_zeros(arr: pa.Array, size: int) -> pa.Array:
    """FixedString(size) values without their trailing zero bytes, as a binary array."""
    n = len(arr)
    fixed = arr if arr.offset == 0 else pa.concat_arrays([arr])
    data = np.frombuffer(fixed.buffers()[1], dtype=np.uint8, count=n * size).reshape(n, size) if n else (
        np.zeros((0, size), dtype=np.uint8))
    nonzero = data != 0
    lengths = np.where(nonzero.any(axis=1), size - np.argmax(nonzero[:, ::-1], axis=1), 0).astype(np.int32)
    keep = np.arange(size)[None, :] < lengths[:, None]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    out = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                                                 pa.py_buffer(data[keep].tobytes())])
    if arr.null_count:
        out = pc.if_else(arr.is_valid(), out, pa.scalar(None, pa.binary()))
    return out


@register("toString")
def _to_string(ctx: Context, node: Function) -> Val:
    if not 1 <= len(node.args) <= 2:
        raise type_error("toString takes 1 or 2 arguments")
    v = ctx.evaluate(node.args[0])
    if len(node.args) == 2 and v.info.kind == "datetime":
        tz = dates.tz_argument(ctx, node, v, 1)
        v = Val(v.arr, dtype(f"DateTime('{tz}')"))
    return to_string(ctx, v)


# ---- strings ------------------------------------------------------------------------------------------


def _string_arg(v: Val, fname: str) -> pa.Array:
    if v.info.kind not in ("string", "fixedstring"):
        raise type_error(f"Illegal type {v.dtype.name} of argument of function {fname}")
    return v.arr.cast(pa.binary()) if v.info.kind == "fixedstring" else v.arr


def _map_ascii(arr: pa.Array, lo: int, hi: int, delta: int) -> pa.Array:
    """Shift bytes in [lo, hi] by ``delta`` in a binary array's data buffer (ASCII lower/upper)."""
    arr = arr if arr.offset == 0 else pa.concat_arrays([arr])
    bufs = arr.buffers()
    if bufs[2] is None:
        return arr
    data = np.frombuffer(bufs[2], dtype=np.uint8).copy()
    sel = (data >= lo) & (data <= hi)
    data[sel] = (data[sel].astype(np.int16) + delta).astype(np.uint8)
    return pa.Array.from_buffers(arr.type, len(arr), [bufs[0], bufs[1], pa.py_buffer(data.tobytes())],
                                 null_count=arr.null_count)


@register("lower", "lcase")
def _lower(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return arrow_val(_map_ascii(_string_arg(a, node.name), 65, 90, 32), "String", a.info.nullable)


@register("upper", "ucase")
def _upper(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return arrow_val(_map_ascii(_string_arg(a, node.name), 97, 122, -32), "String", a.info.nullable)


@register("length")
def _length(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return arrow_val(pc.binary_length(_string_arg(a, node.name)).cast(pa.uint64()), "UInt64", a.info.nullable)


@register("empty", "notEmpty")
def _empty(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    lengths, valid = make_val_lengths(_string_arg(a, node.name))
    res = lengths == 0 if node.name == "empty" else lengths != 0
    return bool_val(res, valid, a.info.nullable)


def make_val_lengths(arr: pa.Array) -> tuple[NDArray, NDArray | None]:
    lengths = pc.binary_length(arr)
    valid = None if not lengths.null_count else np.asarray(lengths.is_valid().to_numpy(zero_copy_only=False))
    return np.asarray(lengths.fill_null(0).to_numpy(zero_copy_only=False)), valid


@register("concat")
def _concat(ctx: Context, node: Function) -> Val:
    args = ctx.args(node, (2, 1 << 30))
    arrays = [_string_arg(a, "concat") for a in args]
    return arrow_val(pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.binary())), "String",
                     any_nullable(*args))


@register("substring", "substr", "mid")
def _substring(ctx: Context, node: Function) -> Val:
    args = ctx.args(node, (2, 3))
    arr = _string_arg(args[0], node.name)
    consts = [a.const for a in args[1:]]
    if any(c is None or c.kind not in ("uint", "int") for c in consts):
        raise type_error("substring supports constant integer offset and length only")
    offset = int(consts[0].value)  # type: ignore[union-attr,arg-type]
    length = int(consts[1].value) if len(consts) > 1 else None  # type: ignore[union-attr,arg-type]
    if offset == 0 or (length is not None and length <= 0):
        return arrow_val(pc.binary_slice(arr, 0, 0), "String", args[0].info.nullable)
    start = offset - 1 if offset > 0 else offset
    stop = None if length is None else start + length
    if stop is not None and start < 0 <= stop:
        stop = None
    return arrow_val(pc.binary_slice(arr, start, stop), "String", args[0].info.nullable)


@register("startsWith", "endsWith")
def _starts_with(ctx: Context, node: Function) -> Val:
    a, b = ctx.args(node, 2)
    if b.const is None or b.const.kind != "string":
        raise type_error(f"{node.name} supports a constant prefix only")
    fn = pc.starts_with if node.name == "startsWith" else pc.ends_with
    res = fn(_string_arg(a, node.name), str(b.const.value))
    from replicad.sql.expressions_compare import arrow_bool

    return arrow_bool(res, a.info.nullable)


# ---- hashes -------------------------------------------------------------------------------------------


def _as_uint64(v: Val, fname: str) -> tuple[NDArray, NDArray | None]:
    if v.info.kind not in ("int", "date", "datetime", "enum"):
        raise type_error(f"Illegal type {v.dtype.name} of argument of function {fname}")
    values, valid = v.numpy()
    return values.astype(np.int64).view(np.uint64) if values.dtype.kind == "i" else values.astype(
        np.uint64), valid


@register("intHash64")
def _int_hash64(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    x, valid = _as_uint64(a, node.name)
    with np.errstate(over="ignore"):
        x = x ^ np.uint64(0x4CF2D2BAAE6DA887)  # IntHash64Impl's salt
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xFF51AFD7ED558CCD)
        x = x ^ (x >> np.uint64(33))
        x = x * np.uint64(0xC4CEB9FE1A85EC53)
        x = x ^ (x >> np.uint64(33))
    return make_val(x, "UInt64", valid, a.info.nullable)


@register("intHash32")
def _int_hash32(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    key, valid = _as_uint64(a, node.name)
    u = np.uint64
    with np.errstate(over="ignore"):
        key = key ^ u(0x75D9543DE018BF45)  # IntHash32Impl's salt
        key = (~key) + (key << u(18))
        key = key ^ ((key >> u(31)) | (key << u(33)))
        key = key * u(21)
        key = key ^ ((key >> u(11)) | (key << u(53)))
        key = key + (key << u(6))
        key = key ^ ((key >> u(22)) | (key << u(42)))
    return make_val(key & u(0xFFFFFFFF), "UInt32", valid, a.info.nullable)


@register("tuple")
def _tuple(ctx: Context, node: Function) -> Val:
    raise type_error("tuple(...) is only supported as a key (PARTITION BY / ORDER BY) or on the right of IN")


__all__ = ["binary_arithmetic", "convert", "to_string", "validity"]
