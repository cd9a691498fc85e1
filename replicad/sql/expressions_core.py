"""The evaluation core under :mod:`replicad.sql.expressions`: evaluated values (:class:`Val`), the
evaluation :class:`Context`, the function registry (:func:`register` / :func:`lookup`) and the helpers the
function modules share.  ``expressions_compare``, ``expressions_dates`` and ``expressions_functions``
register their functions here; ``expressions`` imports them all (so the registry is full) and adds the
public API (:class:`Expr`, :func:`compile_expression`, :func:`compile_key`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa

from replicad.datatypes import DataType
from replicad.errors import BadInputError, SyntaxError_
from replicad.sql.expressions_ast import (
    Function,
    Identifier,
    Literal,
    Node,
    format_ast,
)
from replicad.sql.expressions_types import (
    NDArray,
    TypeInfo,
    and_valid,
    dtype,
    from_numpy,
    info,
    literal_int_type,
    to_numpy,
    with_nullable,
)

UNKNOWN_IDENTIFIER = 47
UNKNOWN_FUNCTION = 46
ILLEGAL_TYPE_OF_ARGUMENT = 43


def type_error(msg: str) -> BadInputError:
    return BadInputError(msg, code=ILLEGAL_TYPE_OF_ARGUMENT)


@dataclass
class Val:
    """An evaluated argument: ``arr`` (storage Arrow, length n), its type, and the literal it came from."""

    arr: pa.Array
    dtype: DataType
    const: Literal | None = None

    @cached_property
    def info(self) -> TypeInfo:
        return info(self.dtype)

    def numpy(self) -> tuple[NDArray, NDArray | None]:
        return to_numpy(self.arr, self.info)


@dataclass
class Context:
    n: int
    tz: str
    table: pa.Table
    types: dict[str, DataType]

    def evaluate(self, node: Node) -> Val:
        if isinstance(node, Literal):
            return literal_val(node, self.n)
        if isinstance(node, Identifier):
            return self.column(node.name)
        if isinstance(node, Function):
            impl = lookup(node.name)
            if impl is None:
                raise BadInputError(f"Unknown function {node.name}", code=UNKNOWN_FUNCTION)
            if node.params is not None:
                raise BadInputError(f"Function {node.name} takes no parameters", code=UNKNOWN_FUNCTION)
            return impl(self, node)
        raise SyntaxError_(f"{format_ast(node)} cannot be evaluated here")

    def args(self, node: Function, count: int | tuple[int, int] | None = None) -> list[Val]:
        lo, hi = (count, count) if isinstance(count, int) else (count or (0, 1 << 30))
        if not lo <= len(node.args) <= hi:
            want = str(lo) if lo == hi else f"{lo}..{hi}"
            raise BadInputError(f"Function {node.name} takes {want} arguments, {len(node.args)} given",
                                code=42)
        return [self.evaluate(a) for a in node.args]

    def column(self, name: str) -> Val:
        dt = self.types.get(name)
        i = self.table.schema.get_field_index(name) if dt is not None else -1  # no list of the names
        if dt is None or (i < 0 and name not in self.table.column_names):
            raise BadInputError(f"Missing column {name!r} (unknown identifier)", code=UNKNOWN_IDENTIFIER)
        col = self.table.column(i if i >= 0 else name)  # -1 for a name twice: column() refuses it as before
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        return Val(arr, dt)

    def tz_of(self, v: Val) -> str:
        return v.info.tz or self.tz


Impl = Callable[[Context, Function], Val]
_REGISTRY: dict[str, Impl] = {}
_REGISTRY_CI: dict[str, Impl] = {}


def register(*names: str) -> Callable[[Impl], Impl]:
    def deco(f: Impl) -> Impl:
        for n in names:
            _REGISTRY[n] = f
            _REGISTRY_CI.setdefault(n.lower(), f)
        return f

    return deco


def lookup(name: str) -> Impl | None:
    return _REGISTRY.get(name) or _REGISTRY_CI.get(name.lower())


# ---- literals -----------------------------------------------------------------------------------------


def literal_type(lit: Literal) -> DataType:
    if lit.kind in ("uint", "int"):
        assert isinstance(lit.value, int)
        return dtype(literal_int_type(lit.value))
    if lit.kind == "float":
        return dtype("Float64")
    if lit.kind == "string":
        return dtype("String")
    if lit.kind == "null":
        return dtype("Nullable(UInt8)")
    raise type_error(f"array literal {format_ast(lit)} is not supported here")


def literal_val(lit: Literal, n: int) -> Val:
    dt = literal_type(lit)
    if lit.kind == "null":
        return Val(pa.nulls(n, pa.uint8()), dt, lit)
    value: object = lit.value.encode("utf-8", "surrogateescape") if isinstance(lit.value, str) else lit.value
    scalar = pa.scalar(value, dt.arrow_type)
    return Val(pa.repeat(scalar, n), dt, lit)


def const_values(node: Node) -> list[Literal]:
    """The literal list on the right of IN: ``(1, 2)``, ``1``, ``(-1)``, ``('a', 'b')``."""
    items = node.args if isinstance(node, Function) and node.name == "tuple" else (node,)
    out = []
    for item in items:
        if isinstance(item, Function) and item.name == "negate" and isinstance(item.args[0], Literal):
            inner = item.args[0]
            if inner.kind in ("uint", "int", "float") and isinstance(inner.value, (int, float)):
                item = Literal(-inner.value, "float" if inner.kind == "float" else "int")
        if not isinstance(item, Literal):
            raise type_error(f"IN needs a list of constants, got {format_ast(item)}")
        out.append(item)
    return out


def truthy(v: Val) -> NDArray:
    """Boolean numpy mask: value != 0, NULL -> False."""
    t = v.info
    if t.kind not in ("int", "float", "date", "datetime", "enum", "nothing"):
        raise type_error(f"Illegal type {v.dtype.name} of a condition: a number is expected")
    values, valid = v.numpy()
    out = np.asarray(values != 0, dtype=bool)
    return out if valid is None else out & valid


def bool_val(mask: NDArray, valid: NDArray | None = None, nullable: bool = False) -> Val:
    dt = dtype("Nullable(UInt8)") if nullable or valid is not None else dtype("UInt8")
    return Val(from_numpy(mask.astype(np.uint8), dt, valid), dt)


def validity(*vals: Val) -> NDArray | None:
    return and_valid(*(to_numpy_valid(v) for v in vals))


def to_numpy_valid(v: Val) -> NDArray | None:
    if not v.arr.null_count:
        return None
    return np.asarray(v.arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def any_nullable(*vals: Val) -> bool:
    return any(v.info.nullable for v in vals)


def make_val(values: NDArray, type_name: str, valid: NDArray | None, nullable: bool = False) -> Val:
    """Numpy values -> a Val of ``type_name`` (Nullable if ``nullable`` or some value is invalid)."""
    dt = with_nullable(dtype(type_name), nullable or valid is not None)
    return Val(from_numpy(values, dt, valid), dt)


def arrow_val(arr: pa.Array, type_name: str, nullable: bool = False) -> Val:
    dt = with_nullable(dtype(type_name), nullable or arr.null_count > 0)
    return Val(arr, dt)
