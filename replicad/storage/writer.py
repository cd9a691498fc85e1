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

import os
import shutil
import struct
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.datatypes.composite import NullableType
from replicad.datatypes.strings import StringType
from replicad.errors import BadInputError
from replicad.model.cityhash import file_hash
from replicad.native import _strings
from replicad.storage.block import prepare_block, sort_indices, sort_table
from replicad.storage.checksums import Checksum, Checksums
from replicad.storage.compression import CompressedStreamWriter
from replicad.storage.part import (
    CHECKSUMS_FILE,
    COLUMNS_FILE,
    COUNT_FILE,
    DATA_EXT,
    MARKS_EXT,
    PARTITION_FILE,
    PRIMARY_INDEX_FILE,
    columns_text,
    fsync_dir,
    minmax_file_name,
    stream_stem,
    write_file,
)

__all__ = [
    "BulkSerializer",
    "PartWriter",
    "WriterSettings",
    "WrittenPart",
    "prepare_block",
    "sort_indices",
    "sort_table",
]

Method = Literal["zstd", "lz4", "none"]
_MARK = struct.Struct("<QQ")
#: a write of fewer rows runs in the caller's thread, column after column
PARALLEL_MIN_ROWS = 8192


@dataclass(frozen=True)
class WriterSettings:
    """MergeTree/insert settings that shape the bytes of a part (ClickHouse names and defaults)."""

    index_granularity: int = 8192
    min_compress_block_size: int = 65536
    max_compress_block_size: int = 1048576
    method: Method = "zstd"
    level: int = 1
    #: fsync every file and the directory before :meth:`PartWriter.finish` returns (``fsync_after_insert``;
    #: off by default, as in ClickHouse: the atomic rename of the finished directory is what keeps a
    #: crashed process from leaving a half-written part under a part name)
    fsync: bool = False
    #: worker threads for columns (0 = one per CPU, at most the number of columns; 1 = no pool)
    threads: int = 0

    def __post_init__(self) -> None:
        if self.index_granularity <= 0:
            raise ValueError("index_granularity must be positive")
        if not 0 < self.min_compress_block_size <= self.max_compress_block_size:
            raise ValueError("need 0 < min_compress_block_size <= max_compress_block_size")
        if self.method not in ("zstd", "lz4", "none"):
            raise ValueError(f"unknown compression method {self.method!r}")


@dataclass(frozen=True)
class WrittenPart:
    """What :meth:`PartWriter.finish` produced (the part is still in its temporary directory)."""

    path: Path
    rows: int
    marks_count: int
    checksums: Checksums
    columns_text: str
    bytes_on_disk: int


class _Stream:
    """One substream: ``<name>.bin`` (compressed blocks) + ``<name>.mrk`` (16 bytes per granule)."""

    __slots__ = ("_bin", "_marks", "_min", "_out", "name")

    def __init__(self, directory: Path, name: str, settings: WriterSettings) -> None:
        self.name = name
        self._bin = open(directory / (name + DATA_EXT), "wb", buffering=0)
        self._out = CompressedStreamWriter(
            self._bin, settings.method, settings.level, settings.max_compress_block_size
        )
        self._marks = bytearray()
        self._min = settings.min_compress_block_size

    def mark(self) -> None:
        """A granule starts here: flush if min_compress_block_size is buffered, then record the mark."""
        out = self._out
        if out.offset_in_block >= self._min:
            out.flush_block()
        self._marks += _MARK.pack(out.compressed_offset, out.offset_in_block)

    def append(self, data: bytes) -> None:
        self._out.write(data)

    def finish(self, directory: Path, fsync: bool) -> dict[str, Checksum]:
        out = self._out
        out.close()
        if fsync:
            os.fsync(self._bin.fileno())
        self._bin.close()
        marks = bytes(self._marks)
        write_file(directory / (self.name + MARKS_EXT), marks, fsync)
        return {
            self.name + DATA_EXT: Checksum(
                file_size=out.file_size,
                file_hash=out.file_hash,
                is_compressed=True,
                uncompressed_size=out.uncompressed_size,
                uncompressed_hash=out.uncompressed_hash,
            ),
            self.name + MARKS_EXT: _plain_checksum(marks),
        }

    def close(self) -> None:
        if not self._bin.closed:
            self._bin.close()


def _serialized_rows(arr: pa.Array) -> dict[str, memoryview]:
    """The bytes of serialized rows (``fixed_size_binary``: one value per row; ``binary``: one row's
    serialization per value), as a view of the array's buffer (no copy)."""
    n = len(arr)
    buffers = arr.buffers()
    if pa.types.is_fixed_size_binary(arr.type):
        width = arr.type.byte_width
        data = buffers[1]
        return {"": memoryview(data)[arr.offset * width:(arr.offset + n) * width] if data is not None
                else memoryview(b"")}
    dtype = np.dtype(np.int64 if pa.types.is_large_binary(arr.type) else np.int32)
    offsets = np.frombuffer(buffers[1], dtype=dtype, count=n + 1, offset=arr.offset * dtype.itemsize)
    data = buffers[2]
    if data is None or offsets[n] == offsets[0]:
        return {"": memoryview(b"")}
    return {"": memoryview(data)[int(offsets[0]):int(offsets[n])]}


