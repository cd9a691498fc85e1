"""Write a ClickHouse 18.16 Wide part, streaming, column by column (FACTS §5.1).

Usage::

    w = PartWriter(tmp_dir, columns, WriterSettings(), primary_key=["k"], minmax_columns=["d"],
                   partition_value=[(UInt32, 202611)])
    with w:
        for batch in sorted_batches:
            w.write(batch)                    # storage Arrow, already sorted by the table's ORDER BY
        part = w.finish()                     # WrittenPart(rows, checksums, columns_text, ...)

Memory is bounded by the compressed block size per stream (plus the batch being written), not by
the part: granules carry across :meth:`PartWriter.write` calls exactly like ClickHouse's
``index_offset``, and every stream cuts blocks with ClickHouse's rule — before each granule, flush the
buffered data if it holds at least ``min_compress_block_size`` bytes; and cut whenever
``max_compress_block_size`` bytes have accumulated (even mid-granule).  The result is byte-identical to
what 18.16 writes for the same rows and compression method.  Batch boundaries do not change the bytes,
except for stateful serializations (LowCardinality): there, as in ClickHouse's ``writeData``, every
piece of a granule delivered by one call gets its own index header — feed the blocks ClickHouse would.

Columns are processed in a thread pool (one task per column per batch); hashing, compression and the
numpy/pyarrow serialization release the GIL.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.storage.block import prepare_block, sort_indices, sort_table
from replicad.storage.checksums import Checksum
from replicad.storage.column_writer import (
    BulkSerializer,
    ColumnWriter,
    WriterSettings,
    combine_chunks,
)
from replicad.storage.written_part import WrittenPart, storage_arrays, write_part_metadata

#: the machine's CPUs, read once (os.cpu_count reads /sys on every call: ~6 µs per part written)
_CPUS = os.cpu_count() or 1

__all__ = [
    "BulkSerializer",
    "PartWriter",
    "WriterSettings",
    "WrittenPart",
    "prepare_block",
    "sort_indices",
    "sort_table",
]

#: a write of fewer rows runs in the caller's thread, column after column
PARALLEL_MIN_ROWS = 8192

T = TypeVar("T")

@functools.cache
def column_pool(threads: int) -> ThreadPoolExecutor:
    """The process's column threads for writers of ``threads`` threads, started once: a pool per part
    started its threads for every 10k-row insert, and each new thread made (and the pool's end freed) its
    own compression context (``_ZstdContext.__del__`` in a py-spy of 16 inserting clients).  Writers take
    it only when they write alone (replication/sink.py), so they seldom share it.  Made once, as the
    compression pool (storage/compression.py ``_parallel_pool``)."""
    return ThreadPoolExecutor(threads, thread_name_prefix="part-writer")


def _results(futures: Sequence[Future[T]]) -> list[T]:
    """The futures' results in order, once every one is done (none left running when this raises)."""
    wait(futures)
    return [f.result() for f in futures]


class PartWriter:
    """Streams sorted storage-Arrow batches into a Wide part in ``tmp_dir`` (created, or emptied).

    ``primary_key`` names the PRIMARY KEY columns in order; a name that is not a column (an
    expression's result) must be typed in ``key_types`` and passed with every batch in ``key_arrays``.
    ``minmax_columns`` are the columns the partition expression reads (``minmax_<col>.idx``);
    ``partition_value`` the partition key's values with their types (``partition.dat``), None when the
    table has no partition key.  ``raw_columns`` (neither key nor partition columns) arrive as serialized
    rows — ``PartReader.read_granules(raw=...)`` — and are written as they are.  On any exception in
    :meth:`write`/:meth:`finish` (or leaving a ``with`` block with one) the temporary directory is removed.
    """

    def __init__(
        self,
        tmp_dir: str | os.PathLike[str],
        columns: Sequence[tuple[str, DataType]],
        settings: WriterSettings | None = None,
        *,
        primary_key: Sequence[str] = (),
        key_types: Mapping[str, DataType] | None = None,
        minmax_columns: Sequence[str] = (),
        partition_value: Sequence[tuple[DataType, object]] | None = None,
        raw_columns: Collection[str] = (),
    ) -> None:
        self.path = Path(tmp_dir)
        self.settings = settings or WriterSettings()
        self.columns = list(columns)
        names = [n for n, _ in self.columns]
        if len(set(names)) != len(names):
            raise ValueError("duplicate column names")
        self._types = dict(self.columns)
        self._key_types: dict[str, DataType] = {}
        for k in primary_key:
            kt = self._types.get(k) or (key_types or {}).get(k)
            if kt is None:
                raise ValueError(f"primary key {k!r} is neither a column nor typed in key_types")
            self._key_types[k] = kt
        self.primary_key = list(primary_key)
        for c in minmax_columns:
            if c not in self._types:
                raise ValueError(f"partition key column {c!r} is not a column")
        self.minmax_columns = list(minmax_columns)
        self.partition_value = None if partition_value is None else list(partition_value)
        self.raw_columns = frozenset(raw_columns)
        for c in self.raw_columns:
            if c not in self._types or c in self._key_types or c in self.minmax_columns:
                raise ValueError(f"column {c!r} cannot come serialized (not a column, or a key column)")

        self.rows = 0
        self.marks_count = 0
        self._index_offset = 0  # rows still missing from the last granule of the previous batch
        self._primary = bytearray()
        self._minmax: dict[str, tuple[Any, Any]] = {}
        self._finished = False
        self._closed = False

        try:
            self.path.mkdir(parents=True)
        except FileExistsError:  # an empty directory made for us is used as it is (no rmdir + mkdir)
            if any(self.path.iterdir()):
                shutil.rmtree(self.path)
                self.path.mkdir()
        self._cols: list[ColumnWriter] = []
        #: taken at the first write of PARALLEL_MIN_ROWS rows or more: a small part is written by this
        #: thread alone (handing work over would cost more than the work); the column threads are the
        #: process's (:func:`column_pool`), not started per part
        self._pool: ThreadPoolExecutor | None = None  # before abort() can run
        taken: set[str] = set()
        try:
            for name, dtype in self.columns:
                raw = name in self.raw_columns
                self._cols.append(ColumnWriter(self.path, name, dtype, self.settings, taken, raw))
        except BaseException:
            self.abort()
            raise
        threads = self.settings.threads or _CPUS
        self._threads = min(threads, len(self._cols))

    # ---- writing -------------------------------------------------------------------------------------

    def _segments(self, n: int) -> list[tuple[int, int, bool]]:
        """(start, length, starts_granule) pieces of an ``n``-row batch."""
        g = self.settings.index_granularity
        out: list[tuple[int, int, bool]] = []
        pos = 0
        if self._index_offset:
            first = min(self._index_offset, n)
            out.append((0, first, False))
            pos = first
        while pos < n:
            length = min(g, n - pos)
            out.append((pos, length, True))
            pos += length
        return out

    def write(
        self,
        batch: pa.RecordBatch | pa.Table,
        key_arrays: Mapping[str, pa.Array | pa.ChunkedArray] | None = None,
        *,
        order: npt.NDArray[np.int64] | pa.Array | None = None,
    ) -> None:
        """Append rows (storage Arrow).  Extra primary-key arrays go in ``key_arrays``.

        The rows must be in ORDER BY order — or ``order`` holds the indices of the rows to write, in
        ORDER BY order (e.g. :func:`sort_indices`, or a slice of it to stream a big sorted block in
        pieces); ``batch`` and ``key_arrays`` are then in input order.  Each column is permuted inside
        its own task, so the sorted table is never materialised (ClickHouse's ``writeWithPermutation``).
        """
        if self._finished or self._closed:
            raise RuntimeError("PartWriter is finished")
        try:
            self._write(batch, key_arrays or {}, order)
        except BaseException:
            self.abort()
            raise

    def _write(
        self,
        batch: pa.RecordBatch | pa.Table,
        key_arrays: Mapping[str, pa.Array | pa.ChunkedArray],
        order: npt.NDArray[np.int64] | pa.Array | None,
    ) -> None:
        perm: pa.Array | None = None
        if order is not None:
            perm = order if isinstance(order, pa.Array) else pa.array(order, pa.int64())
        n = batch.num_rows if perm is None else len(perm)
        if n == 0:
            return
        arrays = storage_arrays(batch, self.columns, self.raw_columns)
        segments = self._segments(n)
        if self._pool is None and self._threads > 1 and n >= PARALLEL_MIN_ROWS:
            self._pool = column_pool(self._threads)

        if self._pool is None:
            for col in self._cols:
                col.write(arrays[col.name], segments, perm)
        else:
            futures: list[Future[None]] = [
                self._pool.submit(col.write, arrays[col.name], segments, perm) for col in self._cols
            ]
            try:
                self._index_and_minmax(arrays, key_arrays, segments, n, perm)
            finally:
                _results(futures)  # every column's job done (raising the first error) before going on
            self._advance(n)
            return
        self._index_and_minmax(arrays, key_arrays, segments, n, perm)
        self._advance(n)

    def _advance(self, n: int) -> None:
        g = self.settings.index_granularity
        written_for_last_mark = (g - self._index_offset + n) % g
        self._index_offset = (g - written_for_last_mark) % g
        self.rows += n

    def _index_and_minmax(
        self,
        arrays: Mapping[str, pa.Array],
        key_arrays: Mapping[str, pa.Array | pa.ChunkedArray],
        segments: Sequence[tuple[int, int, bool]],
        n: int,
        perm: pa.Array | None,
    ) -> None:
        starts = [s for s, _, is_mark in segments if is_mark]
        self.marks_count += len(starts)
        if self.primary_key and starts:
            keys: list[tuple[DataType, pa.Array]] = []
            for k in self.primary_key:
                arr = arrays.get(k)
                if arr is None:
                    given = key_arrays.get(k)
                    if given is None:
                        raise ValueError(f"primary key expression {k!r}: no key array given")
                    arr = combine_chunks(given)
                    if len(arr) != len(arrays[self.columns[0][0]]):
                        raise ValueError(f"primary key array {k!r} has {len(arr)} rows, the batch does not")
                keys.append((self._key_types[k], arr))
            # The first row of each granule, for every key column (rows interleaved column by column).
            idx = pa.array(starts, pa.int64())
            if perm is not None:
                idx = perm.take(idx)
            firsts = [(t, a.take(idx)) for t, a in keys]
            for i in range(len(starts)):
                for t, a in firsts:
                    self._primary += t.serialize_value(a, i)
        for c in self.minmax_columns:
            values = arrays[c]
            if perm is not None and len(perm) != len(values):
                values = values.take(perm)
            mm = pc.min_max(values)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is None:
                continue
            cur = self._minmax.get(c)
            if cur is None:
                self._minmax[c] = (lo, hi)
            else:
                self._minmax[c] = (min(cur[0], lo), max(cur[1], hi))

    # ---- finishing -----------------------------------------------------------------------------------

    def seal(self) -> dict[str, Checksum]:
        """Compress every stream's last block: the part's ``.bin`` checksums (``<stream>.bin`` → checksum),
        hence its deduplication block id, are known before :meth:`finish` makes its files (a small part's
        compressed bytes are still in memory).  The bytes written are the same, sealed first or not."""
        if self._finished or self._closed:
            raise RuntimeError("PartWriter is finished")
        try:
            files: dict[str, Checksum] = {}
            if self._pool is None:
                for col in self._cols:
                    files.update(col.seal())
            else:
                for result in _results([self._pool.submit(c.seal) for c in self._cols]):
                    files.update(result)
            return files
        except BaseException:
            self.abort()
            raise

    def finish(self) -> WrittenPart:
        """Flush every stream and write the metadata files; return the part's description."""
        if self._finished:
            raise RuntimeError("PartWriter.finish called twice")
        try:
            return self._finish()
        except BaseException:
            self.abort()
            raise

    def _finish(self) -> WrittenPart:
        fsync = self.settings.fsync
        files: dict[str, Checksum] = {}
        if self._pool is None:
            for col in self._cols:
                files.update(col.finish(self.path, fsync))
        else:
            for result in _results([self._pool.submit(c.finish, self.path, fsync) for c in self._cols]):
                files.update(result)
            self._pool = None

        written = write_part_metadata(
            self.path, files, self.columns, rows=self.rows, marks_count=self.marks_count,
            primary=bytes(self._primary) if self.primary_key else None, partition_value=self.partition_value,
            minmax_columns=self.minmax_columns, minmax=self._minmax, fsync=fsync)
        self._finished = True
        self._closed = True
        return written

    def abort(self) -> None:
        """Stop writing and remove the temporary directory (idempotent)."""
        if self._closed and self._finished:
            return
        self._closed = True
        self._pool = None  # the process's: no job of this writer is left in it (each call waits for its own)
        for col in getattr(self, "_cols", []):
            col.close()
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None or not self._finished:
            self.abort()
