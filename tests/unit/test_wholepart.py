"""native/wholepart.c's seal_streams against the Python pieces it replaces (serialization, permutation,
BlockCompressor blocks, CompressedStreamWriter's cuts and marks, file hashes), and its refusals of buffers
that do not describe their rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.cityhash import file_hash
from replicad.native._wholepart import seal_streams
from replicad.storage.compression import (
    METHOD_LZ4,
    METHOD_NONE,
    METHOD_ZSTD,
    BlockCompressor,
    CompressedStreamWriter,
)

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


def _expected(plain: bytes, method: str) -> tuple[bytes, bytes, int, bytes, bytes]:
    """One granule in one block."""
    body = bytes(BlockCompressor(method, 1).block(plain)) if plain else b""  # type: ignore[arg-type]
    return body, file_hash(body), len(plain), file_hash(plain), bytes(16)


class _Chunks:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: bytes | memoryview) -> int:
        self.data += b
        return len(b)


def _cut(pieces: list[bytes], method: str, min_block: int, max_block: int
         ) -> tuple[bytes, bytes, int, bytes, bytes]:
    """What PartWriter's stream makes of granules' serialized rows: blocks, hashes, marks."""
    sink = _Chunks()
    out = CompressedStreamWriter(sink, method, 1, max_block)  # type: ignore[arg-type]
    marks = b""
    for piece in pieces:
        marks += out.mark(min_block)
        out.write(piece)
    out.close()
    body = bytes(sink.data)
    plain = b"".join(pieces)
    return body, file_hash(body) if body else bytes(16), out.uncompressed_size, file_hash(plain), marks


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
               (RAW, raw, 0), (RAW, b"", 0)]
    got = seal_streams(streams, order, METHODS[method], 1, 1 << 20, n, 8192, 65536)
    want = [_string_rows([values[i] for i in rows]), u64[rows].tobytes(),
            days[rows].astype(np.uint16).tobytes(), secs[rows].astype(np.uint32).tobytes(), raw, b""]
    assert got == [_expected(p, method) for p in want]


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.binary(max_size=30), min_size=1, max_size=80),
    granule=st.integers(1, 30),
    min_block=st.sampled_from([0, 1, 40, 65536]),
    max_block=st.sampled_from([1, 7, 64, 1 << 20]),
    method=st.sampled_from(sorted(METHODS)),
    permuted=st.booleans(),
    raw_sizes=st.lists(st.integers(0, 50), min_size=80, max_size=80),
)
def test_granules_cut_into_blocks_and_marked_as_part_writer_does(
    values: list[bytes], granule: int, min_block: int, max_block: int, method: str, permuted: bool,
    raw_sizes: list[int],
) -> None:
    """Many granules: blocks cut before a granule holding min_block pending bytes and at every max_block
    bytes (mid-granule too), the marks pointing into them, empty granules of a RAW stream included."""
    n = len(values)
    rng = np.random.default_rng(n * 31 + granule)
    order = rng.permutation(n).astype(np.int64) if permuted else None
    rows = np.arange(n) if order is None else order
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    u16 = rng.integers(0, 1 << 16, n).astype(np.uint16)
    days = rng.integers(-2**31, 2**31 - 1, n).astype(np.int32)
    starts = list(range(0, n, granule))
    raw_pieces = [bytes(rng.integers(0, 4, raw_sizes[i]).astype(np.uint8)) for i in range(len(starts))]
    raw_starts = np.concatenate([[0], np.cumsum([len(p) for p in raw_pieces[:-1]])]).astype(np.int64)
    streams = [(STRING, offsets, data := b"".join(values)), (FIXED, u16, 2), (NARROW_4_2, days, 0),
               (RAW, b"".join(raw_pieces), raw_starts), (RAW, b"", 0)]
    del data
    got = seal_streams(streams, order, METHODS[method], 1, max_block, n, granule, min_block)

    def by_granule(rows_bytes: list[bytes]) -> list[bytes]:
        return [b"".join(rows_bytes[g:g + granule]) for g in starts]

    want = [
        by_granule([_string_rows([values[i]]) for i in rows]),
        by_granule([u16[i].tobytes() for i in rows]),
        by_granule([days[i].astype(np.uint16).tobytes() for i in rows]),
        raw_pieces,
        [b""] * len(starts),
    ]
    assert got == [_cut(p, method, min_block, max_block) for p in want]


def test_long_streams_without_the_gil() -> None:
    """>= 256 KiB of streams (the GIL let go): the same blocks, one granule or many."""
    rng = np.random.default_rng(5)
    big = rng.integers(0, 50, 200_000, dtype=np.int64)
    order = rng.permutation(len(big)).astype(np.int64)
    for method in ("zstd", "lz4"):
        sealed = seal_streams([(FIXED, big, 8)], order, METHODS[method], 1, 1 << 21, len(big), 1 << 20, 65536)
        assert sealed == [_expected(big[order].tobytes(), method)]
        plain = big[order].tobytes()
        sealed = seal_streams([(FIXED, big, 8)], order, METHODS[method], 1, 1 << 20, len(big), 8192, 65536)
        assert sealed == [_cut([plain[g * 8:(g + 8192) * 8] for g in range(0, len(big), 8192)], method, 65536,
                               1 << 20)]


@pytest.mark.parametrize(("streams", "order", "rows", "message"), [
    ([(FIXED, np.arange(4, dtype=np.int64), 8)], np.array([0, 4], np.int64), 2, "not a row"),
    ([(FIXED, np.arange(4, dtype=np.int64), 8)], np.array([-1], np.int64), 1, "not a row"),
    ([(FIXED, b"12345", 2)], None, 2, "whole number"),
    ([(FIXED, b"1234", 0)], None, 2, "whole number"),
    ([(NARROW_8_4, b"1234", 0)], None, 1, "whole number"),
    ([(STRING, np.array([0, 5], np.int32), b"abc")], None, 1, "outside the data"),
    ([(STRING, np.array([0, 2, 1, 3], np.int32), b"abc")], None, 3, "decrease"),
    ([(STRING, np.array([0, 1, 2], np.int32), b"ab")], np.array([0, 1, 1, 2], np.int64), 4, "not a row"),
    ([(STRING, b"abc", b"abc")], None, 1, "int32"),
    ([(9, b"", 0)], None, 1, "kind"),
    ([(FIXED, b"12", 1)], np.zeros(3, np.int32), 3, "int64 value a row"),
    ([(FIXED, b"12", 1)], np.zeros(3, np.int64), 2, "int64 value a row"),
    ([(FIXED, b"123", 1)], None, 2, "3 rows in a part of 2"),
    ([(RAW, b"123", 0)], None, 2, "many granules without"),
    ([(RAW, b"123", np.array([0], np.int64))], None, 2, "one int64 a granule"),
    ([(RAW, b"123", np.array([1, 2], np.int64))], None, 2, "not its granules"),
    ([(RAW, b"123", np.array([0, 4], np.int64))], None, 2, "not its granules"),
    ([(RAW, b"123", np.array([0, 2, 1], np.int64))], None, 3, "not its granules"),
])
def test_refuses_buffers_that_do_not_describe_their_rows(streams: list[tuple[int, object, object]],
                                                         order: object, rows: int, message: str) -> None:
    """(granules of one row: a part of ``rows`` granules)"""
    with pytest.raises(ValueError, match=message):
        seal_streams(streams, order, METHOD_ZSTD, 1, 1 << 20, rows, 1, 0)


def test_refuses_an_unknown_method_and_malformed_streams() -> None:
    with pytest.raises(ValueError, match="method"):
        seal_streams([(RAW, b"x", 0)], None, 0x91, 1, 1 << 20, 1, 1, 0)
    with pytest.raises(TypeError):
        seal_streams([(RAW, b"x")], None, METHOD_LZ4, 1, 1 << 20, 1, 1, 0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at least 1"):
        seal_streams([(RAW, b"x", 0)], None, METHOD_LZ4, 1, 1 << 20, 0, 1, 0)
