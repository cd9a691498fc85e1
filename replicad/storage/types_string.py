"""String (VarUInt length + bytes), FixedString(N) (N zero-padded bytes) and the vectorised VarUInt codec.

Decoding a stream of length-prefixed strings is inherently sequential (row i's header position depends on
all earlier lengths).  :func:`decode_varuint_prefixed` does it without a per-row Python loop: it decodes
a VarUInt at *every* byte position, then follows the chain of "next header" pointers from position 0 by
pointer doubling plus a few strided hops (see :func:`_follow_chain`).  Work is O(B log(n)) at worst for B
bytes and n rows, so call it per granule rather than per file.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import CorruptedDataError
from replicad.storage.types_base import (
    FIELD_STRING,
    DataType,
    first_true,
    is_stringlike,
)

I64 = npt.NDArray[np.int64]


# ---- VarUInt ---------------------------------------------------------------------------------------


def varuint_sizes(values: npt.NDArray[Any]) -> I64:
    """Encoded size in bytes of each (unsigned) value."""
    v = np.asarray(values, dtype=np.uint64)
    k = np.ones(len(v), dtype=np.int64)
    if len(v) == 0:
        return k
    top = int(v.max())
    shift = 7
    while shift < 64 and top >> shift:
        k += v >= np.uint64(1 << shift)
        shift += 7
    return k


def encode_varuint_into(
    out: npt.NDArray[np.uint8], starts: I64, values: npt.NDArray[Any], sizes: I64
) -> None:
    """Write each ``values[i]`` as VarUInt at ``out[starts[i]:starts[i]+sizes[i]]``."""
    v = np.asarray(values, dtype=np.uint64)
    if len(v) == 0:
        return
    kmax = int(sizes.max())
    if kmax == 1:
        out[starts] = v.astype(np.uint8)
        return
    for j in range(kmax):
        sel = sizes > j
        group = ((v[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        more = (sizes[sel] > j + 1).astype(np.uint8) << 7
        out[starts[sel] + j] = group | more


def encode_varuints(values: npt.NDArray[Any]) -> bytes:
    """Concatenated VarUInt encodings of ``values``."""
    sizes = varuint_sizes(values)
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    out = np.empty(int(sizes.sum()), dtype=np.uint8)
    encode_varuint_into(out, starts, values, sizes)
    return out.tobytes()


def encode_varuint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def decode_varuints_at(buf: npt.NDArray[np.uint8], pos: I64) -> tuple[I64, I64]:
    """(value, encoded size) of the VarUInts starting at ``pos``; size 1<<40 if truncated/overlong."""
    size = len(buf)
    first = buf[pos]
    value = (first & 0x7F).astype(np.int64)
    k = np.ones(len(pos), dtype=np.int64)
    active = np.flatnonzero(first >= 0x80)
    j = 1
    while active.size and j < 10:
        at = pos[active] + j
        inside = at < size
        k[active[~inside]] = 1 << 40
        active, at = active[inside], at[inside]
        byte = buf[at].astype(np.int64)
        if j < 9:
            value[active] |= (byte & 0x7F) << (7 * j)
        else:  # the 10th byte carries bit 63 only
            value[active] |= np.where(byte & 1, np.int64(-(2**63)), np.int64(0))
        k[active] += 1
        active = active[byte >= 0x80]
        j += 1
    if active.size:
        k[active] = 1 << 40
    return value, k


def _next_header_table(buf: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
    """For every byte position p (plus two sentinels): where the next record starts if a record started at p.

    Values are clamped to the sentinel ``len(buf) + 1`` (= "past the end / invalid").
    """
    size = len(buf)
    sentinel = size + 1
    idx = np.int32 if size + 2 < 2**31 - 2**8 else np.int64
    nxt = np.empty(size + 2, dtype=idx)
    np.bitwise_and(buf, 0x7F, out=nxt[:size], casting="unsafe")
    np.add(nxt[:size], np.arange(1, size + 1, dtype=idx), out=nxt[:size])
    continued = buf >= 0x80
    if size >= 64 and np.count_nonzero(continued) > size // 16:  # e.g. non-ASCII text: whole-array passes
        _add_multibyte_dense(buf, continued, nxt, sentinel)
        return nxt
    multi = np.flatnonzero(continued)
    if multi.size:
        value, k = decode_varuints_at(buf, multi)
        value = np.where(value < 0, sentinel, np.minimum(value, sentinel))
        nxt[multi] = np.minimum(multi + k + value, sentinel)
    np.minimum(nxt, sentinel, out=nxt)
    nxt[size:] = sentinel
    return nxt


def _add_multibyte_dense(
    buf: npt.NDArray[np.uint8], live: npt.NDArray[np.bool_], nxt: npt.NDArray[Any], sentinel: int
) -> None:
    """Finish :func:`_next_header_table` when many bytes have the continuation bit (shifted whole arrays).

    Only VarUInts of at most as many bytes as ``sentinel`` needs can point inside the buffer; longer ones
    (and ones running off the end) become the sentinel.
    """
    size = len(buf)
    live = live.copy()
    extra = np.zeros(size, dtype=np.int64)  # bytes 1.. of each VarUInt: their value bits, plus 1 per byte
    nbytes = max(1, -(-sentinel.bit_length() // 7))
    shifted = np.empty(size, dtype=np.uint8)
    for j in range(1, nbytes):
        if not live.any():
            break
        shifted[: size - j] = buf[j:]
        shifted[size - j:] = 0x80  # past the end: the VarUInt stays unfinished
        part = (shifted & 0x7F).astype(np.int64) << (7 * j)
        part += 1
        part *= live
        extra += part
        live &= shifted >= 0x80
    total = nxt[:size].astype(np.int64) + extra
    total[live] = sentinel  # longer than any VarUInt that can point inside the buffer
    np.minimum(total, sentinel, out=total)
    nxt[:size] = total
    nxt[size:] = sentinel


def _follow_chain(nxt: npt.NDArray[Any], n: int, size: int) -> I64:
    """Positions of the first ``n`` records of the chain 0 -> nxt[0] -> ... (short records).

    ``r`` rounds of pointer doubling over the whole table cost about ``size`` ns each; the remaining
    ``n / 2**r`` strided hops are taken one at a time (about 150 ns each); ``r >= 2`` so that a hop
    never stands for fewer than 4 rows, and ``r`` otherwise balances the two costs.
    """
    best_r, best_cost = 2, float("inf")
    for r in range(2, max(2, (n - 1).bit_length()) + 1):
        cost = -(-n // (1 << r)) * 150.0 + r * size * 1.0
        if cost < best_cost:
            best_r, best_cost = r, cost
    tables = [nxt]
    for _ in range(best_r):
        t = tables[-1]
        tables.append(t[t])
    far = tables[-1]
    hops = -(-n // (1 << best_r))
    checkpoints = [0] * hops
    p = 0
    item = far.item
    for h in range(hops):
        checkpoints[h] = p
        p = item(p)
    positions = np.array(checkpoints, dtype=np.int64)
    for r in range(best_r - 1, -1, -1):
        finer = np.empty(2 * len(positions), dtype=np.int64)
        finer[0::2] = positions
        finer[1::2] = tables[r][positions]
        positions = finer
    return positions[:n]


def _walk_long_records(data: bytes, n: int) -> I64:
    """Positions of the first ``n`` records when records are long (>= ``LONG_RECORD`` bytes on average).

    Each step costs ~100 ns of interpreter time, amortised over the record's bytes; every vectorised
    alternative touches each byte several times and is slower here (measured: 300-byte strings, 8192 rows:
    ~1 ms this way vs ~7 ms through the full next-record table).  Positions past the end are returned
    as they are; the caller validates them.
    """
    size = len(data)
    out = [0] * n
    p = 0
    for i in range(n):
        out[i] = p
        if p >= size:
            break
        c = data[p]
        if c < 0x80:
            p += 1 + c
            continue
        length, shift, q = 0, 0, p
        while q < size and shift < 64:
            c = data[q]
            length |= (c & 0x7F) << shift
            q += 1
            shift += 7
            if c < 0x80:
                break
        else:
            out[i] = size + 1
            break
        p = q + length
    else:
        return np.array(out, dtype=np.int64)
    arr = np.array(out, dtype=np.int64)
    arr[i:] = max(arr[i], size)
    return arr


LONG_RECORD = 24

def decode_varuint_prefixed(data: memoryview | bytes, n: int) -> tuple[I64, I64, I64, int]:
    """Locate ``n`` consecutive (VarUInt length, bytes) records at the start of ``data``.

    Returns (header positions, header sizes, payload lengths, bytes consumed).
    """
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, z, 0
    buf = np.frombuffer(data, dtype=np.uint8)
    size = len(buf)
    if size == 0:
        raise CorruptedDataError(f"String: need {n} rows, stream is empty")
    if size >= LONG_RECORD * n:
        pos = _walk_long_records(bytes(data) if not isinstance(data, bytes) else data, n)
    else:
        pos = _follow_chain(_next_header_table(buf), n, size)
    if int(pos[-1]) >= size:
        raise CorruptedDataError(f"String: stream of {size} bytes holds fewer than {n} rows")
    value, k = decode_varuints_at(buf, pos[-1:])
    if k[0] >= 1 << 40 or value[0] < 0 or int(pos[-1]) + int(k[0]) + int(value[0]) > size:
        raise CorruptedDataError(f"String: last of {n} rows runs past the end of the {size}-byte stream")
    value, k = decode_varuints_at(buf, pos)
    end = int(pos[-1] + k[-1] + value[-1])
    return pos, k, value, end


# ---- String ----------------------------------------------------------------------------------------


def binary_parts(arr: pa.Array) -> tuple[npt.NDArray[Any], npt.NDArray[np.uint8]]:
    """(offsets relative to the data start, data bytes) of a ``pa.binary()`` array without nulls."""
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4)
    base = int(offsets[0])
    data_buf = arr.buffers()[2]
    end = int(offsets[-1])
    if data_buf is None or end == base:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(data_buf, dtype=np.uint8, count=end - base, offset=base)
    return (offsets - base if base else offsets), data


def binary_from_parts(lengths: npt.NDArray[Any], data: npt.NDArray[np.uint8]) -> pa.Array:
    n = len(lengths)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    bufs = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(np.ascontiguousarray(data))]
    return pa.Array.from_buffers(pa.binary(), n, bufs)


def encode_strings(arr: pa.Array) -> bytes:
    """VarUInt length + bytes for every row (nulls as empty strings)."""
    if arr.null_count:
        arr = arr.fill_null(b"")
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    n = len(arr)
    if n == 0:
        return b""
    offsets, data = binary_parts(arr)
    lengths = np.diff(offsets).astype(np.int64)
    sizes = varuint_sizes(lengths)
    total = int(offsets[-1]) + int(sizes.sum())
    if len(data) > 32 * n and total < 2**31:  # long strings: let Arrow interleave headers and payloads
        hoff = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(sizes, out=hoff[1:])
        hbytes = np.empty(int(hoff[-1]), dtype=np.uint8)
        encode_varuint_into(hbytes, hoff[:-1].astype(np.int64), lengths, sizes)
        headers = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(hoff), pa.py_buffer(hbytes)])
        joined = pc.binary_join_element_wise(headers, arr, pa.scalar(b"", pa.binary()))
        jbufs = joined.buffers()
        joff = np.frombuffer(jbufs[1], dtype=np.int32, count=n + 1, offset=joined.offset * 4)
        return memoryview(jbufs[2])[int(joff[0]):int(joff[-1])].tobytes()
    out = np.empty(total, dtype=np.uint8)
    csizes = np.cumsum(sizes)
    starts = offsets[:-1] + csizes - sizes
    is_data = np.ones(total, dtype=bool)
    if int(sizes[-1]) == 1 and int(csizes[-1]) == n:
        is_data[starts] = False
    else:
        for j in range(int(sizes.max())):
            is_data[starts[sizes > j] + j] = False
    encode_varuint_into(out, starts, lengths, sizes)
    out[is_data] = data
    return out.tobytes()


def decode_strings(data: memoryview, n: int) -> tuple[pa.Array, int]:
    pos, sizes, lengths, used = decode_varuint_prefixed(data, n)
    if n == 0:
        return pa.array([], pa.binary()), 0
    if used >= 2**31:
        buf = np.frombuffer(data, dtype=np.uint8, count=used)
        is_data = np.ones(used, dtype=bool)
        for j in range(int(sizes.max())):
            is_data[pos[sizes > j] + j] = False
        return binary_from_parts(lengths, buf[is_data]), used
    # whole records (header + payload) as one zero-copy binary array, then cut the headers off
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[:n] = pos
    offsets[n] = used
    records = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    kinds = np.unique(sizes)
    out = pc.binary_slice(records, int(kinds[0]), 2**31 - 1)
    for kk in kinds[1:]:
        out = pc.if_else(pa.array(sizes == kk), pc.binary_slice(records, int(kk), 2**31 - 1), out)
    return out, used


def convert_to_binary(dt: DataType, arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if is_stringlike(t) or pa.types.is_fixed_size_binary(t):
        return arr.cast(pa.binary())
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.binary())
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t):
        return arr.cast(pa.string()).cast(pa.binary())
    raise dt.wrong_input(arr)


class StringType(DataType):
    name = "String"
    arrow_type = pa.binary()
    field_type = FIELD_STRING
    field_kind = "string"

    @property
    def default_value(self) -> Any:
        return b""

    def encode(self, arr: pa.Array) -> bytes:
        return encode_strings(arr)

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        return decode_strings(data, n)

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        v: bytes = arr[i].as_py()
        return bytes([FIELD_STRING]) + struct.pack("<Q", len(v)) + v

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        return convert_to_binary(self, arr)


class FixedStringType(DataType):
    field_type = FIELD_STRING
    field_kind = "string"

    def __init__(self, size: int) -> None:
        if not 0 < size <= 0xFFFFFF:
            raise ValueError(f"FixedString size {size} is out of range")
        self.size = size
        self.name = f"FixedString({size})"
        self.arrow_type = pa.binary(size)

    @property
    def default_value(self) -> Any:
        return b"\0" * self.size

    def encode(self, arr: pa.Array) -> bytes:
        if arr.null_count:
            arr = arr.fill_null(pa.scalar(self.default_value, self.arrow_type))
        n = len(arr)
        buf = arr.buffers()[1]
        if buf is None:
            return bytes(n * self.size)
        return bytes(memoryview(buf)[arr.offset * self.size:(arr.offset + n) * self.size])

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        size = n * self.size
        if len(data) < size:
            raise CorruptedDataError(f"{self.name}: need {size} bytes for {n} rows, have {len(data)}")
        return pa.Array.from_buffers(self.arrow_type, n, [None, pa.py_buffer(bytes(data[:size]))]), size

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        v: bytes = arr[i].as_py()
        return bytes([FIELD_STRING]) + struct.pack("<Q", len(v)) + v

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        if arr.type == self.arrow_type:
            return arr
        b = convert_to_binary(self, arr)
        lengths = pc.binary_length(b)
        bad = first_true(pc.greater(lengths, self.size))
        if bad >= 0:
            raise self.reject(arr, bad, f"is longer than {self.size} bytes")
        return pad_fixed(b, self.size)


def pad_fixed(b: pa.Array, size: int) -> pa.Array:
    """``pa.binary()`` values of at most ``size`` bytes -> ``pa.binary(size)``, zero padded, nulls kept."""
    n = len(b)
    valid = b.is_valid()
    filled = b.fill_null(b"") if b.null_count else b
    offsets, data = binary_parts(filled)
    lengths = np.diff(offsets)
    grid = np.arange(size, dtype=np.int64)[None, :] < lengths[:, None]
    out = np.zeros((n, size), dtype=np.uint8)
    out[grid] = data
    validity = None
    if b.null_count:
        validity = pa.py_buffer(np.packbits(valid.to_numpy(zero_copy_only=False), bitorder="little"))
    return pa.Array.from_buffers(pa.binary(size), n, [validity, pa.py_buffer(out)])
