"""Compressed blocks: byte-identical to ClickHouse 18.16, strict verification, the streaming writer."""

from __future__ import annotations

import gc
import io
import os
import random
import struct
import threading
from pathlib import Path

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import CorruptedDataError
from replicad.model.cityhash import cityhash128, file_hash
from replicad.storage import compression
from replicad.storage.compression import (
    BLOCK_OVERHEAD,
    MAX_COMPRESS_BLOCK_SIZE,
    BlockCompressor,
    CompressedStreamWriter,
    compress_block,
    decompress_all,
    iter_blocks,
    iter_file_blocks,
    method_name,
    read_block,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BASIC = FIXTURES / "ch18_part_basic" / "202611_1_1_0"
ZSTD = FIXTURES / "ch18_part_zstd" / "all_1_1_0"
METHODS = st.sampled_from(["lz4", "lz4hc", "zstd", "none"])


def reblock(body: bytes) -> bytes:
    """A block with a correct checksum over an arbitrary (possibly bogus) header+payload."""
    return cityhash128(body) + body


def test_facts_example_block() -> None:
    # id.bin of two Int8 rows 1, 2 as written by 18.16 (CLICKHOUSE_FACTS §5.1)
    expect = bytes.fromhex("dcaa1f71962c636070f92f0fc127b798" "82" "0c000000" "02000000" "200102")
    assert compress_block(b"\x01\x02", "lz4") == expect
    assert decompress_all(expect) == b"\x01\x02"


@pytest.mark.parametrize(
    ("part", "name", "method"),
    [(BASIC, n, "lz4") for n in ("id.bin", "ctime.bin", "name.bin", "n.bin", "n.null.bin", "tags.bin")]
    + [(BASIC, "tags.size0.bin", "lz4"), (ZSTD, "k.bin", "zstd"), (ZSTD, "s.bin", "zstd")],
)
def test_real_files_roundtrip_byte_identical(part: Path, name: str, method: str) -> None:
    data = (part / name).read_bytes()
    blocks = list(iter_blocks(data, name))
    assert len(blocks) == 1
    _, payload = blocks[0]
    assert compress_block(payload, method) == data  # type: ignore[arg-type]
    assert method_name(data[16]) == method


def test_real_contents() -> None:
    assert decompress_all((BASIC / "id.bin").read_bytes()) == bytes([0xFD, 0x01, 0x05])  # ids -3, 1, 5
    assert decompress_all((BASIC / "n.null.bin").read_bytes()) == b"\x01\x00\x00"
    sizes = decompress_all((BASIC / "tags.size0.bin").read_bytes())
    assert struct.unpack("<3Q", sizes) == (0, 2, 2)
    k = decompress_all((ZSTD / "k.bin").read_bytes())
    assert struct.unpack("<1000I", k) == tuple(range(1000))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=0, max_size=4), METHODS)
def test_roundtrip(chunks: list[bytes], method: str) -> None:
    data = b"".join(compress_block(c, method) for c in chunks)  # type: ignore[arg-type]
    assert decompress_all(data) == b"".join(chunks)
    offsets = [o for o, _ in iter_blocks(bytearray(data))]
    assert offsets == [sum(len(compress_block(c, method)) for c in chunks[:i]) for i in range(len(chunks))]  # type: ignore[arg-type]
    assert list(iter_file_blocks(io.BytesIO(data))) == list(iter_blocks(data))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=500), METHODS, st.data())
def test_any_flipped_byte_is_detected(payload: bytes, method: str, data: st.DataObject) -> None:
    good = compress_block(b"x" * 10, "lz4")
    block = bytearray(compress_block(payload, method))  # type: ignore[arg-type]
    i = data.draw(st.integers(min_value=0, max_value=len(block) - 1))
    block[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    blob = good + bytes(block)
    with pytest.raises(CorruptedDataError) as ei:
        decompress_all(blob, "c.bin")
    assert "c.bin" in str(ei.value) and f"offset {len(good)}" in str(ei.value)
    with pytest.raises(CorruptedDataError):
        list(iter_file_blocks(io.BytesIO(blob), "c.bin"))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300), METHODS, st.data())
