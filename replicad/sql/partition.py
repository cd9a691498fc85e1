"""ClickHouse partition IDs and splitting rows by partition key (MergeTreePartition::getID, 18.16 rules).

* no partition key -> ``all``;
* every key value an integer Field (ints, Enum, Date, DateTime) -> the values joined by ``-``, a Date
  rendered ``YYYYMMDD``, everything else in decimal (``202611``, ``202611--3``, ``1795309323``);
* otherwise the lowercase hex of ClickHouse's SipHash-128 over each value's Field bytes (type byte +
  payload).  Decimals are hashed the 18.16 way (value + scale); ClickHouse 19.x+ hash the value only, so a
  Decimal-keyed table gets different partition IDs on modern servers (FACTS §6.1).

``split_by_partition`` evaluates the key once for the whole table and groups rows with pyarrow/numpy.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.errors import BadInputError
from replicad.model.siphash import SipHash
from replicad.sql.expressions import Expr, compile_key
from replicad.sql.expressions_ast import format_list

_EPOCH = _dt.date(1970, 1, 1)


def _integer_value(dt: DataType, arr: pa.Array, i: int) -> int:
    t = arr.type
    if pa.types.is_date32(t):
        return int(arr.cast(pa.int32())[i].as_py())
    if pa.types.is_timestamp(t):
        return int(arr.cast(pa.int64())[i].as_py())
    v = arr[i].as_py()
    if isinstance(v, bool):
        return int(v)
    if not isinstance(v, int):
        raise BadInputError(f"partition value {v!r} of type {dt.name} is not an integer")
    return v


def _yyyymmdd(days: int) -> str:
    d = _EPOCH + _dt.timedelta(days=days)
    return f"{d.year:04d}{d.month:02d}{d.day:02d}"


def partition_id_at(types: Sequence[DataType], arrays: Sequence[pa.Array], i: int) -> str:
    """Partition ID of row ``i`` of the evaluated key columns ``arrays`` (storage Arrow of ``types``)."""
    if not types:
        return "all"
    if all(t.is_integer_like and arr[i].is_valid for t, arr in zip(types, arrays, strict=True)):
        parts = []
        for t, arr in zip(types, arrays, strict=True):
            v = _integer_value(t, arr, i)
            parts.append(_yyyymmdd(v) if t.is_date else str(v))
        return "-".join(parts)
    h = SipHash()
    for t, arr in zip(types, arrays, strict=True):
        h.update(t.field_bytes(arr, i, legacy_decimal=True))
    return h.hexdigest128()


def partition_id(values: list[tuple[DataType, object]]) -> str:
    """Partition ID of one key tuple given as (type, value) pairs; values are storage-Arrow Python values
    (``datetime.date`` for Date, ``datetime.datetime``/int seconds for DateTime, bytes for String ...)."""
    types = [t for t, _ in values]
    arrays = [pa.array([v], type=t.arrow_type) for t, v in values]
    return partition_id_at(types, arrays, 0)


@dataclass(frozen=True)
class PartitionKey:
    """A table's partition key: the PARTITION BY expression list (``tuple()`` / none -> empty)."""

    expressions: tuple[Expr, ...]

    @classmethod
    def parse(cls, text: str | None) -> PartitionKey:
        return cls(tuple(compile_key(text)))

    @cached_property
    def text(self) -> str:
        """The key as the table ``metadata`` znode writes it (``toYYYYMM(d)``, ``a, b``, empty)."""
        return format_list([e.node for e in self.expressions])

    @cached_property
    def columns(self) -> list[str]:
        """Columns the key reads, in order of first use (these get ``minmax_<col>.idx`` files)."""
        out: list[str] = []
        for e in self.expressions:
            out.extend(c for c in e.columns if c not in out)
        return out

    def evaluate(self, table: pa.Table, types: dict[str, DataType], tz: str = "UTC"
                 ) -> tuple[list[pa.Array], list[DataType]]:
        arrays: list[pa.Array] = []
        out_types: list[DataType] = []
        for e in self.expressions:
            arr, dt = e.evaluate(table, types, tz)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            arrays.append(arr)
            out_types.append(dt)
        return arrays, out_types

    def result_types(self, types: dict[str, DataType], tz: str = "UTC") -> list[DataType]:
        return [e.result_type(types, tz) for e in self.expressions]


