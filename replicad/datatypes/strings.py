"""String (VarUInt length + bytes) and FixedString(N) (N zero-padded bytes).

String streams are encoded and decoded by the C extension :mod:`replicad.native._strings` (a stream of
length-prefixed strings is inherently sequential: row i's header position depends on all earlier lengths).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import (
    FIELD_STRING,
    DataType,
    first_true,
    is_stringlike,
)
from replicad.errors import CorruptedDataError
from replicad.native import _strings

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


def encode_strings(arr: pa.Array) -> bytes:
    """VarUInt length + bytes for every row (nulls as empty strings)."""
    if arr.null_count:
        arr = arr.fill_null(b"")
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    arr = arr.cast(pa.large_binary() if large else pa.binary())
    n = len(arr)
    if n == 0:
        return b""
    _validity, offsets, data = arr.buffers()
    dtype = np.dtype(np.int64 if large else np.int32)
    offs = np.frombuffer(offsets, dtype=dtype, count=n + 1, offset=arr.offset * dtype.itemsize)
    return _strings.encode(offs, data if data is not None else b"")


def decode_strings(data: memoryview, n: int) -> tuple[pa.Array, int]:
    """The first ``n`` strings of ``data`` as ``pa.binary()`` (``large_binary`` past 2 GiB) and bytes used."""
    try:
        offsets, payload, used = _strings.decode(data, n)
    except ValueError as e:
        raise CorruptedDataError(f"String: {e}") from None
    t = pa.binary() if len(offsets) == 4 * (n + 1) else pa.large_binary()
    return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), pa.py_buffer(payload)]), used


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
