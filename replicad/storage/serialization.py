"""Serialization variants current ClickHouse writes into parts, for reading them.

ClickHouse 18.16 knows one binary serialization per type (see :mod:`replicad.storage.types_base`).
Current ClickHouse (26.x, FACTS §5.2) records per part, in ``serialization.json``, two variants the
reader must follow:

* ``"types_serialization_versions": {"string": 1}`` (``string_serialization_version='with_size_stream'``):
  a String is two streams, ``<c>.size`` (UInt64 length per row) and ``<c>`` (the bytes, concatenated
  without length prefixes).  Only for top-level String columns, unless (26.3+)
  ``"propagate_types_serialization_versions_to_nested_types": true``: then for Strings inside Nullable and
  Array as well (``<c>.null``, ``<c>.size``, ``<c>``;
  ``<c>.size0``, ``<c>.size``, ``<c>``).  LowCardinality dictionaries keep length-prefixed keys.
* ``"kind": "Sparse"`` for a column: stream ``<c>.sparse.idx`` holds, per granule, one VarUInt per
  non-default row (the number of default rows before it) and a closing VarUInt with bit 62 set (the
  trailing default rows of the granule); the column's own streams hold only the non-default values.
  With ``"types_serialization_versions": {"nullable": 1}`` (``nullable_serialization_version =
  'allow_sparse'``) a Nullable(T) column can be Sparse too: the left-out rows are NULL and the values
  are T's streams, without a null map.

:func:`serialization_of` maps a column's :class:`DataType` to a stand-in type whose substreams and
:meth:`DataType.deserialize` follow the part's variant; the stand-ins keep the type's name, so they
compare equal to the declared type.  :func:`deserialize_sequential` decodes a column whose substreams
are concatenated in one buffer, as Compact parts store each granule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from replicad.errors import CorruptedDataError, UnsupportedPartFormatError
from replicad.storage.types_base import DataType
from replicad.storage.types_composite import ArrayType, NullableType, _take_stream
from replicad.storage.types_enum import EnumType
from replicad.storage.types_lowcard import KEYS_VERSION, LowCardinalityType
from replicad.storage.types_string import StringType

SPARSE_SUFFIX = ".sparse.idx"
STRING_SIZE_SUFFIX = ".size"
END_OF_GRANULE_FLAG = 1 << 62


@dataclass(frozen=True)
class SerializationInfo:
    """What ``serialization.json`` says (an absent file means 18.16's defaults)."""

    string_size_stream: bool = False
    propagate_to_nested: bool = False
    #: column name -> kind ("Default", "Sparse", ...)
    kinds: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes | None, part_name: str = "") -> SerializationInfo:
        if data is None:
            return cls()
        try:
            info = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise CorruptedDataError(f"part {part_name}: bad serialization.json: {e}") from None
        if not isinstance(info, dict):
            raise CorruptedDataError(f"part {part_name}: serialization.json is not an object")
        version = info.get("version", 0)
        if version not in (0, 1, 2):
            raise UnsupportedPartFormatError(
                f"part {part_name}: serialization.json version {version} is not supported"
            )
        versions = info.get("types_serialization_versions") or {}
        string_version = versions.get("string", 0)
        if string_version in (0, "0", "single_stream"):
            sized = False
        elif string_version in (1, "1", "with_size_stream"):
            sized = True
        else:
            raise UnsupportedPartFormatError(
                f"part {part_name}: String serialization version {string_version!r} is not supported"
            )
        kinds: dict[str, str] = {}
        for col in info.get("columns") or []:
            if isinstance(col, dict) and isinstance(col.get("name"), str):
                kinds[col["name"]] = str(col.get("kind", "Default"))
        # absent (before 26.3, or with propagation off): only top-level String columns have size streams
        propagate = bool(info.get("propagate_types_serialization_versions_to_nested_types", False))
        return cls(sized, propagate, kinds)


