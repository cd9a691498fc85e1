"""A fetched part written into a directory made ahead (storage/prepared_dirs.py, storage/part_sink.py): the
received files are the sender's, byte for byte, whatever the directory held; a file of the table's last part
that this one has not is removed; the part's own files become the set made ahead next; a leftover at the
target keeps its own handling."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from replicad.errors import CorruptedDataError
from replicad.storage.checksums import Checksums
from replicad.storage.part_receive import receive_part, receive_whole_body
from replicad.storage.part_sink import PartSink
from replicad.storage.part_transfer import files_to_send
from replicad.storage.prepared_dirs import PER_SET, PreparedDirs, prepared_for

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "ch18_part_basic"
PART = FIXTURE_DIR / "202611_1_1_0"
RESPONSE = (FIXTURE_DIR / "dpe_v0_response_202611_0_0_0.bin").read_bytes()
CHECKSUMS = Checksums.parse((PART / "checksums.txt").read_bytes())
SENT = {p.name: p.read_bytes() for p in PART.iterdir()}


def _stream(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def _table(tmp_path: Path) -> tuple[Path, Path, PreparedDirs]:
    data = tmp_path / "d"
    table = data / "data" / "db" / "t"
    table.mkdir(parents=True)
    pool = prepared_for(data, table)
    assert pool is not None
    return data, table, pool


def _wait(pool: PreparedDirs, n: int) -> None:
    deadline = time.monotonic() + 10
    while pool.ready() < n:
        assert time.monotonic() < deadline, pool.ready()
        time.sleep(0.01)


async def _fetch(data: Path, table: Path) -> tuple[PartSink, dict[str, bytes]]:
    target = table / "tmp-fetch_202611_0_0_0"
    sink = PartSink(target, False, replace_stale=True, prepared_in=data)
    got = await receive_part(_stream(RESPONSE), target, 0, CHECKSUMS, sink=sink)
    return sink, {p.name: p.read_bytes() for p in got.path.iterdir()}


async def test_a_fetch_writes_into_a_directory_made_ahead(tmp_path: Path) -> None:
    data, table, pool = _table(tmp_path)
    pool.note([*files_to_send(CHECKSUMS), "gone.bin"], table)  # the table's last part had one more file
    _wait(pool, PER_SET)
    for d in pool.root.iterdir():
        (d / "count.txt").write_bytes(b"9" * 1000)  # cannot be: cut to what was received all the same
    hits = pool.hits
    _sink, files = await _fetch(data, table)
    assert pool.hits == hits + 1
    assert files == SENT  # no gone.bin, no 9s
    deadline = time.monotonic() + 10
    while (got := pool.take_for(table)) is None or got[1] != frozenset(SENT):
        assert time.monotonic() < deadline, got
        await asyncio.sleep(0.01)
    assert {p.name for p in got[0].iterdir()} == set(SENT)


async def test_a_leftover_at_the_target_is_replaced_and_the_directory_made_ahead_dropped(
        tmp_path: Path) -> None:
    data, table, pool = _table(tmp_path)
    pool.note(files_to_send(CHECKSUMS), table)
    _wait(pool, PER_SET)
    before = set(pool.root.iterdir())
    stale = table / "tmp-fetch_202611_0_0_0"
    stale.mkdir()
    (stale / "junk").write_bytes(b"x")
    sink, files = await _fetch(data, table)
    assert sink.replaced_stale and files == SENT
    taken = before - set(pool.root.iterdir())
    assert len(taken) == 1 and not next(iter(taken)).exists()


def test_a_body_received_whole_takes_a_directory_made_ahead_for_its_files(tmp_path: Path) -> None:
    """receive_whole_body (a small body read whole): a directory holding exactly the part's files is taken
    (what it held is cut to the received bytes); a leftover at the target is replaced and said, or left
    alone and refused without ``replace_stale``; a body failing a check takes nothing and writes nothing."""
    data, table, pool = _table(tmp_path)
    pool.note(files_to_send(CHECKSUMS), table)
    _wait(pool, PER_SET)
    for d in pool.root.iterdir():
        (d / "count.txt").write_bytes(b"9" * 1000)
    hits = pool.hits
    got = receive_whole_body(RESPONSE, table / "tmp-fetch_202611_0_0_0", 0, CHECKSUMS, prepared_in=data,
                             replace_stale=True)
    assert pool.hits == hits + 1 and not got.replaced_stale
    assert {p.name: p.read_bytes() for p in got.path.iterdir()} == SENT
    stale = table / "tmp-fetch_202611_1_1_0"
    stale.mkdir()
    (stale / "junk").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        receive_whole_body(RESPONSE, stale, 0, CHECKSUMS, prepared_in=data)
    assert (stale / "junk").read_bytes() == b"x"
    again = receive_whole_body(RESPONSE, stale, 0, CHECKSUMS, prepared_in=data, replace_stale=True)
    assert again.replaced_stale and {p.name: p.read_bytes() for p in stale.iterdir()} == SENT
    _wait(pool, PER_SET)
    ready, hits = pool.ready(), pool.hits
    bad = bytearray(RESPONSE)
    bad[-1] ^= 1
    target = table / "tmp-fetch_202611_2_2_0"
    with pytest.raises(CorruptedDataError, match="Checksum mismatch"):
        receive_whole_body(bytes(bad), target, 0, CHECKSUMS, prepared_in=data)
    assert not target.exists() and pool.ready() == ready and pool.hits == hits
