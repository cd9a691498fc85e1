"""Where a merge round cuts a source's pending rows: sort keys as Python values (only the few rows a round
looks at: the frontier, and the probes of a binary search) and the search itself.

A :data:`Key` orders as ClickHouse's ORDER BY does: values, then NaN, then NULL, column after column.
:func:`cut` counts the pending rows before a frontier key (or up to it, ``inclusive``); one integer or float
key column without NULLs is searched by numpy (which orders NaN last and -0.0 with 0.0, as ClickHouse does),
other keys by :mod:`bisect` over the rows' Python values.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

#: a row's sort key: per key column ``(0, value)``, ``(1, 0)`` for NaN, ``(2, 0)`` for NULL
Key = tuple[tuple[int, object], ...]


def _sortable(v: object) -> tuple[int, object]:
    """ClickHouse order: values, then NaN, then NULL."""
    if v is None:
        return (2, 0)
    if isinstance(v, float) and math.isnan(v):
        return (1, 0)
    return (0, v)


class _KeyView:
    """The sort keys of a source's pending rows, row by row, for :mod:`bisect`."""

    def __init__(self, keys: Sequence[pa.Array | pa.ChunkedArray]) -> None:
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys[0]) if self.keys else 0

    def __getitem__(self, i: int) -> Key:
        return tuple(_sortable(k[i].as_py()) for k in self.keys)


def key_at(keys: Sequence[pa.Array | pa.ChunkedArray], i: int) -> Key:
    """The sort key of row ``i`` (``keys``: the sorting-key arrays)."""
    return _KeyView(keys)[i]


def cut(keys: Sequence[pa.Array | pa.ChunkedArray], frontier: Key, inclusive: bool) -> int:
    """Rows of ``keys`` (sorted) before ``frontier`` (``inclusive``: rows equal to it too)."""
    if len(keys) == 1:
        fast = _numeric_cut(keys[0], frontier[0], inclusive)
        if fast is not None:
            return fast
    return (bisect_right if inclusive else bisect_left)(_KeyView(keys), frontier)


def _numeric_cut(key: pa.Array | pa.ChunkedArray, frontier: tuple[int, object],
                 inclusive: bool) -> int | None:
    """:func:`cut` of one integer or float key column without NULLs, by numpy's binary search; None for
    other keys."""
    t = key.type
    if key.null_count or not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return None
    kind, value = frontier
    if kind == 1:
        value = math.nan
    elif kind != 0 or not isinstance(value, int | float):
        return None
    chunks = key.chunks if isinstance(key, pa.ChunkedArray) else [key]
    # the key is sorted: the rows before the frontier are those before it in each chunk
    v: int | float = value
    n = 0
    for c in chunks:
        if len(c):
            values = c.to_numpy()
            x = values.dtype.type(v)  # of the array's type: with a Python int numpy converted the array
            n += int(np.searchsorted(values, x, side="right") if inclusive else np.searchsorted(values, x))
    return n
