"""Nullable(T) and Array(T).

Streams: Nullable writes ``<c>.null.bin`` (UInt8 per row, 1 = NULL) then T's streams, with the values the
array holds under its NULL rows (T's zero value for inserted rows; 18.16 keeps old values there after a
mutation and through merges).  Array writes ``<c>.size<level>.bin`` (per-row element counts as UInt64,
*not* cumulative offsets) then T's streams for all elements; ``level`` counts enclosing arrays (``.size0``,
``.size1``...).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes.base import (
    FIELD_ARRAY,
    FIELD_NULL,
    BadValue,
    DataType,
    as_array,
)
from replicad.errors import CorruptedDataError
from replicad.model.varint import encode_varuint


def _append(out: dict[str, bytes], suffix: str, data: bytes) -> None:
    prev = out.get(suffix)
    out[suffix] = data if prev is None else prev + data


def _take_stream(
    bufs: dict[str, bytes], pos: dict[str, int], suffix: str, size: int, what: str
) -> memoryview:
    try:
        buf = bufs[suffix]
    except KeyError:
        raise CorruptedDataError(f"{what}: missing stream {suffix!r}") from None
    start = pos.get(suffix, 0)
    if len(buf) - start < size:
        raise CorruptedDataError(f"{what}: stream {suffix!r} has {len(buf) - start} bytes, need {size}")
    pos[suffix] = start + size
    return memoryview(buf)[start:start + size]


def with_nulls(arr: pa.Array, is_null: np.ndarray[Any, np.dtype[np.bool_]]) -> pa.Array:
    """``arr`` with rows where ``is_null`` set to NULL."""
    if not is_null.any():
        return arr
    if arr.type.num_fields == 0 and not arr.null_count and not pa.types.is_dictionary(arr.type):
        # the values stay as they are under the new NULLs (18.16 keeps them too)
        valid = ~is_null
        if arr.offset:
            valid = np.concatenate([np.zeros(arr.offset, dtype=bool), valid])
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(arr.type, len(arr), [validity, *arr.buffers()[1:]], offset=arr.offset)
    return pc.if_else(pa.array(is_null), pa.nulls(len(arr), arr.type), arr)


def values_under_nulls(arr: pa.Array) -> pa.Array:
    """``arr`` without its validity bitmap: the stored values of the NULL rows come out as they are.

    18.16 keeps whatever a Nullable column's nested column holds under a NULL (the old value after
    ``UPDATE c = NULL``, the source's value through a merge), so the writer writes what the array carries;
    inserts put the type's zero there (see ``replicad.storage.block.zero_under_nulls``).  Types whose
    layout is not one validity bitmap over plain buffers are returned unchanged."""
    if not arr.null_count or arr.type.num_fields != 0 or pa.types.is_dictionary(arr.type):
        return arr
    return pa.Array.from_buffers(arr.type, len(arr), [None, *arr.buffers()[1:]], offset=arr.offset)


def _keeping_nulls(arr: pa.Array | pa.ChunkedArray, select: Callable[[pa.Array], pa.Array]) -> pa.Array:
    a = as_array(arr)
    if not a.null_count or a.type.num_fields != 0 or pa.types.is_dictionary(a.type):
        return select(a)
    is_null = np.asarray(select(a.is_null()).to_numpy(zero_copy_only=False), dtype=bool)
    return with_nulls(select(values_under_nulls(a)), is_null)


def take_rows(table: pa.Table, indices: pa.Array | np.ndarray[Any, Any]) -> pa.Table:
    """``table.take(indices)`` keeping the values stored under NULLs (pyarrow's take writes 0 there)."""
    idx = indices if isinstance(indices, pa.Array) else pa.array(indices)
    return pa.Table.from_arrays([_keeping_nulls(c, lambda a: a.take(idx)) for c in table.columns],
                                schema=table.schema)


def filter_rows(table: pa.Table, mask: pa.Array | np.ndarray[Any, Any]) -> pa.Table:
    """``table.filter(mask)`` keeping the values stored under NULLs (pyarrow's filter writes 0 there)."""
    keep = mask if isinstance(mask, pa.Array) else pa.array(mask, pa.bool_())
    return pa.Table.from_arrays([_keeping_nulls(c, lambda a: a.filter(keep)) for c in table.columns],
                                schema=table.schema)


class NullableType(DataType):
    is_nullable = True

    def __init__(self, inner: DataType) -> None:
        if inner.is_nullable or isinstance(inner, ArrayType):
            raise ValueError(f"Nested type {inner.name} cannot be inside Nullable type")
        self.inner = inner
        self.name = f"Nullable({inner.name})"
        self.arrow_type = inner.arrow_type
        self.field_type = inner.field_type
        self.field_kind = inner.field_kind
        self.is_integer_like = inner.is_integer_like
        self.is_date = inner.is_date

    @property
    def default_value(self) -> Any:
        return None

    def defaults(self, n: int) -> pa.Array:
        return pa.nulls(n, self.arrow_type)

    def _substreams(self, array_level: int) -> list[str]:
        return [".null", *self.inner._substreams(array_level)]

    def _serialize_into(self, arr: pa.Array, out: dict[str, bytes], array_level: int) -> None:
        nulls = arr.is_null().to_numpy(zero_copy_only=False).astype(np.uint8)
        _append(out, ".null", nulls.tobytes())
        self.inner._serialize_into(values_under_nulls(arr), out, array_level)

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        null_map = np.frombuffer(_take_stream(bufs, pos, ".null", n, self.name), dtype=np.uint8) != 0
        values = self.inner._deserialize_from(bufs, pos, n, array_level)
        return with_nulls(values, null_map)

    def encode(self, arr: pa.Array) -> bytes:
        return self.inner.encode(arr)

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        return self.inner.decode(data, n)

    def serialize_value(self, arr: pa.Array | pa.ChunkedArray, i: int) -> bytes:
        a = as_array(arr)
        if not a[i].is_valid:
            return b"\x01"
        return b"\x00" + self.inner.serialize_value(a, i)

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return self.inner._field_payload(arr, i, legacy_decimal)

    def field_bytes(self, arr: pa.Array | pa.ChunkedArray, i: int, *, legacy_decimal: bool = True) -> bytes:
        a = as_array(arr)
        if not a[i].is_valid:
            return bytes([FIELD_NULL])
        return self.inner.field_bytes(a, i, legacy_decimal=legacy_decimal)

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        return self.inner.convert(arr, tz)

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        return self.inner.to_user_arrow(arr, tz)


def list_parts(arr: pa.Array) -> tuple[np.ndarray[Any, np.dtype[np.int64]], pa.Array]:
    """(per-row element counts, the elements of exactly these rows) of a list array."""
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        counts = np.full(len(arr), size, dtype=np.int64)
        return counts, arr.values.slice(arr.offset * size, len(arr) * size)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    counts = np.diff(offsets)
    if arr.null_count:
        counts[arr.is_null().to_numpy(zero_copy_only=False)] = 0
    if not len(arr):
        return counts, arr.values.slice(0, 0)
    return counts, arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def list_from_counts(counts: np.ndarray[Any, np.dtype[Any]], values: pa.Array, item: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise CorruptedDataError("Array: more than 2**31 elements in one call")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values, type=pa.list_(item))


class ArrayBulkSerializer:
    """Writer state of an Array whose elements need per-part state (``writer.BulkSerializer``)."""

    def __init__(self, dtype: ArrayType, inner: Any, level: int) -> None:
        self.dtype = dtype
        self.inner = inner
        self.level = level
        if isinstance(inner, ArrayBulkSerializer):
            inner.level = level + 1

    def prefix(self) -> dict[str, bytes]:
        return dict(self.inner.prefix())

    def serialize(self, arr: pa.Array) -> dict[str, bytes]:
        counts, values = list_parts(as_array(arr))
        out = {f".size{self.level}": counts.astype("<u8").tobytes()}
        out.update(self.inner.serialize(values))
        return out

    def suffix(self) -> dict[str, bytes]:
        return dict(self.inner.suffix())


class ArrayType(DataType):
    field_type = FIELD_ARRAY
    field_kind = "array"

    def __init__(self, inner: DataType) -> None:
        self.inner = inner
        self.name = f"Array({inner.name})"
        self.arrow_type = pa.list_(inner.arrow_type)

    @property
    def default_value(self) -> Any:
        return []

    def _substreams(self, array_level: int) -> list[str]:
        return [f".size{array_level}", *self.inner._substreams(array_level + 1)]

    def _serialize_into(self, arr: pa.Array, out: dict[str, bytes], array_level: int) -> None:
        counts, values = list_parts(arr)
        _append(out, f".size{array_level}", counts.astype("<u8").tobytes())
        self.inner._serialize_into(values, out, array_level + 1)

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        suffix = f".size{array_level}"
        counts = np.frombuffer(_take_stream(bufs, pos, suffix, 8 * n, self.name), dtype="<u8")
        total = int(counts.sum()) if n else 0
        if n and int(counts.max()) >= 2**31:
            raise CorruptedDataError(f"{self.name}: implausible array size {int(counts.max())}")
        values = self.inner._deserialize_from(bufs, pos, total, array_level + 1)
        return list_from_counts(counts, values, self.inner.arrow_type)

    @property
    def bulk_serializer(self) -> Callable[[], ArrayBulkSerializer]:
        """Present only when the element type is stateful (LowCardinality): per-part writer state."""
        make_inner = getattr(self.inner, "bulk_serializer", None)
        if make_inner is None:
            raise AttributeError("bulk_serializer")
        return lambda: ArrayBulkSerializer(self, make_inner(), 0)

    def encode(self, arr: pa.Array) -> bytes:
        raise TypeError("Array has several streams: use serialize()")

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        raise TypeError("Array has several streams: use deserialize()")

    def serialize_value(self, arr: pa.Array | pa.ChunkedArray, i: int) -> bytes:
        """serializeBinary(Field) of an array: VarUInt count, then each element's serializeBinary."""
        counts, values = list_parts(as_array(arr).slice(i, 1))
        parts = [encode_varuint(int(counts[0]))]
        parts.extend(self.inner.serialize_value(values, j) for j in range(len(values)))
        return b"".join(parts)

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        counts, values = list_parts(arr.slice(i, 1))
        parts = [bytes([FIELD_ARRAY]), struct.pack("<Q", int(counts[0]))]
        inner = self.inner
        parts.extend(inner.field_bytes(values, j, legacy_decimal=legacy_decimal) for j in range(len(values)))
        return b"".join(parts)

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        t = arr.type
        if pa.types.is_null(t):
            return pa.nulls(len(arr), self.arrow_type)
        if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
                or getattr(pa.types, "is_list_view", lambda _t: False)(t)):
            raise self.wrong_input(arr)
        if not pa.types.is_fixed_size_list(t) and not pa.types.is_list(t) and not pa.types.is_large_list(t):
            arr = arr.cast(pa.large_list(t.value_type))
        counts, values = list_parts(arr)
        try:
            converted = self.inner.convert_checked(values, tz)
        except BadValue as e:
            ends = np.cumsum(counts)
            row = int(np.searchsorted(ends, e.row, side="right"))
            element = e.row - int(ends[row] - counts[row])
            raise BadValue(row, e.value, f"(array element {element}) {e.reason}") from None
        out = list_from_counts(counts, converted, self.inner.arrow_type)
        if arr.null_count:
            out = with_nulls(out, arr.is_null().to_numpy(zero_copy_only=False))
        return out

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        a = as_array(arr)
        counts, values = list_parts(a)
        user = self.inner.to_user_arrow(values, tz)
        return list_from_counts(counts, user, user.type)
