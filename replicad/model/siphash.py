"""ClickHouse's SipHash-2-4 (Common/SipHash.h semantics), key (0, 0).

ClickHouse finalises the stream like the 64-bit reference (length byte in the top byte of the last word,
``v2 ^= 0xff``) and then returns ``(v0 ^ v1, v2 ^ v3)`` as its 128-bit value, which is *not* the reference
SipHash-128.  It is used for partition IDs, block IDs and the minimalistic checksums stored in ZooKeeper;
all of those hash a few hundred bytes, so a pure-Python implementation is fast enough.
"""

from __future__ import annotations

import struct

_M = 0xFFFFFFFFFFFFFFFF


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


class SipHash:
    """Streaming hasher; ``update`` may be called with any chunking."""

    __slots__ = ("_cnt", "_tail", "v0", "v1", "v2", "v3")

    def __init__(self) -> None:
        self.v0 = 0x736F6D6570736575
        self.v1 = 0x646F72616E646F6D
        self.v2 = 0x6C7967656E657261
        self.v3 = 0x7465646279746573
        self._cnt = 0
        self._tail = b""

    def _rounds(self, n: int) -> None:
        v0, v1, v2, v3 = self.v0, self.v1, self.v2, self.v3
        for _ in range(n):
            v0 = (v0 + v1) & _M
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        self.v0, self.v1, self.v2, self.v3 = v0, v1, v2, v3

    def _word(self, m: int) -> None:
        self.v3 ^= m
        self._rounds(2)
        self.v0 ^= m

    def update(self, data: bytes) -> SipHash:
        self._cnt += len(data)
        buf = self._tail + bytes(data)
        full = len(buf) - len(buf) % 8
        for (m,) in struct.iter_unpack("<Q", buf[:full]):
            self._word(m)
        self._tail = buf[full:]
        return self

    def update_u64(self, value: int) -> SipHash:
        return self.update(struct.pack("<Q", value & _M))

    def update_string(self, s: bytes) -> SipHash:
        """ClickHouse's ``hash.update(size); hash.update(data)`` idiom."""
        self.update_u64(len(s))
        return self.update(s)

    def _final(self) -> tuple[int, int, int, int]:
        saved = (self.v0, self.v1, self.v2, self.v3)
        last = int.from_bytes(self._tail, "little") | ((self._cnt & 0xFF) << 56)
        self._word(last)
        self.v2 ^= 0xFF
        self._rounds(4)
        out = (self.v0, self.v1, self.v2, self.v3)
        self.v0, self.v1, self.v2, self.v3 = saved
        return out

    def get128(self) -> tuple[int, int]:
        """``(low, high)`` words exactly as ClickHouse's ``get128`` fills its two UInt64s."""
        v0, v1, v2, v3 = self._final()
        return v0 ^ v1, v2 ^ v3

    def digest128(self) -> bytes:
        lo, hi = self.get128()
        return struct.pack("<QQ", lo, hi)

    def hexdigest128(self) -> str:
        return self.digest128().hex()

    def get64(self) -> int:
        v0, v1, v2, v3 = self._final()
        return v0 ^ v1 ^ v2 ^ v3


def siphash128(data: bytes) -> bytes:
    return SipHash().update(data).digest128()


def siphash64(data: bytes) -> int:
    return SipHash().update(data).get64()
