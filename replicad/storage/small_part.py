"""A part held whole in memory, written in one go (an insert block's part): the same files and bytes as
:class:`replicad.storage.writer.PartWriter`, without its streaming machinery.

:class:`SmallPartWriter` serializes each column once (permuted by the ORDER BY as PartWriter's
writeWithPermutation does) and hands every stream to one native call (native/wholepart.c) that cuts its
compressed blocks as PartWriter's streams cut them (before each granule, the pending bytes become a block
if there are min_compress_block_size of them; a block at every max_compress_block_size bytes), compresses
them, hashes the file and the plain bytes, and makes the marks, where PartWriter builds a stream, a block
writer and two running hashes per substream and feeds them granule by granule (~0.3 ms of a 100-row,
6-column part's ~0.5 ms; ~4 ms of a 10,000-row part's ~7 ms).  Without the system's compression library the
same streams are cut and compressed in Python (:class:`CompressedStreamWriter`).

Stateful serializations (LowCardinality) and serialized-row columns (a merge's) are left to PartWriter, as
are blocks of more than :data:`SMALL_PART_MAX_BYTES`: :func:`small_part_fits` says which parts this writer
takes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.datatypes.composite import NullableType
from replicad.datatypes.dates import DateTimeType, DateType
from replicad.datatypes.numeric import FloatType, IntType
from replicad.datatypes.strings import StringType
from replicad.native import _strings
from replicad.native._files import write_files
from replicad.native._wholepart import seal_streams
from replicad.storage.checksums import Checksum
from replicad.storage.column_writer import WriterSettings, combine_chunks, plain_checksum
from replicad.storage.compression import (
    METHOD_LZ4,
    METHOD_NONE,
    METHOD_ZSTD,
    CompressedStreamWriter,
)
from replicad.storage.fresh_files import MAX_PART_BYTES as FRESH_PART_BYTES
from replicad.storage.part import DATA_EXT, MARKS_EXT, stream_stem
from replicad.storage.prepared_dirs import PreparedDirs
from replicad.storage.reader import fixed_width
from replicad.storage.written_part import WrittenPart, closing_files, storage_arrays, written_part

__all__ = ["SmallPartWriter", "small_part_fits"]

#: a block of more Arrow bytes goes to PartWriter (which holds ~a compressed block per stream, where this
#: writer holds every column serialized and compressed until the files are made): a few granule-sized rows
#: of huge values keep PartWriter's memory bound
SMALL_PART_MAX_BYTES = 4 << 20


def small_part_fits(columns: Sequence[tuple[str, DataType]], rows: int, nbytes: int = 0) -> bool:
    """Whether :class:`SmallPartWriter` writes this part: rows (any number of granules) of at most
    :data:`SMALL_PART_MAX_BYTES` (``nbytes``: the block's Arrow size), no stateful column."""
    return 0 < rows and nbytes <= SMALL_PART_MAX_BYTES and all(
        getattr(dtype, "bulk_serializer", None) is None for _n, dtype in columns)


class _Sink:
    """The ``.bin`` bytes of a substream longer than one block (what CompressedStreamWriter writes)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any, /) -> int:
        self.parts.append(bytes(data))
        return len(data)


class SmallPartWriter:
    """PartWriter's face for a part held whole in memory (:func:`small_part_fits`): :meth:`write` once
    (the rows, or ``order`` into them), :meth:`seal` (the ``.bin`` checksums), :meth:`finish` (the files).
    On an exception in them, or leaving a ``with`` block unfinished, the temporary directory is removed."""

    def __init__(
        self,
        tmp_dir: str | os.PathLike[str],
        columns: Sequence[tuple[str, DataType]],
        settings: WriterSettings,
        *,
        primary_key: Sequence[str] = (),
        key_types: Mapping[str, DataType] | None = None,
        minmax_columns: Sequence[str] = (),
        partition_value: Sequence[tuple[DataType, object]] | None = None,
        prepared: PreparedDirs | None = None,
    ) -> None:
        self.path = Path(tmp_dir)
        #: where a directory holding the part's files, made ahead, may be taken instead of making ``tmp_dir``
        self.prepared = prepared
        self.settings = settings
        self.columns = list(columns)
        self._types = dict(self.columns)
        if len(self._types) != len(self.columns):
            raise ValueError("duplicate column names")
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
        self.rows = 0
        self.marks_count = 0
        self._primary = b""
        self._minmax: dict[str, tuple[Any, Any]] = {}
        #: (stream stem, .bin bytes, .bin checksum, .mrk bytes), in column and substream order
        self._streams: list[tuple[str, bytes, Checksum, bytes]] = []
        self._written = False
        self._closed = False
        # the directory is made with the files (finish): a system call less before the block id is known

    # ---- writing -------------------------------------------------------------------------------------

    def write(
        self,
        batch: pa.RecordBatch | pa.Table,
        key_arrays: Mapping[str, pa.Array | pa.ChunkedArray] | None = None,
        *,
        order: npt.NDArray[np.int64] | pa.Array | None = None,
    ) -> None:
        """All the part's rows (storage Arrow), in ORDER BY order or permuted by ``order`` (as PartWriter)."""
        if self._written or self._closed:
            raise RuntimeError("SmallPartWriter takes one write")
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
        idx: npt.NDArray[np.int64] | None = None
        perm: pa.Array | None = None
        if order is not None:
            if isinstance(order, pa.Array):
                perm = order
                idx = np.ascontiguousarray(order.to_numpy(zero_copy_only=False), dtype=np.int64)
            else:
                idx = np.ascontiguousarray(order, dtype=np.int64)
        n = batch.num_rows if idx is None else len(idx)
        if n < 1:
            raise ValueError("SmallPartWriter writes 1 row or more")
        arrays = storage_arrays(batch, self.columns)
        method = _METHOD_BYTES.get(self.settings.method)
        if method is None or not self._seal_natively(arrays, idx, perm, method, n):
            for name, dtype, stems in self._stems():
                pieces = _granule_pieces(dtype, arrays[name], idx, self.settings.index_granularity, n)
                for suffix, stem in stems:
                    self._streams.append(self._stream(stem, [p.get(suffix, b"") for p in pieces]))
        granule = self.settings.index_granularity
        firsts = [g if idx is None else int(idx[g]) for g in range(0, n, granule)]
        keys: list[tuple[DataType, pa.Array]] = []
        for k in self.primary_key:
            arr = arrays.get(k)
            if arr is None:
                given = key_arrays.get(k)
                if given is None:
                    raise ValueError(f"primary key expression {k!r}: no key array given")
                arr = combine_chunks(given)
                if len(arr) != batch.num_rows:
                    raise ValueError(f"primary key array {k!r} has {len(arr)} rows, the batch does not")
            keys.append((self._key_types[k], arr))
        primary = bytearray()
        for row in firsts:  # the first row of each granule, key column after key column
            for key_type, arr in keys:
                primary += key_type.serialize_value(arr, row)
        self._primary = bytes(primary)
        self.marks_count = len(firsts)
        for c in self.minmax_columns:
            values = arrays[c]
            if perm is not None and len(perm) != len(values):
                values = values.take(perm)
            bounds = _min_max(values)
            if bounds is not None:
                self._minmax[c] = bounds
        self.rows = n
        self._written = True

    def _stems(self) -> list[tuple[str, DataType, list[tuple[str, str]]]]:
        """Each column with the (substream suffix, stream stem) pairs it writes: a stream shared with an
        earlier column (Nested sizes) is written once, by the first."""
        taken: set[str] = set()
        out = []
        for name, dtype in self.columns:
            stems = []
            for suffix in dtype.substreams():
                stem = stream_stem(name, suffix)
                if stem not in taken:
                    taken.add(stem)
                    stems.append((suffix, stem))
            if stems:
                out.append((name, dtype, stems))
        return out

    def _seal_natively(self, arrays: Mapping[str, pa.Array], idx: npt.NDArray[np.int64] | None,
                       perm: pa.Array | None, method: int, rows: int) -> bool:
        """Every stream serialized, cut into blocks, compressed and hashed, its marks made, by one native
        call (native/wholepart.c): the String and fixed-width columns' rows permuted there, the other
        columns' serialized here first.  False (nothing done) when the system's compression library cannot
        be loaded."""
        s = self.settings
        stems: list[str] = []
        specs: list[tuple[int, Any, Any]] = []
        for name, dtype, pairs in self._stems():
            given = _native_streams(dtype, arrays[name], idx, perm, s.index_granularity)
            for suffix, stem in pairs:
                stems.append(stem)
                specs.append(given.get(suffix, _EMPTY_STREAM))
        try:
            sealed = seal_streams(specs, idx, method, s.level, s.max_compress_block_size, rows,
                                  s.index_granularity, s.min_compress_block_size)
        except OSError:
            return False
        for stem, (body, body_hash, size, plain_hash, marks) in zip(stems, sealed, strict=True):
            self._streams.append((stem, body, Checksum(
                file_size=len(body), file_hash=body_hash, is_compressed=True, uncompressed_size=size,
                uncompressed_hash=plain_hash), marks))
        return True

    def _stream(self, stem: str, pieces: Sequence[bytes | memoryview]) -> tuple[str, bytes, Checksum, bytes]:
        """A stream cut, compressed and marked in Python: ``pieces`` are its granules' serialized rows."""
        s = self.settings
        sink = _Sink()
        out = CompressedStreamWriter(sink, s.method, s.level, s.max_compress_block_size)
        marks = bytearray()
        for piece in pieces:
            marks += out.mark(s.min_compress_block_size)
            out.write(piece)
        out.close()
        return stem, b"".join(sink.parts), Checksum(
            file_size=out.file_size, file_hash=out.file_hash, is_compressed=True,
            uncompressed_size=out.uncompressed_size, uncompressed_hash=out.uncompressed_hash), bytes(marks)

    # ---- finishing -----------------------------------------------------------------------------------

    def seal(self) -> dict[str, Checksum]:
        """The part's ``.bin`` checksums (``<stream>.bin`` → checksum), hence its block id; no file made."""
        if not self._written or self._closed:
            raise RuntimeError("SmallPartWriter.seal before write, or after finish")
        return {stem + DATA_EXT: checksum for stem, _b, checksum, _m in self._streams}

    def finish(self) -> WrittenPart:
        """The part's files in its temporary directory; its description."""
        if not self._written or self._closed:
            raise RuntimeError("SmallPartWriter.finish before write, or twice")
        try:
            files: dict[str, Checksum] = {}
            out: list[tuple[str, bytes]] = []
            for stem, body, checksum, marks in self._streams:
                out += ((stem + DATA_EXT, body), (stem + MARKS_EXT, marks))
                files[stem + DATA_EXT] = checksum
                files[stem + MARKS_EXT] = (_MARK_CHECKSUM if marks == _FIRST_MARK
                                           else plain_checksum(marks))
            closing, text, checksums = closing_files(
                files, self.columns, rows=self.rows, primary=self._primary if self.primary_key else None,
                partition_value=self.partition_value, minmax_columns=self.minmax_columns, minmax=self._minmax)
            every = out + closing
            self._write_files(every)
            size = sum(len(data) for _n, data in every)
            written = written_part(self.path, checksums, closing, text, rows=self.rows,
                                   marks_count=self.marks_count,
                                   files=tuple(every) if size <= FRESH_PART_BYTES else ())
        except BaseException:
            self.abort()
            raise
        self._closed = True
        return written

    def _write_files(self, entries: list[tuple[str, bytes]]) -> None:
        """The directory and every file in one native call (the GIL let go once, not at each of ~50 system
        calls); into a directory made ahead when one holds these files (``self.path`` becomes it)."""
        ready = (self.prepared.take((name for name, _d in entries), self.path.parent)
                 if self.prepared is not None else None)
        if ready is not None:
            planned, self.path = self.path, ready  # from here, a failure removes the taken directory
            try:
                write_files(ready, entries, self.settings.fsync, False, True)
                return
            except FileNotFoundError as e:
                if e.filename != str(ready):
                    raise
                self.path = planned  # removed meanwhile (a temporary-directory cleanup): make one as before
        try:
            write_files(self.path, entries, self.settings.fsync, True)
        except (FileExistsError, FileNotFoundError) as e:
            if e.filename != str(self.path):
                raise
            self._make_dir()  # a leftover of the name, or no parent directory: as PartWriter
            write_files(self.path, entries, self.settings.fsync)

    def _make_dir(self) -> None:
        """The part's directory as PartWriter makes it: with its parents; an empty one of the name is used
        as it is, a leftover with files in it replaced."""
        try:
            self.path.mkdir(parents=True)
        except FileExistsError:
            if any(self.path.iterdir()):
                shutil.rmtree(self.path)
                self.path.mkdir()

    def abort(self) -> None:
        """Stop and remove the temporary directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._streams = []
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> SmallPartWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None or not self._closed:
            self.abort()


#: the one mark of a one-granule substream (compressed offset 0, offset in the block 0), and its checksum
_FIRST_MARK = bytes(16)
_MARK_CHECKSUM = plain_checksum(_FIRST_MARK)


#: seal_streams' method byte of each method it compresses with (others: BlockCompressor)
_METHOD_BYTES = {"none": METHOD_NONE, "lz4": METHOD_LZ4, "zstd": METHOD_ZSTD}
_RAW, _FIXED, _STRING, _NARROW_4_2, _NARROW_8_4 = 0, 1, 2, 3, 4
_EMPTY_STREAM = (_RAW, b"", 0)


def _native_streams(dtype: DataType, arr: pa.Array, idx: npt.NDArray[np.int64] | None,
                    perm: pa.Array | None, granule: int) -> Mapping[str, tuple[int, Any, Any]]:
    """seal_streams' description of the column's substreams (suffix → (kind, a, b)): a String column
    without NULLs as its Arrow buffers (serialized, and permuted by ``idx``, natively), a fixed-width column
    as its serialized rows, a Nullable(String) whose NULL rows store "" as its null map and buffers; any
    other column taken (permuted) and serialized here, granule by granule (:func:`_raw_streams`)."""
    strings = _plain_strings(dtype, arr)
    if strings is not None:
        return {"": (_STRING, *strings)}
    rows = _plain_rows(dtype, arr)
    if rows is not None:
        return {"": rows}
    nullable = _nullable_strings(dtype, arr)
    if nullable is not None:
        nulls, offsets, data = nullable
        return {".null": (_FIXED, nulls, 1), "": (_STRING, offsets, data)}
    fixed = _fixed_rows(dtype, arr)
    if fixed is not None:
        return {"": (_FIXED, *fixed)}
    return _raw_streams(dtype, arr if idx is None else _taken_array(arr, idx, perm), granule)


def _raw_streams(dtype: DataType, rows: pa.Array, granule: int) -> Mapping[str, tuple[int, Any, Any]]:
    """The rows (in the part's order) serialized granule by granule, as PartWriter's column writer
    serializes them, as RAW streams with where each granule starts (0: one granule)."""
    n = len(rows)
    if n <= granule:
        return {suffix: (_RAW, data, 0) for suffix, data in dtype.serialize(rows).items()}
    pieces = _granule_pieces(dtype, rows, None, granule, n)
    out: dict[str, tuple[int, Any, Any]] = {}
    for suffix in dtype.substreams():
        parts = [p.get(suffix, b"") for p in pieces]
        starts = np.zeros(len(parts), dtype=np.int64)
        np.cumsum([len(x) for x in parts[:-1]], out=starts[1:])
        out[suffix] = (_RAW, b"".join(parts), starts)
    return out


def _granule_pieces(dtype: DataType, arr: pa.Array, idx: npt.NDArray[np.int64] | None, granule: int,
                    rows: int) -> list[Mapping[str, bytes | memoryview]]:
    """(the Python path) each granule's serialized rows per substream suffix."""
    return [dtype.serialize(arr.slice(g, granule)) if idx is None
            else _serialized(dtype, arr, idx[g:g + granule]) for g in range(0, rows, granule)]


def _min_max(values: pa.Array) -> tuple[Any, Any] | None:
    """The least and the greatest value (None: no value): of an integer, date32 or timestamp column without
    NULLs as ints by numpy (what pa.array makes the same values of again), else by pyarrow."""
    t = values.type
    if not values.null_count and len(values):
        if pa.types.is_integer(t):
            ints = values.to_numpy()
        elif pa.types.is_date32(t) or pa.types.is_timestamp(t):
            ints = values.view(pa.int32() if pa.types.is_date32(t) else pa.int64()).to_numpy()
        else:
            ints = None
        if ints is not None:
            return int(ints.min()), int(ints.max())
    mm = pc.min_max(values)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return None if lo is None else (lo, hi)


def _plain_rows(dtype: DataType, arr: pa.Array) -> tuple[int, Any, int] | None:
    """seal_streams' description of a column without NULLs whose Arrow values are its serialized rows
    (Int*, UInt*, Float*), or their low bytes (Date: date32 days, DateTime: timestamp[s] seconds): the
    Arrow buffer itself, no serialization here.  None for other columns."""
    kind = type(dtype)
    if arr.null_count or arr.type != dtype.arrow_type:
        return None
    if kind is IntType or kind is FloatType:
        width = arr.type.bit_width // 8
        return _FIXED, _values(arr, width), width
    if kind is DateType:
        return _NARROW_4_2, _values(arr, 4), 0
    if kind is DateTimeType:
        return _NARROW_8_4, _values(arr, 8), 0
    return None


def _values(arr: pa.Array, width: int) -> memoryview:
    start = arr.offset * width
    return memoryview(arr.buffers()[1])[start:start + len(arr) * width]


def _serialized(dtype: DataType, arr: pa.Array, idx: npt.NDArray[np.int64]
                ) -> Mapping[str, bytes | memoryview]:
    """The column's rows ``idx`` serialized per substream suffix: what PartWriter's column writer appends for
    them."""
    strings = _plain_strings(dtype, arr)
    if strings is not None:
        return {"": _strings.encode_take(*strings, idx)}
    nullable = _nullable_strings(dtype, arr)
    if nullable is not None:
        nulls, offsets, data = nullable
        return {".null": nulls[idx].tobytes(), "": _strings.encode_take(offsets, data, idx)}
    fixed = _fixed_rows(dtype, arr)
    if fixed is not None:  # rows one after another: permute the rows' bytes
        plain, width = fixed
        return {"": np.frombuffer(plain, dtype=np.dtype((np.void, width)))[idx].tobytes()}
    return dtype.serialize(_taken_array(arr, idx, None))


def _plain_strings(dtype: DataType, arr: pa.Array) -> tuple[npt.NDArray[np.int32], Any] | None:
    """A String column without NULLs: its Arrow offsets and data; else None."""
    if type(dtype) is StringType and arr.type == pa.binary() and not arr.null_count:
        return _string_buffers(arr)
    return None


def _nullable_strings(dtype: DataType, arr: pa.Array
                      ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int32], Any] | None:
    """A Nullable(String) column whose NULL rows store "": its null map (a byte a row) and Arrow offsets and
    data; else None (such a column whose NULL rows store bytes is serialized from a take)."""
    if not (type(dtype) is NullableType and type(dtype.inner) is StringType and arr.type == pa.binary()
            and dtype.substreams() == [".null", ""]):
        return None
    offsets, data = _string_buffers(arr)
    nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    if arr.null_count and np.diff(offsets)[nulls].any():
        return None
    return nulls.view(np.uint8), offsets, data


def _fixed_rows(dtype: DataType, arr: pa.Array) -> tuple[bytes | memoryview, int] | None:
    """A one-stream fixed-width column serialized as rows one after another: (the rows, bytes a row);
    else None."""
    width = fixed_width(dtype.name) if dtype.substreams() == [""] else None
    if not width:
        return None
    plain = dtype.serialize(arr).get("", b"")
    return (plain, width) if len(plain) == len(arr) * width else None


def _taken_array(arr: pa.Array, idx: npt.NDArray[np.int64], perm: pa.Array | None) -> pa.Array:
    """The column's rows ``idx`` (``perm`` when given as Arrow: the same rows)."""
    return arr.take(perm if perm is not None else pa.array(idx, pa.int64()))


def _string_buffers(arr: pa.Array) -> tuple[npt.NDArray[np.int32], Any]:
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    return offsets, bufs[2] if bufs[2] is not None else b""
