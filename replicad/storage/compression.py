"""ClickHouse compressed blocks (.bin files, the body of checksums.txt v4).

A block is ``16-byte CityHash128 v1.0.2 of the rest | UInt8 method | UInt32 compressed size (the 9 header
bytes included) | UInt32 decompressed size | payload``.  Methods: 0x02 none, 0x82 LZ4 (raw block, no size
prefix; LZ4HC writes the same method byte), 0x90 ZSTD (one frame).  With lz4/zstandard at level 1 the blocks
are byte-identical to what ClickHouse 18.16 writes.  Reading also decodes the column codecs of current
ClickHouse (Multiple, Delta, DoubleDelta, Gorilla, T64, GCD: :mod:`replicad.storage.codecs`); other
codecs raise :class:`UnsupportedPartFormatError` naming them.

Reading verifies every checksum and size and raises :class:`CorruptedDataError` naming the file and the
block's offset.  :class:`CompressedStreamWriter` produces a .bin file incrementally, cutting 1 MiB blocks
like ClickHouse's CompressedWriteBuffer, and tracks the numbers a part writer needs for marks and for
checksums.txt.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Literal, Protocol

import lz4.block
import pyarrow as pa
import zstandard

from replicad.errors import CorruptedDataError, UnsupportedPartFormatError
from replicad.model.cityhash import BytesLike, FileHasher, cityhash128
from replicad.storage.codecs import DECODERS, METHOD_MULTIPLE, decode_multiple

METHOD_NONE = 0x02
METHOD_LZ4 = 0x82
METHOD_ZSTD = 0x90

CHECKSUM_SIZE = 16
HEADER_SIZE = 9  # method byte + two UInt32 sizes
BLOCK_OVERHEAD = CHECKSUM_SIZE + HEADER_SIZE
MAX_COMPRESS_BLOCK_SIZE = 1048576  # ClickHouse's DBMS_DEFAULT_BUFFER_SIZE: a block is cut at 1 MiB
MAX_BLOCK_SIZE = 0x40000000  # ClickHouse refuses compressed/decompressed sizes above 1 GiB

Method = Literal["lz4", "lz4hc", "zstd", "none"]

_HEADER = struct.Struct("<BII")
#: a .mrk entry: the block's offset in the compressed file, the row's offset in the block
_MARK = struct.Struct("<QQ")
_METHOD_NAMES = {METHOD_NONE: "none", METHOD_LZ4: "lz4", METHOD_ZSTD: "zstd"}
_MODERN_METHODS = {
    0x91: "Multiple",
    0x92: "Delta",
    0x93: "T64",
    0x94: "DoubleDelta",
    0x95: "Gorilla",
    0x96: "AES-128-GCM-SIV",
    0x97: "AES-256-GCM-SIV",
    0x98: "FPC",
    0x99: "DeflateQpl",
    0x9A: "GCD",
    0x9B: "ZSTD_QPL",
}


def _system_lz4() -> Callable[[BytesLike], bytes] | None:
    """``LZ4_compress_default`` of the system liblz4 (the library 18.16 is linked with), if present.

    python-lz4's block API is compatible but occasionally emits a slightly different (equally valid)
    encoding; the C library gives byte-identical blocks to 18.16 (e.g. its checksums.txt)."""
    try:
        lib = ctypes.CDLL("liblz4.so.1")
        compress = lib.LZ4_compress_default
        bound = lib.LZ4_compressBound
    except (OSError, AttributeError):
        return None
    compress.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    compress.restype = ctypes.c_int
    bound.argtypes = [ctypes.c_int]
    bound.restype = ctypes.c_int

    def run(data: BytesLike) -> bytes:
        n = len(data)
        if n == 0 or n > 0x7E000000:
            return lz4.block.compress(data, mode="default", store_size=False)  # type: ignore[no-any-return]
        src: object = data
        if not isinstance(data, bytes):
            mv = _as_bytes_view(data)
            src = mv.tobytes() if mv.readonly else (ctypes.c_char * n).from_buffer(mv)
        cap = bound(n)
        out = ctypes.create_string_buffer(cap)
        size = compress(src, out, n, cap)
        if size <= 0:
            raise RuntimeError("LZ4_compress_default failed")
        return ctypes.string_at(out, size)

    return run


_LZ4_SYSTEM = _system_lz4()


class _ZstdContext:
    """A ZSTD compression context, freed with this object."""

    __slots__ = ("_free", "ptr")

    def __init__(self, ptr: int, free: Callable[[int], int]) -> None:
        self.ptr, self._free = ptr, free

    def __del__(self) -> None:
        self._free(self.ptr)


class _ZstdContexts(threading.local):
    """One ZSTD compression context per thread, reused (ZSTD_compress makes, and zeroes, a new one on every
    call: most of the cost of a small block), freed with the thread's data when the thread ends.  Same
    output: ZSTD_compress is ZSTD_compressCCtx on a fresh context."""

    def __init__(self, create: Callable[[], int | None], free: Callable[[int], int]) -> None:
        self._create, self._free = create, free
        self.ctx: _ZstdContext | None = None

    def get(self) -> int:
        ctx = self.ctx
        if ctx is None:
            ptr = self._create()
            if not ptr:
                raise MemoryError("ZSTD_createCCtx failed")
            ctx = self.ctx = _ZstdContext(ptr, self._free)
        return ctx.ptr


def _zstd_contexts(lib: ctypes.CDLL) -> _ZstdContexts:
    create, free = lib.ZSTD_createCCtx, lib.ZSTD_freeCCtx
    create.argtypes = []
    create.restype = ctypes.c_void_p
    free.argtypes = [ctypes.c_void_p]
    free.restype = ctypes.c_size_t
    return _ZstdContexts(create, free)


def _system_zstd() -> Callable[[BytesLike, int], bytes] | None:
    """``ZSTD_compress`` of the system libzstd (the library Debian's 18.16 is linked with), if present.

    python-zstandard bundles its own zstd release whose output differs from older releases on large
    compressible blocks; the system library gives byte-identical blocks to a ClickHouse on this machine."""
    try:
        lib = ctypes.CDLL("libzstd.so.1")
        contexts = _zstd_contexts(lib)
        compress = lib.ZSTD_compressCCtx
        bound = lib.ZSTD_compressBound
        is_error = lib.ZSTD_isError
    except (OSError, AttributeError):
        return None
    compress.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                         ctypes.c_int]
    compress.restype = ctypes.c_size_t
    bound.argtypes = [ctypes.c_size_t]
    bound.restype = ctypes.c_size_t
    is_error.argtypes = [ctypes.c_size_t]
    is_error.restype = ctypes.c_uint
    def run(data: BytesLike, level: int) -> bytes:
        n = len(data)
        src: object = data
        if not isinstance(data, bytes):
            mv = _as_bytes_view(data)
            src = mv.tobytes() if mv.readonly or n == 0 else (ctypes.c_char * n).from_buffer(mv)
        cap = bound(n)
        out = ctypes.create_string_buffer(cap)
        size = compress(contexts.get(), out, cap, src, n, level)
        if is_error(size):
            raise RuntimeError("ZSTD_compressCCtx failed")
        return ctypes.string_at(out, size)

    return run


_ZSTD_SYSTEM = _system_zstd()


#: (source address, source size, destination address, destination capacity) -> compressed size
_CompressInto = Callable[[int, int, int, int], int]


@functools.cache
def _system_compress_into(method: Method, level: int) -> tuple[_CompressInto, Callable[[int], int]] | None:
    """The system library's compress-into-a-buffer call for ``method`` and its bound, or None.

    The same library calls as :func:`_system_lz4` / :func:`_system_zstd` (the same bytes), without their
    copies: the payload is compressed straight after the block header of a reused buffer.  Made once per
    (method, level) and shared by every stream of every part: each thread keeps one zstd context for the
    process's life, freed when the thread ends (a context per column stream cost a library lookup, an
    allocation and a fresh context's first-use setup on each column of each part, and was never freed:
    ~120 KB leaked per zstd column stream written)."""
    try:
        if method == "lz4":
            lib = ctypes.CDLL("liblz4.so.1")
            lz4_compress = lib.LZ4_compress_default
            lz4_bound = lib.LZ4_compressBound
            lz4_compress.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
            lz4_compress.restype = ctypes.c_int
            lz4_bound.argtypes = [ctypes.c_int]
            lz4_bound.restype = ctypes.c_int

            def lz4_into(src: int, n: int, dst: int, cap: int) -> int:
                size: int = lz4_compress(src, dst, n, cap)
                if size <= 0:
                    raise RuntimeError("LZ4_compress_default failed")
                return size

            return lz4_into, lz4_bound
        if method == "zstd":
            lib = ctypes.CDLL("libzstd.so.1")
            contexts = _zstd_contexts(lib)
            zstd_compress = lib.ZSTD_compressCCtx
            zstd_bound = lib.ZSTD_compressBound
            is_error = lib.ZSTD_isError
            zstd_compress.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                      ctypes.c_size_t, ctypes.c_int]
            zstd_compress.restype = ctypes.c_size_t
            zstd_bound.argtypes = [ctypes.c_size_t]
            zstd_bound.restype = ctypes.c_size_t
            is_error.argtypes = [ctypes.c_size_t]
            is_error.restype = ctypes.c_uint
            def zstd_into(src: int, n: int, dst: int, cap: int) -> int:
                size: int = zstd_compress(contexts.get(), dst, cap, src, n, level)
                if is_error(size):
                    raise RuntimeError("ZSTD_compressCCtx failed")
                return size

            return zstd_into, zstd_bound
    except (OSError, AttributeError):
        return None
    return None


class _BlockBuffer(threading.local):
    """A thread's reusable output buffer for :class:`BlockCompressor` (replaced, never resized, when a
    bigger one is needed: views of the old one stay valid)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.address = 0

    def get(self, size: int) -> tuple[bytearray, int]:
        if len(self.buf) < size:
            self.buf = bytearray(max(size, 2 * len(self.buf)))
            self.address = pa.py_buffer(self.buf).address
        return self.buf, self.address


