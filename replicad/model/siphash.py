"""ClickHouse's SipHash-2-4 (Common/SipHash.h semantics), key (0, 0).

ClickHouse finalises the stream like the 64-bit reference (length byte in the top byte of the last word,
``v2 ^= 0xff``) and then returns ``(v0 ^ v1, v2 ^ v3)`` as its 128-bit value, which is *not* the reference
SipHash-128.  It is used for partition IDs, block IDs, the columns hash and the minimalistic checksums
stored in ZooKeeper.

The work happens in the C extension ``replicad.native._siphash`` (a streaming state; the GIL is
released for buffers of 64 KiB or more); tests/unit/test_siphash.py keeps a pure-Python reference.
"""

from __future__ import annotations

from typing import SupportsIndex

from replicad.native import _siphash as _native

BytesLike = bytes | bytearray | memoryview


class SipHash:
    """Streaming hasher; ``update`` may be called with any chunking.  Reading a value (``get128``,
    ``digest128``, ``get64``...) does not change the state: more data may be fed afterwards."""

    __slots__ = ("_h",)

    def __init__(self) -> None:
        self._h = _native.Hasher()

    def update(self, data: BytesLike) -> SipHash:
        self._h.update(data)
        return self

    def update_u64(self, value: SupportsIndex) -> SipHash:
        """The 8 little-endian bytes of ``value`` modulo 2**64."""
        self._h.update_u64(value)
        return self

    def update_string(self, s: BytesLike) -> SipHash:
        """ClickHouse's ``hash.update(size); hash.update(data)`` idiom (size as a UInt64)."""
        self._h.update_string(s)
        return self

    def get128(self) -> tuple[int, int]:
        """``(low, high)`` words exactly as ClickHouse's ``get128`` fills its two UInt64s."""
        return self._h.get128()

    def digest128(self) -> bytes:
        """``get128`` as 16 bytes: low word little-endian, then high word little-endian."""
        return self._h.digest128()

    def hexdigest128(self) -> str:
        return self._h.digest128().hex()

    def get64(self) -> int:
        return self._h.get64()


def siphash128(data: BytesLike) -> bytes:
    return _native.sip128(data)


def siphash64(data: BytesLike) -> int:
    return _native.sip64(data)
