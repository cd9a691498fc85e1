"""A memory-mapped compressed file (``.bin``) read between two marks.

A mark is a position ``(offset of a compressed block in the file, offset in its decompressed data)``.
:meth:`CompressedFile.read_between` decompresses only the blocks between two marks, keeping the last
block decompressed (consecutive reads of one stream usually start in it).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from replicad.errors import CorruptedDataError
from replicad.storage.compression import BLOCK_OVERHEAD, CHECKSUM_SIZE, read_block

Position = tuple[int, int]


class CompressedFile:
    def __init__(self, path: Path, part_name: str) -> None:
        self.path = path
        try:
            self.size = os.path.getsize(path)
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part_name}: no data file {path.name}") from None
        self._mm: mmap.mmap | None = None
        self._cache: tuple[int, bytes, int] | None = None  # (offset, payload, next offset)

    @property
    def end(self) -> Position:
        return self.size, 0

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

    def read_between(self, start: Position, stop: Position) -> bytes:
        """Decompressed bytes from mark ``start`` up to mark ``stop`` (``end`` = the end of the file)."""
        sb, so = start
        eb, eo = stop
        if eb < sb or (eb == sb and eo < so) or eb > self.size:
            raise CorruptedDataError(f"{self.path.name}: bad marks ({sb},{so}) .. ({eb},{eo})")
        if self.size == 0 or (sb, so) == (eb, eo):
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

    def decompressed_position(self, mark: Position) -> int:
        """Offset of a mark in the whole decompressed stream (walks block headers only)."""
        sb, so = mark
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
