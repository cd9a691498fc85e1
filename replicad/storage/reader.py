"""Read the columns of a part into storage Arrow, granule range by granule range.

Reads what ClickHouse 18.16 writes (Wide, ``.mrk`` marks: two UInt64 per granule, granules of
``index_granularity`` rows) and what current ClickHouse writes:

* Wide parts with adaptive granularity (``.mrk2``: three UInt64 per granule — offsets and row count — plus
  a final mark) and compressed marks (``.cmrk``/``.cmrk2``: the same bytes in compressed blocks); stream
  files named by a hash when the name is long (:func:`file_stem`);
* Compact parts (``data.bin`` with ``data.mrk3``/``.cmrk3``/``.mrk4``/``.cmrk4``:
  :mod:`replicad.storage.compact`);
* the serialization variants of ``serialization.json`` — String size streams, Sparse columns
  (:mod:`replicad.storage.serialization`) — and the column codecs (:mod:`replicad.storage.codecs`).

The primary index (``primary.idx`` or ``primary.cidx``) is not needed to read; projections (``*.proj/``)
are not read; rows a lightweight DELETE marked in ``_row_exists`` are left out.  What cannot be read is
refused with :class:`UnsupportedPartFormatError` naming it.  :func:`incompatibilities_with_18_16` lists
why 18.16 could not load a part.

Memory is bounded by the batch: :meth:`PartReader.iter_batches` decompresses only the blocks that
hold the requested granules (found through the marks), read from the ``.bin`` with ``pread``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.datatypes import DataType, parse_type
from replicad.datatypes.composite import filter_rows
from replicad.errors import CorruptedDataError, MetadataMismatchError, UnsupportedPartFormatError
from replicad.model.siphash import siphash128
from replicad.native import _strings
from replicad.native._partread import read_whole_streams
from replicad.storage.compact import CompactData, CompactMarks, find_marks
from replicad.storage.compressed_file import CompressedFile
from replicad.storage.compression import decompress_all
from replicad.storage.part import DATA_EXT, PartDirectory, stream_stem
from replicad.storage.serialization import (
    SPARSE_SUFFIX,
    SerializationInfo,
    SparseType,
    deserialize_sequential,
    serialization_of,
    sparse_granule_rows,
)
from replicad.storage.whole_stream import WholeStream

_FIXED_WIDTHS = {
    "Int8": 1, "UInt8": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4, "Int64": 8, "UInt64": 8,
    "Float32": 4, "Float64": 8, "Date": 2, "DateTime": 4, "UUID": 16, "Decimal32": 4, "Decimal64": 8,
    "Decimal128": 16, "Enum8": 1, "Enum16": 2,
}
_READ_GRANULES = 16  # granules decoded at once by PartReader.read
ROW_EXISTS = "_row_exists"  # the mask column of current ClickHouse's lightweight DELETE
#: columns current ClickHouse may store in a part besides the table's (never read as data)
SYSTEM_COLUMNS = frozenset({ROW_EXISTS, "_block_number", "_block_offset"})
_NAME_HEAD = re.compile(r"^([A-Za-z0-9]+)(?:\((.*)\))?$", re.S)


def fixed_width(type_name: str) -> int | None:
    """Bytes per row of a type's main stream, or None if variable (String, Array ...)."""
    m = _NAME_HEAD.match(type_name)
    if not m:
        return None
    head, args = m.group(1), m.group(2)
    if head == "Nullable" and args is not None:
        return fixed_width(args.strip())
    if head == "FixedString" and args is not None:
        return int(args)
    if head == "Decimal" and args is not None:
        precision = int(args.split(",")[0])
        return 4 if precision <= 9 else 8 if precision <= 18 else 16
    return _FIXED_WIDTHS.get(head)


def substream_width(type_name: str, suffix: str) -> int | None:
    """Bytes per row of one substream when it is fixed width (``.null`` 1, ``.size0`` 8, main stream)."""
    if suffix == ".null":
        return 1
    if suffix == ".size0":
        return 8
    if suffix == "":
        return fixed_width(type_name)
    return None


