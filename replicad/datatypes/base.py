"""The ``DataType`` base class and shared helpers of the ClickHouse type system.

A ``DataType`` converts between three representations of a column:

* user input (any pyarrow array a parser produced) -> *storage Arrow* via :meth:`DataType.to_storage`;
* storage Arrow <-> ClickHouse's binary column serialization (the bytes of the ``.bin`` streams) via
  :meth:`DataType.serialize` / :meth:`DataType.deserialize`;
* storage Arrow -> a user-friendly Arrow array for query output via :meth:`DataType.to_user_arrow`.

Composite types (Nullable, Array) write several streams; each stream is identified by its file-name
suffix (``""`` = ``<col>.bin``, ``".null"``, ``".size0"`` ...), listed by :meth:`DataType.substreams`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError, CorruptedDataError

# ClickHouse Field type numbers used when a partition key is hashed (FACTS §6.1).
FIELD_NULL = 0
FIELD_UINT64 = 1
FIELD_INT64 = 2
FIELD_FLOAT64 = 3
FIELD_UINT128 = 4
FIELD_STRING = 16
FIELD_ARRAY = 17
FIELD_TUPLE = 18
FIELD_DECIMAL32 = 19
FIELD_DECIMAL64 = 20
FIELD_DECIMAL128 = 21


class BadValue(Exception):
    """Internal: one input value cannot be stored.  ``row`` is relative to the array being converted.

    :meth:`DataType.to_storage` turns it into a :class:`BadInputError` naming the column and the row.
    """

    def __init__(self, row: int, value: str, reason: str) -> None:
        super().__init__(f"value {value} at row {row} {reason}")
        self.row = row
        self.value = value
        self.reason = reason


def first_true(mask: Any) -> int:
    """Index of the first true element of a boolean numpy/pyarrow mask (nulls count as false), or -1."""
    if isinstance(mask, (pa.Array, pa.ChunkedArray)):
        mask = pc.fill_null(mask, False)
        if isinstance(mask, pa.ChunkedArray):
            mask = mask.combine_chunks()
        mask = mask.to_numpy(zero_copy_only=False)
    m = np.asarray(mask, dtype=bool)
    if m.size == 0:
        return -1
    i = int(np.argmax(m))
    return i if m[i] else -1


def show_value(arr: pa.Array, i: int) -> str:
    """Short readable rendering of ``arr[i]`` for error messages."""
    v: object = arr[i].as_py()
    if isinstance(v, bytes):
        raw = v
        try:
            v = raw.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + raw[:32].hex()
    if isinstance(v, str):
        return repr(v[:64])
    if v is None:
        return "NULL"
    return str(v)


def as_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def is_stringlike(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
        or pa.types.is_large_binary(t) or getattr(pa.types, "is_string_view", lambda _t: False)(t)
        or getattr(pa.types, "is_binary_view", lambda _t: False)(t)
    )


class DataType(ABC):
    """One ClickHouse data type.  Instances are immutable and compare equal by canonical name."""

    #: canonical ClickHouse type text, as written in columns.txt (e.g. ``Nullable(Decimal(9, 2))``)
    name: str
    #: storage Arrow type (see the project conventions)
    arrow_type: pa.DataType
    #: ClickHouse Field type this type's values become (``FIELD_*``; used for partition-key hashing)
    field_type: int
    #: the Field kind as text: uint64, int64, float64, uint128, string, decimal32/64/128, array
    field_kind: str
    #: true for types whose Field is an integer (ints, Date, DateTime, Enum): partition IDs print them
    is_integer_like: bool = False
    #: true for Date (partition IDs render it as YYYYMMDD)
    is_date: bool = False
    is_nullable: bool = False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DataType {self.name}>"

    # ---- streams -------------------------------------------------------------------------------------

    def substreams(self) -> list[str]:
        """File-name suffixes of this column's streams, in ClickHouse's order (``""`` = ``<col>.bin``)."""
        return self._substreams(0)

    def _substreams(self, array_level: int) -> list[str]:
        return [""]

    def serialize(self, arr: pa.Array | pa.ChunkedArray) -> dict[str, bytes]:
        """ClickHouse binary serialization of these rows, per substream suffix."""
        out: dict[str, bytes] = {}
        self._serialize_into(as_array(arr), out, 0)
        return out

    def deserialize(self, bufs: dict[str, bytes], n_rows: int) -> pa.Array:
        """Inverse of :meth:`serialize`: ``bufs`` hold exactly these ``n_rows`` rows' bytes per substream."""
        pos: dict[str, int] = {}
        arr = self._deserialize_from(bufs, pos, n_rows, 0)
        for suffix, used in pos.items():
            # a LowCardinality dictionary stream is passed to its end: later dictionaries stay unread
            if used != len(bufs[suffix]) and not suffix.endswith(".dict"):
                raise CorruptedDataError(
                    f"{self.name}: {len(bufs[suffix]) - used} unread bytes left in stream {suffix!r}"
                )
        return arr

    def _serialize_into(self, arr: pa.Array, out: dict[str, bytes], array_level: int) -> None:
        data = self.encode(arr)
        prev = out.get("")
        out[""] = data if prev is None else prev + data

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        try:
            buf = bufs[""]
        except KeyError:
            raise CorruptedDataError(f"{self.name}: missing main stream") from None
        start = pos.get("", 0)
        arr, used = self.decode(memoryview(buf)[start:], n)
        pos[""] = start + used
        return arr

    @abstractmethod
    def encode(self, arr: pa.Array) -> bytes:
        """Bytes of the main stream for these rows (simple types).  Nulls are written as defaults."""

    @abstractmethod
    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        """Decode ``n`` rows from the start of ``data``; return the array and the bytes consumed."""

    # ---- single values -------------------------------------------------------------------------------

    def serialize_value(self, arr: pa.Array | pa.ChunkedArray, i: int) -> bytes:
        """ClickHouse ``serializeBinary`` of ``arr[i]`` (for primary.idx, minmax_*.idx, partition.dat)."""
        a = as_array(arr)
        return self.encode(a.slice(i, 1))

    def field_bytes(self, arr: pa.Array | pa.ChunkedArray, i: int, *, legacy_decimal: bool = True) -> bytes:
        """Field type byte + payload of ``arr[i]``, as ClickHouse SipHashes it for hashed partition IDs.

        UInt64 ``01``+8B, Int64 ``02``+8B, Float64 ``03``+8B, UUID ``04``+16B, String ``10``+UInt64 len+bytes,
        Decimal ``13/14/15``+value (+UInt32 scale when ``legacy_decimal``, as 18.16 hashes it), NULL ``00``.
        """
        a = as_array(arr)
        if not a[i].is_valid:
            return bytes([FIELD_NULL])
        return self._field_payload(a, i, legacy_decimal)

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        raise NotImplementedError(f"{self.name}: no Field form")

    # ---- user input / output -------------------------------------------------------------------------

    def to_storage(self, values: pa.Array | pa.ChunkedArray, column: str, tz: str = "UTC") -> pa.Array:
        """Cast/validate parser output into storage Arrow; :class:`BadInputError` names column and row.

        ``tz`` is the time zone of DateTime text (a ``DateTime('tz')`` column uses its own).
        """
        arr = as_array(values)
        try:
            return self.convert_checked(arr, tz)
        except BadValue as e:
            raise BadInputError(f"column {column}: value {e.value} at row {e.row} {e.reason}") from None

    def convert_checked(self, arr: pa.Array, tz: str) -> pa.Array:
        """:meth:`convert` after rejecting nulls for non-Nullable types."""
        if not self.is_nullable and arr.null_count:
            i = first_true(arr.is_null())
            raise BadValue(i, "NULL", f"is not allowed: type {self.name} is not Nullable")
        return self.convert(arr, tz)

    @abstractmethod
    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        """Convert user values (nulls propagate) to storage Arrow, raising :class:`BadValue`."""

    def to_user_arrow(self, arr: pa.Array | pa.ChunkedArray, tz: str = "UTC") -> pa.Array:
        """Storage Arrow -> friendly Arrow for output (Enum names, UUID text, tz-aware timestamps)."""
        return as_array(arr)

    @property
    def default_value(self) -> Any:
        """The type's default as a Python value of the storage Arrow type (0, b"", epoch, [] ...)."""
        return 0

    def defaults(self, n: int) -> pa.Array:
        """``n`` default values in storage Arrow (what ClickHouse fills for missing columns)."""
        return pa.repeat(pa.scalar(self.default_value, self.arrow_type), n)

    def reject(self, arr: pa.Array, i: int, reason: str) -> BadValue:
        return BadValue(i, show_value(arr, i), f"{reason} for {self.name}")

    def wrong_input(self, arr: pa.Array) -> BadValue:
        i = first_true(arr.is_valid()) if len(arr) else 0
        return BadValue(max(i, 0), show_value(arr, max(i, 0)) if len(arr) else "?",
                        f"of input type {arr.type} cannot be stored as {self.name}")


def locate_failure(arr: pa.Array, fn: Any) -> int:
    """Index of the first element of ``arr`` for which the vectorised ``fn`` raises (bisection, O(n))."""
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            fn(arr.slice(lo, mid - lo))
        except (pa.ArrowException, ValueError, OverflowError, BadValue):
            hi = mid
        else:
            lo = mid
    return lo


def checked(arr: pa.Array, fn: Any, dtype: DataType, reason: str, shown: pa.Array | None = None) -> pa.Array:
    """``fn(arr)``; if it fails, raise :class:`BadValue` for the first failing row (shown from ``shown``)."""
    try:
        return fn(arr)
    except (pa.ArrowException, ValueError, OverflowError):
        raise dtype.reject(arr if shown is None else shown, locate_failure(arr, fn), reason) from None