def test_truncation_is_detected(payload: bytes, method: str, data: st.DataObject) -> None:
    block = compress_block(payload, method)  # type: ignore[arg-type]
    cut = data.draw(st.integers(min_value=1, max_value=len(block) - 1))
    with pytest.raises(CorruptedDataError, match="truncated"):
        decompress_all(block[:cut])
    with pytest.raises(CorruptedDataError, match="truncated"):
        list(iter_file_blocks(io.BytesIO(block[:cut])))


def test_bad_headers_with_valid_checksums() -> None:
    with pytest.raises(CorruptedDataError, match="unknown compression method"):
        decompress_all(reblock(struct.pack("<BII", 0x05, 10, 1) + b"a"))
    with pytest.raises(CorruptedDataError, match="unsupported compression codec FPC"):
        decompress_all(reblock(struct.pack("<BII", 0x98, 10, 1) + b"a"))
    with pytest.raises(CorruptedDataError, match="cannot decompress block"):  # a Delta payload too short
        decompress_all(reblock(struct.pack("<BII", 0x92, 10, 1) + b"a"))
    with pytest.raises(CorruptedDataError, match="bad compressed block sizes"):
        decompress_all(reblock(struct.pack("<BII", 0x02, 3, 1) + b"a"))
    with pytest.raises(CorruptedDataError, match="bad compressed block sizes"):
        decompress_all(reblock(struct.pack("<BII", 0x02, 10, 0x40000001) + b"a"))
    with pytest.raises(CorruptedDataError, match="header says"):
        decompress_all(reblock(struct.pack("<BII", 0x02, 11, 1) + b"ab"))
    lz = compress_block(b"hello world" * 10, "lz4")
    with pytest.raises(CorruptedDataError):  # LZ4 payload shorter/longer than the header claims
        decompress_all(reblock(lz[16:21] + struct.pack("<I", 109) + lz[25:]))
    frame = zstandard.ZstdCompressor().compress(b"abc" * 100)
    with pytest.raises(CorruptedDataError, match="ZSTD frame declares"):
        decompress_all(reblock(struct.pack("<BII", 0x90, 9 + len(frame), 10) + frame))
    with pytest.raises(CorruptedDataError, match="cannot decompress"):
        decompress_all(reblock(struct.pack("<BII", 0x90, 9 + 4, 10) + b"junk"))


def test_read_block_at_offset() -> None:
    a, b = compress_block(b"first"), compress_block(b"second", "zstd")
    payload, nxt = read_block(a + b, len(a), "f.bin")
    assert payload == b"second" and nxt == len(a) + len(b)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.binary(max_size=400), max_size=12),
    st.integers(min_value=1, max_value=300),
    st.sampled_from(["lz4", "zstd", "none"]),
    st.sets(st.integers(min_value=0, max_value=11)),
)
def test_stream_writer_marks(writes: list[bytes], max_block: int, method: str, flush_at: set[int]) -> None:
    out = io.BytesIO()
    w = CompressedStreamWriter(out, method, max_block_size=max_block)  # type: ignore[arg-type]
    marks = []
    for i, chunk in enumerate(writes):
        if i in flush_at:
            w.flush_block()
            assert w.offset_in_block == 0
        marks.append((w.compressed_offset, w.offset_in_block))
        w.write(chunk)
        assert w.offset_in_block < max_block
    w.close()
    blob = out.getvalue()
    plain = b"".join(writes)
    assert decompress_all(blob) == plain
    assert all(len(p) <= max_block for _, p in iter_blocks(blob))
    assert (w.file_size, w.file_hash) == (len(blob), file_hash(blob))
    assert (w.uncompressed_size, w.uncompressed_hash) == (len(plain), file_hash(plain))
    # every mark points at the chunk written right after it
    for (off, in_block), chunk in zip(marks, writes, strict=True):
        if not chunk:
            continue
        rest = b"".join(p for o, p in iter_blocks(blob) if o >= off)
        assert rest[in_block : in_block + len(chunk)] == chunk


