"""UUID: storage ``pa.binary(16)`` holding the canonical big-endian bytes of the UUID text.

On disk ClickHouse writes two little-endian UInt64: the first 8 bytes read as a big-endian number, then the
last 8 (``00000000-0000-0000-0000-000000000001`` -> ``00*8 01 00*7``), i.e. each half byte-reversed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import FIELD_UINT128, DataType, is_stringlike
from replicad.datatypes.strings import binary_parts
from replicad.errors import CorruptedDataError

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_NIBBLE = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _NIBBLE[_c] = 10 + _i
_DASHES = (8, 13, 18, 23)
_HEX_COLUMNS = np.array([i for i in range(36) if i not in _DASHES])


def swap_halves(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """(n*16,) bytes -> each 8-byte half reversed (its own inverse)."""
    return np.ascontiguousarray(raw.reshape(-1, 2, 8)[:, :, ::-1]).reshape(-1)


def uuid_text(raw16: npt.NDArray[np.uint8]) -> pa.Array:
    """(n, 16) canonical bytes -> ``pa.string()`` of ``xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    n = len(raw16)
    out = np.full((n, 36), ord("-"), dtype=np.uint8)
    hexes = np.empty((n, 32), dtype=np.uint8)
    hexes[:, 0::2] = _HEX_DIGITS[raw16 >> 4]
    hexes[:, 1::2] = _HEX_DIGITS[raw16 & 0x0F]
    out[:, _HEX_COLUMNS] = hexes
    offsets = (np.arange(n + 1, dtype=np.int32) * 36)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out)])


class UUIDType(DataType):
    name = "UUID"
    arrow_type = pa.binary(16)
    field_type = FIELD_UINT128
    field_kind = "uint128"

    @property
    def default_value(self) -> Any:
        return bytes(16)

    def _raw(self, arr: pa.Array) -> npt.NDArray[np.uint8]:
        if arr.null_count:
            arr = arr.fill_null(pa.scalar(bytes(16), pa.binary(16)))
        buf = arr.buffers()[1]
        if buf is None:
            return np.zeros(16 * len(arr), dtype=np.uint8)
        return np.frombuffer(buf, dtype=np.uint8, count=16 * len(arr), offset=16 * arr.offset)

    def encode(self, arr: pa.Array) -> bytes:
        return swap_halves(self._raw(arr)).tobytes()

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        size = 16 * n
        if len(data) < size:
            raise CorruptedDataError(f"UUID: need {size} bytes for {n} rows, have {len(data)}")
        raw = swap_halves(np.frombuffer(data, dtype=np.uint8, count=size))
        return pa.Array.from_buffers(self.arrow_type, n, [None, pa.py_buffer(raw)]), size

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_UINT128]) + self.encode(arr.slice(i, 1))

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        if isinstance(t, pa.ExtensionType):
            arr = arr.storage
            t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
            t = arr.type
        if pa.types.is_null(t):
            return pa.nulls(len(arr), self.arrow_type)
        if t == self.arrow_type:
            return arr
        if not is_stringlike(t):
            raise self.wrong_input(arr)
        raw_ok = pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        b = arr.cast(pa.binary())
        valid = b.is_valid()
        filled = b.fill_null(b"0" * 32) if b.null_count else b
        offsets, data = binary_parts(filled)
        lens = np.diff(offsets)
        is16 = (lens == 16) if raw_ok else np.zeros(len(lens), dtype=bool)
        accepted = is16 | (lens == 36) | (lens == 32)
        if not accepted.all():
            raise self.reject(arr, int(np.argmin(accepted)), "is not a UUID")
        n = len(b)
        out = np.zeros((n, 16), dtype=np.uint8)
        starts = offsets[:-1]
        if is16.any():
            rows16 = np.flatnonzero(is16)
            out[rows16] = data[starts[rows16][:, None] + np.arange(16)]
        for length, cols in ((36, _HEX_COLUMNS), (32, np.arange(32))):
            rows = np.flatnonzero(lens == length)
            if not rows.size:
                continue
            text = data[starts[rows][:, None] + np.arange(length)]
            ok = (_NIBBLE[text[:, cols]] != 255).all(axis=1)
            if length == 36:
                ok &= (text[:, list(_DASHES)] == ord("-")).all(axis=1)
            if not ok.all():
                raise self.reject(arr, int(rows[int(np.argmin(ok))]), "is not a UUID")
            nib = _NIBBLE[text[:, cols]]
            out[rows] = (nib[:, 0::2] << 4) | nib[:, 1::2]
        validity = None
        if b.null_count:
            validity = pa.py_buffer(np.packbits(valid.to_numpy(zero_copy_only=False), bitorder="little"))
        return pa.Array.from_buffers(self.arrow_type, n, [validity, pa.py_buffer(out)])

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        text = uuid_text(self._raw(a).reshape(-1, 16))
        if a.null_count:
            text = pc.if_else(a.is_valid(), text, pa.nulls(len(a), pa.string()))
        return text
