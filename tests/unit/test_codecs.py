"""Column codecs of current ClickHouse (replicad.storage.codecs): hypothesis round trips through
reference encoders (tests/support/codec_encoders.py), whole compressed blocks, and malformed input.
chdb-written parts with every codec are read in tests/integration/test_modern_parts_chdb.py."""

from __future__ import annotations

import lz4.block
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import CorruptedDataError
from replicad.native import _bitcodecs
from replicad.storage import codecs
from replicad.storage.compression import read_block
from tests.support import codec_encoders as enc

WIDTHS = st.sampled_from([1, 2, 4, 8])


@st.composite
def int_data(draw: st.DrawFn) -> tuple[bytes, int]:
    width = draw(WIDTHS)
    bits = 8 * width
    style = draw(st.sampled_from(["any", "small", "steps"]))
    n = draw(st.integers(0, 300))
    if style == "any":
        vals = draw(st.lists(st.integers(0, 2**bits - 1), min_size=n, max_size=n))
    elif style == "small":
        base = draw(st.integers(0, 2**bits - 1))
        vals = [(base + d) % 2**bits for d in draw(st.lists(st.integers(-40, 40), min_size=n, max_size=n))]
    else:
        step = draw(st.integers(0, 2**min(bits, 20)))
        vals = [(i * step + draw(st.integers(0, 3))) % 2**bits for i in range(n)]
    tail = draw(st.binary(max_size=width - 1))  # a size not a multiple of the width: copied verbatim
    return tail + enc.as_bytes(vals, width, False), width


@settings(max_examples=150, deadline=None)
@given(case=int_data())
def test_delta_round_trip(case: tuple[bytes, int]) -> None:
    data, width = case
    assert codecs.decode_delta(enc.encode_delta(data, width), len(data)) == data


@settings(max_examples=150, deadline=None)
@given(case=int_data())
def test_double_delta_round_trip(case: tuple[bytes, int]) -> None:
    data, width = case
    assert codecs.decode_double_delta(enc.encode_double_delta(data, width), len(data)) == data


@settings(max_examples=150, deadline=None)
@given(case=int_data())
def test_gorilla_round_trip(case: tuple[bytes, int]) -> None:
    data, width = case
    assert codecs.decode_gorilla(enc.encode_gorilla(data, width), len(data)) == data


@settings(max_examples=150, deadline=None)
@given(case=int_data(), signed=st.booleans(), bit_variant=st.booleans())
def test_t64_round_trip(case: tuple[bytes, int], signed: bool, bit_variant: bool) -> None:
    data, width = case
    assert codecs.decode_t64(enc.encode_t64(data, width, signed, bit_variant), len(data)) == data


@settings(max_examples=60, deadline=None)
@given(case=int_data())
def test_multiple_in_a_block(case: tuple[bytes, int]) -> None:
    """Delta then T64 then LZ4 in one Multiple block, decoded by read_block like any .bin block."""
    data, width = case
    payload = enc.multiple(data, [
        (codecs.METHOD_DELTA, lambda b: enc.encode_delta(b, width)),
        (codecs.METHOD_GORILLA, lambda b: enc.encode_gorilla(b, 1)),
        (0x82, lambda b: lz4.block.compress(b, store_size=False)),
    ])
    block = enc.block(codecs.METHOD_MULTIPLE, payload, len(data))
    assert read_block(block, 0, "x.bin") == (data, len(block))


def test_t64_constant_and_full_range() -> None:
    const = enc.as_bytes([7] * 100, 4, True)
    assert codecs.decode_t64(enc.encode_t64(const, 4, True, False), len(const)) == const
    extremes = enc.as_bytes([-(2**63), 2**63 - 1, 0, -1] * 20, 8, True)
    for variant in (False, True):
        assert codecs.decode_t64(enc.encode_t64(extremes, 8, True, variant), len(extremes)) == extremes


@pytest.mark.parametrize("method, payload", [
    (codecs.METHOD_DELTA, b"\x03\x00abc"),  # bad width
    (codecs.METHOD_DOUBLE_DELTA, b"\x04\x00\x05\x00\x00\x00"),  # 5 items announced, 2 expected
    (codecs.METHOD_T64, b"\x7f"),  # unknown type cookie
    (codecs.METHOD_MULTIPLE, b"\x00"),  # no methods
])
def test_malformed_payloads_are_corruption(method: int, payload: bytes) -> None:
    with pytest.raises(CorruptedDataError, match="cannot decompress block"):
        read_block(enc.block(method, payload, 8), 0, "x.bin")


