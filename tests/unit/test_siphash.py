"""ClickHouse SipHash (replicad.model.siphash over the C extension replicad.native._siphash), checked
against a pure-Python reference of the algorithm (the implementation the module had before it went
native, verified against ClickHouse partition IDs), against values from ClickHouse's own tests, and
against ClickHouse 26 (chdb) ``sipHash64`` / ``sipHash128``."""

from __future__ import annotations

import itertools
import random
import struct
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.siphash import SipHash, siphash64, siphash128
from replicad.native import _siphash

_M = 0xFFFFFFFFFFFFFFFF


# ---------------------------------------------------------------------------------------- reference


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M


class RefSipHash:
    """Pure-Python ClickHouse SipHash-2-4, key (0, 0): 64-bit reference finalisation, and
    ``(v0 ^ v1, v2 ^ v3)`` as the 128-bit value."""

    def __init__(self) -> None:
        self.v = [0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573]
        self.cnt = 0
        self.tail = b""

    @staticmethod
    def _rounds(v: list[int], n: int) -> None:
        v0, v1, v2, v3 = v
        for _ in range(n):
            v0 = (v0 + v1) & _M
            v1 = _rotl(v1, 13) ^ v0
            v0 = _rotl(v0, 32)
            v2 = (v2 + v3) & _M
            v3 = _rotl(v3, 16) ^ v2
            v0 = (v0 + v3) & _M
            v3 = _rotl(v3, 21) ^ v0
            v2 = (v2 + v1) & _M
            v1 = _rotl(v1, 17) ^ v2
            v2 = _rotl(v2, 32)
        v[:] = [v0, v1, v2, v3]

    @classmethod
    def _word(cls, v: list[int], m: int) -> None:
        v[3] ^= m
        cls._rounds(v, 2)
        v[0] ^= m

    def update(self, data: bytes) -> RefSipHash:
        self.cnt += len(data)
        buf = self.tail + bytes(data)
        full = len(buf) - len(buf) % 8
        for (m,) in struct.iter_unpack("<Q", buf[:full]):
            self._word(self.v, m)
        self.tail = buf[full:]
        return self

    def update_u64(self, value: int) -> RefSipHash:
        return self.update(struct.pack("<Q", value & _M))

    def update_string(self, s: bytes) -> RefSipHash:
        self.update_u64(len(s))
        return self.update(s)

    def _final(self) -> list[int]:
        v = list(self.v)
        last = int.from_bytes(self.tail, "little") | ((self.cnt & 0xFF) << 56)
        self._word(v, last)
        v[2] ^= 0xFF
        self._rounds(v, 4)
        return v

    def get128(self) -> tuple[int, int]:
        v0, v1, v2, v3 = self._final()
        return v0 ^ v1, v2 ^ v3

    def digest128(self) -> bytes:
        return struct.pack("<QQ", *self.get128())

    def get64(self) -> int:
        v0, v1, v2, v3 = self._final()
        return v0 ^ v1 ^ v2 ^ v3


# ---------------------------------------------------------------------------------------- properties


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_one_shot_matches_reference(data: bytes) -> None:
    ref = RefSipHash().update(data)
    assert siphash128(data) == _siphash.sip128(data) == ref.digest128()
    assert siphash64(data) == _siphash.sip64(data) == ref.get64()
    h = SipHash().update(data)
    assert h.digest128() == ref.digest128()
    assert h.get128() == ref.get128()
    assert h.get64() == ref.get64()
    assert h.hexdigest128() == ref.digest128().hex()


_OPS = st.one_of(
    st.tuples(st.just("update"), st.binary(max_size=40)),
    st.tuples(st.just("update_string"), st.binary(max_size=40)),
    st.tuples(st.just("update_u64"), st.integers(min_value=-(2**70), max_value=2**70)),
    st.tuples(st.just("read"), st.none()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_OPS, max_size=30))
