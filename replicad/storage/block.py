"""An insert block on its way to a part: user Arrow mapped onto the table's columns, ORDER BY order.

* :func:`prepare_block` — a user table (any column order/subset, parser types) -> the table's columns
  in storage Arrow; unknown columns and bad values are :class:`BadInputError` naming column and row.
  Columns the insert lacks get their ``DEFAULT`` expression, ``MATERIALIZED`` columns are always computed
  (and refused in the input), as 18.16's AddingDefaultBlockOutputStream does (:class:`ColumnDefaults`).
* :func:`sort_indices` / :func:`sort_table` — the stable ORDER BY permutation (NaN and NULL last), for
  :meth:`PartWriter.write` (``order=``) or to materialise a sorted table.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.errors import BadInputError, ReplicadError
from replicad.sql.expressions import Expr, compile_expression
from replicad.sql.expressions_ast import Function, Literal

NO_SUCH_COLUMN_IN_TABLE = 16
ILLEGAL_COLUMN = 44
CYCLIC_ALIASES = 174

#: schema metadata key of a record batch whose columns are already storage Arrow, converted and checked by
#: their ``DataType.convert`` (the insert parsers' output); its value, from :func:`storage_types_metadata`,
#: names each column's type.  :func:`prepare_block` takes a column of such a block as it is when the table's
#: column has that same type (not after an ALTER changed it), instead of converting it a second time.
STORAGE_TYPES_KEY = b"replicad.storage_types"


def storage_types_metadata(names: Sequence[str], types: Sequence[DataType]) -> dict[bytes, bytes]:
    """The schema metadata of a block of storage-Arrow columns ``names`` of types ``types``."""
    return {STORAGE_TYPES_KEY: "\n".join(f"{n}\t{t.name}" for n, t in zip(names, types, strict=True))
            .encode("utf-8")}


def _storage_types(table: pa.Table) -> dict[str, str]:
    """Column name -> type name of the columns ``table`` holds already converted (none for other tables)."""
    meta = table.schema.metadata
    text = meta.get(STORAGE_TYPES_KEY) if meta else None
    if not text:
        return {}
    return dict(line.split("\t", 1) for line in text.decode("utf-8").split("\n"))


def _combine(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def sort_table(table: pa.Table, key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Table:
    """Rows of ``table`` in ORDER BY order; ``key_arrays`` are the evaluated sorting-key expressions.

    Stable, ascending, NaN and NULL last (ClickHouse sorts MergeTree inserts with nulls_direction=1).
    Numeric keys without NULLs are sorted by numpy (radix/merge sort), others by pyarrow.
    """
    if not key_arrays or table.num_rows <= 1:
        return table
    indices = sort_indices(key_arrays)
    if is_identity(indices):
        return table
    return table.take(indices)


def sort_indices(key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> npt.NDArray[np.int64]:
    """Stable ORDER BY permutation of the rows described by ``key_arrays`` (:func:`sort_order`; the
    identity when the rows are in order already)."""
    perm = sort_order(key_arrays)
    return np.arange(len(key_arrays[0]), dtype=np.int64) if perm is None else perm


#: up to this many rows a block's keys are sorted by numpy's stable argsort as they are: the pairs trick
#: of :func:`_stable_argsort` (and its run count) is a dozen more numpy calls, which a small insert runs
#: cold at several times their hot cost
SMALL_SORT_ROWS = 8192


def sort_order(key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> npt.NDArray[np.int64] | None:
    """Stable ORDER BY permutation of the rows described by ``key_arrays``, or None when the rows are in
    that order already (no permutation).

    Every key becomes a numpy sort key (numbers as they are; strings and binary strings as their dense rank,
    from the sorted dictionary of their distinct values, byte-wise unsigned as ClickHouse compares them), and
    the keys are sorted least significant first with a stable sort each (LSD): the same permutation as one
    multi-key stable sort, without comparing strings row by row.  Keys of other kinds (nulls, decimals …) go
    to pyarrow's multi-key sort."""
    if not key_arrays:
        return None
    numeric = [numpy_sort_key(a) for a in key_arrays]
    if any(k is None for k in numeric):
        table = pa.table({f"k{i}": a for i, a in enumerate(key_arrays)})
        sort_keys = [(f"k{i}", "ascending", "at_end") for i in range(len(key_arrays))]
        perm = np.asarray(pc.sort_indices(table, sort_keys=sort_keys).to_numpy(), dtype=np.int64)
        return None if is_identity(perm) else perm
    keys = [k for k in numeric if k is not None]
    if len(keys[0]) < 2 or in_order(keys):  # rows already sorted (a SELECT from a MergeTree table ...)
        return None
    argsort = _plain_stable_argsort if len(keys[0]) <= SMALL_SORT_ROWS else _stable_argsort
    perm = argsort(keys[-1])
    for key in reversed(keys[:-1]):
        perm = perm[argsort(key[perm])]
    return perm