class BlockCompressor:
    """Compressed blocks of one method and level, each returned as a view of a per-thread buffer.

    The bytes are :func:`compress_block`'s; the payload is compressed in place after the header and the
    checksum is computed over the buffer, with no intermediate copies.  A returned view is valid until
    the same thread's next :meth:`block` call."""

    _buffers = _BlockBuffer()

    def __init__(self, method: Method, level: int = 1) -> None:
        self.method: Method = method
        self.level = level
        self._code = method_byte(method)
        self._into = _system_compress_into(method, level)

    def block(self, data: BytesLike) -> BytesLike:
        n = len(data)
        if self._into is None or n == 0 or n > 0x7E000000:
            return compress_block(data, self.method, self.level)
        compress, bound = self._into
        cap = bound(n)
        buf, address = self._buffers.get(BLOCK_OVERHEAD + cap)
        src = pa.py_buffer(data)  # no copy, read-only buffers too; keeps ``data`` alive during the call
        size = compress(src.address, n, address + BLOCK_OVERHEAD, cap)
        end = BLOCK_OVERHEAD + size
        _HEADER.pack_into(buf, CHECKSUM_SIZE, self._code, HEADER_SIZE + size, n)
        view = memoryview(buf)
        buf[:CHECKSUM_SIZE] = cityhash128(view[CHECKSUM_SIZE:end])
        return view[:end]


