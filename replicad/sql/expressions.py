"""One expression evaluator for partition keys, sorting keys, WHERE (SELECT, mutations) and UPDATE.

``compile_expression(text)`` parses ClickHouse expression text into an :class:`Expr`;
``Expr.evaluate(table, types, tz)`` evaluates it vectorised over a pyarrow Table in storage Arrow and
returns ``(array, DataType)``: the values in storage Arrow plus their ClickHouse result type, inferred
with ClickHouse 18.16's rules (``toYYYYMM`` -> UInt32, ``intDiv(UInt64, UInt8)`` -> UInt64,
``Int32 % UInt8`` -> Int8, comparisons -> UInt8 ...).  Those types decide partition IDs and the bytes of
``partition.dat``, so they follow 18.16 exactly.  DateTime functions use the column's own time zone, else
``tz`` (the server time zone, default UTC).  Nothing is evaluated per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import pyarrow as pa

# Importing the function modules fills the registry (they register into expressions_core).
from replicad.sql import expressions_compare as _compare  # noqa: F401
from replicad.sql import expressions_dates as _dates  # noqa: F401
from replicad.sql import expressions_functions as _functions  # noqa: F401
from replicad.sql.expressions_ast import (
    Node,
    format_ast,
    key_expression_list,
    parse_expression,
    referenced_columns,
)
from replicad.sql.expressions_core import Context, Val, register, truthy
from replicad.sql.expressions_types import NDArray
from replicad.storage.types import DataType

# ---- public API -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """A compiled expression.  ``text`` is ClickHouse's one-line formatting of it."""

    node: Node

    @cached_property
    def text(self) -> str:
        return format_ast(self.node)

    @cached_property
    def columns(self) -> list[str]:
        """Referenced column names, in order of first appearance."""
        return referenced_columns(self.node)

    def evaluate(self, table: pa.Table, types: dict[str, DataType], tz: str = "UTC"
                 ) -> tuple[pa.Array, DataType]:
        ctx = Context(table.num_rows, tz, table, types)
        v = ctx.evaluate(self.node)
        return v.arr, v.dtype

    def result_type(self, types: dict[str, DataType], tz: str = "UTC") -> DataType:
        """The result type for columns of ``types`` (evaluated over zero rows)."""
        return self.evaluate(empty_table(types, self.columns), types, tz)[1]

    def mask(self, table: pa.Table, types: dict[str, DataType], tz: str = "UTC") -> NDArray:
        """Rows where the expression is true (non-zero and not NULL), as a numpy bool array (WHERE)."""
        arr, _dt = self.evaluate(table, types, tz)
        return truthy(Val(arr, _dt))


def compile_expression(text: str) -> Expr:
    """Parse ClickHouse expression text (SyntaxError_ on bad syntax; unknown functions fail at evaluate)."""
    return Expr(parse_expression(text))


def compile_key(text: str | None) -> list[Expr]:
    """A key clause (PARTITION BY / ORDER BY ...) as its expression list: ``(a, b)`` -> [a, b],
    ``tuple()`` / None -> []."""
    if text is None or not text.strip():
        return []
    return [Expr(n) for n in key_expression_list(parse_expression(text))]


def empty_table(types: dict[str, DataType], names: Sequence[str]) -> pa.Table:
    cols = {n: pa.array([], types[n].arrow_type) for n in names if n in types}
    return pa.table(cols) if cols else pa.table({"_": pa.array([], pa.uint8())}).drop(["_"])


__all__ = ["Context", "Expr", "Val", "compile_expression", "compile_key", "register", "truthy"]
