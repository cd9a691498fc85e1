"""LowCardinality(String) and LowCardinality(Nullable(String)).

Storage Arrow is plain ``pa.binary()`` (nullable for the Nullable flavour).  Two streams:

* ``<c>.dict.bin`` ("keys"): UInt64 key-serialization version ``1`` once at the start (the state prefix),
  then shared dictionaries: UInt64 ``num_keys`` + keys as String bulk.  Key 0 is the default ``''``
  (Nullable: key 0 stands for NULL, key 1 is ``''``).  A dictionary is written *after* the granules that
  use it: when it reaches ``max_dictionary_size`` keys, and at the end of the part (state suffix).  Every
  mark of ``.dict`` therefore points at the dictionary its granule uses.
* ``<c>.bin`` ("indexes"), per serialize call: UInt64 flags (low byte: index width 0..3 = UInt8..UInt64;
  0x100 NeedGlobalDictionary, 0x200 HasAdditionalKeys, 0x400 NeedUpdateDictionary), [UInt64 n + n keys
  if HasAdditionalKeys], UInt64 rows, the indexes.  Index ``i < len(dictionary)`` is a dictionary key,
  otherwise additional key ``i - len(dictionary)``.

Writing a part goes through :meth:`LowCardinalityType.bulk_serializer` (per-part state; see
``writer.BulkSerializer``).  :meth:`DataType.deserialize` expects ``bufs[".dict"]`` to start at the first
granule's ``.dict`` mark (after the version prefix) and may leave later dictionaries unread.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import CorruptedDataError, UnsupportedPartFormatError
from replicad.storage.types_base import FIELD_STRING, DataType, as_array
from replicad.storage.types_composite import with_nulls
from replicad.storage.types_string import StringType, decode_strings, encode_strings

NEED_GLOBAL_DICTIONARY = 1 << 8
HAS_ADDITIONAL_KEYS = 1 << 9
NEED_UPDATE_DICTIONARY = 1 << 10
KEYS_VERSION = 1
_WIDTHS = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _index_width(max_index: int) -> int:
    for code in range(4):
        if max_index < 1 << (8 << code):
            return code
    raise ValueError("index too large")


class LowCardinalityType(DataType):
    field_type = FIELD_STRING
    field_kind = "string"

    def __init__(self, nullable: bool) -> None:
        self.is_nullable = nullable
        self.inner = StringType()
        self.name = "LowCardinality(Nullable(String))" if nullable else "LowCardinality(String)"
        self.arrow_type = pa.binary()
        #: keys every dictionary starts with (index 0 = NULL placeholder for Nullable, then '')
        self.special = 2 if nullable else 1

    @property
    def default_value(self) -> Any:
        return None if self.is_nullable else b""

    def defaults(self, n: int) -> pa.Array:
        return pa.nulls(n, pa.binary()) if self.is_nullable else super().defaults(n)

    def _substreams(self, array_level: int) -> list[str]:
        return [".dict", ""]

    def bulk_serializer(
        self, max_dictionary_size: int = 8192, single_dictionary: bool = False
    ) -> LowCardinalitySerializer:
        """Per-part writer state (18.16 defaults: 8192 keys per dictionary, one dictionary per 8192 keys)."""
        return LowCardinalitySerializer(self, max_dictionary_size, single_dictionary)

    def _serialize_into(self, arr: pa.Array, out: dict[str, bytes], array_level: int) -> None:
        """Stand-alone rows: one dictionary of exactly their keys, written right away."""
        ser = self.bulk_serializer()
        parts = ser.serialize(arr)
        tail = ser.suffix()
        for suffix, data in (*parts.items(), *tail.items()):
            out[suffix] = out.get(suffix, b"") + data

    def _deserialize_from(
        self, bufs: dict[str, bytes], pos: dict[str, int], n: int, array_level: int
    ) -> pa.Array:
        try:
            index_buf, dict_buf = bufs[""], bufs[".dict"]
        except KeyError as e:
            raise CorruptedDataError(f"{self.name}: missing stream {e}") from None
        ipos, dpos = pos.get("", 0), pos.get(".dict", 0)
        dictionary: pa.Array | None = None
        read_dictionary = False
        pieces: list[pa.Array] = []
        remaining = n
        view = memoryview(index_buf)
        dview = memoryview(dict_buf)
        while remaining > 0:
            if len(view) - ipos < 8:
                raise CorruptedDataError(f"{self.name}: index stream ends with {remaining} rows unread")
            (flags,) = struct.unpack_from("<Q", view, ipos)
            ipos += 8
            width = flags & ~(NEED_GLOBAL_DICTIONARY | HAS_ADDITIONAL_KEYS | NEED_UPDATE_DICTIONARY)
            if width > 3:
                raise CorruptedDataError(f"{self.name}: bad index serialization type {flags:#x}")
            if flags & NEED_GLOBAL_DICTIONARY and (dictionary is None or flags & NEED_UPDATE_DICTIONARY):
                if index_buf is dict_buf:  # one buffer for every stream (a Compact granule): no shared one
                    raise UnsupportedPartFormatError(
                        f"{self.name}: a shared dictionary inside a Compact part is not supported")
                dictionary, dpos = self._read_keys(dview, dpos, "dictionary")
                read_dictionary = True
            keys = dictionary if flags & NEED_GLOBAL_DICTIONARY else None
            if flags & HAS_ADDITIONAL_KEYS:
                extra, ipos = self._read_keys(view, ipos, "additional keys")
                keys = extra if keys is None else pa.concat_arrays([keys, extra])
            if keys is None:
                raise CorruptedDataError(f"{self.name}: granule has neither dictionary nor keys")
            if len(view) - ipos < 8:
                raise CorruptedDataError(f"{self.name}: truncated index header")
            (rows,) = struct.unpack_from("<Q", view, ipos)
            ipos += 8
            if rows > remaining:
                raise CorruptedDataError(f"{self.name}: granule of {rows} rows, only {remaining} requested")
            dt = _WIDTHS[width]
            size = rows * dt.itemsize
            if len(view) - ipos < size:
                raise CorruptedDataError(f"{self.name}: truncated indexes")
            idx = np.frombuffer(view, dtype=dt, count=rows, offset=ipos)
            ipos += size
            if rows and int(idx.max()) >= len(keys):
                raise CorruptedDataError(f"{self.name}: index {int(idx.max())} beyond {len(keys)} keys")
            values = pc.take(keys, pa.array(idx))
            if self.is_nullable:  # key 0 (of the dictionary, or of the additional keys alone) is NULL
                values = with_nulls(values, idx == 0)
            pieces.append(values)
            remaining -= rows
        pos[""] = ipos
        if read_dictionary:  # (a Compact part's granule has additional keys only, no dictionary stream)
            pos[".dict"] = dpos
        if not pieces:
            return pa.array([], pa.binary())
        return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)

    def _read_keys(self, view: memoryview, at: int, what: str) -> tuple[pa.Array, int]:
        if len(view) - at < 8:
            raise CorruptedDataError(f"{self.name}: {what} missing")
        (count,) = struct.unpack_from("<Q", view, at)
        if count > len(view):
            raise CorruptedDataError(f"{self.name}: implausible {what} size {count}")
        keys, used = decode_strings(view[at + 8:], count)
        return keys, at + 8 + used

    def encode(self, arr: pa.Array) -> bytes:
        raise TypeError("LowCardinality has several streams: use serialize()")

    def decode(self, data: memoryview, n: int) -> tuple[pa.Array, int]:
        raise TypeError("LowCardinality has several streams: use deserialize()")

    def serialize_value(self, arr: pa.Array | pa.ChunkedArray, i: int) -> bytes:
        a = as_array(arr)
        if self.is_nullable:
            return b"\x01" if not a[i].is_valid else b"\x00" + encode_strings(a.slice(i, 1))
        return encode_strings(a.slice(i, 1))

    def _field_payload(self, arr: pa.Array, i: int, legacy_decimal: bool) -> bytes:
        return self.inner._field_payload(arr, i, legacy_decimal)

    def convert(self, arr: pa.Array, tz: str) -> pa.Array:
        return self.inner.convert(arr, tz)


class LowCardinalitySerializer:
    """Per-part LowCardinality writer state: ``prefix()``, ``serialize(rows)`` per granule, ``suffix()``."""

    def __init__(self, dtype: LowCardinalityType, max_dictionary_size: int, single_dictionary: bool) -> None:
        self.dtype = dtype
        self.max_size = max(max_dictionary_size, dtype.special + 1)
        self.single = single_dictionary
        self.keys: pa.Array | None = None  # the shared dictionary being built (None = none open)

    def _new_dictionary(self) -> pa.Array:
        return pa.array([b""] * self.dtype.special, pa.binary())

    def prefix(self) -> dict[str, bytes]:
        return {".dict": _u64(KEYS_VERSION)}

    def serialize(self, arr: pa.Array) -> dict[str, bytes]:
        arr = as_array(arr)
        if arr.type != pa.binary():
            arr = arr.cast(pa.binary())
        n = len(arr)
        if n == 0:  # nothing written (ClickHouse opens a dictionary here, losing NeedUpdate for later rows)
            return {}
        need_update = self.keys is None
        if self.keys is None:
            self.keys = self._new_dictionary()
        keys = self.keys
        size_before = len(keys)
        special = self.dtype.special
        valid = arr.filter(arr.is_valid()) if arr.null_count else arr
        uniq = pc.unique(valid)
        # keys of this granule already in the dictionary (the special keys are matched only for '')
        found = pc.index_in(uniq, value_set=keys.slice(special - 1))
        new = uniq.filter(pc.is_null(found))
        room = max(self.max_size - len(keys), 0)
        added, overflow = new.slice(0, room), new.slice(room)
        if len(added):
            keys = pa.concat_arrays([keys, added])
            self.keys = keys
        extra = overflow
        # index of every row: dictionary position, or len(keys) + position among the additional keys
        lookup = pa.concat_arrays([keys.slice(special - 1), extra]) if len(extra) else keys.slice(special - 1)
        idx = pc.index_in(arr, value_set=lookup).to_numpy(zero_copy_only=False)
        if arr.null_count:
            idx = np.where(arr.is_null().to_numpy(zero_copy_only=False), -(special - 1), idx)
        idx = np.asarray(idx, dtype=np.int64) + (special - 1)
        # like ClickHouse's ColumnUnique: the index width follows the dictionary size, not the indexes used
        width = _index_width(max(size_before, len(keys) + len(extra) - 1))
        flags = width | NEED_GLOBAL_DICTIONARY
        if need_update:
            flags |= NEED_UPDATE_DICTIONARY
        if len(extra):
            flags |= HAS_ADDITIONAL_KEYS
        body = [_u64(flags)]
        if len(extra):
            body += [_u64(len(extra)), encode_strings(extra)]
        body += [_u64(n), idx.astype(_WIDTHS[width]).tobytes()]
        out = {"": b"".join(body)}
        if not self.single and len(keys) >= self.max_size:
            out[".dict"] = self._flush()
        return out

    def _flush(self) -> bytes:
        keys = self.keys
        self.keys = None
        if keys is None:
            return b""
        return _u64(len(keys)) + encode_strings(keys)

    def suffix(self) -> dict[str, bytes]:
        return {".dict": self._flush()} if self.keys is not None else {}
