"""CityHash v1.0.2 (the version ClickHouse pins) and ClickHouse's file hash.

* ``cityhash128`` — the compressed-block checksum (16 bytes, low 64-bit word first, little endian).
* ``file_hash`` / ``FileHasher`` — the "hashing buffer" hash found in checksums.txt and after every file
  on the DataPartsExchange wire: state (0, 0) is replaced by ``CityHash128WithSeed(chunk, state)`` for
  every 2048-byte chunk of the input (the final chunk may be shorter); empty input gives 16 zero bytes.

All the work happens in the C extension ``replicad.native._cityhash102`` (the GIL is released for big
buffers), so hashing a whole file costs one call.
"""

from __future__ import annotations

import os
from typing import BinaryIO

from replicad.native import _cityhash102 as _native

BytesLike = bytes | bytearray | memoryview

CHUNK_SIZE: int = _native.CHUNK_SIZE  # 2048
_READ_SIZE = 1 << 20
_U64 = (1 << 64) - 1


def cityhash128(data: BytesLike) -> bytes:
    """CityHash128 v1.0.2 of ``data`` as 16 bytes (low word LE, then high word LE)."""
    return _native.cityhash128(data)


def cityhash128_with_seed(data: BytesLike, seed_lo: int, seed_hi: int) -> tuple[int, int]:
    """CityHash128WithSeed v1.0.2; seed and result are (low, high) 64-bit words."""
    if not (0 <= seed_lo <= _U64 and 0 <= seed_hi <= _U64):
        raise ValueError("seed words must be unsigned 64-bit integers")
    return _native.cityhash128_with_seed(data, seed_lo, seed_hi)


def file_hash(data: BytesLike) -> bytes:
    """ClickHouse hashing-buffer hash of a complete file's bytes (16 bytes)."""
    return _native.file_hash(data)


class FileHasher:
    """Streaming version of :func:`file_hash`; feed it any slicing of the data."""

    __slots__ = ("_h",)

    def __init__(self, data: BytesLike | None = None) -> None:
        self._h = _native.Hasher()
        if data is not None:
            self._h.update(data)

    def update(self, data: BytesLike) -> None:
        self._h.update(data)

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.digest().hex()

    @property
    def size(self) -> int:
        """Number of bytes fed so far."""
        return self._h.size

    def copy(self) -> FileHasher:
        other = FileHasher.__new__(FileHasher)
        other._h = self._h.copy()
        return other


def hash_stream(f: BinaryIO, read_size: int = _READ_SIZE) -> tuple[int, bytes]:
    """Read ``f`` to its end; return (number of bytes, file hash)."""
    h = _native.Hasher()
    while True:
        chunk = f.read(read_size)
        if not chunk:
            break
        h.update(chunk)
    return h.size, h.digest()


def hash_file(path: str | os.PathLike[str]) -> tuple[int, bytes]:
    """(size, file hash) of the file at ``path``, read in 1 MiB pieces (blocking: call from a thread)."""
    with open(path, "rb") as f:
        return hash_stream(f)
