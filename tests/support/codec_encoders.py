"""Reference encoders of ClickHouse's column codecs, for round-trip tests of replicad.storage.codecs.

Written from the compression side of the formats (replicad itself never writes these codecs: 18.16
cannot read them).  Plain Python loops: test data only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np

from replicad.model.cityhash import cityhash128

_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _values(data: bytes, width: int) -> tuple[bytes, list[int]]:
    skip = len(data) % width
    body = data[skip:]
    return data[:skip], list(struct.unpack(f"<{len(body) // width}{_FMT[width]}", body))


def encode_delta(data: bytes, width: int) -> bytes:
    skip, vals = _values(data, width)
    mask = (1 << 8 * width) - 1
    prev, out = 0, []
    for v in vals:
        out.append((v - prev) & mask)
        prev = v
    return bytes([width, len(skip)]) + skip + struct.pack(f"<{len(out)}{_FMT[width]}", *out)


class _BitWriter:
    def __init__(self) -> None:
        self.value = 0
        self.count = 0

    def write(self, n: int, v: int) -> None:
        self.value = (self.value << n) | (v & ((1 << n) - 1))
        self.count += n

    def bytes(self) -> bytes:
        pad = -self.count % 8
        total = (self.count + pad) // 8
        return (self.value << pad).to_bytes(total, "big") if total else b""


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) else v


def encode_double_delta(data: bytes, width: int) -> bytes:
    skip, vals = _values(data, width)
    bits = 8 * width
    mask = (1 << bits) - 1
    head = bytes([width, len(skip)]) + skip
    if not vals:
        return head
    out = struct.pack("<I", len(vals)) + struct.pack(f"<{_FMT[width]}", vals[0])
    prev_delta = 0
    if len(vals) > 1:
        prev_delta = (vals[1] - vals[0]) & mask
        out += struct.pack(f"<{_FMT[width]}", prev_delta)
    w = _BitWriter()
    for i in range(2, len(vals)):
        delta = (vals[i] - vals[i - 1]) & mask
        dd = _signed((delta - prev_delta) & mask, bits)
        prev_delta = delta
        if dd == 0:
            w.write(1, 0)
            continue
        if -63 < dd < 64:
            prefix, nbits, data_bits = 0b10, 2, 7
        elif -255 < dd < 256:
            prefix, nbits, data_bits = 0b110, 3, 9
        elif -2047 < dd < 2048:
            prefix, nbits, data_bits = 0b1110, 4, 12
        elif -(2**31) < dd < 2**31 - 1:
            prefix, nbits, data_bits = 0b11110, 5, 32
        else:
            prefix, nbits, data_bits = 0b11111, 5, 64
        w.write(nbits, prefix)
        w.write(1, 1 if dd < 0 else 0)
        w.write(data_bits - 1, abs(dd) - 1)
    return head + out + w.bytes()


def encode_gorilla(data: bytes, width: int) -> bytes:
    skip, vals = _values(data, width)
    bits = 8 * width
    length_bits = {1: 4, 2: 5, 4: 6, 8: 7}[width]
    head = bytes([width, len(skip)]) + skip
    if not vals:
        return head
    out = struct.pack("<I", len(vals)) + struct.pack(f"<{_FMT[width]}", vals[0])
    w = _BitWriter()
    prev_lead = prev_trail = prev_data = 0
    for i in range(1, len(vals)):
        x = vals[i] ^ vals[i - 1]
        if x == 0:
            w.write(1, 0)
            continue
        lead = bits - x.bit_length()
        trail = (x & -x).bit_length() - 1
        if prev_data and prev_lead <= lead and prev_trail <= trail:
            w.write(2, 0b10)
            w.write(prev_data, x >> prev_trail)
        else:
            data_bits = bits - lead - trail
            w.write(2, 0b11)
            w.write(length_bits - 1, lead)
            w.write(length_bits, data_bits)
            w.write(data_bits, x >> trail)
            prev_lead, prev_trail, prev_data = lead, trail, data_bits
    return head + out + w.bytes()


T64_COOKIES = {(1, False): 1, (2, False): 2, (4, False): 3, (8, False): 4,
               (1, True): 6, (2, True): 7, (4, True): 8, (8, True): 9}


def encode_t64(data: bytes, width: int, signed: bool, bit_variant: bool) -> bytes:
    skip, uvals = _values(data, width)
    vals = [_signed(v, 8 * width) for v in uvals] if signed else uvals
    out = bytes([T64_COOKIES[(width, signed)] | (0x80 if bit_variant else 0)]) + skip
    if not vals:
        return out
    lo, hi = min(vals), max(vals)
    out += struct.pack("<qq" if signed else "<QQ", lo, hi)
    if signed and lo < 0 <= hi:
        num_bits = (hi if lo + hi >= 0 else ~lo).bit_length() + 1
    else:
        num_bits = ((lo & (2**64 - 1)) ^ (hi & (2**64 - 1))).bit_length()
    if num_bits == 0:
        return out
    for start in range(0, len(uvals), 64):
        chunk = uvals[start:start + 64]
        if bit_variant:
            words = [sum(((v >> j) & 1) << i for i, v in enumerate(chunk)) for j in range(num_bits)]
            out += struct.pack(f"<{num_bits}Q", *words)
            continue
        full, part = divmod(num_bits, 8)
        for b in range(full):
            row = bytearray(64)
            for i, v in enumerate(chunk):
                row[i] = (v >> 8 * b) & 0xFF
            out += bytes(row)
        words = [sum(((v >> (8 * full + k)) & 1) << i for i, v in enumerate(chunk)) for k in range(part)]
        out += struct.pack(f"<{part}Q", *words)
    return out


def multiple(data: bytes, stages: list[tuple[int, Callable[[bytes], bytes]]]) -> bytes:
    """A Multiple payload: each stage (method, encoder) codes the previous stage's header + payload."""
    buf = data
    for method, encode in stages:
        payload = encode(buf)
        buf = struct.pack("<BII", method, 9 + len(payload), len(buf)) + payload
    return bytes([len(stages)]) + bytes(m for m, _e in stages) + buf


def block(method: int, payload: bytes, size: int) -> bytes:
    """A complete compressed block (checksum, header) around a codec payload."""
    body = struct.pack("<BII", method, 9 + len(payload), size) + payload
    return cityhash128(body) + body


def as_bytes(values: list[int], width: int, signed: bool) -> bytes:
    dt = np.dtype(f"<{'i' if signed else 'u'}{width}")
    return np.array(values, dtype=dt).tobytes()


def encode_gcd(data: bytes, width: int) -> bytes:
    skip, vals = _values(data, width)
    g = 0
    for v in vals:
        g = math.gcd(g, v)
    out = bytes([width, len(skip)]) + skip + g.to_bytes(width, "little")
    return out + b"".join((v // g if g else 0).to_bytes(width, "little") for v in vals)
