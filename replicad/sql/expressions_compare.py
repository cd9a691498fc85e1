"""Comparisons, IN, LIKE, logical operators, NULL checks and conditionals for the expression evaluator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError
from replicad.sql.expressions_ast import Function, Literal
from replicad.sql.expressions_core import (
    Context,
    Val,
    any_nullable,
    bool_val,
    const_values,
    literal_val,
    register,
    truthy,
    type_error,
    validity,
)
from replicad.sql.expressions_types import (
    NDArray,
    TypeInfo,
    dtype,
    from_numpy,
    if_result,
    info_of_name,
    with_nullable,
)

NUMERIC_KINDS = ("int", "float", "date", "datetime", "enum")
STRING_KINDS = ("string", "fixedstring")

_NP_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "equals": np.equal, "notEquals": np.not_equal, "less": np.less, "greater": np.greater,
    "lessOrEquals": np.less_equal, "greaterOrEquals": np.greater_equal,
}
_PC_OPS = {"equals": "equal", "notEquals": "not_equal", "less": "less", "greater": "greater",
           "lessOrEquals": "less_equal", "greaterOrEquals": "greater_equal"}


def _is_string_const(v: Val) -> bool:
    return v.const is not None and v.const.kind == "string"


def convert_const(v: Val, target: Val, ctx: Context) -> Val:
    """A literal converted to ``target``'s (non-Nullable) type, the way ClickHouse reads a constant
    compared with a column: ``d = '2026-01-01'``, ``e = 'b'`` (Enum), ``u = '0123...'`` (UUID)."""
    assert v.const is not None
    t = target.info
    value = v.const.value
    if t.kind == "enum" and isinstance(value, str):
        codes = dict(t.enum_values)
        if value not in codes:
            raise BadInputError(f"Unknown element {value!r} for type {t.name}", code=36)
        return Val(pa.repeat(pa.scalar(codes[value], pa.int8() if t.bits == 8 else pa.int16()), ctx.n),
                   dtype(t.name))
    base = dtype(t.name)
    user = pa.array([value]) if v.const.kind != "null" else pa.nulls(1)
    try:
        stored = base.to_storage(user, "literal", ctx.tz_of(target))
    except BadInputError as e:
        raise type_error(f"Cannot convert {v.const.value!r} to {t.name}: {e}") from None
    return Val(pa.repeat(stored[0], ctx.n) if ctx.n else stored.slice(0, 0), base)


def align_constants(a: Val, b: Val, ctx: Context) -> tuple[Val, Val]:
    """Convert a string/number constant on one side to the other side's type where ClickHouse would."""
    # (18.16 compares FixedString with a String constant byte for byte: 'ab\\0\\0' != 'ab')
    convertible = ("date", "datetime", "uuid", "enum", "decimal")
    if _is_string_const(a) and b.info.kind in convertible:
        a = convert_const(a, b, ctx)
    elif _is_string_const(b) and a.info.kind in convertible:
        b = convert_const(b, a, ctx)
    elif a.const is not None and a.const.kind in ("uint", "int", "float") and b.info.kind == "decimal":
        a = convert_const(a, b, ctx)
    elif b.const is not None and b.const.kind in ("uint", "int", "float") and a.info.kind == "decimal":
        b = convert_const(b, a, ctx)
    return a, b


def _date_to_datetime(v: Val, tz: str) -> tuple[NDArray, NDArray | None]:
    days, valid = v.numpy()
    secs = days.astype(np.int64) * 86400
    if tz != "UTC":
        local = pa.array(secs, pa.int64()).cast(pa.timestamp("s"))
        utc = pc.assume_timezone(local, tz, ambiguous="earliest", nonexistent="earliest")
        secs = np.asarray(utc.cast(pa.int64()).to_numpy(zero_copy_only=False))
    return secs, valid


def numeric_compare(op: str, a: Val, b: Val, ctx: Context) -> Val:
    ta, tb = a.info, b.info
    if ta.kind == "date" and tb.kind == "datetime":
        av, va = _date_to_datetime(a, ctx.tz_of(b))
        bv, vb = b.numpy()
        ta = TypeInfo("int", "Int64", bits=64, signed=True)
    elif tb.kind == "date" and ta.kind == "datetime":
        av, va = a.numpy()
        bv, vb = _date_to_datetime(b, ctx.tz_of(a))
        tb = TypeInfo("int", "Int64", bits=64, signed=True)
    else:
        av, va = a.numpy()
        bv, vb = b.numpy()
    valid = validity(a, b) if (va is not None or vb is not None) else None
    return bool_val(compare_numbers(op, av, ta, bv, tb), valid, any_nullable(a, b))


def _signed(t: TypeInfo) -> bool:
    return t.kind in ("int", "enum", "float") and t.signed


