"""A small part's streams read whole by one native call (native/partread.c, storage/whole_stream.py):
PartReader gives the same rows as reading them the general way, for every simple type and compression
method; a fault of a stream (a flipped byte, a missing or odd marks file, more than one block, a
symbolic link) is read the general way, whose error names it; hostile names read nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import CorruptedDataError
from replicad.native._partread import read_whole_streams
from replicad.storage import reader as reader_module
from replicad.storage.reader import PartReader
from replicad.storage.small_part import SmallPartWriter
from replicad.storage.whole_stream import WholeStream
from replicad.storage.writer import PartWriter, WriterSettings
from tests.support.part_rows import ALL_TYPES, make_rows

SIMPLE = [c for c in ALL_TYPES[1:] if not c[1].startswith("LowCardinality")]


def _part(path: Path, columns: list[tuple[str, str]], n: int, seed: int, method: str = "zstd",
          max_block: int = 1 << 20, granularity: int = 8192) -> Path:
    table, _tsv = make_rows(columns, n, seed)
    cols = [(c, parse_type(t)) for c, t in columns]
    s = WriterSettings(index_granularity=granularity, method=method,  # type: ignore[arg-type]
                       max_compress_block_size=max_block, min_compress_block_size=min(max_block, 65536),
                       fsync=False)
    cls: Any = SmallPartWriter if n <= granularity else PartWriter
    with cls(path, cols, s, primary_key=["k"]) as w:
        w.write(table, {})
        w.seal()
        w.finish()
    return path


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module, "read_whole_streams", lambda d, streams, m: [None] * len(streams))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.sampled_from(SIMPLE), min_size=1, max_size=6, unique=True), n=st.integers(1, 300),
       method=st.sampled_from(["lz4", "zstd", "none"]), seed=st.integers(0, 2**31))
def test_whole_streams_give_the_general_reading(tmp_path_factory: pytest.TempPathFactory,
                                                chosen: list[tuple[str, str]], n: int, method: str,
                                                seed: int) -> None:
    path = _part(tmp_path_factory.mktemp("p") / "all_1_1_0", [("k", "UInt64"), *chosen], n, seed, method)
    r = PartReader(path, index_granularity=8192)
    assert all(isinstance(s, WholeStream) for s in r._streams.values())
    whole = r.read()
    with pytest.MonkeyPatch.context() as mp:
        _general(mp)
        r2 = PartReader(path, index_granularity=8192)
        assert not any(isinstance(s, WholeStream) for s in r2._streams.values())
        assert r2.read().equals(whole)
    raw = [c for c, _t in chosen if r.raw_width(c) is not None]
    assert r.read_granules(0, 1, raw=raw).equals(PartReader(path).read_granules(0, 1, raw=raw))


def test_a_faulty_stream_is_read_the_general_way_and_named(tmp_path: Path) -> None:
    cols = [("k", "UInt64"), ("s", "String"), ("u32", "UInt32")]
    good = _part(tmp_path / "good_1_1_0", cols, 50, 1)
    want = PartReader(good).read()
    # a flipped byte in a block: the native read declines it, the general one names it
    bad = _part(tmp_path / "bad_1_1_0", cols, 50, 1, method="none")  # only the checksum can tell
    data = bytearray((bad / "s.bin").read_bytes())
    data[-1] ^= 0x40
    (bad / "s.bin").write_bytes(bytes(data))
    r = PartReader(bad)
    assert not isinstance(r._streams["s"], WholeStream) and isinstance(r._streams["k"], WholeStream)
    with pytest.raises(CorruptedDataError, match="checksum mismatch"):
        r.read()
    # no marks file: the general error
    (bad / "u32.mrk2").unlink() if (bad / "u32.mrk2").exists() else (bad / "u32.mrk").unlink()
    with pytest.raises(CorruptedDataError, match="no marks file"):
        PartReader(bad)
    # a data file of several blocks, and a symbolic link: read the general way, the same rows
    multi = _part(tmp_path / "multi_1_1_0", cols, 50, 1, max_block=64)
    r = PartReader(multi)
    assert not isinstance(r._streams["s"], WholeStream) and r.read().equals(want)
    linked = _part(tmp_path / "link_1_1_0", cols, 50, 1)
    os.rename(linked / "s.bin", tmp_path / "elsewhere.bin")
    os.symlink(tmp_path / "elsewhere.bin", linked / "s.bin")
    r = PartReader(linked)
    assert not isinstance(r._streams["s"], WholeStream) and r.read().equals(want)


def test_a_mark_outside_the_one_block_is_refused(tmp_path: Path) -> None:
    path = _part(tmp_path / "m_1_1_0", [("k", "UInt64"), ("u32", "UInt32")], 10, 1)
    marks = next(p for p in path.iterdir() if p.name.startswith("u32.mrk"))
    raw = bytearray(marks.read_bytes())
    raw[8] = 200  # the first mark's offset in the decompressed block: past its 40 bytes
    marks.write_bytes(bytes(raw))
    with pytest.raises(CorruptedDataError, match="not in the one block"):
        PartReader(path).read()


def test_parts_past_one_granule_are_read_the_general_way(tmp_path: Path) -> None:
    path = _part(tmp_path / "big_1_1_0", [("k", "UInt64"), ("s", "String")], 300, 2, granularity=100)
    r = PartReader(path, index_granularity=100)
    assert not any(isinstance(s, WholeStream) for s in r._streams.values())
    assert r.rows == 300
    # granularity not given (8192 assumed): three granules in one block each, read whole, granule by granule
    whole = PartReader(path)
    assert all(isinstance(s, WholeStream) for s in whole._streams.values()) and whole.granules == 3
    for a, b in ((0, 1), (1, 2), (2, 3), (1, 3), (0, 3)):
        assert whole.read_granules(a, b).equals(r.read_granules(a, b))
        assert whole.read_granules(a, b, raw=["s"]).equals(r.read_granules(a, b, raw=["s"]))


def test_hostile_names_and_directories_read_nothing(tmp_path: Path) -> None:
    path = _part(tmp_path / "h_1_1_0", [("k", "UInt64")], 5, 1)
    (tmp_path / "outside.bin").write_bytes((path / "k.bin").read_bytes())
    marks = next(p.name for p in path.iterdir() if p.name.startswith("k.mrk"))
    got = read_whole_streams(path, [(marks, "k.bin"), (marks, "../outside.bin"), (marks, ".."), (marks, ""),
                                    ("../" + marks, "k.bin"), (marks, "missing.bin")], 1 << 20)
    assert got[0] is not None and got[1:] == [None] * 5
    assert read_whole_streams(tmp_path / "nowhere", [(marks, "k.bin")], 1 << 20) == [None]
    assert read_whole_streams(path, [(marks, "k.bin")], 10) == [None]  # past max_bytes
    with pytest.raises(TypeError):
        read_whole_streams(path, [("k.bin",)], 1 << 20)  # type: ignore[list-item]
