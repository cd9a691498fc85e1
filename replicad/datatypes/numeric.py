"""Fixed-width numeric types: Int8..Int64, UInt8..UInt64, Float32/64, and the shared fixed-width codec."""

from __future__ import annotations

import functools
import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import (
    FIELD_FLOAT64,
    FIELD_INT64,
    FIELD_UINT64,
    DataType,
    checked,
    first_true,
    is_stringlike,
)
from replicad.errors import CorruptedDataError
from replicad.native import _textints


class FixedWidthType(DataType):
    """A type whose every value is ``np_dtype.itemsize`` bytes in ``.bin`` (little-endian)."""

    np_dtype: np.dtype[Any]

    def storage_numpy(self, arr: pa.Array) -> npt.NDArray[Any]:
        """Storage Arrow -> numpy values in the serialized dtype (nulls become 0)."""
        if arr.null_count:
            arr = arr.fill_null(pa.scalar(0, arr.type))
        return np.asarray(arr.to_numpy(zero_copy_only=False)).astype(self.np_dtype, copy=False)

    def storage_from_numpy(self, values: npt.NDArray[Any]) -> pa.Array:
        return pa.array(values, type=self.arrow_type)

    def encode(self, arr: pa.Array) -> bytes:
        return self.storage_numpy(arr).tobytes()

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        size = n * self.np_dtype.itemsize
        if len(data) < size:
            raise CorruptedDataError(f"{self.name}: need {size} bytes for {n} rows, have {len(data)}")
        values = np.frombuffer(data, dtype=self.np_dtype, count=n)
        return self.storage_from_numpy(values), size


def strip_text(arr: pa.Array) -> pa.Array:
    """Binary/string input -> utf8 strings without surrounding whitespace."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return pc.utf8_trim_whitespace(arr)


_INT_RE = r"^[+-]?[0-9]+$"


class IntType(FixedWidthType):
    is_integer_like = True

    def __init__(self, bits: int, signed: bool) -> None:
        self.bits = bits
        self.signed = signed
        self.name = f"{'Int' if signed else 'UInt'}{bits}"
        self.np_dtype = np.dtype(f"<{'i' if signed else 'u'}{bits // 8}")
        self.arrow_type = pa.from_numpy_dtype(self.np_dtype.newbyteorder("="))
        self.field_type = FIELD_INT64 if signed else FIELD_UINT64
        self.field_kind = "int64" if signed else "uint64"
        self.min = -(1 << (bits - 1)) if signed else 0
        self.max = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        v = int(arr[i].as_py())
        return bytes([self.field_type]) + struct.pack("<q" if self.signed else "<Q", v)

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        return convert_integers(self, arr, self.arrow_type)


#: texts up to this size are checked by one ``bytes.translate`` (numpy's temporaries cost more there); a
#: regular-expression scan of the same bytes was 40x slower (900 µs for 64 KB), holding the GIL
_SMALL_TEXT = 65536


@functools.cache
def _plain_bytes(forbidden: bytes) -> bytes:
    """The bytes a plain text may hold: printable ASCII without space ('!'..'~'), less ``forbidden``."""
    return bytes(c for c in range(0x21, 0x7F) if c not in forbidden)


def _plain_ascii(arr: pa.Array, forbidden: bytes) -> pa.Array | None:
    """``arr`` as UTF-8 text if its values hold only printable ASCII other than space (so that
    :func:`strip_text` would change nothing) and none of the ``forbidden`` bytes; else None."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
        return None
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    data_buf = buffers[2]
    if data_buf is not None and offsets[-1] > offsets[0]:
        lo, hi = int(offsets[0]), int(offsets[-1])
        if hi - lo <= _SMALL_TEXT:  # one scan of the bytes, no temporary arrays
            if bytes(memoryview(data_buf)[lo:hi]).translate(None, _plain_bytes(forbidden)):
                return None  # something is left once every plain byte is deleted
        else:
            data = np.frombuffer(data_buf, dtype=np.uint8)[lo:hi]
            if ((data - np.uint8(0x21)) > 0x5D).any():  # outside '!'..'~'
                return None
            if any((data == b).any() for b in forbidden):
                return None
    if pa.types.is_string(arr.type):
        return arr
    # printable ASCII is valid UTF-8: the same buffers as text, without the cast's validation pass
    return pa.Array.from_buffers(pa.string(), len(arr), arr.buffers(), arr.null_count, arr.offset)