def method_byte(method: Method) -> int:
    if method in ("lz4", "lz4hc"):
        return METHOD_LZ4
    if method == "zstd":
        return METHOD_ZSTD
    if method == "none":
        return METHOD_NONE
    raise ValueError(f"unknown compression method {method!r}")


def _compress_payload(data: BytesLike, method: Method, level: int) -> bytes:
    if method == "lz4":
        if _LZ4_SYSTEM is not None:
            return _LZ4_SYSTEM(data)
        return lz4.block.compress(data, mode="default", store_size=False)  # type: ignore[no-any-return]
    if method == "lz4hc":
        return lz4.block.compress(  # type: ignore[no-any-return]
            data, mode="high_compression", compression=level if level > 1 else 9, store_size=False
        )
    if method == "zstd":
        if _ZSTD_SYSTEM is not None:
            return _ZSTD_SYSTEM(data, level)
        return zstandard.ZstdCompressor(level=level).compress(data)
    return bytes(data)


def compress_block(data: BytesLike, method: Method = "lz4", level: int = 1) -> bytes:
    """One complete compressed block holding ``data`` (checksum + header + payload)."""
    if len(data) > MAX_BLOCK_SIZE:
        raise ValueError("block too large")
    code = method_byte(method)
    payload = _compress_payload(data, method, level)
    body = _HEADER.pack(code, HEADER_SIZE + len(payload), len(data)) + payload
    return cityhash128(body) + body


