"""A compressed file (``.bin``) read between two marks.

A mark is a position ``(offset of a compressed block in the file, offset in its decompressed data)``.
:meth:`CompressedFile.read_between` decompresses only the blocks between two marks, keeping the last
block decompressed (consecutive reads of one stream usually start in it).

Blocks are read with ``pread`` (usually one read for header and body), not memory-mapped: the pages of
a mapped file count in the process's resident set as long as they stay mapped, so a merge of many
parts would hold all of its compressed input in RSS; read blocks are freed once decompressed.
"""

from __future__ import annotations

import os
from pathlib import Path

from replicad.errors import CorruptedDataError
from replicad.storage.compression import (
    BLOCK_OVERHEAD,
    CHECKSUM_SIZE,
    HEADER_SIZE,
    MAX_BLOCK_SIZE,
    read_block,
)

Position = tuple[int, int]
_MIN_READ = 4096
_READ_SLACK = 1024


class CompressedFile:
    def __init__(self, path: Path, part_name: str) -> None:
        self.path = path
        try:
            self.size = os.path.getsize(path)
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part_name}: no data file {path.name}") from None
        self._fd: int | None = None
        self._read_size = _MIN_READ  # bytes read at a block's offset (header and, usually, the body)
        self._cache: tuple[int, bytes, int] | None = None  # (offset, payload, next offset)

    @property
    def end(self) -> Position:
        return self.size, 0

    def _pread(self, n: int, offset: int) -> bytes:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return os.pread(self._fd, n, offset)

    def _header(self, offset: int) -> tuple[int, int]:
        """(compressed size with the 9 header bytes, decompressed size) of the block at ``offset``."""
        head = self._pread(BLOCK_OVERHEAD, offset)
        if len(head) < BLOCK_OVERHEAD:
            raise CorruptedDataError(f"{self.path.name}: truncated block header at {offset}")
        return (int.from_bytes(head[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little"),
                int.from_bytes(head[CHECKSUM_SIZE + 5:CHECKSUM_SIZE + 9], "little"))

    def _block(self, offset: int) -> tuple[bytes, int]:
        c = self._cache
        if c is not None and c[0] == offset:
            return c[1], c[2]
        # One read for header and body when the block is no bigger than the previous one (+ slack): the
        # blocks of a stream are of similar sizes.  A bad size is reported by read_block.
        raw = self._pread(min(self._read_size, self.size - offset), offset)
        if len(raw) >= BLOCK_OVERHEAD:
            csize = int.from_bytes(raw[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little")
            size = CHECKSUM_SIZE + csize if HEADER_SIZE <= csize <= MAX_BLOCK_SIZE else BLOCK_OVERHEAD
            size = min(size, self.size - offset)
            if size > len(raw):
                raw += self._pread(size - len(raw), offset + len(raw))
            self._read_size = max(size + _READ_SLACK, _MIN_READ)
        payload, used = read_block(raw, 0, self.path.name, offset)
        nxt = offset + used
        self._cache = (offset, payload, nxt)
        return payload, nxt

    def read_between(self, start: Position, stop: Position) -> bytes:
        """Decompressed bytes from mark ``start`` up to mark ``stop`` (``end`` = the end of the file)."""
        data, so, end = self._between(start, stop)
        return data[so:end] if (so or end != len(data)) else data

    def read_between_view(self, start: Position, stop: Position) -> bytes | memoryview:
        """:meth:`read_between`, as a read-only view of the decompressed bytes when the range is a part of
        them (no copy)."""
        data, so, end = self._between(start, stop)
        return memoryview(data)[so:end] if (so or end != len(data)) else data

    def _between(self, start: Position, stop: Position) -> tuple[bytes, int, int]:
        """The decompressed blocks holding marks ``start`` .. ``stop``, and where the range lies in them."""
        sb, so = start
        eb, eo = stop
        if eb < sb or (eb == sb and eo < so) or eb > self.size:
            raise CorruptedDataError(f"{self.path.name}: bad marks ({sb},{so}) .. ({eb},{eo})")
        if self.size == 0 or (sb, so) == (eb, eo):
            return b"", 0, 0
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
        return data, so, end

    def decompressed_position(self, mark: Position) -> int:
        """Offset of a mark in the whole decompressed stream (walks block headers only)."""
        sb, so = mark
        off, total = 0, 0
        while off < sb:
            if off + BLOCK_OVERHEAD > self.size:
                raise CorruptedDataError(f"{self.path.name}: truncated block header at {off}")
            csize, dsize = self._header(off)
            total += dsize
            off += CHECKSUM_SIZE + csize
        if off != sb:
            raise CorruptedDataError(f"{self.path.name}: mark offset {sb} is not at a block boundary")
        return total + so

    def close(self) -> None:
        self._cache = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
