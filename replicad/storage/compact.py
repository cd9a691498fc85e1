"""Compact parts: every column in one ``data.bin``, one marks file for all of them.

Current ClickHouse writes a part below ``min_bytes_for_wide_part`` (10 MiB) as Compact (FACTS §5.2):

* ``data.bin``: granule after granule; inside a granule, column after column in columns.txt order, each
  column's substreams one after the other (its state prefix first, e.g. LowCardinality's key version),
  each column flushed as its own compressed block(s).
* marks, always adaptive, one row per granule plus a final mark (row count 0):

  - ``data.mrk3`` / ``data.cmrk3`` (compressed): per column ``(block offset, offset in block)``, then
    UInt64 rows of the granule;
  - ``data.mrk4`` / ``data.cmrk4`` (25.x+, ``write_marks_for_substreams_in_compact_parts``): the same
    with one pair per *substream*, the substreams listed per column in ``columns_substreams.txt``.

A column's bytes in a granule run from its first mark to the next column's first mark (the next
granule's first column, the final mark, or the end of the file for the last one); they are decoded by
:func:`replicad.storage.serialization.deserialize_sequential`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from replicad.errors import CorruptedDataError
from replicad.storage.compressed_file import CompressedFile, Position
from replicad.storage.compression import decompress_all
from replicad.storage.part import COMPACT_DATA_FILE, COMPACT_MARKS_FILES, PartDirectory, _read_back_quoted

DATA_FILE = COMPACT_DATA_FILE
SUBSTREAMS_FILE = "columns_substreams.txt"
_SUBSTREAMS_HEADER = "columns substreams version: 1\n"


@dataclass(frozen=True)
class CompactMarks:
    file: str  # data.mrk3, data.cmrk3, data.mrk4 or data.cmrk4

    @property
    def compressed(self) -> bool:
        return self.file.startswith("data.c")

    @property
    def per_substream(self) -> bool:
        return self.file.endswith("4")


MARKS_FILES = COMPACT_MARKS_FILES


def find_marks(files: set[str]) -> CompactMarks | None:
    """The Compact marks file among a part's files, or None (not a Compact part)."""
    for name in MARKS_FILES:
        if name in files:
            return CompactMarks(name)
    return None


def parse_columns_substreams(text: str) -> list[tuple[str, list[str]]]:
    """``columns_substreams.txt``: ``[(column, [substream names])]`` in columns.txt order."""
    if not text.startswith(_SUBSTREAMS_HEADER):
        raise CorruptedDataError(f"{SUBSTREAMS_FILE}: bad header")
    lines_at = len(_SUBSTREAMS_HEADER)
    head, sep, rest = text[lines_at:].partition(" columns:\n")
    if not sep or not head.isdigit():
        raise CorruptedDataError(f"{SUBSTREAMS_FILE}: bad column count line")
    out: list[tuple[str, list[str]]] = []
    pos = 0
    for _ in range(int(head)):
        count_text, sep, _tail = rest[pos:].partition(" substreams for column ")
        if not sep or not count_text.isdigit():
            raise CorruptedDataError(f"{SUBSTREAMS_FILE}: bad substream count at column {len(out)}")
        name, pos = _read_back_quoted(rest, pos + len(count_text) + len(sep))
        if rest[pos:pos + 2] != ":\n":
            raise CorruptedDataError(f"{SUBSTREAMS_FILE}: expected ':' after column {name!r}")
        pos += 2
        subs: list[str] = []
        for _ in range(int(count_text)):
            nl = rest.find("\n", pos)
            if not rest.startswith("\t", pos) or nl < 0:
                raise CorruptedDataError(f"{SUBSTREAMS_FILE}: bad substream line of column {name!r}")
            subs.append(rest[pos + 1:nl])
            pos = nl + 1
        out.append((name, subs))
    if pos != len(rest):
        raise CorruptedDataError(f"{SUBSTREAMS_FILE}: trailing data")
    return out


class CompactData:
    """``data.bin`` and its marks: the bytes of one column in one granule."""

    def __init__(self, part: PartDirectory, marks: CompactMarks, column_names: list[str]) -> None:
        self.part = part
        self.marks_file = marks
        names = column_names
        if marks.per_substream:
            listed = parse_columns_substreams(part.read_bytes(SUBSTREAMS_FILE).decode("utf-8"))
            if [n for n, _s in listed] != names:
                raise CorruptedDataError(
                    f"part {part.name}: {SUBSTREAMS_FILE} does not list the columns.txt columns")
            counts = [max(len(s), 1) for _n, s in listed]
        else:
            counts = [1] * len(names)
        #: index of each column's first (offset, offset) pair in a mark
        self.first_pair = dict(zip(names, np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist(),
                                   strict=True))
        self._order = names
        pairs = int(sum(counts))
        raw = part.read_bytes(marks.file)
        if marks.compressed:
            raw = decompress_all(raw, marks.file)
        width = 8 * (2 * pairs + 1)
        if len(raw) % width:
            raise CorruptedDataError(
                f"part {part.name}: {marks.file} size {len(raw)} is not a multiple of {width} "
                f"({len(names)} columns, {pairs} marks per granule)"
            )
        self.marks: npt.NDArray[np.uint64] = np.frombuffer(raw, dtype="<u8").reshape(-1, 2 * pairs + 1)
        rows = self.marks[:, -1].astype(np.int64)
        self.has_final_mark = bool(len(rows)) and rows[-1] == 0
        self.granule_rows: npt.NDArray[np.int64] = rows[:-1] if self.has_final_mark else rows
        self.data = CompressedFile(part.path / DATA_FILE, part.name)

    def _position(self, granule: int, pair: int) -> Position:
        row = self.marks[granule]
        return int(row[2 * pair]), int(row[2 * pair + 1])

    def column_bytes(self, column: str, granule: int) -> bytes:
        """The decompressed bytes of ``column`` in ``granule`` (all its substreams, in order)."""
        i = self._order.index(column)
        start = self._position(granule, self.first_pair[column])
        if i + 1 < len(self._order):
            stop = self._position(granule, self.first_pair[self._order[i + 1]])
        elif granule + 1 < len(self.marks):
            stop = self._position(granule + 1, 0)
        else:
            stop = self.data.end
        return self.data.read_between(start, stop)

    def close(self) -> None:
        self.data.close()
