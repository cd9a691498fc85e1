"""replicad.native._strings: String streams (VarUInt length + bytes) against a plain-Python reference,
including truncated and hostile buffers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.datatypes.strings import decode_strings, encode_strings
from replicad.errors import CorruptedDataError
from replicad.model.varint import encode_varuint
from replicad.native import _strings


def reference_decode(buf: bytes, n: int) -> tuple[list[bytes], int] | None:
    """The first n records, or None if the stream does not hold them (10-byte VarUInts at most)."""
    pos, out = 0, []
    for _ in range(n):
        length, shift = 0, 0
        for _k in range(10):
            if pos >= len(buf):
                return None
            b = buf[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        else:
            return None
        length &= 2**64 - 1
        if length > len(buf) - pos:
            return None
        out.append(buf[pos:pos + length])
        pos += length
    return out, pos


def stream(values: list[bytes]) -> bytes:
    return b"".join(encode_varuint(len(v)) + v for v in values)


def as_list(offsets: bytes, data: bytes, n: int) -> list[bytes]:
    t = pa.binary() if len(offsets) == 4 * (n + 1) else pa.large_binary()
    arr = pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    arr.validate(full=True)
    return [bytes(v) for v in arr.to_pylist()]


@given(st.lists(st.binary(max_size=300), max_size=100), st.binary(max_size=10))
def test_round_trip(values: list[bytes], tail: bytes) -> None:
    encoded = stream(values)
    assert encode_strings(pa.array(values, pa.binary())) == encoded
    assert encode_strings(pa.array(values, pa.large_binary())) == encoded
    offsets, data, used = _strings.decode(encoded + tail, len(values))
    assert used == len(encoded)
    assert len(offsets) == 4 * (len(values) + 1)
    assert as_list(offsets, data, len(values)) == values


@given(st.binary(max_size=64), st.integers(0, 70))
@settings(max_examples=500)
def test_any_bytes_match_reference(buf: bytes, n: int) -> None:
    expected = reference_decode(buf, n)
    if expected is None:
        with pytest.raises(ValueError):
            _strings.decode(buf, n)
        with pytest.raises(CorruptedDataError):
            decode_strings(memoryview(buf), n)
    else:
        offsets, data, used = _strings.decode(buf, n)
        assert (as_list(offsets, data, n), used) == expected


@given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=50), st.data())
def test_truncated_streams_fail(values: list[bytes], data: st.DataObject) -> None:
    encoded = stream(values)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ValueError):
        _strings.decode(encoded[:cut], len(values))


@given(st.integers(0, 2**64 - 1), st.binary(max_size=100), st.integers(0, 5))
def test_huge_declared_lengths_fail(length: int, payload: bytes, before: int) -> None:
    if length <= len(payload):
        length += len(payload) + 1
    length &= 2**64 - 1
    buf = b"\x00" * before + encode_varuint(length) + payload
    if length <= len(payload):  # wrapped around: a valid record after all
        return
    with pytest.raises(ValueError, match="past the end"):
        _strings.decode(buf, before + 1)


def test_hostile_headers() -> None:
    with pytest.raises(ValueError, match="longer than 10 bytes"):
        _strings.decode(b"\x80" * 11 + b"\x00", 1)
    with pytest.raises(ValueError, match="cut off"):
        _strings.decode(b"\x01a\x80\x80", 2)
    with pytest.raises(ValueError, match="fewer than"):
        _strings.decode(b"\x00" * 5, 6)
    with pytest.raises(ValueError, match="fewer than"):
        _strings.decode(b"", 2**62)  # refused before allocating anything
    with pytest.raises(ValueError):
        _strings.decode(b"\x00", -1)
    # 10-byte VarUInt with bit 63 set: a length no buffer can hold
    with pytest.raises(ValueError, match="past the end"):
        _strings.decode(b"\xff" * 9 + b"\x01" + b"x" * 10, 1)
    assert _strings.decode(b"", 0) == (b"\0" * 4, b"", 0)
    assert _strings.decode(b"\x81\x00x", 1) == (b"\0" * 4 + b"\1\0\0\0", b"x", 3)  # padded VarUInt


def test_encode_rejects_bad_offsets() -> None:
    data = b"abcdef"
    for bad in ([0, 3, 2], [0, 7], [-1, 2], [3, 2]):
        with pytest.raises(ValueError, match="out of order or outside"):
            _strings.encode(np.array(bad, np.int32), data)
    with pytest.raises(ValueError, match="int32 or int64"):
        _strings.encode(np.array([0, 1], np.uint8), data)
    with pytest.raises(ValueError, match="int32 or int64"):
        _strings.encode(np.array([0.0, 1.0]), data)
    with pytest.raises(ValueError, match="at least one"):
        _strings.encode(np.array([], np.int64), data)
    assert _strings.encode(np.array([2, 2, 5], np.int64), data) == b"\x00\x03cde"
    assert _strings.encode(np.array([6], np.int32), data) == b""


def test_sliced_and_null_arrays() -> None:
    values = [b"x" * i for i in range(300)]
    arr = pa.array(values, pa.binary())
    assert encode_strings(arr.slice(130, 50)) == stream(values[130:180])
    with_nulls = pa.array([b"ab", None, b"c"], pa.binary())
    assert encode_strings(with_nulls) == b"\x02ab\x00\x01c"
    assert encode_strings(pa.array(["é", "z"], pa.string())) == b"\x02\xc3\xa9\x01z"


def test_big_stream_releases_gil_and_round_trips() -> None:
    rng = np.random.default_rng(5)
    values = [rng.bytes(int(k)) for k in rng.integers(0, 400, 20000)]
    t = parse_type("String")
    arr = pa.array(values, pa.binary())
    data = t.serialize(arr)[""]
    assert data == stream(values)
    assert t.deserialize({"": data}, len(values)).equals(arr)