def _plain_checksum(data: bytes) -> Checksum:
    return Checksum(file_size=len(data), file_hash=file_hash(data), is_compressed=False,
                    uncompressed_size=0, uncompressed_hash=bytes(16))


def _is_serialized(t: pa.DataType) -> bool:
    return bool(pa.types.is_fixed_size_binary(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _combine(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


class BulkSerializer(Protocol):
    """Per-part serialization state of a stateful type (LowCardinality's shared dictionary).

    A ``DataType`` with a ``bulk_serializer()`` method returning this is written through it:
    ``prefix()`` before the first mark (ClickHouse's serializeBinaryBulkStatePrefix), ``serialize()``
    once per granule piece, in order, and ``suffix()`` after the last row (serializeBinaryBulkStateSuffix).
    Each returns bytes per substream suffix.  Stateless types just use ``DataType.serialize``.
    """

    def prefix(self) -> dict[str, bytes]: ...

    def serialize(self, arr: pa.Array) -> dict[str, bytes]: ...

    def suffix(self) -> dict[str, bytes]: ...


class _Column:
    """A column's streams and how to feed them one batch at a time.

    A stream already owned by an earlier column (the shared array sizes of Nested columns, e.g.
    ``n.size0`` of ``n.a`` and ``n.b``) is written by that column only, as ClickHouse does.
    """

    def __init__(self, directory: Path, name: str, dtype: DataType, settings: WriterSettings,
                 taken: set[str], raw: bool = False) -> None:
        self.name = name
        self.dtype = dtype
        #: rows arrive serialized (PartReader.read_granules' ``raw``): written as they are
        self.raw = raw
        self.pairs: list[tuple[str, _Stream]] = []
        for suffix in dtype.substreams():
            stem = stream_stem(name, suffix)
            if stem in taken:
                continue
            taken.add(stem)
            self.pairs.append((suffix, _Stream(directory, stem, settings)))
        self.streams = [s for _, s in self.pairs]
        make_state = getattr(dtype, "bulk_serializer", None)
        self.state: BulkSerializer | None = make_state() if make_state is not None else None
        self._serialize: Any = self.state.serialize if self.state is not None else dtype.serialize
        if raw:
            if self.state is not None or dtype.substreams() != [""]:
                raise ValueError(f"column {name}: {dtype.name} cannot be written from serialized rows")
            self._serialize = _serialized_rows
        if self.state is not None:
            self._append(self.state.prefix())
        #: a plain String column (or a Nullable one): a permuted write encodes the rows in order straight
        #: from the input
        suffixes = [p for p, _ in self.pairs]
        self._strings = type(dtype) is StringType and not raw and suffixes == [""]
        self._nullable_strings = (type(dtype) is NullableType and type(dtype.inner) is StringType and not raw
                                  and suffixes == [".null", ""])

    def _append(self, parts: Mapping[str, bytes]) -> None:
        for suffix, stream in self.pairs:
            stream.append(parts.get(suffix, b""))

    def write(
        self, arr: pa.Array, segments: Sequence[tuple[int, int, bool]], order: pa.Array | None = None
    ) -> None:
        """Serialize ``arr`` (permuted by ``order`` first, if given) segment by segment (a segment = the
        rows of one granule in this batch)."""
        if order is not None:
            if self._strings and arr.type == pa.binary() and not arr.null_count:
                self._write_strings_taken(arr, segments, order)
                return
            if self._nullable_strings and arr.type == pa.binary() and self._write_nullable_strings_taken(
                    arr, segments, order):
                return
            arr = arr.take(order)
        serialize = self._serialize
        pairs = self.pairs
        for start, length, is_mark in segments:
            parts = serialize(arr.slice(start, length))
            for suffix, stream in pairs:
                if is_mark:
                    stream.mark()
                stream.append(parts.get(suffix, b""))

    def _write_strings_taken(self, arr: pa.Array, segments: Sequence[tuple[int, int, bool]],
                             order: pa.Array) -> None:
        """:meth:`write` of a String column permuted by ``order``: each segment's stream is encoded from the
        rows it takes (:func:`replicad.native._strings.encode_take`), the same bytes as taking the rows
        first and encoding them, without the permuted copy of the column."""
        n = len(arr)
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
        data = bufs[2] if bufs[2] is not None else b""
        idx = np.ascontiguousarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)
        ((_, stream),) = self.pairs
        for start, length, is_mark in segments:
            if is_mark:
                stream.mark()
            stream.append(_strings.encode_take(offsets, data, idx[start:start + length]))

    def _write_nullable_strings_taken(self, arr: pa.Array, segments: Sequence[tuple[int, int, bool]],
                                      order: pa.Array) -> bool:
        """:meth:`_write_strings_taken` of a Nullable(String) column: the null map taken with numpy, the
        strings encoded from the input rows.  Only when every NULL row stores an empty string (as inserts
        make them; a take would drop what a NULL row stores): False, nothing written, otherwise."""
        n = len(arr)
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
        if arr.null_count and np.diff(offsets)[nulls].any():
            return False
        data = bufs[2] if bufs[2] is not None else b""
        idx = np.ascontiguousarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)
        null_map = nulls.view(np.uint8)
        (_, null_stream), (_, stream) = self.pairs
        for start, length, is_mark in segments:
            taken = idx[start:start + length]
            if is_mark:
                null_stream.mark()
            null_stream.append(null_map[taken].tobytes())
            if is_mark:
                stream.mark()
            stream.append(_strings.encode_take(offsets, data, taken))
        return True

    def finish(self, directory: Path, fsync: bool) -> dict[str, Checksum]:
        if self.state is not None:
            self._append(self.state.suffix())
        out: dict[str, Checksum] = {}
        for s in self.streams:
            out.update(s.finish(directory, fsync))
        return out

    def close(self) -> None:
        for s in self.streams:
            s.close()


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
        self._cols: list[_Column] = []
        #: made by the first write of PARALLEL_MIN_ROWS rows or more: a small part is written by this thread
        #: alone (starting threads and handing work over would cost more than the work)
        self._pool: ThreadPoolExecutor | None = None  # before abort() can run
        taken: set[str] = set()
        try:
            for name, dtype in self.columns:
                raw = name in self.raw_columns
                self._cols.append(_Column(self.path, name, dtype, self.settings, taken, raw))
        except BaseException:
            self.abort()
            raise
        threads = self.settings.threads or (os.cpu_count() or 1)
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
        arrays: dict[str, pa.Array] = {}
        for name, dtype in self.columns:
            idx = batch.schema.get_field_index(name)
            if idx < 0:
                raise BadInputError(f"column {name}: missing from the block being written")
            arr = _combine(batch.column(idx))
            if name in self.raw_columns:
                if not _is_serialized(arr.type):
                    raise BadInputError(f"column {name}: serialized rows expected, not {arr.type}")
            elif arr.type != dtype.arrow_type:
                raise BadInputError(
                    f"column {name}: storage type {arr.type} does not match {dtype.name} ({dtype.arrow_type})"
                )
            arrays[name] = arr
        segments = self._segments(n)
        if self._pool is None and self._threads > 1 and n >= PARALLEL_MIN_ROWS:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="part-writer")

        if self._pool is None:
            for col in self._cols:
                col.write(arrays[col.name], segments, perm)
        else:
            futures: list[Future[None]] = [
                self._pool.submit(col.write, arrays[col.name], segments, perm) for col in self._cols
            ]
            self._index_and_minmax(arrays, key_arrays, segments, n, perm)
            errors = [f.exception() for f in futures]
            for e in errors:
                if e is not None:
                    raise e
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
                    arr = _combine(given)
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
            for result in self._pool.map(lambda c: c.finish(self.path, fsync), self._cols):
                files.update(result)
            self._pool.shutdown(wait=True)
            self._pool = None

        def put(name: str, data: bytes) -> None:
            write_file(self.path / name, data, fsync)
            files[name] = _plain_checksum(data)

        if self.primary_key:
            put(PRIMARY_INDEX_FILE, bytes(self._primary))
        if self.partition_value is not None:
            put(PARTITION_FILE, b"".join(
                t.serialize_value(pa.array([v], t.arrow_type), 0) for t, v in self.partition_value
            ))
            if self.rows:
                for c in self.minmax_columns:
                    t = self._types[c]
                    lo, hi = self._minmax[c]
                    pair = pa.array([lo, hi], t.arrow_type)
                    put(minmax_file_name(c), t.serialize_value(pair, 0) + t.serialize_value(pair, 1))
            put(COUNT_FILE, str(self.rows).encode())
        elif self.minmax_columns:
            raise ValueError("minmax_columns given without a partition_value")
        else:
            put(COUNT_FILE, str(self.rows).encode())

        text = columns_text(self.columns)
        text_bytes = text.encode("utf-8")
        write_file(self.path / COLUMNS_FILE, text_bytes, fsync)
        checksums = Checksums(files=files)
        checksums_bytes = checksums.to_bytes()
        write_file(self.path / CHECKSUMS_FILE, checksums_bytes, fsync)
        if fsync:
            fsync_dir(self.path)
        self._finished = True
        self._closed = True
        # every file of the (fresh) directory is one of these: no stat of each
        size = sum(c.file_size for c in files.values()) + len(text_bytes) + len(checksums_bytes)
        return WrittenPart(self.path, self.rows, self.marks_count, checksums, text, size)

    def abort(self) -> None:
        """Stop writing and remove the temporary directory (idempotent)."""
        if self._closed and self._finished:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
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
