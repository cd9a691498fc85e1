"""Serialization variants of current ClickHouse (replicad.storage.serialization, replicad.storage.compact):
Sparse offsets and String size streams round-tripped through reference encoders, Compact granules
decoded from one buffer, columns_substreams.txt.  chdb-written parts: test_modern_parts_chdb."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import CorruptedDataError, UnsupportedPartFormatError
from replicad.model.varint import encode_varuint
from replicad.storage.compact import parse_columns_substreams
from replicad.storage.serialization import (
    END_OF_GRANULE_FLAG,
    SerializationInfo,
    SizedStringType,
    SparseType,
    deserialize_sequential,
    serialization_of,
    sparse_positions,
)
from replicad.storage.types import parse_type as T


def sparse_offsets(granules: list[list[bool]]) -> bytes:
    """``.sparse.idx`` bytes of granules given as per-row "is non-default" flags."""
    out = b""
    for rows in granules:
        run = 0
        for non_default in rows:
            if non_default:
                out += encode_varuint(run)
                run = 0
            else:
                run += 1
        out += encode_varuint(run | END_OF_GRANULE_FLAG)
    return out


@settings(max_examples=100, deadline=None)
@given(granules=st.lists(st.lists(st.integers(-3, 3), min_size=1, max_size=40), min_size=1, max_size=5),
       as_string=st.booleans())
def test_sparse_round_trip(granules: list[list[int]], as_string: bool) -> None:
    flat = [v for g in granules for v in g]
    inner = T("String") if as_string else T("Int32")
    values = [v for v in flat if v]
    if as_string:
        main = b"".join(encode_varuint(len(str(v))) + str(v).encode() for v in values)
        expected = pa.array([str(v).encode() if v else b"" for v in flat], pa.binary())
    else:
        main = struct.pack(f"<{len(values)}i", *values)
        expected = pa.array(flat, pa.int32())
    dtype = SparseType(inner)
    bufs = {".sparse.idx": sparse_offsets([[v != 0 for v in g] for g in granules]), "": main}
    assert dtype.deserialize(bufs, len(flat)).equals(expected)
    # a Compact granule: the same streams one after the other
    assert deserialize_sequential(dtype, bufs[".sparse.idx"] + main, len(flat)).equals(expected)


def test_sparse_offsets_beyond_the_rows_are_corruption() -> None:
    bufs = {".sparse.idx": sparse_offsets([[False] * 5]), "": b""}
    with pytest.raises(CorruptedDataError, match="sparse offsets cover"):
        SparseType(T("UInt8")).deserialize(bufs, 3)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.binary(max_size=30), max_size=50))
def test_sized_string_and_nested(values: list[bytes]) -> None:
    sizes = struct.pack(f"<{len(values)}Q", *map(len, values))
    got = SizedStringType().deserialize({".size": sizes, "": b"".join(values)}, len(values))
    assert got.equals(pa.array(values, pa.binary()))
    info = SerializationInfo(string_size_stream=True, propagate_to_nested=True)
    arr_type = serialization_of("a", T("Array(Nullable(String))"), info)
    assert arr_type.substreams() == [".size0", ".null", ".size", ""]
    assert arr_type == T("Array(Nullable(String))")  # the stand-in keeps the type's name
    n = len(values)
    nulls = bytes(v == b"" for v in values)
    row_sizes = struct.pack("<2Q", n // 2, n - n // 2)
    seq = row_sizes + nulls + sizes + b"".join(values)
    got_arr = deserialize_sequential(arr_type, seq, 2)
    flat = [None if v == b"" else v for v in values]
    assert got_arr.to_pylist() == [flat[:n // 2], flat[n // 2:]]


def test_low_cardinality_in_a_compact_granule() -> None:
    """Key version, then flags (additional keys), keys, rows, indexes: all in one buffer."""
    keys = b"".join(encode_varuint(len(k)) + k for k in (b"", b"x", b"yz"))
    buf = struct.pack("<QQQ", 1, 0x600, 3) + keys + struct.pack("<Q", 4) + bytes([1, 2, 0, 2])
    got = deserialize_sequential(T("LowCardinality(String)"), buf, 4)
    assert got.to_pylist() == [b"x", b"yz", b"", b"yz"]
    with pytest.raises(CorruptedDataError, match="unread bytes"):
        deserialize_sequential(T("LowCardinality(String)"), buf + b"\0", 4)
    shared = struct.pack("<QQ", 1, 0x500) + buf[16:]  # NeedGlobalDictionary: not in a Compact granule
    with pytest.raises(UnsupportedPartFormatError, match="shared dictionary"):
        deserialize_sequential(T("LowCardinality(String)"), shared, 4)


def test_serialization_json() -> None:
    info = SerializationInfo.parse(b'{"columns":[{"kind":"Sparse","name":"x","num_defaults":9,'
                                   b'"num_rows":10}],"types_serialization_versions":{"string":1},"version":1}')
    assert info.string_size_stream and info.kinds == {"x": "Sparse"}
    assert isinstance(serialization_of("x", T("UInt8"), info), SparseType)
    assert serialization_of("y", T("UInt8"), info) == T("UInt8")
    assert SerializationInfo.parse(None) == SerializationInfo()
    with pytest.raises(UnsupportedPartFormatError, match=r"Sparse serialization of LowCardinality"):
        serialization_of("x", T("LowCardinality(Nullable(String))"), info)
    nullable = serialization_of("x", T("Nullable(UInt8)"), info)
    assert nullable.substreams() == [".sparse.idx", ""]  # no null map: the left-out rows are NULL
    bufs = {".sparse.idx": sparse_offsets([[False, True, False, True]]), "": b"\0\7"}
    assert nullable.deserialize(bufs, 4).to_pylist() == [None, 0, None, 7]
    with pytest.raises(CorruptedDataError, match=r"bad serialization\.json"):
        SerializationInfo.parse(b"{")


def test_columns_substreams() -> None:
    text = ("columns substreams version: 1\n2 columns:\n1 substreams for column `k`:\n\tk\n"
            "3 substreams for column `a b`:\n\ta%20b.size0\n\ta%20b.size\n\ta%20b\n")
    assert parse_columns_substreams(text) == [("k", ["k"]), ("a b", ["a%20b.size0", "a%20b.size", "a%20b"])]
    for bad in (text.replace("version: 1", "version: 2"), text[:-1], text + "x"):
        with pytest.raises(CorruptedDataError):
            parse_columns_substreams(bad)


def test_sparse_array_between_defaults() -> None:
    dtype = SparseType(T("Array(UInt8)"))
    bufs = {".sparse.idx": sparse_offsets([[False, True, False]]), ".size0": struct.pack("<Q", 2),
            "": b"\1\2"}
    assert dtype.deserialize(bufs, 3).to_pylist() == [[], [1, 2], []]
    assert dtype.defaults(2).to_pylist() == [[], []]


@settings(max_examples=300, deadline=None)
@given(granules=st.lists(st.lists(st.booleans(), min_size=1, max_size=30), min_size=1, max_size=4),
       tail=st.binary(max_size=20), cut=st.integers(0, 3))
def test_sparse_positions_vectorised(granules: list[list[bool]], tail: bytes, cut: int) -> None:
    """The vectorised offsets decoder stops at the closing group that completes the rows, whatever follows
    (a Compact granule's values), and refuses offsets that are cut short or cover other row counts."""
    idx = sparse_offsets(granules)
    flat = [v for g in granules for v in g]
    positions, end = sparse_positions(b"xy" + idx + tail, 2, len(flat))
    assert positions.tolist() == [i for i, v in enumerate(flat) if v] and end == 2 + len(idx)
    if cut:
        with pytest.raises(CorruptedDataError):
            sparse_positions(idx[:max(len(idx) - cut, 0)], 0, len(flat))
    with pytest.raises(CorruptedDataError, match="cover"):
        sparse_positions(idx, 0, len(flat) + 1)