def _corrupt(file_name: str, offset: int, what: str) -> CorruptedDataError:
    where = f" in {file_name}" if file_name else ""
    return CorruptedDataError(f"{what}{where} at offset {offset}")


_THREAD = threading.local()


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor, made once: a new one per block cost ~7 µs (its context allocated and
    set up), as much as decompressing a small block.  Each ``decompress`` starts a fresh frame, also after one
    that failed."""
    d: zstandard.ZstdDecompressor | None = getattr(_THREAD, "zstd", None)
    if d is None:
        d = _THREAD.zstd = zstandard.ZstdDecompressor()
    return d


def _decode_payload(code: int, payload: memoryview, size: int, file_name: str, offset: int) -> bytes:
    try:
        if code == METHOD_LZ4:
            out = lz4.block.decompress(payload, uncompressed_size=size)
        elif code == METHOD_ZSTD:
            declared = zstandard.get_frame_parameters(payload).content_size
            if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
                raise _corrupt(file_name, offset, f"ZSTD frame declares {declared} bytes, header says {size}")
            out = _zstd_decompressor().decompress(payload, max_output_size=max(size, 1))
        elif code == METHOD_NONE:
            out = bytes(payload)
        elif code == METHOD_MULTIPLE:
            def stage(method: int, data: bytes, dsize: int) -> bytes:
                return _decode_payload(method, memoryview(data), dsize, file_name, offset)

            out = decode_multiple(bytes(payload), size, stage)
        elif code in DECODERS:
            out = DECODERS[code](bytes(payload), size)
        elif code in _MODERN_METHODS:
            where = f" in {file_name}" if file_name else ""
            raise UnsupportedPartFormatError(
                f"unsupported compression codec {_MODERN_METHODS[code]}{where} at offset {offset}")
        else:
            raise _corrupt(file_name, offset, f"unknown compression method byte 0x{code:02x}")
    except CorruptedDataError:
        raise
    except Exception as e:  # lz4.block.LZ4BlockError, zstandard.ZstdError
        raise _corrupt(file_name, offset, f"cannot decompress block ({e})") from e
    if len(out) != size:
        raise _corrupt(file_name, offset, f"decompressed {len(out)} bytes, header says {size}")
    return out  # type: ignore[no-any-return]


def _as_bytes_view(data: BytesLike) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    return mv if (mv.ndim == 1 and mv.itemsize == 1) else mv.cast("B")


def _parse_block(mv: memoryview, pos: int, file_name: str, file_offset: int) -> tuple[bytes, int]:
    """Verify the block at ``mv[pos:]`` (reported as ``file_offset``); return (payload, end position)."""
    if pos < 0 or len(mv) - pos < BLOCK_OVERHEAD:
        raise _corrupt(file_name, file_offset, "truncated compressed block header")
    code, csize, dsize = _HEADER.unpack_from(mv, pos + CHECKSUM_SIZE)
    if csize < HEADER_SIZE or csize > MAX_BLOCK_SIZE or dsize > MAX_BLOCK_SIZE:
        raise _corrupt(file_name, file_offset, f"bad compressed block sizes ({csize}, {dsize})")
    body_end = pos + CHECKSUM_SIZE + csize
    if body_end > len(mv):
        raise _corrupt(file_name, file_offset, f"truncated compressed block (needs {csize} bytes)")
    body = mv[pos + CHECKSUM_SIZE : body_end]
    if cityhash128(body) != mv[pos : pos + CHECKSUM_SIZE]:
        raise _corrupt(file_name, file_offset, "checksum mismatch of compressed block")
    return _decode_payload(code, body[HEADER_SIZE:], dsize, file_name, file_offset), body_end


def read_block(
    data: BytesLike, offset: int = 0, file_name: str = "", file_offset: int | None = None
) -> tuple[bytes, int]:
    """Verify and decompress the block starting at ``offset``; return (payload, offset of the next block).

    Errors name ``file_offset`` (default ``offset``): where ``data`` starts in the file, plus ``offset``."""
    where = offset if file_offset is None else file_offset + offset
    return _parse_block(_as_bytes_view(data), offset, file_name, where)


def iter_blocks(data: BytesLike, file_name: str = "") -> Iterator[tuple[int, bytes]]:
    """Yield (offset of the block in the file, decompressed payload) for every block of a whole file."""
    mv = _as_bytes_view(data)
    offset = 0
    while offset < len(mv):
        payload, nxt = _parse_block(mv, offset, file_name, offset)
        yield offset, payload
        offset = nxt


def decompress_all(data: BytesLike, file_name: str = "") -> bytes:
    """The concatenated decompressed content of a whole compressed file, every block verified."""
    parts = [p for _, p in iter_blocks(data, file_name)]
    return parts[0] if len(parts) == 1 else b"".join(parts)


def iter_file_blocks(f: BinaryIO, file_name: str = "") -> Iterator[tuple[int, bytes]]:
    """Like :func:`iter_blocks` but reading one block at a time from a binary file (bounded memory)."""
    offset = 0
    while True:
        head = f.read(BLOCK_OVERHEAD)
        if not head:
            return
        block = head
        if len(head) == BLOCK_OVERHEAD:
            _, csize, _ = _HEADER.unpack_from(head, CHECKSUM_SIZE)
            if HEADER_SIZE < csize <= MAX_BLOCK_SIZE:
                block = head + f.read(csize - HEADER_SIZE)
        payload, size = _parse_block(memoryview(block), 0, file_name, offset)
        yield offset, payload
        offset += size


#: a write of at least this many whole blocks compresses them in parallel (the same blocks, in order)
PARALLEL_MIN_BLOCKS = 4
#: a stream writer keeps a view of what it was given (no copy) when the memory behind it is at most this big
HOLD_MAX_BYTES = 2 * MAX_COMPRESS_BLOCK_SIZE


@functools.cache
def _parallel_pool() -> ThreadPoolExecutor | None:
    """The process's pool for compressing the blocks of one big write side by side; None on one CPU."""
    cpus = os.cpu_count() or 1
    return ThreadPoolExecutor(min(cpus, 4), thread_name_prefix="compress") if cpus > 1 else None