def _plain_stable_argsort(key: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    return np.argsort(key, kind="stable").astype(np.int64, copy=False)


def in_order(keys: Sequence[npt.NDArray[Any]]) -> bool:
    """Whether the rows are already in the order of the sort keys (most significant first): each row's keys
    compare lexicographically at or below the next row's, as ClickHouse checks a block before sorting it.
    Vectorised; a NaN compares false, so it falls back to the sort (which puts NaN last)."""
    first = keys[0]
    if len(first) < 2:
        return True
    if not (first[:-1] <= first[1:]).all():  # the usual unsorted block stops at the cheapest test
        return False
    ok = keys[-1][:-1] <= keys[-1][1:]
    for key in reversed(keys[:-1]):  # in order: less than the next row, or equal and in order on the rest
        a, b = key[:-1], key[1:]
        ok = (a < b) | ((a == b) & ok)
    return bool(ok.all())


def _string_rank(arr: pa.Array) -> npt.NDArray[Any]:
    """Dense ranks (from 1) of the values of a binary/string array without nulls, byte-wise unsigned."""
    if pa.types.is_dictionary(arr.type):
        ranks = pc.rank(arr.dictionary, sort_keys="ascending", tiebreaker="dense").to_numpy()
        return np.asarray(ranks[arr.indices.to_numpy(zero_copy_only=False)])
    # through the dictionary: the distinct values are sorted once (as fast as ranking all rows when every
    # value is distinct, several times faster when values repeat, as sort keys' leading columns do)
    encoded = pc.dictionary_encode(arr)
    ranks = pc.rank(encoded.dictionary, sort_keys="ascending", tiebreaker="dense").to_numpy()
    return np.asarray(ranks[encoded.indices.to_numpy(zero_copy_only=False)])


#: at most one descent per this many rows: the key is a few sorted runs (timsort's best case; at one run per
#: 1,000 rows of random keys it is still 17% faster than the pairs' sort, measured at 1 M rows)
_RUN_ROWS = 1024


def _stable_argsort(key: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """``np.argsort(key, kind="stable")``, faster: when (key - min) and the row number fit in 64 bits
    together, the pairs are unique and numpy's (SIMD) unstable sort of them gives the stable order.  A key
    made of a few sorted runs (a SELECT from a MergeTree table read by several threads: 22 runs in 1 M rows)
    goes to numpy's stable sort as it is (timsort merges the runs: 2.5 ms against 55 ms for the pairs)."""
    n = len(key)
    if n > 1 and int(np.count_nonzero(key[1:] < key[:-1])) * _RUN_ROWS < n:
        return np.argsort(key, kind="stable").astype(np.int64, copy=False)
    if key.dtype.kind in "iu" and n > 1:
        lo, hi = int(key.min()), int(key.max())
        row_bits = (n - 1).bit_length()
        if (hi - lo).bit_length() + row_bits <= 64:
            pairs = key.astype(np.uint64)  # modular: (key - lo) below is exact, it is < 2**64
            pairs -= np.uint64(lo % 2**64)
            pairs <<= np.uint64(row_bits)
            pairs |= np.arange(n, dtype=np.uint64)
            pairs.sort()
            pairs &= np.uint64((1 << row_bits) - 1)
            return pairs.astype(np.int64)
    return np.argsort(key, kind="stable").astype(np.int64, copy=False)


_STRING_KINDS = (pa.types.is_binary, pa.types.is_string, pa.types.is_large_binary, pa.types.is_large_string)


def numpy_sort_key(arr: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any] | None:
    """A numpy array that sorts as ``arr`` does in ORDER BY (strings: dense byte-wise ranks; NaN last as
    numpy sorts it), or None (NULLs, decimals, other kinds: pyarrow's sort)."""
    t = arr.type
    value_type = t.value_type if pa.types.is_dictionary(t) else t
    if any(is_kind(value_type) for is_kind in _STRING_KINDS):
        return None if arr.null_count else _string_rank(_combine(arr))
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date32(t) or \
        pa.types.is_timestamp(t)
    if not numeric or arr.null_count:
        return None
    a = _combine(arr)
    if pa.types.is_date32(t) or pa.types.is_timestamp(t):
        a = a.view(pa.int32() if pa.types.is_date32(t) else pa.int64())
    return np.asarray(a.to_numpy(zero_copy_only=False))


def is_identity(indices: npt.NDArray[np.int64]) -> bool:
    return bool(np.array_equal(indices, np.arange(len(indices), dtype=indices.dtype)))


def prepare_block(
    table: pa.Table,
    columns: Sequence[tuple[str, DataType]],
    tz: str = "UTC",
    *,
    fill_missing: bool = True,
    defaults: Iterable[tuple[str, str, str]] | ColumnDefaults = (),
) -> pa.Table:
    """Map a user Arrow table onto the table's columns, in storage Arrow and the table's column order.

    ``columns`` are the physical columns (ordinary and MATERIALIZED); ``defaults`` the table's
    ``(column, DEFAULT|MATERIALIZED|ALIAS, expression)`` (or a :class:`ColumnDefaults`).  Unknown columns
    and MATERIALIZED columns in the input are a BadInputError.  A missing column with a DEFAULT
    expression gets it evaluated over the block; other missing columns get the type's default (NULL for
    Nullable), as ClickHouse does for columns omitted from an INSERT; with ``fill_missing=False`` a
    missing non-Nullable column without DEFAULT is a BadInputError instead.  MATERIALIZED columns are
    always computed.  Expressions are evaluated in dependency order over the converted block.  Values are
    converted by ``DataType.to_storage``, whose errors name the column and the row.
    """
    known = {name for name, _ in columns}
    rules = defaults if isinstance(defaults, ColumnDefaults) else ColumnDefaults(defaults)
    seen: set[str] = set()
    for name in table.column_names:
        if rules.kind(name) == "MATERIALIZED":
            raise BadInputError(f"Cannot insert column {name}, because it is MATERIALIZED column.",
                                code=ILLEGAL_COLUMN)
        if name not in known:
            raise BadInputError(
                f"column {name}: no such column in table (columns: {', '.join(sorted(known))})",
                code=NO_SUCH_COLUMN_IN_TABLE,
            )
        if name in seen:
            raise BadInputError(f"column {name}: given twice")
        seen.add(name)
    n = table.num_rows
    given: dict[str, pa.Array] = {}
    converted = _storage_types(table)
    for name, dtype in columns:
        if name in seen:
            col = table.column(name)
            same = converted.get(name) == dtype.name and col.type == dtype.arrow_type
            given[name] = _combine(col) if same else _to_storage(dtype, col, name, tz)
        elif rules.kind(name) in ("DEFAULT", "MATERIALIZED"):
            continue
        elif fill_missing or getattr(dtype, "is_nullable", False):
            given[name] = _defaults(dtype, n)
        else:
            raise BadInputError(f"column {name}: missing (at row 0) and type {dtype.name} has no NULL")
    out = rules.complete(given, columns, n, tz)
    return pa.Table.from_arrays([zero_under_nulls(out[nm]) for nm, _ in columns],
                                schema=pa.schema([pa.field(nm, dt.arrow_type) for nm, dt in columns]))


def zero_under_nulls(arr: pa.Array) -> pa.Array:
    """``arr`` with the zero value (0, '', zero bytes) stored under its NULL rows, as 18.16's parsers and
    ``insertDefault`` leave them: the writer writes whatever a Nullable array holds there."""
    if not arr.null_count or arr.type.num_fields != 0 or pa.types.is_dictionary(arr.type):
        return arr
    t = arr.type
    if pa.types.is_binary(t) or pa.types.is_string(t):
        zero = pa.scalar(b"" if pa.types.is_binary(t) else "", t)
    elif pa.types.is_fixed_size_binary(t):
        zero = pa.scalar(bytes(t.byte_width), t)
    elif pa.types.is_decimal(t):
        zero = pa.scalar(decimal.Decimal(0), t)
    elif pa.types.is_date32(t) or pa.types.is_timestamp(t):
        zero = pa.scalar(0, pa.int32() if pa.types.is_date32(t) else pa.int64()).cast(t)
    else:
        zero = pa.scalar(0, t)
    filled = arr.fill_null(zero)
    valid = arr.is_valid()
    validity = valid.buffers()[1] if valid.offset == 0 else pa.py_buffer(
        np.packbits(valid.to_numpy(zero_copy_only=False), bitorder="little"))
    return pa.Array.from_buffers(t, len(arr), [validity, *filled.buffers()[1:]], null_count=arr.null_count,
                                 offset=filled.offset)


class ColumnDefaults:
    """A table's DEFAULT / MATERIALIZED / ALIAS expressions, compiled, and their evaluation over a block.

    ``defaults`` are ``(column, kind, expression)`` with the expression as the ``columns`` znode stores
    it (already wrapped in ``CAST(expr, 'Type')`` where its own type differs from the column's).
    """

    def __init__(self, defaults: Iterable[tuple[str, str, str]] = ()) -> None:
        self.rules: dict[str, tuple[str, Expr]] = {}
        for column, kind, text in defaults:
            kind = kind.upper()
            if kind in ("DEFAULT", "MATERIALIZED", "ALIAS") and text:
                self.rules[column] = (kind, compile_expression(text))

    def kind(self, column: str) -> str:
        rule = self.rules.get(column)
        return rule[0] if rule else ""

    @cached_property
    def materialized(self) -> list[str]:
        return [c for c, (kind, _e) in self.rules.items() if kind == "MATERIALIZED"]

    def complete(
        self, given: Mapping[str, pa.Array], columns: Sequence[tuple[str, DataType]], n: int, tz: str
    ) -> dict[str, pa.Array]:
        """``given`` plus every physical column it lacks: DEFAULT columns and all MATERIALIZED columns
        computed from their expressions, in dependency order (an expression may read other computed
        columns, ALIAS columns included)."""
        types = dict(columns)
        values: dict[str, pa.Array] = dict(given)
        state: dict[str, int] = {}  # 1 = being computed, 2 = done
        for column in [c for c, _t in columns if c not in values and c in self.rules]:
            self._compute(column, values, types, state, n, tz)
        return values

    def _compute(self, column: str, values: dict[str, pa.Array], types: dict[str, DataType],
                 state: dict[str, int], n: int, tz: str) -> None:
        """``values[column]`` computed, its dependencies first.  A method, not a closure calling itself: such
        a closure is a reference cycle, and the block's columns in ``values`` stayed alive with it until a
        full garbage collection (a whole 1 M-row block held at rest after an insert, and during the next)."""
        if state.get(column) == 2:
            return
        if state.get(column) == 1:
            raise BadInputError(f"Cyclic aliases: the DEFAULT/MATERIALIZED expression of column "
                                f"{column} depends on itself", code=CYCLIC_ALIASES)
        state[column] = 1
        kind, expr = self.rules[column]
        for dep in expr.columns:
            if dep not in values and dep in self.rules:
                self._compute(dep, values, types, state, n, tz)
        values[column], types[column] = self._evaluate(column, kind, expr, values, types, n, tz)
        state[column] = 2

    def _evaluate(
        self, column: str, kind: str, expr: Expr, values: Mapping[str, pa.Array],
        types: dict[str, DataType], n: int, tz: str,
    ) -> tuple[pa.Array, DataType]:
        block = pa.table({c: values[c] for c in dict.fromkeys(expr.columns) if c in values}) if expr.columns \
            else pa.table({"_": pa.nulls(n, pa.uint8())})
        target = types.get(column)
        try:
            arr, dtype = expr.evaluate(block, types, tz)
            if target is not None and dtype.name != target.name:
                cast = Expr(Function("CAST", (expr.node, Literal(target.name, "string"))))
                arr, dtype = cast.evaluate(block, types, tz)
        except BadInputError as e:
            raise BadInputError(f"column {column}: cannot compute its {kind} expression {expr.text}: {e}",
                                code=e.code) from None
        arr = _combine(arr)
        if len(arr) != n:  # a constant folded to one value
            arr = pa.repeat(arr[0], n) if len(arr) else _defaults(target or dtype, n)
        if target is None:
            return arr, dtype
        if arr.type != target.arrow_type or (not getattr(target, "is_nullable", False) and arr.null_count):
            arr = _to_storage(target, pa.chunked_array([arr]), column, tz)
        return arr, target


def _to_storage(dtype: DataType, values: pa.ChunkedArray, column: str, tz: str) -> pa.Array:
    try:
        result: pa.Array = dtype.to_storage(values, column, tz)
    except ReplicadError:
        raise
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
        raise BadInputError(f"column {column}: cannot store as {dtype.name}: {e}") from None
    return result


def _defaults(dtype: DataType, n: int) -> pa.Array:
    if getattr(dtype, "is_nullable", False):
        return pa.nulls(n, dtype.arrow_type)
    make = getattr(dtype, "defaults", None)
    if make is not None:
        result: pa.Array = make(n)
        return result
    return pa.repeat(pa.scalar(dtype.default_value, dtype.arrow_type), n)
