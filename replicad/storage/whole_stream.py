"""A substream of a small part read whole (replicad/native/partread.c reads every stream of a part of one
granule in one call: its marks, and its ``.bin`` of one compressed block decompressed): the reads
:class:`replicad.storage.reader.PartReader` makes of a stream, served from memory."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from replicad.errors import CorruptedDataError

__all__ = ["WholeStream"]


class WholeStream:
    """A substream read whole (native/partread.c: its ``.bin`` empty or one compressed block), with its
    marks: :class:`_StreamReader`'s reads, from memory."""

    def __init__(self, stem: str, marks: npt.NDArray[np.uint64], data: bytes, file_size: int,
                 where: str) -> None:
        self.stem, self.marks, self.data, self.file_size = stem, marks, data, file_size
        self.where = where

    def position(self, mark: int) -> tuple[int, int]:
        if mark < len(self.marks):
            row = self.marks[mark]
            return int(row[0]), int(row[1])
        return self.file_size, 0

    def decompressed_position(self, mark: int) -> int:
        block, offset = self.position(mark)
        if block == self.file_size and offset == 0:
            return len(self.data)
        if block != 0 or offset > len(self.data):
            raise CorruptedDataError(f"{self.where}: mark {mark} ({block}, {offset}) is not in the one block")
        return offset

    def read_range(self, a: int, b: int) -> bytes:
        return bytes(self.read_range_view(a, b))

    def read_range_view(self, a: int, b: int) -> bytes | memoryview:
        if a >= b:
            return b""
        start, end = self.decompressed_position(a), self.decompressed_position(b)
        if start == 0 and end == len(self.data):
            return self.data
        if start > end:
            raise CorruptedDataError(f"{self.where}: marks {a} and {b} go backwards")
        return memoryview(self.data)[start:end]

    def close(self) -> None:
        pass