class ByteSink(Protocol):
    """Where a :class:`CompressedStreamWriter` puts its blocks (a binary file, or a part writer's buffered
    ``.bin``)."""

    def write(self, data: BytesLike, /) -> int: ...


class CompressedStreamWriter:
    """Writes a ClickHouse compressed file (.bin) to a binary file object, block by block.

    * ``write(b)`` appends uncompressed bytes; a block is cut as soon as ``max_block_size`` (1 MiB, as
      ClickHouse's CompressedWriteBuffer) bytes are buffered, so large writes are split exactly there.
    * ``flush_block()`` cuts the current block now (no-op if nothing is buffered); a part writer calls it
      when the buffered size reaches min_compress_block_size before writing a mark.
    * ``compressed_offset`` = bytes of the file written so far (the file offset of the next block) and
      ``offset_in_block`` = uncompressed bytes buffered in the current block: together the mark
      ``(compressed_offset, offset_in_block)`` of the next byte written.
    * After ``close()`` (which flushes; the underlying file is left open): ``file_size``/``file_hash`` (hash
      of the compressed bytes) and ``uncompressed_size``/``uncompressed_hash`` (hash of the plain stream),
      both ClickHouse file hashes as in checksums.txt.
    """

    def __init__(
        self,
        f: ByteSink,
        method: Method = "lz4",
        level: int = 1,
        max_block_size: int = MAX_COMPRESS_BLOCK_SIZE,
    ) -> None:
        if not 0 < max_block_size <= MAX_BLOCK_SIZE:
            raise ValueError("max_block_size out of range")
        self._f = f
        self._method: Method = method
        self._code = method_byte(method)
        self._level = level
        self._compressor = BlockCompressor(method, level)
        self._max = max_block_size
        #: the current block's data, not yet copied: views of what write() was given (bytes or read-only
        #: buffers, kept alive by the views) or copies of writable ones; joined once, when compressed
        self._pending: list[memoryview] = []
        self._pending_size = 0
        self._compressed_hash = FileHasher()
        self._plain_hash = FileHasher()
        self._closed = False

    @property
    def compressed_offset(self) -> int:
        return self._compressed_hash.size

    @property
    def offset_in_block(self) -> int:
        return self._pending_size

    @property
    def file_size(self) -> int:
        return self._compressed_hash.size

    @property
    def file_hash(self) -> bytes:
        return self._compressed_hash.digest()

    @property
    def uncompressed_size(self) -> int:
        return self._plain_hash.size

    @property
    def uncompressed_hash(self) -> bytes:
        return self._plain_hash.digest()

    def _emit(self, data: BytesLike) -> None:
        if len(data) > MAX_BLOCK_SIZE:
            raise ValueError("block too large")
        self._put(self._compressor.block(data))

    def _put(self, block: BytesLike) -> None:
        self._f.write(block)
        self._compressed_hash.update(block)

    def _compressed_copy(self, data: BytesLike) -> bytes:
        return bytes(self._compressor.block(data))  # the view is of the worker thread's buffer

    def write(self, data: BytesLike) -> None:
        if self._closed:
            raise ValueError("write to a closed CompressedStreamWriter")
        mv = _as_bytes_view(data)
        n = len(mv)
        if not n:
            return
        self._plain_hash.update(mv)
        pos = 0
        if self._pending_size:
            take = min(self._max - self._pending_size, n)
            self._hold(mv[:take])
            pos = take
            if self._pending_size < self._max:
                return
            self.flush_block()
        full = (n - pos) // self._max
        pool = _parallel_pool() if full >= PARALLEL_MIN_BLOCKS else None
        if pool is not None:  # many whole blocks (a column of long values): compressed side by side
            pieces = [mv[pos + i * self._max : pos + (i + 1) * self._max] for i in range(full)]
            for block in pool.map(self._compressed_copy, pieces):
                self._put(block)
            pos += full * self._max
        while n - pos >= self._max:
            self._emit(mv[pos : pos + self._max])
            pos += self._max
        if pos < n:
            self._hold(mv[pos:])

    def _hold(self, mv: memoryview) -> None:
        """Keep ``mv`` for the current block: the view itself when its memory cannot change and is not much
        bigger than a block (the view keeps all of it alive: a piece of a big insert's column is copied, as
        the rest of that column is not kept for it), else a copy."""
        if not mv.readonly or mv.obj is None or memoryview(mv.obj).nbytes > HOLD_MAX_BYTES:
            mv = memoryview(mv.tobytes())
        self._pending.append(mv)
        self._pending_size += len(mv)

    def mark(self, min_block_size: int) -> bytes:
        """A granule starts at the next byte written: the pending bytes cut into a block first if there are
        ``min_block_size`` or more (ClickHouse's rule before each mark); the 16-byte ``.mrk`` entry
        (UInt64 ``compressed_offset``, UInt64 ``offset_in_block``)."""
        if self._pending_size >= min_block_size:
            self.flush_block()
        return _MARK.pack(self._compressed_hash.size, self._pending_size)

    def flush_block(self) -> None:
        pending = self._pending
        if pending:
            self._emit(pending[0] if len(pending) == 1 else b"".join(pending))
            self._pending = []
            self._pending_size = 0

    def close(self) -> None:
        if not self._closed:
            self.flush_block()
            self._closed = True

    def __enter__(self) -> CompressedStreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def method_name(code: int) -> str:
    return _METHOD_NAMES.get(code) or _MODERN_METHODS.get(code) or f"0x{code:02x}"
