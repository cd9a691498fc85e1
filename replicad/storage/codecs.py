"""Decoding the column codecs of current ClickHouse (``CODEC(...)`` in a column definition).

ClickHouse 18.16 has no per-column codecs; current ClickHouse marks a compressed block with the codec's
method byte (FACTS §5.1).  Read here (formats from ClickHouse's source, checked against chdb-written
parts; ``skip`` bytes, ``size % width`` of them, are copied verbatim before the coded values):

* ``0x91`` Multiple: UInt8 count, one method byte per codec in the order applied, then the output of the
  last one; each stage is ``UInt8 method, UInt32 size with this 9-byte header, UInt32 decoded size,
  payload`` and is undone last codec first.
* ``0x92`` Delta: UInt8 width, UInt8 skip, skip bytes, then the differences of consecutive values
  (wrapping), the first against 0.
* ``0x94`` DoubleDelta: UInt8 width, UInt8 skip, skip bytes, UInt32 count, the first value, the first
  delta, then an MSB-first bit stream with, per value, the change of delta: ``0`` for none, else a
  prefix ``10``/``110``/``1110``/``11110``/``11111`` for 7/9/12/32/64 bits holding a sign bit and
  ``|dd| - 1``.
* ``0x95`` Gorilla: UInt8 width, UInt8 skip, skip bytes, UInt32 count, the first value, then per value
  the XOR with the previous one: ``0`` (equal), ``10`` + the bits inside the previous window, or
  ``11`` + leading zeros + length + the bits (a new window).
* ``0x9a`` GCD: UInt8 width (up to 32), UInt8 skip, skip bytes, the common divisor, then every value
  divided by it.
* ``0x93`` T64: UInt8 type cookie (bit 7: bit-transposed variant), skip bytes, Int64/UInt64 min and
  max, then per 64 values a transposed matrix of the ``num_bits`` low bits that differ between min and
  max (8 * num_bits bytes); the high bits come back from min (or max for non-negative values when the
  range crosses zero).

The decoders are numpy where the format allows (Delta, T64); the bit-stream loops of DoubleDelta and
Gorilla run in C (:mod:`replicad.native._bitcodecs`), with the Python loops here as their reference.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from replicad.native import _bitcodecs

METHOD_MULTIPLE = 0x91
METHOD_DELTA = 0x92
METHOD_T64 = 0x93
METHOD_DOUBLE_DELTA = 0x94
METHOD_GORILLA = 0x95
METHOD_GCD = 0x9A

_UNSIGNED: dict[int, np.dtype[Any]] = {
    1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_STAGE_HEADER = struct.Struct("<BII")


class CodecError(ValueError):
    """The payload of a codec is malformed."""


def _width_and_skip(payload: bytes, size: int) -> tuple[int, int]:
    if len(payload) < 2:
        raise CodecError("payload shorter than its 2-byte header")
    width = payload[0]
    if width not in _UNSIGNED:
        raise CodecError(f"bad value width {width}")
    skip = size % width
    if len(payload) < 2 + skip:
        raise CodecError("payload shorter than its unaligned prefix")
    return width, skip


def decode_delta(payload: bytes, size: int) -> bytes:
    width, skip = _width_and_skip(payload, size)
    body = payload[2 + skip:]
    if len(body) != size - skip:
        raise CodecError(f"Delta: {len(body)} coded bytes for {size - skip}")
    deltas = np.frombuffer(body, dtype=_UNSIGNED[width])
    with np.errstate(over="ignore"):
        values = np.cumsum(deltas, dtype=_UNSIGNED[width])
    return payload[2:2 + skip] + values.tobytes()


class _Bits:
    """An MSB-first bit stream over ``data``; reading past its end gives zero bits (as padding does)."""

    def __init__(self, data: bytes) -> None:
        self.data = data + bytes(16)
        self.limit = 8 * len(data)
        self.pos = 0

    def read(self, n: int) -> int:
        if n == 0:
            return 0
        start = self.pos >> 3
        chunk = int.from_bytes(self.data[start:start + 10], "big")
        shift = 80 - (self.pos & 7) - n
        self.pos += n
        if self.pos > self.limit:
            raise CodecError("bit stream ends early")
        return (chunk >> shift) & ((1 << n) - 1)

    def peek5(self) -> int:
        start = self.pos >> 3
        return (int.from_bytes(self.data[start:start + 2], "big") >> (11 - (self.pos & 7))) & 0x1F


# 5 peeked high bits -> (prefix bits, data bits) of a DoubleDelta item
_DD_SPEC = [(1, 0)] * 16 + [(2, 7)] * 8 + [(3, 9)] * 4 + [(4, 12)] * 2 + [(5, 32), (5, 64)]


def _coded_items(payload: bytes, size: int) -> tuple[bytes, int, int, bytes]:
    """A DoubleDelta or Gorilla block that decodes to ``size`` bytes: (the leading bytes kept as they are,
    the item width, the item count, the coded items after the count); count 0 when no whole item is coded."""
    width, skip = _width_and_skip(payload, size)
    head, body = payload[2:2 + skip], payload[2 + skip:]
    n = (size - skip) // width
    if n == 0:
        return head, width, 0, b""
    if len(body) < 4:
        raise CodecError("missing item count")
    (count,) = struct.unpack_from("<I", body)
    if count != n:
        raise CodecError(f"{count} items coded, {n} expected")
    return head, width, count, body[4:]


def decode_double_delta(payload: bytes, size: int, *, native: bool = True) -> bytes:
    head, width, count, body = _coded_items(payload, size)
    if count == 0:
        return head
    if len(body) < width * min(count, 2):
        raise CodecError("DoubleDelta: truncated first values")
    first = int.from_bytes(body[:width], "little")
    delta = int.from_bytes(body[width:2 * width], "little") if count > 1 else 0
    bits = body[2 * width:] if count > 1 else b""
    run = _bitcodecs.double_delta if native else _double_delta_loop
    return head + run(bits, width, count, first, delta)


def _double_delta_loop(data: bytes, width: int, count: int, first: int, delta: int) -> bytes:
    """The reference of ``_bitcodecs.double_delta`` (same arguments, same result)."""
    mask = (1 << (8 * width)) - 1
    out = np.zeros(count, dtype=np.uint64)
    value = first & mask
    out[0] = value
    if count > 1:
        value = (value + delta) & mask
        out[1] = value
    bits = _Bits(data)
    for i in range(2, count):
        prefix, data_bits = _DD_SPEC[bits.peek5()]
        bits.pos += prefix
        if bits.pos > bits.limit:
            raise CodecError("bit stream ends early")
        dd = 0
        if data_bits:
            sign = bits.read(1)
            dd = bits.read(data_bits - 1) + 1
            if sign:
                dd = -dd
        delta = (delta + dd) & mask
        value = (value + delta) & mask
        out[i] = value
    return out.astype(_UNSIGNED[width]).tobytes()


_GORILLA_LENGTH_BITS = {1: 4, 2: 5, 4: 6, 8: 7}


def decode_gorilla(payload: bytes, size: int, *, native: bool = True) -> bytes:
    head, width, count, body = _coded_items(payload, size)
    if count == 0:
        return head
    if len(body) < width:
        raise CodecError("Gorilla: truncated first value")
    first = int.from_bytes(body[:width], "little")
    run = _bitcodecs.gorilla if native else _gorilla_loop
    return head + run(body[width:], width, count, first)


def _gorilla_loop(data: bytes, width: int, count: int, first: int) -> bytes:
    """The reference of ``_bitcodecs.gorilla`` (same arguments, same result)."""
    bit_size = 8 * width
    length_bits = _GORILLA_LENGTH_BITS[width]
    out = np.zeros(count, dtype=np.uint64)
    value = first
    out[0] = value
    bits = _Bits(data)
    lead = data_bits = trail = 0
    for i in range(1, count):
        if bits.read(1):
            if bits.read(1):
                lead = bits.read(length_bits - 1)
                data_bits = bits.read(length_bits)
                trail = bit_size - lead - data_bits
                if trail < 0:
                    raise CodecError("malformed bit stream")
            if data_bits == 0 and lead == 0 and trail == 0:
                raise CodecError("malformed bit stream")
            value ^= bits.read(data_bits) << trail
        out[i] = value
    return out.astype(_UNSIGNED[width]).tobytes()


# T64 type cookies (low 7 bits) -> (value width, signed)
_T64_TYPES = {1: (1, False), 2: (2, False), 3: (4, False), 4: (8, False), 6: (1, True), 7: (2, True),
              8: (4, True), 9: (8, True), 13: (2, False), 14: (4, False), 15: (8, True), 17: (1, False),
              18: (2, False), 19: (4, True), 20: (8, True), 21: (4, False), 22: (4, True), 23: (4, True),
              24: (8, True)}


def _valuable_bits(lo: int, hi: int, signed: bool) -> int:
    if signed and lo < 0 <= hi:
        top = hi if lo + hi >= 0 else ~lo
        return top.bit_length() + 1
    return ((lo & 0xFFFFFFFFFFFFFFFF) ^ (hi & 0xFFFFFFFFFFFFFFFF)).bit_length()


def _bits_to_values(words: npt.NDArray[np.uint64], first_bit: int) -> npt.NDArray[np.uint64]:
    """``words`` (blocks x k) of bit-transposed rows: word j bit i = bit ``first_bit + j`` of value i."""
    cols = np.arange(64, dtype=np.uint64)
    out = np.zeros((words.shape[0], 64), dtype=np.uint64)
    for j in range(words.shape[1]):
        out |= ((words[:, j, None] >> cols) & np.uint64(1)) << np.uint64(first_bit + j)
    return out


def decode_t64(payload: bytes, size: int) -> bytes:
    if not payload:
        raise CodecError("T64: empty payload")
    cookie = payload[0]
    try:
        width, signed = _T64_TYPES[cookie & 0x7F]
    except KeyError:
        raise CodecError(f"T64: unknown type cookie {cookie & 0x7F}") from None
    bit_variant = bool(cookie >> 7)
    skip = size % width
    prefix = payload[1:1 + skip]
    body = payload[1 + skip:]
    n = (size - skip) // width
    if n == 0:
        return prefix
    if len(body) < 16:
        raise CodecError("T64: truncated min/max header")
    lo, hi = struct.unpack_from("<qq" if signed else "<QQ", body)
    num_bits = _valuable_bits(lo, hi, signed)
    udt = _UNSIGNED[width]
    if num_bits == 0:
        return prefix + np.full(n, lo & ((1 << (8 * width)) - 1), dtype=udt).tobytes()
    block = 8 * num_bits
    data = body[16:]
    blocks = (n + 63) // 64
    if len(data) != blocks * block:
        raise CodecError(f"T64: {len(data)} coded bytes, expected {blocks * block}")
    raw = np.frombuffer(data, dtype=np.uint8).reshape(blocks, block)
    if bit_variant:
        values = _bits_to_values(raw.view("<u8").reshape(blocks, num_bits), 0)
    else:
        full, part = divmod(num_bits, 8)
        values = np.zeros((blocks, 64), dtype=np.uint64)
        for b in range(full):
            values |= raw[:, 64 * b:64 * (b + 1)].astype(np.uint64) << np.uint64(8 * b)
        if part:
            words = np.ascontiguousarray(raw[:, 64 * full:]).view("<u8").reshape(blocks, part)
            values |= _bits_to_values(words, 8 * full)
    flat = values.reshape(-1)[:n]
    if num_bits < 64:
        upper_min = np.uint64((lo & 0xFFFFFFFFFFFFFFFF) >> num_bits << num_bits)
        if signed and lo < 0 <= hi:
            upper_max = np.uint64((hi & 0xFFFFFFFFFFFFFFFF) >> num_bits << num_bits)
            negative = (flat >> np.uint64(num_bits - 1)) & np.uint64(1)
            flat = flat | np.where(negative.astype(bool), upper_min, upper_max)
        else:
            flat = flat | upper_min
    return prefix + flat.astype(udt).tobytes()


def decode_gcd(payload: bytes, size: int) -> bytes:
    if size == 0:
        return b""
    if len(payload) < 2 or payload[0] not in (1, 2, 4, 8, 16, 32):
        raise CodecError("GCD: bad header")
    width = payload[0]
    skip = size % width
    body = payload[2 + skip:]
    if len(payload) < 2 + skip or len(body) != width + size - skip:
        raise CodecError(f"GCD: {len(body)} coded bytes for {size - skip}")
    factor = int.from_bytes(body[:width], "little")
    if width <= 8:
        dt = _UNSIGNED[width]
        with np.errstate(over="ignore"):
            values = np.frombuffer(body[width:], dtype=dt) * dt.type(factor)
        return payload[2:2 + skip] + bytes(values.astype(dt).tobytes())
    mask = (1 << 8 * width) - 1
    out = bytearray()
    for at in range(width, len(body), width):
        out += ((int.from_bytes(body[at:at + width], "little") * factor) & mask).to_bytes(width, "little")
    return payload[2:2 + skip] + bytes(out)


def decode_multiple(payload: bytes, size: int, decode_stage: Callable[[int, bytes, int], bytes]) -> bytes:
    if not payload or payload[0] == 0 or len(payload) < 1 + payload[0]:
        raise CodecError("Multiple: bad list of methods")
    count = payload[0]
    methods = payload[1:1 + count]
    data = payload[1 + count:]
    for i in range(count - 1, -1, -1):
        if len(data) < _STAGE_HEADER.size:
            raise CodecError("Multiple: truncated stage header")
        method, csize, dsize = _STAGE_HEADER.unpack_from(data)
        if method != methods[i]:
            raise CodecError(f"Multiple: stage method 0x{method:02x}, list says 0x{methods[i]:02x}")
        if csize != len(data) or dsize > 0x40000000:
            raise CodecError(f"Multiple: stage sizes ({csize}, {dsize}) do not fit {len(data)} bytes")
        if i == 0 and dsize != size:
            raise CodecError(f"Multiple: decodes to {dsize} bytes, block says {size}")
        data = decode_stage(method, data[_STAGE_HEADER.size:], dsize)
    return data


DECODERS: dict[int, Callable[[bytes, int], bytes]] = {
    METHOD_DELTA: decode_delta,
    METHOD_DOUBLE_DELTA: decode_double_delta,
    METHOD_GORILLA: decode_gorilla,
    METHOD_T64: decode_t64,
    METHOD_GCD: decode_gcd,
}