def test_update_sequences_match_reference(ops: list[tuple[str, Any]]) -> None:
    h, ref = SipHash(), RefSipHash()
    for op, arg in ops:
        if op == "read":  # reading mid-stream must not disturb the state
            assert h.get128() == ref.get128()
            assert h.get64() == ref.get64()
            continue
        assert getattr(h, op)(arg) is h
        getattr(ref, op)(arg)
    assert h.digest128() == ref.digest128()
    assert h.get64() == ref.get64()


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_any_chunking_and_buffer_type(data: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    h = SipHash()
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        piece = data[a:b]
        h.update((bytes, bytearray, memoryview)[i % 3](piece))
    assert h.digest128() == siphash128(data)
    # a memoryview slice at a non-zero offset of a bigger buffer
    big = b"\xaa" * 5 + data + b"\x55" * 3
    assert siphash128(memoryview(big)[5 : 5 + len(data)]) == siphash128(data)


def test_update_string_is_length_then_bytes() -> None:
    for s in (b"", b"a", b"columns.txt", bytes(range(256))):
        assert SipHash().update_string(s).digest128() == siphash128(struct.pack("<Q", len(s)) + s)


def test_update_u64_takes_integers_modulo_2_64() -> None:
    for v in (0, 1, 2**63, 2**64 - 1, -1, -(2**64) + 5, 2**64 + 7, 2**100 + 3, True):
        expected = siphash128(struct.pack("<Q", int(v) & _M))
        assert SipHash().update_u64(v).digest128() == expected
    assert SipHash().update_u64(np.uint64(2**64 - 1)).digest128() == siphash128(b"\xff" * 8)
    assert SipHash().update_u64(np.int64(-2)).digest128() == siphash128(struct.pack("<q", -2))
    for bad in (1.0, "1", None):
        with pytest.raises(TypeError):
            SipHash().update_u64(bad)  # type: ignore[arg-type]


def test_rejects_non_buffers() -> None:
    for bad in ("text", 5, None):
        with pytest.raises(TypeError):
            SipHash().update(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            siphash128(bad)  # type: ignore[arg-type]


def test_large_inputs_release_the_gil_and_stay_exact() -> None:
    rng = random.Random(7)
    data = rng.randbytes(200_003)
    ref = RefSipHash().update(data)
    assert siphash128(data) == ref.digest128()
    assert siphash64(data) == ref.get64()
    # a tail left by a small update, then a big one, then a big length-prefixed string
    h, r = SipHash().update(b"abc"), RefSipHash().update(b"abc")
    h.update(data[:70_001]).update_string(data[70_001:])
    r.update(data[:70_001]).update_string(data[70_001:])
    assert h.digest128() == r.digest128()

    results: dict[int, bytes] = {}

    def work(i: int) -> None:
        hh = SipHash()
        for _ in range(5):
            hh.update(data)
        results[i] = hh.digest128()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results.values()) == {siphash128(data * 5)}


def test_native_hasher_copy_and_size() -> None:
    h = _siphash.Hasher()
    h.update(b"0123456789")
    c = h.copy()
    c.update(b"x")
    assert h.size == 10 and c.size == 11
    assert h.digest128() == siphash128(b"0123456789")
    assert c.digest128() == siphash128(b"0123456789x")


# ---------------------------------------------------------------------------------------- ClickHouse


# hex(sipHash128(...)) from ClickHouse's tests/queries/0_stateless/00746_hashing_tuples (bytes in order)
KNOWN_128 = {
    b"foo": "CC45107CC4B79F62D831BEF2103C7CBF",
    b"\x01": "DF2EC2F0669B000EDFF6ADEE264E7D68",
}


def test_known_clickhouse_values() -> None:
    for data, hexed in KNOWN_128.items():
        assert SipHash().update(data).hexdigest128().upper() == hexed
        assert RefSipHash().update(data).digest128().hex().upper() == hexed


def test_against_chdb() -> None:
    chdb = pytest.importorskip("chdb")
    rng = random.Random(20261122)
    inputs = [b"", b"foo"] + [rng.randbytes(n) for n in [*range(1, 70), 100, 255, 256, 257, 1000, 4099]]
    literal = ",".join(f"unhex('{d.hex()}')" for d in inputs)
    sql = f"SELECT hex(sipHash128(x)), sipHash64(x) FROM (SELECT arrayJoin([{literal}]) AS x)"
    rows = bytes(chdb.query(sql, "TSV").bytes()).decode().splitlines()
    assert len(rows) == len(inputs)
    for data, row in zip(inputs, rows, strict=True):
        h128, h64 = row.split("\t")
        assert siphash128(data).hex().upper() == h128, data
        assert siphash64(data) == int(h64), data
