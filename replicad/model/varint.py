"""ClickHouse's VarUInt (LEB128: seven bits a byte, low first, high bit set on all but the last byte)."""

from __future__ import annotations


def encode_varuint(n: int) -> bytes:
    """``writeVarUInt``: ``n`` (0 .. 2**64-1) as 1 to 10 bytes."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