def test_stream_writer_cuts_1mib_blocks_like_clickhouse() -> None:
    data = random.Random(3).randbytes(2 * MAX_COMPRESS_BLOCK_SIZE + 12345)
    out = io.BytesIO()
    with CompressedStreamWriter(out) as w:
        w.write(data[:100])
        w.write(memoryview(data)[100:])
        assert w.offset_in_block == 12345
        assert w.compressed_offset == out.tell()
    sizes = [len(p) for _, p in iter_blocks(out.getvalue())]
    assert sizes == [MAX_COMPRESS_BLOCK_SIZE, MAX_COMPRESS_BLOCK_SIZE, 12345]
    # a block filled exactly is cut at once: the next mark is (end of block, 0)
    out2 = io.BytesIO()
    w2 = CompressedStreamWriter(out2)
    w2.write(bytes(MAX_COMPRESS_BLOCK_SIZE))
    assert w2.offset_in_block == 0 and w2.compressed_offset == len(out2.getvalue()) > BLOCK_OVERHEAD
    w2.close()
    with pytest.raises(ValueError):
        w2.write(b"x")


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_zstd_contexts_are_shared_and_freed_with_their_thread() -> None:
    """A zstd context per stream was never freed (~120 KB per column stream of every part written, 2,000
    streams: ~236 MiB); one per thread now, freed when the thread ends (600 short-lived threads: ~70 MiB
    before)."""
    payload = os.urandom(1 << 16)
    BlockCompressor("zstd", 1).block(payload)
    gc.collect()
    before = _rss_mib()
    for _ in range(2000):
        BlockCompressor("zstd", 1).block(payload)
    gc.collect()
    assert _rss_mib() - before < 40

    def work() -> None:
        BlockCompressor("zstd", 1).block(payload)
        compress_block(payload, "zstd", 1)

    before = _rss_mib()
    for _ in range(600):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    gc.collect()
    assert _rss_mib() - before < 25


@pytest.mark.parametrize("method", ["zstd", "lz4"])
def test_big_writes_compressed_in_parallel_are_the_serial_bytes(method: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A write of many whole blocks is compressed side by side: the file, its hashes and the marks'
    offsets are those of compressing the blocks one after another."""
    rng = random.Random(3)
    words = [bytes(rng.choice(b"abcdefgh") for _ in range(rng.randint(1, 40))) for _ in range(500)]
    body = b" ".join(rng.choice(words) for _ in range(900_000))  # ~19 MB, compressible
    writes = [body[:12345], body[12345:9_000_000], body[9_000_000:9_000_100], body[9_000_100:]]

    def run() -> tuple[bytes, bytes, bytes, list[tuple[int, int]]]:
        f = io.BytesIO()
        w = CompressedStreamWriter(f, method, max_block_size=1 << 20)
        marks = []
        for data in writes:
            marks.append((w.compressed_offset, w.offset_in_block))
            w.write(data)
        w.close()
        return f.getvalue(), w.file_hash, w.uncompressed_hash, marks

    parallel = run()
    monkeypatch.setattr(compression, "PARALLEL_MIN_BLOCKS", 10**9)
    assert parallel == run()
    assert decompress_all(parallel[0]) == body


def test_the_reused_zstd_decompressor_starts_afresh_after_a_bad_frame() -> None:
    """Each thread keeps one zstd decompressor: a block that fails to decompress (a checksum-valid block
    holding a cut or garbled frame) leaves nothing behind for the next block, in this thread or another."""
    from replicad.storage.compression import read_block

    good_data = bytes(range(256)) * 40
    good = compress_block(good_data, "zstd")
    frame = zstandard.ZstdCompressor(level=1).compress(b"x" * 5000 + os.urandom(3000))

    def block(payload: bytes, size: int) -> bytes:
        body = struct.pack("<BII", 0x90, 9 + len(payload), size) + payload
        return cityhash128(body) + body

    for bad in (block(frame[: len(frame) // 2], 8000), block(frame[:6] + bytes(len(frame) - 6), 8000)):
        with pytest.raises(CorruptedDataError, match=r"cannot decompress|declares"):
            read_block(bad)
        assert read_block(good)[0] == good_data  # the same thread, right after
    out: list[bytes] = []
    t = threading.Thread(target=lambda: out.append(read_block(good)[0]))
    t.start()
    t.join()
    assert out == [good_data]
