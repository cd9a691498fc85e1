"""The column streams of a Wide part being written (FACTS §5.1): each substream's ``.bin`` (compressed
blocks) and ``.mrk`` (a mark per granule), a column's substreams fed granule by granule, and the settings
that shape the bytes.  :class:`replicad.storage.writer.PartWriter` drives them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.datatypes import DataType
from replicad.datatypes.composite import NullableType
from replicad.datatypes.strings import StringType
from replicad.model.cityhash import BytesLike, file_hash
from replicad.native import _strings
from replicad.storage.checksums import Checksum
from replicad.storage.compression import CompressedStreamWriter
from replicad.storage.part import DATA_EXT, MARKS_EXT, create_file, stream_stem, write_all, write_file
from replicad.storage.reader import fixed_width

__all__ = ["BulkSerializer", "ColumnWriter", "Method", "WriterSettings", "combine_chunks", "is_serialized",
           "plain_checksum"]

Method = Literal["zstd", "lz4", "none"]


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


#: a stream's compressed bytes are held in memory up to this size before its ``.bin`` file is made (then
#: written as they come): a small part's ``.bin`` is created and written whole at its finish, with one open,
#: one write and one close (no file object, no fstat); memory stays bounded by this per stream
SPILL_BYTES = 16384

class _BinFile:
    """The ``.bin`` file of a stream: what :class:`CompressedStreamWriter` writes, held until it passes
    :data:`SPILL_BYTES`, then written through to the file."""

    __slots__ = ("_fd", "_held", "_size", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._held: list[bytes] = []
        self._size = 0
        self._fd = -1

    def write(self, data: BytesLike, /) -> int:
        n = len(data)
        if self._fd < 0:
            if self._size + n <= SPILL_BYTES:
                self._held.append(bytes(data))  # a copy: the compressor reuses its output buffer
                self._size += n
                return n
            self._fd = create_file(self.path)
            held, self._held = b"".join(self._held), []
            write_all(self._fd, held)
        write_all(self._fd, data)
        return n

    def finish(self, fsync: bool) -> None:
        """The file complete on disk (fsynced when ``fsync``), closed."""
        if self._fd < 0:
            held, self._held = b"".join(self._held), []
            write_file(self.path, held, fsync)
            return
        fd, self._fd = self._fd, -1
        try:
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._held = []
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _Stream:
    """One substream: ``<name>.bin`` (compressed blocks) + ``<name>.mrk`` (16 bytes per granule)."""

    __slots__ = ("_bin", "_marks", "_min", "_out", "_sealed", "name")

    def __init__(self, directory: Path, name: str, settings: WriterSettings) -> None:
        self.name = name
        self._bin = _BinFile(os.path.join(directory, name + DATA_EXT))
        self._out = CompressedStreamWriter(
            self._bin, settings.method, settings.level, settings.max_compress_block_size
        )
        self._marks = bytearray()
        self._min = settings.min_compress_block_size
        self._sealed: Checksum | None = None

    def mark(self) -> None:
        """A granule starts here: flush if min_compress_block_size is buffered, then record the mark."""
        self._marks += self._out.mark(self._min)

    def append(self, data: BytesLike) -> None:
        self._out.write(data)

    def seal(self) -> Checksum:
        """The stream's last block compressed: the ``.bin`` checksum is known (its file is made only now
        if it passed :data:`SPILL_BYTES`; otherwise by :meth:`finish`).  Idempotent."""
        if self._sealed is None:
            out = self._out
            out.close()
            self._sealed = Checksum(
                file_size=out.file_size,
                file_hash=out.file_hash,
                is_compressed=True,
                uncompressed_size=out.uncompressed_size,
                uncompressed_hash=out.uncompressed_hash,
            )
        return self._sealed

    def finish(self, directory: Path, fsync: bool) -> dict[str, Checksum]:
        data = self.seal()
        self._bin.finish(fsync)
        marks = bytes(self._marks)
        write_file(os.path.join(directory, self.name + MARKS_EXT), marks, fsync)
        return {self.name + DATA_EXT: data, self.name + MARKS_EXT: plain_checksum(marks)}

    def close(self) -> None:
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


def plain_checksum(data: bytes) -> Checksum:
    return Checksum(file_size=len(data), file_hash=file_hash(data), is_compressed=False,
                    uncompressed_size=0, uncompressed_hash=bytes(16))


def is_serialized(t: pa.DataType) -> bool:
    return bool(pa.types.is_fixed_size_binary(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def combine_chunks(col: pa.Array | pa.ChunkedArray) -> pa.Array:
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


class ColumnWriter:
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
        #: bytes per row of a fixed-width one-stream type (0: variable, or several streams)
        self._width = (fixed_width(dtype.name) or 0) if not raw and dtype.substreams() == [""] else 0
        #: a plain String column (or a Nullable one): a permuted write encodes the rows in order straight
        #: from the input
        suffixes = [p for p, _ in self.pairs]
        self._strings = type(dtype) is StringType and not raw and suffixes == [""]
        self._nullable_strings = (type(dtype) is NullableType and type(dtype.inner) is StringType and not raw
                                  and suffixes == [".null", ""])
        self._sealed = False

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
        whole = self._serialized_whole(arr)
        if whole is not None:  # one serialization of the batch, cut at the segments' byte offsets
            data, starts = whole
            ((_, stream),) = self.pairs
            for start, length, is_mark in segments:
                if is_mark:
                    stream.mark()
                stream.append(data[int(starts[start]):int(starts[start + length])])
            return
        serialize = self._serialize
        pairs = self.pairs
        for start, length, is_mark in segments:
            parts = serialize(arr.slice(start, length))
            for suffix, stream in pairs:
                if is_mark:
                    stream.mark()
                stream.append(parts.get(suffix, b""))

    def _serialized_whole(self, arr: pa.Array) -> tuple[memoryview, Sequence[int] | npt.NDArray[Any]] | None:
        """The serialized bytes of all of ``arr``'s rows and where each row starts in them (one more
        offset: the end), for a one-stream stateless column whose rows serialize one after the other:
        serialized rows (``raw``) and fixed-width types; None for other columns."""
        if self.state is not None or len(self.pairs) != 1 or self.pairs[0][0] != "":
            return None
        n = len(arr)
        if self.raw:
            if pa.types.is_fixed_size_binary(arr.type):
                width = arr.type.byte_width
                return _serialized_rows(arr)[""], range(0, (n + 1) * width, width)
            bufs = arr.buffers()
            dtype = np.dtype(np.int64 if pa.types.is_large_binary(arr.type) else np.int32)
            offsets = np.frombuffer(bufs[1], dtype=dtype, count=n + 1, offset=arr.offset * dtype.itemsize)
            base = int(offsets[0])
            data = memoryview(bufs[2])[base:int(offsets[n])] if bufs[2] is not None else memoryview(b"")
            return data, offsets - base
        width = self._width
        if not width:
            return None
        data = self._serialize(arr).get("", b"")
        if len(data) != n * width:
            return None
        return memoryview(data), range(0, (n + 1) * width, width)

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

    def seal(self) -> dict[str, Checksum]:
        """Every stream's last block compressed (a stateful type's suffix first): the ``.bin`` checksums
        (``<stream>.bin`` → checksum).  Idempotent; :meth:`finish` seals first if this was not called."""
        if not self._sealed:
            if self.state is not None:
                self._append(self.state.suffix())
            self._sealed = True
        return {s.name + DATA_EXT: s.seal() for s in self.streams}

    def finish(self, directory: Path, fsync: bool) -> dict[str, Checksum]:
        self.seal()
        out: dict[str, Checksum] = {}
        for s in self.streams:
            out.update(s.finish(directory, fsync))
        return out

    def close(self) -> None:
        for s in self.streams:
            s.close()
