"""Read the columns of a Wide part into storage Arrow, granule range by granule range.

Reads what ClickHouse 18.16 writes (``.mrk`` marks: two UInt64 per granule, granules of
``index_granularity`` rows) and what current ClickHouse writes with the Wide layout: adaptive granularity
(``.mrk2``: three UInt64 per granule — offsets and row count — plus a final mark) and compressed marks
(``.cmrk``/``.cmrk2``: the same bytes in compressed blocks); the primary index is not needed to read.
Layouts it cannot read are refused with :class:`UnsupportedPartFormatError` naming what was found:
Compact parts (``data.bin``), sparse columns and strings with a separate size stream
(``serialization.json``).  :func:`incompatibilities_with_18_16` lists why 18.16 could not load a part.

Memory is bounded by the batch: :meth:`PartReader.iter_batches` decompresses only the blocks that
hold the requested granules (found through the marks) from a memory-mapped ``.bin``.
"""

from __future__ import annotations

import json
import mmap
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.errors import CorruptedDataError, MetadataMismatchError, UnsupportedPartFormatError
from replicad.storage.compression import BLOCK_OVERHEAD, CHECKSUM_SIZE, decompress_all, read_block
from replicad.storage.part import DATA_EXT, PartDirectory, stream_stem
from replicad.storage.types import DataType, parse_type

_FIXED_WIDTHS = {
    "Int8": 1, "UInt8": 1, "Int16": 2, "UInt16": 2, "Int32": 4, "UInt32": 4, "Int64": 8, "UInt64": 8,
    "Float32": 4, "Float64": 8, "Date": 2, "DateTime": 4, "UUID": 16, "Decimal32": 4, "Decimal64": 8,
    "Decimal128": 16, "Enum8": 1, "Enum16": 2,
}
_READ_GRANULES = 16  # granules decoded at once by PartReader.read
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
    marks_ext: str  # ".mrk", ".mrk2", ".cmrk" or ".cmrk2"
    mark_width: int  # UInt64s per mark: 2 (offsets) or 3 (offsets + rows, adaptive granularity)

    @property
    def adaptive(self) -> bool:
        return self.mark_width == 3

    @property
    def compressed(self) -> bool:
        return self.marks_ext.startswith(".c")


_MARK_LAYOUTS = {".mrk": _Layout(".mrk", 2), ".mrk2": _Layout(".mrk2", 3),
                 ".cmrk": _Layout(".cmrk", 2), ".cmrk2": _Layout(".cmrk2", 3)}


def detect_layout(part: PartDirectory, columns: Mapping[str, DataType]) -> _Layout:
    """The marks layout of a Wide part, checked for the ``columns`` to be read.

    UnsupportedPartFormatError for what we do not read: Compact parts, sparse columns, strings with
    a separate size stream.  (``primary.cidx`` does not matter for reading column data.)
    """
    files = set(part.files())
    name = part.name
    if "data.bin" in files or any(f.startswith(("data.mrk", "data.cmrk")) for f in files):
        raise UnsupportedPartFormatError(
            f"part {name}: Compact parts (data.bin) are not supported; only Wide parts can be read "
            "(min_bytes_for_wide_part=0, min_rows_for_wide_part=0)"
        )
    if "serialization.json" in files:
        _check_serialization_json(part, columns)
    first = next(iter(columns.items()), None)
    if first is None:
        return _MARK_LAYOUTS[".mrk"]
    stem = stream_stem(first[0], first[1].substreams()[0])
    for ext, layout in _MARK_LAYOUTS.items():
        if stem + ext in files:
            return layout
    if stem + ".mrk3" in files or stem + ".cmrk3" in files:
        raise UnsupportedPartFormatError(f"part {name}: .mrk3 marks (Compact layout) are not supported")
    raise CorruptedDataError(f"part {name}: no marks file for stream {stem}")