@dataclass(frozen=True)
class _Layout:
    marks_ext: str  # ".mrk", ".mrk2", ".cmrk" or ".cmrk2"; Compact: "data.mrk3" ... "data.cmrk4"
    mark_width: int  # UInt64s per mark: 2 (offsets) or 3 (offsets + rows, adaptive granularity)
    compact: CompactMarks | None = None

    @property
    def adaptive(self) -> bool:
        return self.mark_width == 3 or self.compact is not None

    @property
    def compressed(self) -> bool:
        return self.marks_ext.startswith((".c", "data.c"))


_MARK_LAYOUTS = {".mrk": _Layout(".mrk", 2), ".mrk2": _Layout(".mrk2", 3),
                 ".cmrk": _Layout(".cmrk", 2), ".cmrk2": _Layout(".cmrk2", 3)}


def detect_layout(part: PartDirectory, columns: Mapping[str, DataType], files: set[str],
                  info: SerializationInfo) -> _Layout:
    """The marks layout of a part (Wide: checked for the ``columns`` to be read; or Compact), from its file
    names and serialization.

    ``primary.cidx`` does not matter for reading column data.
    """
    name = part.name
    compact = find_marks(files)
    if compact is not None:
        return _Layout(compact.file, 3, compact)
    first = next(iter(columns.items()), None)
    if first is None:
        return _MARK_LAYOUTS[".mrk"]
    stem = file_stem(files, stream_stem(first[0], serialization_of(first[0], first[1], info).substreams()[0]))
    for ext, layout in _MARK_LAYOUTS.items():
        if stem + ext in files:
            return layout
    raise CorruptedDataError(f"part {name}: no marks file for stream {stem}")


def file_stem(files: set[str], stem: str) -> str:
    """The file stem of a stream: its escaped name, or, when current ClickHouse shortened a long name
    (``replace_long_file_name_to_hash``, names over ``max_file_name_length``), the hex SipHash-128 of it."""
    if stem + DATA_EXT in files:
        return stem
    hashed = siphash128(stem.encode("utf-8"))[::-1].hex()
    return hashed if hashed + DATA_EXT in files else stem


def serialization_info(part: PartDirectory, files: set[str] | None = None) -> SerializationInfo:
    """The part's ``serialization.json`` (18.16 defaults without one); ``files``: the part's file names, when
    the caller has them (no stat then)."""
    present = part.has("serialization.json") if files is None else "serialization.json" in files
    return SerializationInfo.parse(part.read_bytes("serialization.json") if present else None, part.name)


def incompatibilities_with_18_16(part: PartDirectory) -> list[str]:
    """Why ClickHouse 18.16 could not load this part (empty if it could)."""
    files = part.files()
    out: list[str] = []
    if find_marks(set(files)) is not None:
        out.append("Compact part (data.bin)")
    if "primary.cidx" in files:
        out.append("compressed primary index (primary.cidx)")
    marks = {f[f.rindex("."):] for f in files if re.search(r"\.(c?mrk[234]?|cmrk)$", f)}
    odd_marks = sorted(marks - {".mrk"})
    if odd_marks:
        out.append(f"marks files {', '.join(odd_marks)}")
    if "serialization.json" in files:
        try:
            info = serialization_info(part)
        except UnsupportedPartFormatError as e:
            out.append(str(e).split(": ", 1)[-1])
        else:
            if info.string_size_stream and any("String" in t for _n, t in part.column_types):
                out.append("strings with a separate size stream (serialization.json)")
            sparse = sorted(n for n, k in info.kinds.items() if k != "Default")
            if sparse:
                out.append(f"sparse serialization of {', '.join(sparse)}")
    system = sorted(n for n, _t in part.column_types if n in SYSTEM_COLUMNS)
    if system:
        out.append(f"system columns {', '.join(system)}"
                   + (" (rows deleted by a lightweight DELETE)" if ROW_EXISTS in system else ""))
    if any(f.endswith(".proj") for f in os.listdir(part.path)):
        out.append("projections (*.proj)")
    return out