@dataclass(frozen=True)
class PartitionChunk:
    """The rows of one partition: its ID, the key value (one-element arrays) and the rows."""

    partition_id: str
    key_types: tuple[DataType, ...]
    key_values: tuple[pa.Array, ...]
    table: pa.Table

    @property
    def values(self) -> tuple[object, ...]:
        return tuple(a[0].as_py() for a in self.key_values)

    def partition_dat(self) -> bytes:
        """``partition.dat``: serializeBinary of each key value (empty when there is no key)."""
        return b"".join(t.serialize_value(a, 0) for t, a in zip(self.key_types, self.key_values, strict=True))


def _group_codes(arrays: Sequence[pa.Array]) -> tuple[np.ndarray, int]:
    """Dense group number per row (groups numbered in order of first appearance) and the group count."""
    n = len(arrays[0])
    if len(arrays) == 1 and _single_value(arrays[0]):  # the usual insert block: one partition
        return np.zeros(n, dtype=np.int64), 1
    combined = np.zeros(n, dtype=np.int64)
    for arr in arrays:
        enc = pc.dictionary_encode(arr, null_encoding="encode")
        codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        combined = combined * (len(enc.dictionary) + 1) + codes
        _, combined = np.unique(combined, return_inverse=True)
        combined = combined.astype(np.int64)
    # renumber groups by first appearance so that the output order is the input order
    uniq, first = np.unique(combined, return_index=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq))
    return rank[combined], len(uniq)


def _single_value(arr: pa.Array) -> bool:
    """True when every row of a non-empty integer array without NULLs holds the same value (one min_max
    kernel, where grouping costs a dictionary encoding and a few numpy sorts)."""
    if not len(arr) or arr.null_count or not pa.types.is_integer(arr.type):
        return False
    lo_hi = pc.min_max(arr)
    return bool(lo_hi["min"].as_py() == lo_hi["max"].as_py())


def split_by_partition(table: pa.Table, key: PartitionKey | str | None, types: dict[str, DataType],
                       tz: str = "UTC") -> list[PartitionChunk]:
    """Split ``table`` (storage Arrow) into one chunk per partition; rows keep their relative order."""
    pk = key if isinstance(key, PartitionKey) else PartitionKey.parse(key)
    if not pk.expressions:
        return [PartitionChunk("all", (), (), table)]
    constant = _constant_key(table, pk, types, tz)
    if constant is not None:  # the usual insert block: one partition, proved from the column's two ends
        arrays, key_types = constant
        pid = partition_id_at(key_types, arrays, 0)
        return [PartitionChunk(pid, tuple(key_types), tuple(arrays), table)]
    distinct = _distinct_rows(table, pk)
    arrays, key_types = pk.evaluate(table if distinct is None else distinct[0], types, tz)
    for e, dt in zip(pk.expressions, key_types, strict=True):
        if dt.name.startswith("Nullable("):
            raise BadInputError(f"Partition key cannot contain nullable columns: {e.text} is {dt.name}")
    if table.num_rows == 0:
        return []
    groups, count = _group_codes(arrays)
    if count == 1:  # the usual insert: one partition, no per-row work
        pid = partition_id_at(key_types, [a.slice(0, 1) for a in arrays], 0)
        return [PartitionChunk(pid, tuple(key_types), tuple(a.slice(0, 1) for a in arrays), table)]
    _, first_of_group = np.unique(groups, return_index=True)  # each group's first index into ``arrays``
    if distinct is not None:  # groups of the distinct values -> groups of the rows
        groups = groups[distinct[1]]
    order = np.argsort(groups, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(groups, minlength=count))])
    chunks = []
    for g in range(count):
        idx = order[bounds[g] : bounds[g + 1]]
        values = tuple(a.slice(int(first_of_group[g]), 1) for a in arrays)
        pid = partition_id_at(key_types, values, 0)
        chunks.append(PartitionChunk(pid, tuple(key_types), values, table.take(pa.array(idx))))
    return chunks


