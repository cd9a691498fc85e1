"""One round of a merge: sorted runs (a cut of each source's pending rows) into one batch in key order.

:func:`merge_runs` merges the runs' sorting keys in C (:mod:`replicad.native._kmerge`: a tournament tree
over the runs' heads, ties to the lower run, as ClickHouse's ``MergingSortedBlockInputStream``) and gathers
every column's rows straight from the runs in that order: no concatenated copy of the runs, no sort of it,
no take.  The reference is the concatenation stably sorted by the key (:func:`reference_order`, what
the merge did before; a property test compares the two).

Keys it compares: integers, dates, timestamps, floats (NaN last, ``-0.0 == 0.0``) and byte strings,
without NULLs; anything else (Nullable, Decimal, FixedString, LowCardinality keys ...) returns None and the
caller sorts.  Columns it gathers in C: fixed-width values and byte strings without NULLs; other columns
are concatenated and taken by the merged order.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import cached_property

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.datatypes.composite import take_rows
from replicad.native import _kmerge
from replicad.storage.block import numpy_sort_key, sort_indices

#: ``_kmerge`` key kinds of the Arrow types it compares (NULL-free arrays)
_INT_KINDS = {8: "b", 16: "h", 32: "i", 64: "q"}
_UINT_KINDS = {8: "B", 16: "H", 32: "I", 64: "Q"}


def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_signed_integer(t):
        return _INT_KINDS[t.bit_width]
    if pa.types.is_unsigned_integer(t):
        return _UINT_KINDS[t.bit_width]
    if pa.types.is_date32(t):
        return "i"
    if pa.types.is_timestamp(t) or pa.types.is_date64(t):
        return "q"
    if pa.types.is_float32(t):
        return "f"
    if pa.types.is_float64(t):
        return "d"
    if pa.types.is_binary(t) or pa.types.is_string(t):
        return "s"
    if pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        return "S"
    return None


def _single(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    return a


def _values(a: pa.Array, width: int) -> memoryview:
    """The bytes of the ``len(a)`` fixed-width values of ``a`` (a view, no copy)."""
    data = a.buffers()[1]
    if data is None:
        return memoryview(b"")
    return memoryview(data)[a.offset * width:(a.offset + len(a)) * width]


def _strings(a: pa.Array) -> tuple[npt.NDArray[np.int32] | npt.NDArray[np.int64], pa.Buffer | bytes]:
    """(the ``len(a) + 1`` offsets, the data buffer) of a binary/string array (views, no copy)."""
    bufs = a.buffers()
    large = pa.types.is_large_binary(a.type) or pa.types.is_large_string(a.type)
    dtype = np.dtype(np.int64 if large else np.int32)
    offsets = np.frombuffer(bufs[1], dtype=dtype, count=len(a) + 1, offset=a.offset * dtype.itemsize)
    return offsets, bufs[2] if bufs[2] is not None else b""


def _fixed_width(t: pa.DataType) -> int | None:
    if pa.types.is_fixed_size_binary(t):
        return int(t.byte_width)
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)
    if numeric and t.bit_width % 8 == 0:
        return int(t.bit_width // 8)
    return None


class MergedOrder:
    """The merged order of a round's runs: per merged row the run it comes from and its row there (int32
    buffers, as ``_kmerge`` takes them); :attr:`indices` (made when asked for) in the runs laid end to end."""

    def __init__(self, sources: bytes, rows: bytes, lengths: Sequence[int]) -> None:
        self.sources = sources
        self.rows = rows
        self.lengths = list(lengths)

    def __len__(self) -> int:
        return len(self.sources) // 4

    @cached_property
    def indices(self) -> pa.Array:
        bases = np.cumsum([0, *self.lengths[:-1]], dtype=np.int64)
        out = bases[np.frombuffer(self.sources, np.int32)] + np.frombuffer(self.rows, np.int32)
        return pa.array(out, pa.int64())


def merged_order(runs: Sequence[Sequence[pa.Array | pa.ChunkedArray]]) -> MergedOrder | None:
    """The merged order of ``runs`` (per run, its sorting-key arrays, each run sorted).  None when a key is
    not of a kind the C merge compares (or holds NULLs)."""
    if not runs or not runs[0]:
        return None
    kinds = ""
    for key in runs[0]:
        kind = _kind(key.type)
        if kind is None:
            return None
        kinds += kind
    args: list[tuple[object, ...]] = []
    lengths: list[int] = []
    for keys in runs:
        lengths.append(len(keys[0]))
        parts: list[object] = []
        for kind, key in zip(kinds, keys, strict=True):
            arr = _single(key)
            if arr.null_count or _kind(arr.type) != kind:
                return None
            if kind in "sS":
                parts.extend(_strings(arr))
            else:
                parts.append(_values(arr, arr.type.bit_width // 8))
        args.append(tuple(parts))
    sources, rows = _kmerge.merge(kinds, args)
    return MergedOrder(sources, rows, lengths)


class BufferPool:
    """Output buffers for gathered columns, used again once nothing refers to them any more.

    A merge writes about its input's size in gathered columns, a round at a time; fresh buffers of that size
    each round are fresh pages (a page fault each, and malloc's mmap / munmap for the big ones): 60% of
    the page faults of the bench merge.  A buffer is handed out again only when the pool holds its only
    reference (the arrays made from it, and any view of them a part writer still holds, refer to it); it is
    handed out as a read-only view, so a stream writer holds views of it without copying them.
    """

    def __init__(self, keep: int = 48) -> None:
        self._buffers: list[bytearray] = []
        self._keep = keep

    def get(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes (contents undefined)."""
        buffers = self._buffers
        free = [i for i in range(len(buffers)) if self._free(i)]
        fits = [i for i in free if len(buffers[i]) >= size]
        if fits:
            return memoryview(buffers[min(fits, key=lambda i: len(buffers[i]))])[:size]
        buf = bytearray(size + size // 4)  # some room: rounds differ in size
        if len(buffers) >= self._keep and free:
            del buffers[min(free, key=lambda i: len(buffers[i]))]
        if len(buffers) < self._keep:
            buffers.append(buf)
        return memoryview(buf)[:size]

    def _free(self, i: int) -> bool:
        # referred to by the list and getrefcount's argument only
        return sys.getrefcount(self._buffers[i]) == 2


def _readonly(view: memoryview) -> pa.Buffer:
    return pa.py_buffer(view.toreadonly())


def _gather(column: list[pa.Array], order: MergedOrder, pool: BufferPool) -> pa.Array:
    """One column of the merged batch: its rows taken from the runs' pieces in merged order."""
    t = column[0].type
    n = len(order)
    sources, rows = order.sources, order.rows
    if not any(a.null_count for a in column):
        width = _fixed_width(t)
        if width is not None:
            out = pool.get(n * width)
            _kmerge.gather_fixed(width, [_values(a, width) for a in column], sources, rows, out)
            return pa.Array.from_buffers(t, n, [None, _readonly(out)])
        if _kind(t) in ("s", "S"):
            runs = [_strings(a) for a in column]
            large = _kind(t) == "S"
            size = sum(int(o[-1]) - int(o[0]) for o, _d in runs) + _kmerge.SLACK
            offsets = pool.get((n + 1) * (8 if large else 4))
            data = pool.get(size)
            _kmerge.gather_binary(runs, sources, rows, offsets, data)
            return pa.Array.from_buffers(t, n, [None, _readonly(offsets), _readonly(data)])
    whole = pa.concat_arrays(column)
    return take_rows(pa.table({"c": whole}), order.indices).column(0).chunk(0)


def merge_runs(tables: Sequence[pa.Table], keys: Sequence[Sequence[pa.Array | pa.ChunkedArray]],
               pool: BufferPool | None = None) -> tuple[pa.Table, MergedOrder] | None:
    """``tables`` (the runs' rows, one schema) merged into one table in key order (``keys``: per run its
    sorting-key arrays), and their merged order.  None when :func:`merged_order` cannot compare the keys.
    The gathered columns' buffers come from ``pool`` (a merge's rounds share one)."""
    order = merged_order(keys)
    if order is None:
        return None
    pool = pool or BufferPool()
    schema = tables[0].schema
    columns = [_gather([_single(t.column(i)) for t in tables], order, pool) for i in range(len(schema))]
    return pa.Table.from_arrays(columns, schema=schema), order


def reference_order(cols: Sequence[pa.Array]) -> npt.NDArray[np.int64]:
    """The stable ORDER BY permutation of concatenated sorted runs, by sorting (the reference of
    :func:`merged_order`).  Numeric keys (strings as their ranks) go to numpy's stable sorts (timsort: it
    finds the runs, O(n log runs)); others to pyarrow."""
    numeric = [k for k in (numpy_sort_key(c) for c in cols) if k is not None]
    if len(numeric) != len(cols):
        return sort_indices(cols)
    if len(numeric) == 1:
        return np.argsort(numeric[0], kind="stable").astype(np.int64, copy=False)
    return np.lexsort(numeric[::-1]).astype(np.int64, copy=False)