def _read_whole(path: str) -> bytes:
    """A small file's bytes: open, read, close (no buffered file object)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _parse_marks(raw: bytes, part: PartDirectory, layout: _Layout, marks_name: str) -> npt.NDArray[np.uint64]:
    if layout.compressed:
        raw = decompress_all(raw, marks_name)
    width = 8 * layout.mark_width
    if len(raw) % width:
        raise CorruptedDataError(
            f"part {part.name}: {marks_name} size {len(raw)} is not a multiple of {width}")
    return np.frombuffer(raw, dtype="<u8").reshape(-1, layout.mark_width)


class _StreamReader:
    """One substream's ``.bin`` (read block by block) and marks."""

    def __init__(self, part: PartDirectory, stem: str, layout: _Layout, file: str) -> None:
        self.stem = stem
        directory = os.fspath(part.path)  # joins of strings: a merge opens a few streams of each source
        self.file = CompressedFile(os.path.join(directory, file + DATA_EXT), part.name)
        marks_name = file + layout.marks_ext
        try:
            raw = _read_whole(os.path.join(directory, marks_name))
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part.name}: no marks file {marks_name}") from None
        self.marks = _parse_marks(raw, part, layout, marks_name)

    def position(self, mark: int) -> tuple[int, int]:
        """(block offset in file, offset in decompressed block) of a mark; the end for ``mark == count``."""
        if mark < len(self.marks):
            row = self.marks[mark]
            return int(row[0]), int(row[1])
        return self.file.end

    def read_range(self, a: int, b: int) -> bytes:
        """Decompressed bytes of granules ``[a, b)``."""
        if a >= b:
            return b""
        return self.file.read_between(self.position(a), self.position(b))

    def read_range_view(self, a: int, b: int) -> bytes | memoryview:
        """:meth:`read_range`, as a read-only view when that saves a copy."""
        if a >= b:
            return b""
        return self.file.read_between_view(self.position(a), self.position(b))

    def decompressed_position(self, mark: int) -> int:
        return self.file.decompressed_position(self.position(mark))

    def close(self) -> None:
        self.file.close()


#: a part of at most one granule (count.txt) whose ``.bin`` files hold at most this many decompressed bytes
#: each has its streams read whole, all in one native call (a merge of small inserts' parts)
WHOLE_READ_BYTES = 1 << 20


