"""CityHash v1.0.2 and ClickHouse's chained file hash, checked against the clickhouse_cityhash wheel
(seedless only: its seeded function ignores the seed) and against hashes written by ClickHouse 18.16."""

from __future__ import annotations

import io
import random
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.cityhash import (
    CHUNK_SIZE,
    FileHasher,
    cityhash128,
    cityhash128_with_seed,
    file_hash,
    hash_file,
    hash_stream,
)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "ch18_part_basic" / "202611_1_1_0"
K3 = 0xC949D7C7509E6557
U64 = (1 << 64) - 1

clickhouse_cityhash = pytest.importorskip("clickhouse_cityhash.cityhash")


def wheel_cityhash128(data: bytes) -> bytes:
    v = clickhouse_cityhash.CityHash128(data)
    return struct.pack("<QQ", v >> 64, v & U64)


def chained_reference(data: bytes) -> bytes:
    """The hashing-buffer definition, spelled out with the seeded primitive."""
    lo, hi = 0, 0
    for i in range(0, len(data), CHUNK_SIZE):
        lo, hi = cityhash128_with_seed(data[i : i + CHUNK_SIZE], lo, hi)
    return struct.pack("<QQ", lo, hi)


def test_every_length_matches_wheel() -> None:
    rnd = random.Random(102)
    for n in [*range(0, 300), 511, 512, 1023, 2048, 4095, 70000]:
        data = rnd.randbytes(n)
        assert cityhash128(data) == wheel_cityhash128(data), n


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1200))
def test_cityhash128_matches_wheel(data: bytes) -> None:
    assert cityhash128(data) == wheel_cityhash128(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=16, max_size=700))
def test_seeded_consistent_with_unseeded(data: bytes) -> None:
    # v1.0.2 CityHash128 of >= 16 bytes is the seeded hash of the rest, seeded by the first 16 bytes.
    lo, hi = struct.unpack("<QQ", data[:16])
    got = cityhash128_with_seed(data[16:], lo ^ K3, hi)
    assert struct.pack("<QQ", *got) == wheel_cityhash128(data)


def test_seed_matters() -> None:
    data = b"x" * 300
    assert cityhash128_with_seed(data, 0, 0) != cityhash128_with_seed(data, 1, 0)
    assert cityhash128_with_seed(data, 0, 0) != cityhash128_with_seed(data, 0, 1)
    with pytest.raises(ValueError):
        cityhash128_with_seed(data, -1, 0)


def test_file_hash_facts() -> None:
    assert file_hash(b"") == bytes(16)
    assert FileHasher().digest() == bytes(16)
    # count.txt "2" as written by ClickHouse 18.16 (CLICKHOUSE_FACTS §0.1)
    assert file_hash(b"2").hex() == "6d6ee28eebb4755396b925d25ba6f21c"


def test_file_hash_of_real_multi_chunk_file() -> None:
    data = (FIXTURE / "name.bin").read_bytes()
    assert len(data) > CHUNK_SIZE
    # the hash 18.16 stored for name.bin in this part's checksums.txt
    assert file_hash(data).hex() == "cd1b40c0bca537f0968e0c63163108e2"
    assert hash_file(FIXTURE / "name.bin") == (len(data), file_hash(data))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=7000), st.lists(st.integers(min_value=0, max_value=7000), max_size=6))
def test_streaming_equals_whole(data: bytes, cuts: list[int]) -> None:
    h = FileHasher()
    prev = 0
    for c in sorted(min(c, len(data)) for c in cuts):
        h.update(memoryview(data)[prev:c])
        prev = c
    h.update(data[prev:])
    assert h.size == len(data)
    assert h.digest() == file_hash(data) == chained_reference(data)


def test_big_buffers_and_copy() -> None:
    data = random.Random(5).randbytes(3 * 1024 * 1024 + 77)
    expect = chained_reference(data)
    assert file_hash(data) == expect
    h = FileHasher()
    h.update(bytearray(data[:100000]))
    h2 = h.copy()
    h.update(data[100000:])
    assert h.digest() == expect
    assert h2.size == 100000 and h2.digest() == file_hash(data[:100000])
    assert hash_stream(io.BytesIO(data), read_size=65536) == (len(data), expect)
    assert FileHasher(data).hexdigest() == expect.hex()