def _check_serialization_json(part: PartDirectory, columns: Mapping[str, DataType]) -> None:
    try:
        info = json.loads(part.read_bytes("serialization.json"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptedDataError(f"part {part.name}: bad serialization.json: {e}") from None
    versions = info.get("types_serialization_versions") or {}
    string_version = versions.get("string", 0)
    if string_version not in (0, "0", "single_stream") and any("String" in t.name for t in columns.values()):
        raise UnsupportedPartFormatError(
            f"part {part.name}: strings with a separate size stream (serialization version "
            f"{string_version}) are not supported (string_serialization_version='single_stream')"
        )
    for col in info.get("columns") or []:
        kind = col.get("kind", "Default")
        if kind != "Default" and col.get("name") in columns:
            raise UnsupportedPartFormatError(
                f"part {part.name}: column {col.get('name')!r} uses {kind} serialization "
                "(ratio_of_defaults_for_sparse_serialization=1)"
            )


def incompatibilities_with_18_16(part: PartDirectory) -> list[str]:
    """Why ClickHouse 18.16 could not load this part (empty if it could)."""
    files = part.files()
    out: list[str] = []
    if "data.bin" in files:
        out.append("Compact part (data.bin)")
    if "primary.cidx" in files:
        out.append("compressed primary index (primary.cidx)")
    odd_marks = sorted({f[f.rindex("."):] for f in files if re.search(r"\.(c?mrk[23]?|cmrk)$", f)} - {".mrk"})
    if odd_marks:
        out.append(f"marks files {', '.join(odd_marks)}")
    if "serialization.json" in files:
        try:
            _check_serialization_json(part, {n: _ANY_STRING for n, _ in part.column_types})
        except UnsupportedPartFormatError as e:
            out.append(str(e).split(": ", 1)[-1])
    return out


class _AnyString:
    name = "String"


_ANY_STRING: Any = _AnyString()


class _StreamReader:
    """One substream's ``.bin`` (memory-mapped) and marks."""

    def __init__(self, part: PartDirectory, stem: str, layout: _Layout) -> None:
        self.stem = stem
        self.path = part.path / (stem + DATA_EXT)
        marks_path = part.path / (stem + layout.marks_ext)
        try:
            raw = marks_path.read_bytes()
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part.name}: no marks file {marks_path.name}") from None
        if layout.compressed:
            raw = decompress_all(raw, marks_path.name)
        width = 8 * layout.mark_width
        if len(raw) % width:
            raise CorruptedDataError(
                f"part {part.name}: {marks_path.name} size {len(raw)} is not a multiple of {width}"
            )
        self.marks: npt.NDArray[np.uint64] = np.frombuffer(raw, dtype="<u8").reshape(-1, layout.mark_width)
        try:
            self.size = os.path.getsize(self.path)
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part.name}: no data file {self.path.name}") from None
        self._mm: mmap.mmap | None = None
        self._cache: tuple[int, bytes, int] | None = None  # (offset, payload, next offset)

    def _data(self) -> mmap.mmap:
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return self._mm

    def _block(self, offset: int) -> tuple[bytes, int]:
        c = self._cache
        if c is not None and c[0] == offset:
            return c[1], c[2]
        payload, nxt = read_block(memoryview(self._data()), offset, self.path.name)
        self._cache = (offset, payload, nxt)
        return payload, nxt

    def position(self, mark: int) -> tuple[int, int]:
        """(block offset in file, offset in decompressed block) of a mark; the end for ``mark == count``."""
        if mark < len(self.marks):
            row = self.marks[mark]
            return int(row[0]), int(row[1])
        return self.size, 0

    def read_range(self, a: int, b: int) -> bytes:
        """Decompressed bytes of granules ``[a, b)``."""
        if a >= b:
            return b""
        sb, so = self.position(a)
        eb, eo = self.position(b)
        if eb < sb or (eb == sb and eo < so) or eb > self.size:
            raise CorruptedDataError(f"{self.path.name}: bad marks {a} ({sb},{so}) .. {b} ({eb},{eo})")
        if self.size == 0:
            return b""
        chunks: list[bytes] = []
        before_end = 0  # decompressed bytes before the block that holds the end mark
        off = sb
        while off < eb or (off == eb and eo > 0):
            payload, nxt = self._block(off)
            if off < eb:
                before_end += len(payload)
            chunks.append(payload)
            off = nxt
        if off < eb:
            raise CorruptedDataError(f"{self.path.name}: mark offset {eb} is not at a block boundary")
        end = before_end + eo if eb < self.size else sum(len(c) for c in chunks)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if end > len(data) or so > end:
            raise CorruptedDataError(f"{self.path.name}: marks point past the end of a block")
        return data[so:end] if (so or end != len(data)) else data

    def decompressed_position(self, mark: int) -> int:
        """Offset of a mark in the whole decompressed stream (walks block headers only)."""
        sb, so = self.position(mark)
        data = self._data()
        off, total = 0, 0
        while off < sb:
            if off + BLOCK_OVERHEAD > self.size:
                raise CorruptedDataError(f"{self.path.name}: truncated block header at {off}")
            csize = int.from_bytes(data[off + CHECKSUM_SIZE + 1:off + CHECKSUM_SIZE + 5], "little")
            dsize = int.from_bytes(data[off + CHECKSUM_SIZE + 5:off + CHECKSUM_SIZE + 9], "little")
            total += dsize
            off += CHECKSUM_SIZE + csize
        if off != sb:
            raise CorruptedDataError(f"{self.path.name}: mark offset {sb} is not at a block boundary")
        return total + so

    def close(self) -> None:
        self._cache = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass  # a view is still referenced (e.g. by a traceback); the GC unmaps it later
            self._mm = None


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
            self.columns: dict[str, DataType] = dict(self.part.columns)
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
        if not opened and part_types:
            name0, type0 = next(iter(part_types.items()))
            opened[name0] = parse_type(type0)
        self._opened = opened
        self.layout = detect_layout(self.part, opened)
        self._streams: dict[str, _StreamReader] = {}
        marks_count = None
        for name, dtype in opened.items():
            for suffix in dtype.substreams():
                stem = stream_stem(name, suffix)
                if stem in self._streams:
                    continue  # Nested columns share their .size0 stream
                s = _StreamReader(self.part, stem, self.layout)
                self._streams[stem] = s
                if marks_count is None:
                    marks_count = len(s.marks)
                elif len(s.marks) != marks_count:
                    raise CorruptedDataError(
                        f"part {self.part.name}: {stem} has {len(s.marks)} marks, other streams {marks_count}"
                    )
        self._granule_rows = self._compute_granules(marks_count or 0, index_granularity)
        self.row_starts = np.concatenate([[0], np.cumsum(self._granule_rows)]).astype(np.int64)

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
            if self.part.has("count.txt") and int(rows.sum()) != self.part.rows:
                raise CorruptedDataError(
                    f"part {self.part.name}: marks hold {int(rows.sum())} rows, count.txt {self.part.rows}"
                )
            return rows
        total = self.part.rows if self.part.has("count.txt") else self._rows_from_fixed_stream()
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

    def _fixed_stream(self) -> tuple[_StreamReader, int] | None:
        for name, dtype in self._opened.items():
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

    def read_granules(self, start: int, end: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows of granules ``[start, end)`` as a table of the selected columns."""
        if not 0 <= start <= end <= self.granules:
            raise IndexError(f"granules {start}..{end} out of 0..{self.granules}")
        n = int(self.row_starts[end] - self.row_starts[start])
        arrays: list[pa.Array] = []
        fields: list[pa.Field] = []
        for name, dtype in self._selected(columns):
            fields.append(pa.field(name, dtype.arrow_type))
            if name not in self.part_columns:
                arrays.append(dtype.defaults(n) if hasattr(dtype, "defaults") else
                              pa.repeat(pa.scalar(dtype.default_value, dtype.arrow_type), n))
                continue
            stored = self.part_columns[name]
            bufs: dict[str, bytes] = {}
            for suffix in stored.substreams():
                stream = self._streams[stream_stem(name, suffix)]
                # A LowCardinality dictionary stream is read from the granule's mark to its end: every
                # mark points at the shared dictionary, which 18.16 writes once, after the last granule.
                stop = len(stream.marks) if suffix.endswith(".dict") else end
                bufs[suffix] = stream.read_range(start, stop)
            try:
                arr = stored.deserialize(bufs, n)
                arrays.append(arr if stored is dtype else _cast(arr, name, stored, dtype))
            except CorruptedDataError as e:
                raise CorruptedDataError(
                    f"part {self.part.name}, column {name}, granules {start}..{end}: {e}"
                ) from e
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole part (for small parts; use :meth:`iter_batches` for big ones)."""
        if self.granules <= _READ_GRANULES:
            return self.read_granules(0, self.granules, columns)
        # Decoding in granule batches is cheaper than one huge decode (variable-width columns).
        tables = list(self.iter_batches(columns, _READ_GRANULES))
        return pa.concat_tables(tables).combine_chunks()

    def iter_batches(
        self, columns: Sequence[str] | None = None, granules_per_batch: int = 16
    ) -> Iterator[pa.Table]:
        """Consecutive tables of up to ``granules_per_batch`` granules each."""
        if granules_per_batch <= 0:
            raise ValueError("granules_per_batch must be positive")
        for start in range(0, self.granules, granules_per_batch):
            yield self.read_granules(start, min(start + granules_per_batch, self.granules), columns)

    def close(self) -> None:
        for s in self._streams.values():
            s.close()

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