class PartReader:
    """Columns of one part as storage Arrow.

    ``columns`` (name -> DataType) selects and types the columns to return (default: all of
    columns.txt, typed from it); a requested column the part does not have is filled with the type's
    defaults, as ClickHouse does after ``ALTER ADD COLUMN``; only the selected columns' types are parsed
    and their streams opened.  ``index_granularity`` is the table's
    setting; when None it is inferred from a fixed-width stream (8192 if the part has none).
    """

    def __init__(
        self,
        part_dir: str | os.PathLike[str] | PartDirectory,
        columns: Mapping[str, DataType] | None = None,
        *,
        index_granularity: int | None = None,
        verify: bool = False,
    ) -> None:
        self.part = part_dir if isinstance(part_dir, PartDirectory) else PartDirectory(Path(part_dir))
        if verify:
            self.part.verify()
        part_types = dict(self.part.column_types)
        #: columns whose type in the part differs from the requested one (a part not yet converted after
        #: ALTER MODIFY COLUMN): read with the part's type, then CAST, as ClickHouse reads such parts
        self._cast: dict[str, DataType] = {}
        if columns is None:
            self.columns: dict[str, DataType] = {
                n: t for n, t in self.part.columns if n not in SYSTEM_COLUMNS}
        else:
            self.columns = dict(columns)
            for name, dtype in self.columns.items():
                have = part_types.get(name)
                if have is not None and have != dtype.name and parse_type(have) != dtype:
                    self._cast[name] = parse_type(have)
        #: the columns read from disk (requested and present in the part), with their types in the part
        self.part_columns = {n: self._cast.get(n, t) for n, t in self.columns.items() if n in part_types}
        # Streams opened: the selected columns', or the part's first column's for the geometry alone.
        opened = dict(self.part_columns)
        #: a lightweight DELETE of current ClickHouse left ``_row_exists`` (0 = deleted): such rows are
        #: left out of what is read (``rows`` and the granules still count them)
        self.row_exists = ROW_EXISTS in part_types and ROW_EXISTS not in self.columns
        if self.row_exists:
            opened[ROW_EXISTS] = parse_type(part_types[ROW_EXISTS])
        if not opened and part_types:
            name0, type0 = next(iter(part_types.items()))
            opened[name0] = parse_type(type0)
        self._opened = opened
        files = set(self.part.files())
        #: the part's file names, listed once
        self._files = files
        info = serialization_info(self.part, files)
        self.layout = detect_layout(self.part, opened, files, info)
        #: per column read, the stand-in type that follows the part's serialization (serialization.json)
        self._serial = {n: serialization_of(n, t, info) for n, t in opened.items()}
        self._streams: dict[str, _StreamReader | WholeStream] = {}
        self._raw_widths: dict[str, int | None] = {}
        self._compact: CompactData | None = None
        if self.layout.compact is not None:
            names = [n for n, _t in self.part.column_types]
            self._compact = CompactData(self.part, self.layout.compact, names)
            rows = self._compact.granule_rows
            if "count.txt" in self._files and int(rows.sum()) != self.part.rows:
                raise CorruptedDataError(
                    f"part {self.part.name}: marks hold {int(rows.sum())} rows, count.txt {self.part.rows}"
                )
            self._granule_rows = rows
            self.row_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
            return
        stems: dict[str, str] = {}  # stem -> file stem (Nested columns share their .size0 stream)
        for name, dtype in self._serial.items():
            for suffix in dtype.substreams():
                stem = stream_stem(name, suffix)
                if stem not in stems:
                    stems[stem] = file_stem(files, stem)
        whole = self._whole_streams(stems, index_granularity)
        marks_count = None
        for stem, file in stems.items():
            s = whole.get(stem) or _StreamReader(self.part, stem, self.layout, file)
            self._streams[stem] = s
            if marks_count is None:
                marks_count = len(s.marks)
            elif len(s.marks) != marks_count:
                raise CorruptedDataError(
                    f"part {self.part.name}: {stem} has {len(s.marks)} marks, other streams {marks_count}"
                )
        self._granule_rows = self._compute_granules(marks_count or 0, index_granularity)
        self.row_starts = np.concatenate([[0], np.cumsum(self._granule_rows)]).astype(np.int64)

    def _whole_streams(self, stems: Mapping[str, str], index_granularity: int | None
                       ) -> dict[str, WholeStream]:
        """The streams of a part of one granule read whole, in one native call (each one it cannot read
        so, left out: read the general way, which names what is wrong with it)."""
        if "count.txt" not in self._files or not stems or self.part.rows > (index_granularity or 8192):
            return {}
        ext = self.layout.marks_ext
        got = read_whole_streams(self.part.path, [(f + ext, f + DATA_EXT) for f in stems.values()],
                                 WHOLE_READ_BYTES)
        out: dict[str, WholeStream] = {}
        for (stem, file), one in zip(stems.items(), got, strict=True):
            if one is not None:
                marks, data, size = one
                out[stem] = WholeStream(stem, _parse_marks(marks, self.part, self.layout, file + ext), data,
                                         size, f"part {self.part.name}: {file}{DATA_EXT}")
        return out

    # ---- geometry ------------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        return int(self.row_starts[-1])

    @property
    def granules(self) -> int:
        return len(self._granule_rows)

    def granule_rows(self, g: int) -> int:
        return int(self._granule_rows[g])

    def _compute_granules(self, marks_count: int, index_granularity: int | None) -> npt.NDArray[np.int64]:
        if self.layout.adaptive:
            first = next(iter(self._streams.values()), None)
            if first is None:
                return np.zeros(0, np.int64)
            rows = first.marks[:, 2].astype(np.int64)
            if len(rows) and rows[-1] == 0:
                rows = rows[:-1]  # the final mark
            if "count.txt" in self._files and int(rows.sum()) != self.part.rows:
                raise CorruptedDataError(
                    f"part {self.part.name}: marks hold {int(rows.sum())} rows, count.txt {self.part.rows}"
                )
            return rows
        total = self.part.rows if "count.txt" in self._files else self._rows_from_fixed_stream()
        if marks_count == 0:
            if total:
                raise CorruptedDataError(f"part {self.part.name}: {total} rows but no marks")
            return np.zeros(0, np.int64)
        g = index_granularity or self._infer_granularity(marks_count) or 8192
        last = total - g * (marks_count - 1)
        if not 0 < last <= g:
            raise CorruptedDataError(
                f"part {self.part.name}: {total} rows do not fit {marks_count} granules of {g} rows"
            )
        out = np.full(marks_count, g, np.int64)
        out[-1] = last
        return out

    def _fixed_stream(self) -> tuple[_StreamReader | WholeStream, int] | None:
        for name, dtype in self._serial.items():
            if isinstance(dtype, SparseType):
                continue  # its value streams hold only the non-default rows
            for suffix in dtype.substreams():
                w = substream_width(dtype.name, suffix)
                if w:
                    return self._streams[stream_stem(name, suffix)], w
        return None

    def _infer_granularity(self, marks_count: int) -> int | None:
        if marks_count <= 1:
            return None
        found = self._fixed_stream()
        if found is None:
            for name, dtype in self._serial.items():
                if isinstance(dtype, SparseType):  # its offsets of the first granule count the rows
                    first = self._streams[stream_stem(name, SPARSE_SUFFIX)].read_range(0, 1)
                    return sparse_granule_rows(first, f"part {self.part.name}, column {name}")
            return None
        stream, width = found
        pos = stream.decompressed_position(1)
        if pos % width or pos == 0:
            raise CorruptedDataError(f"part {self.part.name}: first granule of {stream.stem} has {pos} bytes")
        return pos // width

    def _rows_from_fixed_stream(self) -> int:
        found = self._fixed_stream()
        if found is None:
            raise CorruptedDataError(f"part {self.part.name}: no count.txt and no fixed-width column")
        stream, width = found
        return stream.decompressed_position(len(stream.marks)) // width

    # ---- reading -------------------------------------------------------------------------------------

    def _selected(self, columns: Sequence[str] | None) -> list[tuple[str, DataType]]:
        if columns is None:
            return list(self.columns.items())
        out = []
        for c in columns:
            dtype = self.columns.get(c)
            if dtype is None:
                raise MetadataMismatchError(f"part {self.part.name}: no column {c}")
            out.append((c, dtype))
        return out

    def raw_width(self, name: str) -> int | None:
        """Whether column ``name`` can be read *serialized* (``raw`` of :meth:`read_granules`): its bytes
        per row (0 for String), or None.  Only one-stream columns of a Wide part, stored with the
        requested type: fixed-width types that are not Nullable, and String."""
        if name not in self._raw_widths:
            self._raw_widths[name] = self._raw_width(name)
        return self._raw_widths[name]

    def _raw_width(self, name: str) -> int | None:
        dtype = self.part_columns.get(name)
        if dtype is None or self._compact is not None or name in self._cast:
            return None
        # the part serializes it as the type does (no Sparse, no separate String size stream: then the
        # stand-in is another object, though it may compare equal by name)
        if self._serial.get(name) is not dtype or dtype.substreams() != [""]:
            return None
        if dtype.name == "String":
            return 0
        if getattr(dtype, "bulk_serializer", None) is not None:
            return None
        width = fixed_width(dtype.name)
        return width if width and not dtype.is_nullable else None

    def _read_raw(self, name: str, start: int, end: int, n: int) -> pa.Array:
        """Rows of a :meth:`raw_width` column still serialized: ``fixed_size_binary(width)`` values, or for
        String ``binary`` values holding each row's VarUInt length and bytes."""
        data = self._streams[stream_stem(name, "")].read_range_view(start, end)  # kept as it is: no copy
        width = self.raw_width(name)
        if width:
            if len(data) != n * width:
                raise CorruptedDataError(f"{len(data)} bytes for {n} rows of {width} bytes")
            return pa.Array.from_buffers(pa.binary(width), n, [None, pa.py_buffer(data)])
        try:
            offsets, used = _strings.records(data, n)
        except ValueError as e:
            raise CorruptedDataError(f"String: {e}") from None
        if used != len(data):
            raise CorruptedDataError(f"String: {len(data) - used} unread bytes left in stream ''")
        t = pa.binary() if len(offsets) == 4 * (n + 1) else pa.large_binary()
        return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    def read_granules(
        self, start: int, end: int, columns: Sequence[str] | None = None, raw: Collection[str] = ()
    ) -> pa.Table:
        """Rows of granules ``[start, end)`` as a table of the selected columns.

        Columns named in ``raw`` (each one :meth:`raw_width` accepts) come as their serialized rows (see
        :meth:`_read_raw`): a merge copies them to the new part without decoding and encoding them."""
        if not 0 <= start <= end <= self.granules:
            raise IndexError(f"granules {start}..{end} out of 0..{self.granules}")
        n = int(self.row_starts[end] - self.row_starts[start])
        arrays: list[pa.Array] = []
        fields: list[pa.Field] = []
        for name, dtype in self._selected(columns):
            if name in raw:
                try:
                    arrays.append(self._read_raw(name, start, end, n))
                except CorruptedDataError as e:
                    where = f"part {self.part.name}, column {name}, granules {start}..{end}"
                    raise type(e)(f"{where}: {e}") from e
                fields.append(pa.field(name, arrays[-1].type))
                continue
            fields.append(pa.field(name, dtype.arrow_type))
            if name not in self.part_columns:
                arrays.append(dtype.defaults(n) if hasattr(dtype, "defaults") else
                              pa.repeat(pa.scalar(dtype.default_value, dtype.arrow_type), n))
                continue
            try:
                arr = self._read_column(name, self._serial[name], start, end, n)
                arrays.append(_cast(arr, name, self._cast[name], dtype) if name in self._cast else arr)
            except CorruptedDataError as e:
                raise type(e)(f"part {self.part.name}, column {name}, granules {start}..{end}: {e}") from e
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
        if self.row_exists:
            exists = self._read_column(ROW_EXISTS, self._serial[ROW_EXISTS], start, end, n)
            keep = np.asarray(exists.to_numpy(zero_copy_only=False)) != 0
            if not keep.all():
                table = filter_rows(table, keep)
        return table

    def _read_column(self, name: str, dtype: DataType, start: int, end: int, n: int) -> pa.Array:
        if self._compact is not None:
            pieces = [deserialize_sequential(dtype, self._compact.column_bytes(name, g), self.granule_rows(g))
                      for g in range(start, end)]
            if not pieces:
                return dtype.defaults(0)
            return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        bufs: dict[str, bytes] = {}
        for suffix in dtype.substreams():
            stream = self._streams[stream_stem(name, suffix)]
            # A LowCardinality dictionary stream is read from the granule's mark to its end: every
            # mark points at the shared dictionary, which 18.16 writes once, after the last granule.
            stop = len(stream.marks) if suffix.endswith(".dict") else end
            bufs[suffix] = stream.read_range(start, stop)
        return dtype.deserialize(bufs, n)

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole part (for small parts; use :meth:`iter_batches` for big ones)."""
        if self.granules <= _READ_GRANULES:
            return self.read_granules(0, self.granules, columns)
        # Decoding in granule batches is cheaper than one huge decode (variable-width columns).
        tables = list(self.iter_batches(columns, _READ_GRANULES))
        return pa.concat_tables(tables).combine_chunks()

    def iter_batches(
        self, columns: Sequence[str] | None = None, granules_per_batch: int = 16, raw: Collection[str] = ()
    ) -> Iterator[pa.Table]:
        """Consecutive tables of up to ``granules_per_batch`` granules each (``raw``: see read_granules)."""
        if granules_per_batch <= 0:
            raise ValueError("granules_per_batch must be positive")
        for start in range(0, self.granules, granules_per_batch):
            yield self.read_granules(start, min(start + granules_per_batch, self.granules), columns, raw)

    def close(self) -> None:
        for s in self._streams.values():
            s.close()
        if self._compact is not None:
            self._compact.close()

    def __enter__(self) -> PartReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cast(arr: pa.Array, name: str, stored: DataType, wanted: DataType) -> pa.Array:
    """``CAST(column, 'wanted')`` of values read with the part's own type (ClickHouse's conversion)."""
    from replicad.sql.expressions import compile_expression
    from replicad.sql.expressions_lexer import back_quote_if_needed, quote_string

    expr = compile_expression(f"CAST({back_quote_if_needed(name)}, {quote_string(wanted.name)})")
    out, _t = expr.evaluate(pa.table({name: arr}), {name: stored}, "UTC")
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    if out.type != wanted.arrow_type or (not wanted.is_nullable and out.null_count):
        out = wanted.to_storage(out, name, "UTC")
    return out
