"""An insert block on its way to a part: user Arrow mapped onto the table's columns, ORDER BY order.

* :func:`prepare_block` — a user table (any column order/subset, parser types) -> the table's columns
  in storage Arrow; unknown columns and bad values are :class:`BadInputError` naming column and row.
* :func:`sort_indices` / :func:`sort_table` — the stable ORDER BY permutation (NaN and NULL last), for
  :meth:`PartWriter.write` (``order=``) or to materialise a sorted table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError, ReplicadError
from replicad.storage.types import DataType


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
    if _is_identity(indices):
        return table
    return table.take(indices)


def sort_indices(key_arrays: Sequence[pa.Array | pa.ChunkedArray]) -> npt.NDArray[np.int64]:
    """Stable ORDER BY permutation of the rows described by ``key_arrays``."""
    numeric = [_numpy_key(a) for a in key_arrays]
    if all(k is not None for k in numeric):
        keys = [k for k in numeric if k is not None]
        if len(keys) == 1:
            return _stable_argsort(keys[0])
        return np.lexsort(keys[::-1]).astype(np.int64, copy=False)
    table = pa.table({f"k{i}": a for i, a in enumerate(key_arrays)})
    sort_keys = [(f"k{i}", "ascending", "at_end") for i in range(len(key_arrays))]
    result: npt.NDArray[np.int64] = pc.sort_indices(table, sort_keys=sort_keys).to_numpy().astype(np.int64)
    return result


def _stable_argsort(key: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """``np.argsort(key, kind="stable")``, faster: when (key - min) and the row number fit in 64 bits
    together, the pairs are unique and numpy's (SIMD) unstable sort of them gives the stable order."""
    n = len(key)
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


def _numpy_key(arr: pa.Array | pa.ChunkedArray) -> npt.NDArray[Any] | None:
    t = arr.type
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date32(t) or \
        pa.types.is_timestamp(t)
    if not numeric or arr.null_count:
        return None
    a = _combine(arr)
    if pa.types.is_date32(t) or pa.types.is_timestamp(t):
        a = a.view(pa.int32() if pa.types.is_date32(t) else pa.int64())
    return np.asarray(a.to_numpy(zero_copy_only=False))


def _is_identity(indices: npt.NDArray[np.int64]) -> bool:
    return bool(np.array_equal(indices, np.arange(len(indices), dtype=indices.dtype)))


def prepare_block(
    table: pa.Table,
    columns: Sequence[tuple[str, DataType]],
    tz: str = "UTC",
    *,
    fill_missing: bool = True,
) -> pa.Table:
    """Map a user Arrow table onto the table's columns, in storage Arrow and the table's column order.

    Unknown columns are a BadInputError.  Missing columns get the type's default (NULL for Nullable),
    as ClickHouse does for columns omitted from an INSERT; with ``fill_missing=False`` a missing
    non-Nullable column is a BadInputError instead.  Values are converted by ``DataType.to_storage``,
    whose errors name the column and the row.
    """
    known = {name for name, _ in columns}
    seen: set[str] = set()
    for name in table.column_names:
        if name not in known:
            raise BadInputError(
                f"column {name}: no such column in table (columns: {', '.join(sorted(known))})"
            )
        if name in seen:
            raise BadInputError(f"column {name}: given twice")
        seen.add(name)
    n = table.num_rows
    out: list[pa.Array] = []
    for name, dtype in columns:
        if name in seen:
            out.append(_to_storage(dtype, table.column(name), name, tz))
        elif fill_missing or getattr(dtype, "is_nullable", False):
            out.append(_defaults(dtype, n))
        else:
            raise BadInputError(f"column {name}: missing (at row 0) and type {dtype.name} has no NULL")
    return pa.Table.from_arrays(out, schema=pa.schema([pa.field(nm, dt.arrow_type) for nm, dt in columns]))


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