class SizedStringType(StringType):
    """String as two streams: ``.size`` (UInt64 per row) and the bytes."""

    def _substreams(self, array_level: int) -> list[str]:
        return [STRING_SIZE_SUFFIX, ""]

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        sizes = np.frombuffer(_take_stream(bufs, pos, STRING_SIZE_SUFFIX, 8 * n, self.name), dtype="<u8")
        offsets = np.zeros(n + 1, dtype=np.int64)
        if n:
            np.cumsum(sizes, out=offsets[1:])
        total = int(offsets[-1])
        data = _take_stream(bufs, pos, "", total, self.name)
        if total < 2**31:
            return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                          pa.py_buffer(bytes(data))])
        return pa.Array.from_buffers(pa.large_binary(), n,
                                     [None, pa.py_buffer(offsets), pa.py_buffer(bytes(data))])


def _read_varuint(view: memoryview, at: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view):
            raise CorruptedDataError(f"{what}: truncated VarUInt")
        b = view[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise CorruptedDataError(f"{what}: VarUInt too long")


def sparse_positions(buf: bytes, at: int, n: int, what: str = "") -> tuple[npt.NDArray[np.int64], int]:
    """(rows of the non-default values, end offset) of the sparse offsets for ``n`` rows at ``buf[at:]``.

    The offsets end with the closing group of the granule that completes the ``n`` rows; ``buf`` may go
    on after them (a Compact granule: the values follow).  Vectorised: every VarUInt in the rest of the
    buffer is decoded at once, then the offsets are cut where the rows are complete."""
    rest = np.frombuffer(buf, dtype=np.uint8, offset=at) if at < len(buf) else np.zeros(0, np.uint8)
    ends = np.flatnonzero(rest < 0x80)
    if not len(ends):
        raise CorruptedDataError(f"{what}: truncated VarUInt")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    low = (rest[:ends[-1] + 1] & 0x7F).astype(np.uint64)
    shift = np.arange(len(low)) - np.repeat(starts, lengths)
    low[shift > 9] = 0  # too long: refused below if it is part of the offsets
    values = np.add.reduceat(low << (7 * np.minimum(shift, 9)).astype(np.uint64), starts)
    closing = (values & np.uint64(END_OF_GRANULE_FLAG)) != 0
    rows = np.where(closing, values & ~np.uint64(END_OF_GRANULE_FLAG), values + np.uint64(1))
    covered = np.cumsum(np.minimum(rows, np.uint64(n + 1)).astype(np.int64))  # no overflow on garbage
    stop = np.flatnonzero(closing & (covered >= n))
    if not len(stop) or covered[stop[0]] != n:
        got = int(covered[stop[0]]) if len(stop) else int(covered[-1])
        raise CorruptedDataError(f"{what}: sparse offsets cover {got} rows, expected {n}")
    last = int(stop[0])
    if (lengths[:last + 1] > 10).any():
        raise CorruptedDataError(f"{what}: VarUInt too long")
    positions = covered[:last][~closing[:last]] - 1
    return positions, at + int(ends[last]) + 1


class SparseType(DataType):
    """A Sparse column: ``.sparse.idx`` offsets, then the inner type's streams for non-default rows."""

    def __init__(self, inner: DataType) -> None:
        if inner.is_nullable and not isinstance(inner, NullableType):
            raise UnsupportedPartFormatError(f"Sparse serialization of {inner.name} is not supported")
        self.inner = inner
        #: what the value streams hold: a Sparse Nullable(T) stores its non-NULL values as T, no null map
        self.values_type = inner.inner if isinstance(inner, NullableType) else inner
        self.name = inner.name
        self.arrow_type = inner.arrow_type
        self.field_type = inner.field_type
        self.field_kind = inner.field_kind

    def _substreams(self, array_level: int) -> list[str]:
        return [SPARSE_SUFFIX, *self.values_type._substreams(array_level)]

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        try:
            buf = bufs[SPARSE_SUFFIX]
        except KeyError:
            raise CorruptedDataError(f"{self.name}: missing stream {SPARSE_SUFFIX!r}") from None
        at = pos.get(SPARSE_SUFFIX, 0)
        positions, at = sparse_positions(buf, at, n, f"{self.name} {SPARSE_SUFFIX}")
        pos[SPARSE_SUFFIX] = at
        values = self.values_type._deserialize_from(bufs, pos, len(positions), array_level)
        if len(positions) == n:
            return values
        take = np.zeros(n, dtype=np.int64)
        take[positions] = np.arange(1, len(positions) + 1)
        combined = pa.concat_arrays([self._zero(), values])
        return combined.take(pa.array(take))

    def _zero(self) -> pa.Array:
        """The value the offsets leave out: all-zero bytes (an Enum's 0, not its smallest code)."""
        if isinstance(self.inner, EnumType):
            return pa.array([0], self.inner.arrow_type)
        return self.inner.defaults(1)  # NULL for Nullable

    def encode(self, arr: pa.Array) -> bytes:
        raise TypeError("Sparse columns are read only")

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        raise TypeError("Sparse columns have several streams: use deserialize()")

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        return self.inner.convert(arr, tz)

    def defaults(self, n: int) -> pa.Array:
        return self.inner.defaults(n)


def sparse_granule_rows(buf: bytes, what: str = "") -> int:
    """Rows of one granule's whole ``.sparse.idx`` data (non-default rows, defaults, the closing group)."""
    view = memoryview(buf)
    at = rows = 0
    while True:
        group, at = _read_varuint(view, at, f"{what} {SPARSE_SUFFIX}")
        if group & END_OF_GRANULE_FLAG:
            rows += group & ~END_OF_GRANULE_FLAG
            break
        rows += group + 1
    if at != len(buf) or rows == 0:
        raise CorruptedDataError(f"{what}: bad sparse offsets of a granule ({len(buf) - at} bytes left)")
    return rows


def _with_string_sizes(dtype: DataType, nested: bool) -> DataType:
    if isinstance(dtype, StringType) and not isinstance(dtype, SizedStringType):
        return SizedStringType()
    if not nested:
        return dtype
    if isinstance(dtype, NullableType):
        return NullableType(_with_string_sizes(dtype.inner, nested))
    if isinstance(dtype, ArrayType):
        return ArrayType(_with_string_sizes(dtype.inner, nested))
    return dtype  # LowCardinality keys keep their length prefixes


def serialization_of(name: str, dtype: DataType, info: SerializationInfo) -> DataType:
    """The stand-in type that reads column ``name`` as the part serialized it."""
    out = _with_string_sizes(dtype, info.propagate_to_nested) if info.string_size_stream else dtype
    kind = info.kinds.get(name, "Default")
    if kind == "Sparse":
        return SparseType(out)
    if kind != "Default":
        raise UnsupportedPartFormatError(f"column {name!r} uses {kind} serialization, which is not supported")
    return out


def has_low_cardinality(dtype: DataType) -> bool:
    while True:
        if isinstance(dtype, LowCardinalityType):
            return True
        inner = getattr(dtype, "inner", None)
        if inner is None:
            return False
        dtype = inner


class _OneBuffer(dict[str, bytes]):
    """Every substream suffix names the same buffer."""

    def __init__(self, buf: bytes) -> None:
        super().__init__()
        self.buf = buf

    def __getitem__(self, key: str) -> bytes:
        return self.buf

    def __contains__(self, key: object) -> bool:
        return True


class _OneCursor(dict[str, int]):
    """One read position shared by every substream suffix (they follow each other in the buffer)."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.at = start

    def get(self, key: str, default: Any = None) -> int:
        return self.at

    def __getitem__(self, key: str) -> int:
        return self.at

    def __setitem__(self, key: str, value: int) -> None:
        self.at = value


def deserialize_sequential(dtype: DataType, buf: bytes, n: int, what: str = "") -> pa.Array:
    """Rows of ``dtype`` (a :func:`serialization_of` stand-in) whose substreams follow each other in ``buf``.

    This is how a Compact part stores one granule of one column: the state prefix (LowCardinality's
    key-serialization version), then every substream in order.  The whole buffer must be consumed.
    """
    start = 0
    if has_low_cardinality(dtype):
        if len(buf) < 8 or int.from_bytes(buf[:8], "little") != KEYS_VERSION:
            raise CorruptedDataError(f"{what}: LowCardinality key-serialization version missing")
        start = 8
    cursor = _OneCursor(start)
    arr = dtype._deserialize_from(_OneBuffer(buf), cursor, n, 0)
    if cursor.at != len(buf):
        left = len(buf) - cursor.at
        raise CorruptedDataError(f"{what}: {left} unread bytes after {n} rows of {dtype.name}")
    return arr
