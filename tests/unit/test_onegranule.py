"""native/onegranule.c's seal_streams against the Python pieces it replaces (serialization, permutation,
BlockCompressor blocks, file hashes), and its refusals of buffers that do not describe their rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.cityhash import file_hash
from replicad.native._onegranule import seal_streams
from replicad.storage.compression import METHOD_LZ4, METHOD_NONE, METHOD_ZSTD, BlockCompressor

METHODS = {"none": METHOD_NONE, "lz4": METHOD_LZ4, "zstd": METHOD_ZSTD}
RAW, FIXED, STRING, NARROW_4_2, NARROW_8_4 = 0, 1, 2, 3, 4


def _string_rows(values: list[bytes]) -> bytes:
    out = bytearray()
    for v in values:
        n = len(v)
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        out += v
    return bytes(out)


def _expected(plain: bytes, method: str) -> tuple[bytes, bytes, int, bytes]:
    body = bytes(BlockCompressor(method, 1).block(plain)) if plain else b""  # type: ignore[arg-type]
    return body, file_hash(body), len(plain), file_hash(plain)


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.binary(max_size=40), min_size=1, max_size=60),
    ints=st.data(),
    method=st.sampled_from(sorted(METHODS)),
    permuted=st.booleans(),
)
def test_streams_as_python_serializes_and_compresses_them(
    values: list[bytes], ints: st.DataObject, method: str, permuted: bool,
) -> None:
    n = len(values)
    rng = np.random.default_rng(len(values))
    order = rng.permutation(n).astype(np.int64) if permuted else None
    rows = np.arange(n) if order is None else order
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    data = b"".join(values)
    u64 = np.array(ints.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)), dtype=np.uint64)
    days = np.array(ints.draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)), np.int32)
    secs = np.array(ints.draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n, max_size=n)), np.int64)
    raw = ints.draw(st.binary(max_size=300))
    streams = [(STRING, offsets, data), (FIXED, u64, 8), (NARROW_4_2, days, 0), (NARROW_8_4, secs, 0),
               (RAW, raw, 0), (FIXED, u64[:0], 8) if order is None else (RAW, b"", 0)]
    got = seal_streams(streams, order, METHODS[method], 1, 1 << 20)
    want = [_string_rows([values[i] for i in rows]), u64[rows].tobytes(),
            days[rows].astype(np.uint16).tobytes(), secs[rows].astype(np.uint32).tobytes(), raw, b""]
    assert got == [_expected(p, method) for p in want]


def test_long_streams_without_the_gil_and_streams_past_one_block() -> None:
    """>= 256 KiB of streams (the GIL let go): the same blocks; a stream longer than max_block comes back
    serialized, not compressed."""
    rng = np.random.default_rng(5)
    big = rng.integers(0, 50, 200_000, dtype=np.int64)
    order = rng.permutation(len(big)).astype(np.int64)
    for method in ("zstd", "lz4"):
        sealed = seal_streams([(FIXED, big, 8)], order, METHODS[method], 1, 1 << 21)
        assert sealed == [_expected(big[order].tobytes(), method)]
    small = np.arange(10, dtype=np.uint32)
    assert seal_streams([(FIXED, small, 4), (FIXED, small[:2], 4)], None, METHOD_LZ4, 1, 16) == [
        (None, small.tobytes()), _expected(small[:2].tobytes(), "lz4")]


@pytest.mark.parametrize(("streams", "order", "message"), [
    ([(FIXED, np.arange(4, dtype=np.int64), 8)], np.array([0, 4], np.int64), "not a row"),
    ([(FIXED, np.arange(4, dtype=np.int64), 8)], np.array([-1], np.int64), "not a row"),
    ([(FIXED, b"12345", 2)], None, "whole number"),
    ([(FIXED, b"1234", 0)], None, "whole number"),
    ([(NARROW_8_4, b"1234", 0)], None, "whole number"),
    ([(STRING, np.array([0, 5], np.int32), b"abc")], None, "outside the data"),
    ([(STRING, np.array([0, 2, 1, 3], np.int32), b"abc")], None, "decrease"),
    ([(STRING, np.array([0, 1, 2], np.int32), b"ab")], np.array([0, 1, 1, 2], np.int64), "not a row"),
    ([(STRING, b"abc", b"abc")], None, "int32"),
    ([(9, b"", 0)], None, "kind"),
    ([(FIXED, b"12", 1)], np.zeros(3, np.int32), "int64"),
])
def test_refuses_buffers_that_do_not_describe_their_rows(streams: list[tuple[int, object, object]],
                                                         order: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        seal_streams(streams, order, METHOD_ZSTD, 1, 1 << 20)


def test_refuses_an_unknown_method_and_malformed_streams() -> None:
    with pytest.raises(ValueError, match="method"):
        seal_streams([(RAW, b"x", 0)], None, 0x91, 1, 1 << 20)
    with pytest.raises(TypeError):
        seal_streams([(RAW, b"x")], None, METHOD_LZ4, 1, 1 << 20)
