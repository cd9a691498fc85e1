"""Enum8 / Enum16: stored as Int8 / Int16 codes; the type text lists ``'name' = code`` sorted by code."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import FIELD_INT64, first_true, is_stringlike
from replicad.datatypes.numeric import FixedWidthType, convert_integers


def quote_enum_name(s: str) -> str:
    """ClickHouse writeQuotedString: single quotes, backslash escapes (\\b \\f \\n \\r \\t \\0 \\\\ ')."""
    rep = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0", "\\": "\\\\",
           "'": "\\'"}
    return "'" + "".join(rep.get(c, c) for c in s) + "'"


class EnumType(FixedWidthType):
    field_type = FIELD_INT64
    field_kind = "int64"
    is_integer_like = True

    def __init__(self, bits: int, values: list[tuple[str, int]]) -> None:
        if bits not in (8, 16):
            raise ValueError("Enum width must be 8 or 16")
        if not values:
            raise ValueError("Enum must have at least one value")
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        names: set[str] = set()
        codes: set[int] = set()
        for name, code in values:
            if not lo <= code <= hi:
                raise ValueError(f"Enum{bits} value {code} for {name!r} is out of range")
            if name in names:
                raise ValueError(f"duplicate name {name!r} in Enum")
            if code in codes:
                raise ValueError(f"duplicate value {code} in Enum")
            names.add(name)
            codes.add(code)
        self.bits = bits
        self.values: tuple[tuple[str, int], ...] = tuple(sorted(values, key=lambda nv: nv[1]))
        self.name = f"Enum{bits}(" + ", ".join(f"{quote_enum_name(n)} = {v}" for n, v in self.values) + ")"
        self.np_dtype = np.dtype(f"<i{bits // 8}")
        self.arrow_type = pa.int8() if bits == 8 else pa.int16()
        self._names = pa.array([n.encode("utf-8") for n, _ in self.values], pa.binary())
        self._codes = pa.array([v for _, v in self.values], self.arrow_type)

    @property
    def default_value(self) -> Any:
        """ClickHouse's Enum default is the smallest code (NULL slots of Nullable(Enum) hold 0 instead)."""
        return self.values[0][1]

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return bytes([FIELD_INT64]) + struct.pack("<q", int(arr[i].as_py()))

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
            t = arr.type
        if is_stringlike(t):
            names = arr.cast(pa.binary())
            idx = pc.index_in(names, value_set=self._names)
            bad = first_true(pc.and_(names.is_valid(), idx.is_null()))
            if bad >= 0:
                raise self.reject(arr, bad, "is not a valid name")
            return pc.take(self._codes, idx)
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
            codes = convert_integers(self, arr, self.arrow_type)
            bad = first_true(pc.and_(codes.is_valid(), pc.invert(pc.is_in(codes, value_set=self._codes))))
            if bad >= 0:
                raise self.reject(arr, bad, "is not a valid value")
            return codes
        raise self.wrong_input(arr)

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        """Codes -> names (``pa.string()``); codes not in the Enum (corrupt data) become null."""
        a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        idx = pc.index_in(a, value_set=self._codes)
        return pc.take(self._names.cast(pa.string()), idx)