def _plain_digits(arr: pa.Array) -> pa.Array | None:
    """``arr`` as UTF-8 text if every non-null value is only ASCII digits (the common case), else None."""
    text = arr
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        try:
            text = arr.cast(pa.string())
        except pa.ArrowException:
            return None
    return text if pc.all(pc.fill_null(pc.ascii_is_decimal(text), True)).as_py() else None


def plain_integers(arr: pa.Array, target: pa.DataType) -> pa.Array | None:
    """A text column whose every value is plain decimal digits (a leading '-' for a signed ``target``) within
    the range of ``target`` (an Arrow integer type), parsed straight to it in C
    (:mod:`replicad.native._textints`); None for anything else (the general path reports it)."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)) or not len(arr):
        return None
    validity, offsets, data = arr.buffers()
    got = _textints.parse(offsets, data if data is not None else b"", validity if arr.null_count else None,
                          arr.offset, len(arr), pa.types.is_signed_integer(target), target.bit_width)
    if isinstance(got, int):
        return None
    values = pa.Array.from_buffers(target, len(arr), [None, pa.py_buffer(got)])
    if not arr.null_count:
        return values
    if arr.offset == 0:
        return pa.Array.from_buffers(target, len(arr), [validity, pa.py_buffer(got)])
    return pc.if_else(arr.is_null(), pa.scalar(None, target), values)


def convert_integers(dt: DataType, arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Integers, integral floats, bools and integer text -> ``target`` (an Arrow int type), range checked."""
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return checked(arr, lambda a: a.cast(target), dt, "is out of range")
    if pa.types.is_boolean(t):
        return arr.cast(target)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), target)
    if is_stringlike(t) or pa.types.is_dictionary(t):
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
        plain = plain_integers(arr, target)
        if plain is not None:  # the usual case, parsed in C
            return plain
        text = _plain_digits(arr)
        if text is None:  # signs, spaces, or something to reject
            text = checked(arr, strip_text, dt, "is not valid UTF-8 text")
            bad = first_true(pc.invert(pc.match_substring_regex(text, _INT_RE)))
            if bad >= 0:
                raise dt.reject(arr, bad, "cannot be parsed as an integer")
            text = pc.replace_substring_regex(text, r"^\+", "")
        wide = pa.uint64() if (pa.types.is_unsigned_integer(target)) else pa.int64()
        try:
            parsed = text.cast(wide)
        except pa.ArrowException:
            parsed = None
        if parsed is None:  # beyond 64 bits, or a minus sign for an unsigned type
            wide_cast = lambda a: a.cast(pa.decimal128(38, 0)).cast(target)  # noqa: E731
            return checked(text, wide_cast, dt, "is out of range", arr)
        return checked(parsed, lambda a: a.cast(target), dt, "is out of range", arr)
    raise dt.wrong_input(arr)


class FloatType(FixedWidthType):
    field_type = FIELD_FLOAT64
    field_kind = "float64"

    def __init__(self, bits: int) -> None:
        self.name = f"Float{bits}"
        self.np_dtype = np.dtype(f"<f{bits // 8}")
        self.arrow_type = pa.float32() if bits == 32 else pa.float64()

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_FLOAT64]) + struct.pack("<d", float(arr[i].as_py()))

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        numeric = (pa.types.is_floating, pa.types.is_integer, pa.types.is_boolean, pa.types.is_decimal)
        if any(f(t) for f in numeric):
            return arr.cast(self.arrow_type, safe=False)
        if pa.types.is_null(t):
            return pa.nulls(len(arr), self.arrow_type)
        if is_stringlike(t) or pa.types.is_dictionary(t):
            if pa.types.is_dictionary(t):
                arr = arr.dictionary_decode()
            text = _plain_ascii(arr, b"nN")  # no whitespace to strip, no "inf" spelling to normalise
            if text is None:
                text = checked(arr, strip_text, self, "is not valid UTF-8 text")
                # ClickHouse spellings of the special values
                text = pc.replace_substring_regex(text, r"^(?i)([+-]?)inf$", r"\1inf")
            if self.arrow_type == pa.float64():
                return checked(text, lambda a: a.cast(pa.float64()), self, "cannot be parsed as a number")
            return checked(text, lambda a: a.cast(pa.float64()).cast(self.arrow_type, safe=False),
                           self, "cannot be parsed as a number")
        raise self.wrong_input(arr)


INT_TYPES: dict[str, IntType] = {
    t.name: t for t in (IntType(b, s) for s in (True, False) for b in (8, 16, 32, 64))
}
FLOAT_TYPES: dict[str, FloatType] = {"Float32": FloatType(32), "Float64": FloatType(64)}