def compare_numbers(op: str, av: NDArray, ta: TypeInfo, bv: NDArray, tb: TypeInfo) -> NDArray:
    """Exact comparison of two numeric arrays of ClickHouse types ``ta`` / ``tb`` (mixed signs included)."""
    f = _NP_OPS[op]
    if ta.kind == "float" or tb.kind == "float":
        return np.asarray(f(av.astype(np.float64), bv.astype(np.float64)), dtype=bool)
    sa, sb = _signed(ta), _signed(tb)
    if not sa and not sb:
        return np.asarray(f(av.astype(np.uint64), bv.astype(np.uint64)), dtype=bool)
    if (sa and sb) or (not sa and ta.bits < 64) or (not sb and tb.bits < 64):
        return np.asarray(f(av.astype(np.int64), bv.astype(np.int64)), dtype=bool)
    # one side UInt64, the other signed: negative signed values are smaller than any unsigned one
    neg = (bv if sa is False else av).astype(np.int64) < 0
    res = np.asarray(f(av.astype(np.uint64), bv.astype(np.uint64)), dtype=bool)
    when_neg = bool(f(1, 0)) if not sa else bool(f(0, 1))
    return np.where(neg, when_neg, res)


def _as_binary(v: Val) -> pa.Array:
    return v.arr.cast(pa.binary()) if pa.types.is_fixed_size_binary(v.arr.type) else v.arr


def compare(op: str, a: Val, b: Val, ctx: Context) -> Val:
    a, b = align_constants(a, b, ctx)
    ka, kb = a.info.kind, b.info.kind
    if (a.const is not None and a.const.kind == "null") or (b.const is not None and b.const.kind == "null"):
        return bool_val(np.zeros(ctx.n, dtype=bool), np.zeros(ctx.n, dtype=bool), True)
    if ka in NUMERIC_KINDS and kb in NUMERIC_KINDS:
        return numeric_compare(op, a, b, ctx)
    if ka in STRING_KINDS and kb in STRING_KINDS:
        res = getattr(pc, _PC_OPS[op])(_as_binary(a), _as_binary(b))
    elif ka == kb and ka in ("uuid", "decimal"):
        res = getattr(pc, _PC_OPS[op])(a.arr, b.arr)
    else:
        raise type_error(f"Illegal types of arguments ({a.dtype.name}, {b.dtype.name}) of function {op}")
    return arrow_bool(res, any_nullable(a, b))


