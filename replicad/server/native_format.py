"""ClickHouse's ``Native`` format over HTTP: INSERT input and SELECT output.

A Native stream is a sequence of blocks.  A block is: the number of columns and the number of rows
(VarUInt each), then for every column its name and its type name (VarUInt length + bytes each) and its
data.  Over HTTP (``client_protocol_version`` 0, what replicad answers) there is no block-info header.

Column data is the same bulk serialization as a MergeTree column file, uncompressed, with the streams of
a composite type written one after the other; so the per-type code is the storage serializers'
(``DataType.encode``/``decode`` in ``replicad.storage``).  What differs from the part files:

* ``Array``: a Native block holds *cumulative* UInt64 offsets (the part files hold per-row sizes), then
  the elements;
* ``Nullable``: the null map (UInt8 per row) then the nested values (ClickHouse's default under a NULL);
* ``LowCardinality``: every column starts with the UInt64 key-serialization version ``1`` (before any
  enclosing Array's offsets), then UInt64 flags (index width in the low byte, ``HasAdditionalKeys``
  0x200), UInt64 key count + the keys (a String column; for the Nullable flavour key 0 stands for NULL),
  UInt64 row count and the indexes.  It is accepted on input (clickhouse-connect sends it for such
  columns); on output replicad sends the plain column (``String``/``Nullable(String)``), which is what
  ClickHouse sends with ``low_cardinality_allow_in_native_format = 0`` and what every client reads.

Decoding never loops in Python per value; a block is decoded once enough bytes are buffered (a short
buffer raises :class:`NeedMoreData` and the reader retries with more).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from replicad.datatypes import (
    ArrayType,
    DataType,
    LowCardinalityType,
    NullableType,
    StringType,
    parse_type,
)
from replicad.datatypes.base import as_array
from replicad.datatypes.composite import list_from_counts, list_parts, with_nulls
from replicad.errors import BadInputError, CorruptedDataError, ReplicadError
from replicad.model.varint import encode_varuint
from replicad.server.input_columns import Converter, select_columns
from replicad.service import QueryResult

#: rows per output block (ClickHouse's max_block_size)
OUTPUT_BLOCK_ROWS = 65536
#: the largest Native block accepted on input (a block must be buffered whole to be decoded)
MAX_BLOCK_BYTES = 512 << 20
_LC_VERSION = 1
_LC_HAS_ADDITIONAL_KEYS = 1 << 9
_LC_NEED_GLOBAL_DICTIONARY = 1 << 8
_LC_KNOWN_FLAGS = 0xFF | _LC_NEED_GLOBAL_DICTIONARY | _LC_HAS_ADDITIONAL_KEYS | (1 << 10)
_INDEX_DTYPES = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))
_STRING = StringType()


class NeedMoreData(Exception):
    """Internal: the buffered bytes end inside the block being decoded."""


# ---- encoding ------------------------------------------------------------------------------------------


def output_type(dt: DataType) -> DataType:
    """The type a column is sent as: LowCardinality(T) as T (also inside Array)."""
    if isinstance(dt, LowCardinalityType):
        return NullableType(_STRING) if dt.is_nullable else _STRING
    if isinstance(dt, ArrayType):
        inner = output_type(dt.inner)
        return dt if inner is dt.inner else ArrayType(inner)
    return dt


def encode_column(dt: DataType, arr: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """Native data of one column (storage Arrow of ``dt``; LowCardinality must be mapped by
    :func:`output_type` first)."""
    a = as_array(arr)
    if isinstance(dt, NullableType):
        null_map = a.is_null().to_numpy(zero_copy_only=False).astype(np.uint8)
        return [null_map.tobytes(), *encode_column(dt.inner, a)]  # the inner encoders write defaults
    if isinstance(dt, ArrayType):
        counts, values = list_parts(a)
        offsets = np.cumsum(counts, dtype=np.uint64).astype("<u8")
        return [offsets.tobytes(), *encode_column(dt.inner, values)]
    if isinstance(dt, LowCardinalityType):
        raise TypeError("LowCardinality is sent as its plain type: map it with output_type()")
    return [dt.encode(a)]


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return encode_varuint(len(raw)) + raw


def encode_block(names: Sequence[str], types: Sequence[DataType], columns: Sequence[pa.Array]) -> bytes:
    """One Native block (``types`` are the columns' storage types; LowCardinality is sent plain)."""
    n = len(columns[0]) if columns else 0
    parts = [encode_varuint(len(names)), encode_varuint(n)]
    for name, dt, col in zip(names, types, columns, strict=True):
        out = output_type(dt)
        parts += [_string(name), _string(out.name), *encode_column(out, col)]
    return b"".join(parts)


async def render_native(result: QueryResult) -> AsyncIterator[bytes]:
    """A SELECT's rows as Native blocks of at most :data:`OUTPUT_BLOCK_ROWS` rows (encoded in a worker
    thread).  No rows: no block at all (an empty body), as ClickHouse answers."""
    names = [n for n, _ in result.columns]
    types = [t for _, t in result.columns]
    async for batch in result.batches:
        for start in range(0, batch.num_rows, OUTPUT_BLOCK_ROWS):
            piece = batch.slice(start, OUTPUT_BLOCK_ROWS)
            yield await asyncio.to_thread(encode_block, names, types, piece.columns)


# ---- decoding ------------------------------------------------------------------------------------------


class _Reader:
    """A cursor over a memoryview; running past its end raises :class:`NeedMoreData`."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def take(self, size: int) -> memoryview:
        if size < 0 or self.pos + size > len(self.view):
            raise NeedMoreData
        out = self.view[self.pos:self.pos + size]
        self.pos += size
        return out

    def rest(self) -> memoryview:
        return self.view[self.pos:]

    def left(self) -> int:
        return len(self.view) - self.pos

    def varuint(self) -> int:
        value, shift = 0, 0
        for _ in range(10):
            if self.pos >= len(self.view):
                raise NeedMoreData
            b = self.view[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
            shift += 7
        raise BadInputError("Cannot parse input: Native: a VarUInt is longer than 10 bytes")

    def u64(self) -> int:
        return int(struct.unpack_from("<Q", self.take(8))[0])

    def text(self, what: str, limit: int = 1 << 16) -> str:
        size = self.varuint()
        if size > limit:
            raise BadInputError(f"Cannot parse input: Native: {what} of {size} bytes is too long")
        return bytes(self.take(size)).decode("utf-8", "replace")


def _read_prefix(dt: DataType, r: _Reader) -> None:
    """The per-column state prefix: LowCardinality's key-serialization version (also inside Array)."""
    if isinstance(dt, ArrayType):
        _read_prefix(dt.inner, r)
    elif isinstance(dt, LowCardinalityType):
        version = r.u64()
        if version != _LC_VERSION:
            raise BadInputError(f"Cannot parse input: Native: {dt.name}: key serialization version "
                                f"{version}, expected {_LC_VERSION}")


def _decode_data(dt: DataType, r: _Reader, n: int) -> pa.Array:
    if isinstance(dt, NullableType):
        null_map = np.frombuffer(r.take(n), dtype=np.uint8) != 0
        return with_nulls(_decode_data(dt.inner, r, n), null_map)
    if isinstance(dt, ArrayType):
        offsets = np.frombuffer(r.take(8 * n), dtype="<u8")
        if n and (np.any(np.diff(offsets.astype(np.int64)) < 0) or int(offsets[-1]) >= 2**31):
            raise BadInputError(f"Cannot parse input: Native: {dt.name}: array offsets are not increasing "
                                "or too large")
        counts = np.diff(offsets, prepend=np.uint64(0)).astype(np.int64)
        total = int(offsets[-1]) if n else 0
        if total > r.left():  # every element takes at least one byte
            raise NeedMoreData
        return list_from_counts(counts, _decode_data(dt.inner, r, total), dt.inner.arrow_type)
    if isinstance(dt, LowCardinalityType):
        return _decode_low_cardinality(dt, r, n)
    if n > r.left():  # every value takes at least one byte
        raise NeedMoreData
    try:
        arr, used = dt.decode(r.rest(), n)
    except CorruptedDataError:  # the storage decoders' "too few bytes"
        raise NeedMoreData from None
    r.pos += used
    return arr


def _decode_low_cardinality(dt: LowCardinalityType, r: _Reader, n: int) -> pa.Array:
    if n == 0:
        return pa.array([], dt.arrow_type)
    flags = r.u64()
    width = flags & 0xFF
    if flags & ~_LC_KNOWN_FLAGS or width > 3:
        raise BadInputError(f"Cannot parse input: Native: {dt.name}: unknown index flags {flags:#x}")
    if flags & _LC_NEED_GLOBAL_DICTIONARY or not flags & _LC_HAS_ADDITIONAL_KEYS:
        raise BadInputError(f"Cannot parse input: Native: {dt.name}: a shared dictionary is not supported "
                            "(send the keys with each block)")
    num_keys = r.u64()
    if num_keys > r.left():
        raise NeedMoreData
    keys = _decode_data(_STRING, r, num_keys)
    rows = r.u64()
    if rows != n:
        raise BadInputError(f"Cannot parse input: Native: {dt.name}: {rows} indexes for {n} rows")
    index_dtype = _INDEX_DTYPES[width]
    indexes = np.frombuffer(r.take(n * index_dtype.itemsize), dtype=index_dtype)
    if n and int(indexes.max()) >= num_keys:
        raise BadInputError(f"Cannot parse input: Native: {dt.name}: index {int(indexes.max())} is out of "
                            f"the {num_keys} keys")
    values = keys.take(pa.array(indexes.astype(np.int64)))
    if dt.is_nullable:
        values = with_nulls(values, indexes == 0)
    return values


def decode_column(dt: DataType, view: memoryview, n: int) -> tuple[pa.Array, int]:
    """One column's Native data (prefix included) from the start of ``view``: the storage Arrow array
    and the bytes used.  Raises :class:`NeedMoreData` when ``view`` ends too early."""
    r = _Reader(view)
    _read_prefix(dt, r)
    arr = _decode_data(dt, r, n)
    return arr, r.pos


def decode_block(view: memoryview, max_rows: int = MAX_BLOCK_BYTES
                 ) -> tuple[list[str], list[DataType], list[pa.Array], int]:
    """The first block of ``view``: (names, types as sent, storage arrays, bytes used)."""
    r = _Reader(view)
    ncols = r.varuint()
    nrows = r.varuint()
    if ncols > 10_000 or nrows > max_rows:
        raise BadInputError(f"Cannot parse input: Native: implausible block of {ncols} columns and {nrows} "
                            "rows")
    names, types, arrays = [], [], []
    for _ in range(ncols):
        name = r.text("a column name")
        type_text = r.text("a type name")
        try:
            dt = parse_type(type_text)
        except ReplicadError as e:
            raise BadInputError(f"Cannot parse input: Native: column {name}: type {type_text[:100]}: {e}",
                                code=e.code) from None
        arr, used = decode_column(dt, r.rest(), nrows)
        r.pos += used
        names.append(name)
        types.append(dt)
        arrays.append(arr)
    return names, types, arrays, r.pos


def iter_blocks(read: Any, *, first_read: int = 4 << 20, max_block_bytes: int = MAX_BLOCK_BYTES
                ) -> Iterator[tuple[list[str], list[DataType], list[pa.Array]]]:
    """Decode the blocks of a Native stream; ``read(n)`` returns up to ``n`` bytes (b"" at the end).

    A block is decoded once it is wholly buffered: a short buffer is topped up (doubling) and the block
    decoded again from its start.  A block larger than ``max_block_bytes`` is refused.  Reads of 4 MiB
    (the text formats' block): ClickHouse's blocks of ~0.9 MB (24,576 rows of the bench's events) were
    decoded twice at every 1 MiB read's end, 86 decodes for 47 blocks (0.082 -> 0.072 s CPU for 41 MB)."""
    data, pos, eof = b"", 0, False
    want = first_read
    while True:
        if pos == len(data):
            if eof:
                return
            data, pos = read(want), 0
            if not data:
                return
        try:
            names, types, arrays, used = decode_block(memoryview(data)[pos:])
        except NeedMoreData:
            if eof:
                raise BadInputError("Cannot parse input: Native: the data ends inside a block") from None
            pending = len(data) - pos
            if pending >= max_block_bytes:
                raise BadInputError(f"Cannot parse input: Native: a block is larger than {max_block_bytes} "
                                    "bytes") from None
            more = read(max(want, pending))
            eof = not more
            data, pos = data[pos:] + more, 0
            continue
        pos += used
        yield names, types, arrays


# ---- INSERT … FORMAT Native ------------------------------------------------------------------------------


def parse_native(body: Any, spec: Any) -> Iterator[Any]:
    """The ``formats`` parser of Native input (run in a worker thread): yields the insert's column names,
    then storage record batches cut into insert blocks.  A column sent with a type other than the
    table's is converted from the sent type (its user Arrow form), as the other formats' values are."""

    blocks = iter_blocks(body.read)
    first = next(blocks, None)
    if first is None:
        yield [n for n, _ in spec.columns]
        return
    sent_names = first[0]
    names, positions, types = select_columns(spec, sent_names)
    yield names
    conv = Converter(names, types, spec)
    block: tuple[list[str], list[DataType], list[pa.Array]] | None = first
    while block is not None:
        got_names, got_types, arrays = block
        if got_names != sent_names:
            raise BadInputError(f"Cannot parse input: Native: a block has columns {got_names[:20]}, the "
                                f"first had {sent_names[:20]}", code=117)
        columns = []
        for p, dt in zip(positions, types, strict=True):
            sent, arr = got_types[p], arrays[p]
            columns.append(arr if sent == dt else sent.to_user_arrow(arr, spec.tz))
        yield from conv.feed(columns)
        block = next(blocks, None)
    yield from conv.finish()
