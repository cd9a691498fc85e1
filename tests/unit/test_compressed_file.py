"""CompressedFile ranges: a range over several LZ4 blocks decompressed straight into one buffer gives the
bytes of the blocks decompressed one by one and joined, starting in the block read last or not; a damaged
block is still refused with its offset."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from replicad.errors import CorruptedDataError
from replicad.storage.compressed_file import CompressedFile
from replicad.storage.compression import CompressedStreamWriter


def _file(tmp_path: Path, method: str, blocks: list[bytes]) -> tuple[Path, list[tuple[int, int]], bytes]:
    """A compressed file of ``blocks`` (one compressed block each) and the mark of each block's start."""
    path = tmp_path / f"{method}.bin"
    marks = []
    with path.open("wb") as f:
        w = CompressedStreamWriter(f, method)  # type: ignore[arg-type]
        for b in blocks:
            marks.append((w.compressed_offset, w.offset_in_block))
            w.write(b)
            w.flush_block()
        w.close()
    return path, marks, b"".join(blocks)


@pytest.mark.parametrize("method", ["lz4", "zstd", "none"])
def test_ranges_over_blocks_match_the_joined_blocks(tmp_path: Path, method: str) -> None:
    blocks = [bytes([i]) * (1000 + 37 * i) + b"tail%d" % i for i in range(6)]
    path, marks, whole = _file(tmp_path, method, blocks)
    starts = [sum(len(b) for b in blocks[:i]) for i in range(len(blocks))]
    f = CompressedFile(path, "p")
    end = f.end
    cases = [(0, 0, 5, 3), (1, 10, 3, 7), (2, 0, 2, 500), (3, 5, None, 0), (0, 0, None, 0), (4, 0, 4, 0)]
    for a, ao, b, bo in cases:  # consecutive reads: each starts in the block the previous one read last
        start = (marks[a][0], ao)
        stop = end if b is None else (marks[b][0], bo)
        lo = starts[a] + ao
        hi = len(whole) if b is None else starts[b] + bo
        assert bytes(f.read_between_view(start, stop)) == whole[lo:hi]
        assert f.read_between(start, stop) == whole[lo:hi]
        assert bytes(f.read_between_view(start, stop)) == whole[lo:hi]  # again: now from the cache
    f.close()


def test_a_damaged_block_in_a_range_is_refused(tmp_path: Path) -> None:
    blocks = [bytes([i]) * 3000 for i in range(4)]
    path, marks, _whole = _file(tmp_path, "lz4", blocks)
    data = bytearray(path.read_bytes())
    data[marks[2][0] + 40] ^= 0xFF  # inside the third block's payload
    path.write_bytes(bytes(data))
    f = CompressedFile(path, "p")
    with pytest.raises(CorruptedDataError, match=f"offset {marks[2][0]}"):
        f.read_between_view((0, 0), (marks[3][0], 100))
    f.close()


def test_a_file_dropped_without_close_gives_its_descriptor_back(tmp_path: Path) -> None:
    path, marks, whole = _file(tmp_path, "lz4", [b"x" * 100, b"y" * 100])

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()
    files = [CompressedFile(path, "p") for _ in range(50)]
    for f in files:
        assert f.read_between((marks[0][0], 0), f.end) == whole
    assert open_fds() >= before + 50
    del f, files
    gc.collect()
    assert open_fds() <= before