def arrow_bool(res: pa.Array, nullable: bool) -> Val:
    valid = None
    if res.null_count:
        valid = np.asarray(res.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    mask = np.asarray(res.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    return bool_val(mask, valid, nullable)


def _comparison(op: str) -> Callable[[Context, Function], Val]:
    def impl(ctx: Context, node: Function) -> Val:
        a, b = ctx.args(node, 2)
        return compare(op, a, b, ctx)

    return impl


for _op in _NP_OPS:
    register(_op)(_comparison(_op))


# ---- IN -----------------------------------------------------------------------------------------------


def _in_set(left: Val, consts: list[Literal], ctx: Context) -> NDArray:
    t = left.info
    usable = [c for c in consts if c.kind != "null"]
    if not usable or ctx.n == 0:
        return np.zeros(ctx.n, dtype=bool)
    if t.kind in ("int", "float", "enum", "date", "datetime") and all(
        c.kind in ("uint", "int", "float") for c in usable
    ):
        values, _valid = left.numpy()
        hit = np.zeros(ctx.n, dtype=bool)
        for c in usable:
            cv = literal_val(c, 1)
            cvals, _ = cv.numpy()
            hit |= compare_numbers("equals", values, t, np.repeat(cvals, ctx.n), cv.info)
        return hit
    converted = [align_constants(literal_val(c, 1), Val(left.arr.slice(0, 1), left.dtype), _one(ctx))[0]
                 for c in usable]
    kinds = {c.info.kind for c in converted}
    if any(k not in (t.kind,) and not (k in STRING_KINDS and t.kind in STRING_KINDS) for k in kinds):
        raise type_error(f"Types of IN list elements do not match {left.dtype.name}")
    if t.kind in STRING_KINDS:
        value_set = pa.array([c.arr[0].as_py() for c in converted], pa.binary())
        res = pc.is_in(_as_binary(left), value_set=value_set)
    else:
        value_set = pa.concat_arrays([c.arr.cast(left.arr.type) for c in converted])
        res = pc.is_in(left.arr, value_set=value_set)
    return np.asarray(res.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _one(ctx: Context) -> Context:
    return Context(1, ctx.tz, ctx.table, ctx.types)


def _in_impl(negate: bool) -> Callable[[Context, Function], Val]:
    def impl(ctx: Context, node: Function) -> Val:
        if len(node.args) != 2:
            raise type_error(f"Function {node.name} takes 2 arguments")
        left = ctx.evaluate(node.args[0])
        hit = _in_set(left, const_values(node.args[1]), ctx)
        valid = validity(left)
        return bool_val(~hit if negate else hit, valid, left.info.nullable)

    return impl


register("in", "globalIn")(_in_impl(False))
register("notIn", "globalNotIn")(_in_impl(True))


# ---- LIKE ---------------------------------------------------------------------------------------------


def _like_impl(negate: bool) -> Callable[[Context, Function], Val]:
    def impl(ctx: Context, node: Function) -> Val:
        a, pattern = ctx.args(node, 2)
        if a.info.kind not in STRING_KINDS or pattern.const is None or pattern.const.kind != "string":
            raise type_error(f"{node.name} needs a string and a constant string pattern")
        assert isinstance(pattern.const.value, str)
        res = pc.match_like(_as_binary(a), pattern.const.value)
        v = arrow_bool(res, a.info.nullable)
        if negate:
            values, valid = v.numpy()
            return bool_val(values == 0, valid, a.info.nullable)
        return v

    return impl


register("like")(_like_impl(False))
register("notLike")(_like_impl(True))


# ---- logic and NULL checks ----------------------------------------------------------------------------


@register("and", "or")
def _logic(ctx: Context, node: Function) -> Val:
    args = ctx.args(node, (2, 1 << 30))
    masks = [truthy(a) for a in args]
    out = np.logical_and.reduce(masks) if node.name.lower() == "and" else np.logical_or.reduce(masks)
    return bool_val(np.asarray(out, dtype=bool), validity(*args), any_nullable(*args))


@register("not")
def _not(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return bool_val(~truthy(a), validity(a), a.info.nullable)


@register("isNull")
def _is_null(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return bool_val(np.asarray(a.arr.is_null().to_numpy(zero_copy_only=False), dtype=bool))


@register("isNotNull")
def _is_not_null(ctx: Context, node: Function) -> Val:
    (a,) = ctx.args(node, 1)
    return bool_val(np.asarray(a.arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool))


# ---- conditionals -------------------------------------------------------------------------------------


def common_type(ta: TypeInfo, tb: TypeInfo) -> str:
    """Result type name of if(c, a, b) / multiIf (ClickHouse getLeastSupertype for the common cases)."""
    if ta.kind == "nothing":
        return tb.name
    if tb.kind == "nothing" or ta.name == tb.name:
        return ta.name
    if ta.kind in ("int", "float") and tb.kind in ("int", "float"):
        r = if_result(ta, tb)
        if r is not None:
            return r
    if ta.kind in STRING_KINDS and tb.kind in STRING_KINDS:
        return "String"
    raise type_error(f"There is no supertype for types {ta.name}, {tb.name}")


def supertype(vals: list[Val]) -> str:
    t = vals[0].info
    for v in vals[1:]:
        t = info_of_name(common_type(t, v.info))
    return "UInt8" if t.kind == "nothing" else t.name


def cast_to(v: Val, type_name: str, nullable: bool) -> pa.Array:
    dt = with_nullable(dtype(type_name), nullable)
    if v.info.kind == "nothing":
        return pa.nulls(len(v.arr), dt.arrow_type)
    if v.info.name == type_name:
        return v.arr.cast(dt.arrow_type) if v.arr.type != dt.arrow_type else v.arr
    if v.info.kind in ("int", "float"):
        values, valid = v.numpy()
        return from_numpy(values, dt, valid)
    return v.arr.cast(dt.arrow_type)


def _choose(conds: list[Val], branches: list[Val]) -> Val:
    type_name = supertype(branches)
    nullable = any(b.info.nullable for b in branches)
    out = cast_to(branches[-1], type_name, nullable)
    for cond, branch in zip(reversed(conds), reversed(branches[:-1]), strict=True):
        mask = pa.array(truthy(cond), pa.bool_())
        out = pc.if_else(mask, cast_to(branch, type_name, nullable), out)
    return Val(out, with_nullable(dtype(type_name), nullable))


@register("if")
def _if(ctx: Context, node: Function) -> Val:
    cond, a, b = ctx.args(node, 3)
    return _choose([cond], [a, b])


@register("multiIf")
def _multi_if(ctx: Context, node: Function) -> Val:
    args = ctx.args(node, (3, 1 << 30))
    if len(args) % 2 == 0:
        raise type_error("multiIf needs an odd number of arguments")
    return _choose(args[:-1:2], [*args[1:-1:2], args[-1]])


@register("ifNull", "coalesce")
def _coalesce(ctx: Context, node: Function) -> Val:
    args = ctx.args(node, (1, 1 << 30))
    type_name = supertype(args)
    last_nullable = args[-1].info.nullable or args[-1].info.kind == "nothing"
    arrays = [cast_to(a, type_name, True) for a in args]
    out = pc.coalesce(*arrays)
    dt = with_nullable(dtype(type_name), last_nullable)
    return Val(out if last_nullable else out.cast(dt.arrow_type), dt)