#: functions that never decrease as their Date argument grows: a key ``f(d)`` with the same value for the
#: smallest and the largest ``d`` of a block has it for every row in between
_MONOTONIC_OF_DATE = ("toYYYYMM", "toYYYYMMDD", "toYear", "toMonday", "toStartOfMonth", "toStartOfQuarter",
                      "toStartOfYear", "toRelativeDayNum")


def _constant_key(table: pa.Table, pk: PartitionKey, types: dict[str, DataType], tz: str
                  ) -> tuple[list[pa.Array], list[DataType]] | None:
    """When the key is ``d`` or ``f(d)`` (``f`` in :data:`_MONOTONIC_OF_DATE`) of one Date column without
    NULLs and ``f`` gives the block's smallest and largest date the same value: the key's value (one-row
    arrays) and types, from evaluating it over those two dates only (no distinct values, no grouping).
    None otherwise (the block may span partitions: the caller groups its rows)."""
    if len(pk.expressions) != 1 or table.num_rows == 0:
        return None
    (e,) = pk.expressions
    columns = e.columns
    if len(columns) != 1:
        return None
    col = columns[0]
    dtype = types.get(col)
    if dtype is None or dtype.name != "Date" or col not in table.column_names:
        return None
    text = e.text
    if text != col and not any(text == f"{f}({col})" for f in _MONOTONIC_OF_DATE):
        return None
    arr = table.column(col)
    if arr.null_count:
        return None
    lo_hi = pc.min_max(arr)
    lo, key_types = _key_of_date(pk, col, lo_hi["min"].as_py(), arr.type, types, tz)
    hi, _types = _key_of_date(pk, col, lo_hi["max"].as_py(), arr.type, types, tz)
    if not lo.equals(hi):
        return None
    return [lo], list(key_types)


#: (key text, time zone, date) -> the key's value for that date (a one-row array) and its types: blocks of
#: a stream of inserts share their dates, and evaluating the key costs tens of µs even for one row
_KEY_OF_DATE: dict[tuple[str, str, object], tuple[pa.Array, tuple[DataType, ...]]] = {}
_KEY_OF_DATE_MAX = 4096


def _key_of_date(pk: PartitionKey, col: str, day: object, arrow_type: pa.DataType, types: dict[str, DataType],
                 tz: str) -> tuple[pa.Array, tuple[DataType, ...]]:
    k = (pk.text, tz, day)
    hit = _KEY_OF_DATE.get(k)
    if hit is None:
        arrays, key_types = pk.evaluate(pa.table({col: pa.array([day], arrow_type)}), types, tz)
        if len(_KEY_OF_DATE) >= _KEY_OF_DATE_MAX:
            _KEY_OF_DATE.clear()
        hit = _KEY_OF_DATE[k] = (arrays[0], tuple(key_types))
    return hit


def _distinct_rows(table: pa.Table, pk: PartitionKey) -> tuple[pa.Table, np.ndarray] | None:
    """For a key reading one column without NULLs whose values repeat (a Date column of a block): (a table
    of the column's distinct values in order of first appearance, each row's index into it), so that the
    key is evaluated once per distinct value (a block's dates span a few days: 1M-row int64 temporaries of
    the date functions were the peak of an insert's memory).  None when that does not pay."""
    if len(pk.columns) != 1 or table.num_rows < 2 or pk.columns[0] not in table.column_names:
        return None
    col = table.column(pk.columns[0])
    if col.null_count or pa.types.is_dictionary(col.type):
        return None
    enc = pc.dictionary_encode(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    if len(enc.dictionary) > table.num_rows // 2:
        return None
    indices = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = pa.table({pk.columns[0]: enc.dictionary})
    return values, indices
