"""A compressed file (``.bin``) read between two marks.

A mark is a position ``(offset of a compressed block in the file, offset in its decompressed data)``.
:meth:`CompressedFile.read_between` decompresses only the blocks between two marks, keeping the last
block decompressed (consecutive reads of one stream usually start in it).

Blocks are read with ``pread`` (usually one read for header and body), not memory-mapped: the pages of
a mapped file count in the process's resident set as long as they stay mapped, so a merge of many
parts would hold all of its compressed input in RSS; read blocks are freed once decompressed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable

import pyarrow as pa

from replicad.errors import CorruptedDataError
from replicad.model.cityhash import cityhash128
from replicad.storage.compression import (
    BLOCK_OVERHEAD,
    CHECKSUM_SIZE,
    HEADER_SIZE,
    MAX_BLOCK_SIZE,
    METHOD_LZ4,
    read_block,
)

#: (source address, destination address, compressed size, decompressed size) -> bytes written, < 0 on error
_DecompressInto = Callable[[int, int, int, int], int]


@functools.cache
def _lz4_decompress_into() -> _DecompressInto | None:
    """``LZ4_decompress_safe`` of the system liblz4 (never writes past the given capacity), or None."""
    try:
        fn = ctypes.CDLL("liblz4.so.1").LZ4_decompress_safe
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    decompress: _DecompressInto = fn
    return decompress

Position = tuple[int, int]
_MIN_READ = 4096
_READ_SLACK = 1024


class CompressedFile:
    def __init__(self, path: str | os.PathLike[str], part_name: str) -> None:
        self.path = path
        self.name = os.path.basename(path)  # the file's name, in messages and per block read
        try:
            self.size = os.path.getsize(path)
        except FileNotFoundError:
            raise CorruptedDataError(f"part {part_name}: no data file {self.name}") from None
        self._fd: int | None = None
        self._read_size = _MIN_READ  # bytes read at a block's offset (header and, usually, the body)
        self._cache: tuple[int, bytes | memoryview, int] | None = None  # (offset, payload, next offset)

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
            raise CorruptedDataError(f"{self.name}: truncated block header at {offset}")
        return (int.from_bytes(head[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little"),
                int.from_bytes(head[CHECKSUM_SIZE + 5:CHECKSUM_SIZE + 9], "little"))

    def _raw(self, offset: int) -> bytes:
        """The compressed block at ``offset`` as read (header and body; a bad size is reported later)."""
        # One read for header and body when the block is no bigger than the previous one (+ slack): the
        # blocks of a stream are of similar sizes.
        raw = self._pread(min(self._read_size, self.size - offset), offset)
        if len(raw) >= BLOCK_OVERHEAD:
            csize = int.from_bytes(raw[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little")
            size = CHECKSUM_SIZE + csize if HEADER_SIZE <= csize <= MAX_BLOCK_SIZE else BLOCK_OVERHEAD
            size = min(size, self.size - offset)
            if size > len(raw):
                raw += self._pread(size - len(raw), offset + len(raw))
            self._read_size = max(size + _READ_SLACK, _MIN_READ)
        return raw

    def _block(self, offset: int) -> tuple[bytes | memoryview, int]:
        c = self._cache
        if c is not None and c[0] == offset:
            return c[1], c[2]
        payload, used = read_block(self._raw(offset), 0, self.name, offset)
        nxt = offset + used
        self._cache = (offset, payload, nxt)
        return payload, nxt

    def _lz4_block(self, offset: int) -> tuple[bytes, int, int] | None:
        """The compressed block at ``offset`` when it is LZ4 and intact (checksum, sizes): (the block as
        read, its decompressed size, the next block's offset); None for other blocks (read_block then
        decodes them, or names what is wrong)."""
        raw = self._raw(offset)
        if len(raw) < BLOCK_OVERHEAD or raw[CHECKSUM_SIZE] != METHOD_LZ4:
            return None
        csize = int.from_bytes(raw[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little")
        dsize = int.from_bytes(raw[CHECKSUM_SIZE + 5:CHECKSUM_SIZE + 9], "little")
        if not HEADER_SIZE < csize <= MAX_BLOCK_SIZE or dsize > MAX_BLOCK_SIZE:
            return None
        if CHECKSUM_SIZE + csize > len(raw):
            return None
        body = memoryview(raw)[CHECKSUM_SIZE:CHECKSUM_SIZE + csize]
        if cityhash128(body) != raw[:CHECKSUM_SIZE]:
            return None
        return raw, dsize, offset + CHECKSUM_SIZE + csize

    def _decompressed_into(self, sb: int, eb: int, eo: int) -> tuple[pa.Buffer, int] | None:
        """The blocks from offset ``sb`` to the end mark ``(eb, eo)`` decompressed one after another into
        one buffer (no block decompressed alone, then joined), and the decompressed bytes before the end
        mark's block; None when a block is not an intact LZ4 block, or the range lies in the block read
        last (the caller reads them one by one, or takes that block's payload as it is)."""
        decompress = _lz4_decompress_into()
        if decompress is None:
            return None
        # (offset, the cached payload or the block as read, decompressed size (-1: cached), next offset)
        blocks: list[tuple[int, bytes | memoryview, int, int]] = []
        off = sb
        while off < eb or (off == eb and eo > 0):
            c = self._cache
            if c is not None and c[0] == off:
                blocks.append((off, c[1], -1, c[2]))
                off = c[2]
                continue
            got = self._lz4_block(off)
            if got is None:
                return None
            raw, dsize, nxt = got
            blocks.append((off, raw, dsize, nxt))
            off = nxt
        if off < eb:
            raise CorruptedDataError(f"{self.name}: mark offset {eb} is not at a block boundary")
        if len(blocks) == 1 and blocks[0][2] < 0:
            return None
        total = sum(len(data) if dsize < 0 else dsize for _o, data, dsize, _n in blocks)
        out = pa.allocate_buffer(total)
        view = memoryview(out).cast("B")
        pos = before_end = 0
        for block_offset, data, dsize, nxt in blocks:
            if dsize < 0:  # the cached payload of the previous read
                view[pos:pos + len(data)] = memoryview(data).cast("B")
                size = len(data)
            else:
                src = pa.py_buffer(data)
                csize = int.from_bytes(data[CHECKSUM_SIZE + 1:CHECKSUM_SIZE + 5], "little")
                done = decompress(src.address + BLOCK_OVERHEAD, out.address + pos, csize - HEADER_SIZE, dsize)
                if done != dsize:
                    raise CorruptedDataError(
                        f"cannot decompress block (LZ4 gave {done} of {dsize} bytes) in {self.name} "
                        f"at offset {block_offset}")
                size = dsize
            if block_offset < eb:
                before_end += size
            self._cache = (block_offset, view[pos:pos + size], nxt)
            pos += size
        return out, before_end

    def read_between(self, start: Position, stop: Position) -> bytes:
        """Decompressed bytes from mark ``start`` up to mark ``stop`` (``end`` = the end of the file)."""
        data, so, end = self._between(start, stop)
        if isinstance(data, memoryview):  # a payload decompressed into a shared buffer: bytes of its own
            return bytes(data[so:end])
        return data[so:end] if (so or end != len(data)) else data

    def read_between_view(self, start: Position, stop: Position) -> bytes | memoryview:
        """:meth:`read_between`, as a view of the decompressed bytes when the range is a part of them (no
        copy); a range over several LZ4 blocks is decompressed straight into one buffer."""
        sb, so = start
        eb, eo = stop
        if (sb < eb or (sb == eb and so < eo)) and eb <= self.size:
            got = self._decompressed_into(sb, eb, eo)
            if got is not None:
                out, before_end = got
                end = before_end + eo if eb < self.size else len(out)
                if end > len(out) or so > end:
                    raise CorruptedDataError(f"{self.name}: marks point past the end of a block")
                return memoryview(out).cast("B")[so:end]
        data, so, end = self._between(start, stop)
        return memoryview(data)[so:end] if (so or end != len(data)) else data

    def _between(self, start: Position, stop: Position) -> tuple[bytes | memoryview, int, int]:
        """The decompressed blocks holding marks ``start`` .. ``stop``, and where the range lies in them."""
        sb, so = start
        eb, eo = stop
        if eb < sb or (eb == sb and eo < so) or eb > self.size:
            raise CorruptedDataError(f"{self.name}: bad marks ({sb},{so}) .. ({eb},{eo})")
        if self.size == 0 or (sb, so) == (eb, eo):
            return b"", 0, 0
        chunks: list[bytes | memoryview] = []
        before_end = 0  # decompressed bytes before the block that holds the end mark
        off = sb
        while off < eb or (off == eb and eo > 0):
            payload, nxt = self._block(off)
            if off < eb:
                before_end += len(payload)
            chunks.append(payload)
            off = nxt
        if off < eb:
            raise CorruptedDataError(f"{self.name}: mark offset {eb} is not at a block boundary")
        end = before_end + eo if eb < self.size else sum(len(c) for c in chunks)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if end > len(data) or so > end:
            raise CorruptedDataError(f"{self.name}: marks point past the end of a block")
        return data, so, end

    def decompressed_position(self, mark: Position) -> int:
        """Offset of a mark in the whole decompressed stream (walks block headers only)."""
        sb, so = mark
        off, total = 0, 0
        while off < sb:
            if off + BLOCK_OVERHEAD > self.size:
                raise CorruptedDataError(f"{self.name}: truncated block header at {off}")
            csize, dsize = self._header(off)
            total += dsize
            off += CHECKSUM_SIZE + csize
        if off != sb:
            raise CorruptedDataError(f"{self.name}: mark offset {sb} is not at a block boundary")
        return total + so

    def close(self) -> None:
        self._cache = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        # a reader dropped without close() (a test's PartReader(p).read(), a generator never finished) gives
        # its descriptor back: a plain descriptor, unlike a file object, is not closed by the collector
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