@settings(max_examples=150, deadline=None)
@given(case=int_data())
def test_native_loops_equal_the_python_reference(case: tuple[bytes, int]) -> None:
    data, width = case
    dd = enc.encode_double_delta(data, width)
    slow = codecs.decode_double_delta(dd, len(data), native=False)
    assert slow == codecs.decode_double_delta(dd, len(data))
    g = enc.encode_gorilla(data, width)
    assert codecs.decode_gorilla(g, len(data), native=False) == codecs.decode_gorilla(g, len(data))


@settings(max_examples=300, deadline=None)
@given(width=WIDTHS, count=st.integers(1, 40), first=st.integers(0, 2**64 - 1),
       delta=st.integers(0, 2**64 - 1), bits=st.binary(max_size=60))
def test_native_loops_on_arbitrary_bits(width: int, count: int, first: int, delta: int, bits: bytes) -> None:
    """Any bit stream: the C loops and the Python reference agree on the values or both refuse it."""
    first &= (1 << 8 * width) - 1
    for native_fn, reference in ((lambda: _bitcodecs.double_delta(bits, width, count, first, delta),
                                  lambda: codecs._double_delta_loop(bits, width, count, first, delta)),
                                 (lambda: _bitcodecs.gorilla(bits, width, count, first),
                                  lambda: codecs._gorilla_loop(bits, width, count, first))):
        try:
            expected = reference()
        except ValueError:
            with pytest.raises(ValueError):
                native_fn()
            continue
        assert native_fn() == expected


def test_native_speed_sanity() -> None:
    """A million DoubleDelta values decode in well under a second (the Python loop needs many)."""
    import time

    import numpy as np

    data = (np.arange(1_000_000, dtype="<u8") * 1000 + np.arange(1_000_000) % 7).astype("<u8").tobytes()
    payload = enc.encode_double_delta(data[:80_000], 8)
    t = time.perf_counter()
    assert codecs.decode_double_delta(payload, 80_000) == data[:80_000]
    assert time.perf_counter() - t < 0.5


@settings(max_examples=150, deadline=None)
@given(case=int_data(), factor=st.sampled_from([1, 3, 12, 1000]))
def test_gcd_round_trip(case: tuple[bytes, int], factor: int) -> None:
    data, width = case
    skip = len(data) % width
    mask = (1 << 8 * width) - 1
    scaled = data[:skip] + b"".join(
        ((int.from_bytes(data[i:i + width], "little") * factor) & mask).to_bytes(width, "little")
        for i in range(skip, len(data), width))
    assert codecs.decode_gcd(enc.encode_gcd(scaled, width), len(scaled)) == scaled


@settings(max_examples=400, deadline=None)
@given(method=st.sampled_from([*sorted(codecs.DECODERS), codecs.METHOD_MULTIPLE]),
       payload=st.binary(max_size=80), size=st.integers(0, 200))
def test_garbage_payloads_fail_cleanly(method: int, payload: bytes, size: int) -> None:
    """Any payload: the block decodes to exactly its size or is refused as corrupted, nothing else."""
    try:
        out, _end = read_block(enc.block(method, payload, size), 0, "x.bin")
    except CorruptedDataError:
        return
    assert len(out) == size


@settings(max_examples=300, deadline=None)
@given(case=int_data(), which=st.sampled_from(["delta", "dd", "gorilla", "t64", "gcd"]), at=st.integers(0),
       flip=st.integers(1, 255), cut=st.booleans())
def test_damaged_payloads_fail_cleanly(
    case: tuple[bytes, int], which: str, at: int, flip: int, cut: bool
) -> None:
    """A valid payload with one byte changed or its tail cut: right size out, or refused as corrupted."""
    data, width = case
    method, payload = {
        "delta": (codecs.METHOD_DELTA, lambda: enc.encode_delta(data, width)),
        "dd": (codecs.METHOD_DOUBLE_DELTA, lambda: enc.encode_double_delta(data, width)),
        "gorilla": (codecs.METHOD_GORILLA, lambda: enc.encode_gorilla(data, width)),
        "t64": (codecs.METHOD_T64, lambda: enc.encode_t64(data, width, False, False)),
        "gcd": (codecs.METHOD_GCD, lambda: enc.encode_gcd(data, width)),
    }[which]
    raw = bytearray(payload())
    if not raw:
        return
    i = at % len(raw)
    if cut:
        del raw[i:]
    else:
        raw[i] ^= flip
    try:
        out, _end = read_block(enc.block(method, bytes(raw), len(data)), 0, "x.bin")
    except CorruptedDataError:
        return
    assert len(out) == len(data)
