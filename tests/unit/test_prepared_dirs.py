"""Part directories made ahead of the small inserts (replicad/storage/prepared_dirs.py): what a take finds,
what the refill thread makes and removes, and that a part written into a taken directory has the bytes of
one written into a fresh directory, whatever the taken directory held."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from replicad.datatypes import DataType, parse_type
from replicad.storage.prepared_dirs import PER_SET, PreparedDirs, prepared_for
from replicad.storage.small_part import SmallPartWriter
from replicad.storage.writer import WriterSettings, WrittenPart

NAMES = ["k.bin", "k.mrk", "s.bin", "s.mrk", "count.txt"]
COLS: list[tuple[str, DataType]] = [("k", parse_type("UInt64")), ("s", parse_type("String"))]


def _pool(tmp_path: Path, **kw: int) -> PreparedDirs:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return PreparedDirs(tmp_path / "tmp" / "prepared", **kw)


def _wait_ready(pool: PreparedDirs, n: int) -> None:
    deadline = time.monotonic() + 10
    while pool.ready() < n:
        assert time.monotonic() < deadline, f"{pool.ready()} directories ready, not {n}"
        time.sleep(0.01)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir()}


def test_a_take_finds_a_directory_of_exactly_those_files_once_refilled(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    assert pool.take(NAMES) is None  # nothing made yet: the set is remembered, a refill queued
    _wait_ready(pool, PER_SET)
    d = pool.take(reversed(NAMES))  # a set: the order does not matter
    assert d is not None and d.parent == pool.root
    assert _files(d) == dict.fromkeys(NAMES, b"")
    assert pool.take(NAMES[:-1]) is None  # another set of names finds nothing
    assert (pool.hits, pool.misses) == (1, 2)
    _wait_ready(pool, 2 * PER_SET)  # both sets refilled
    assert pool.take(NAMES) != d  # a taken directory is never handed out again


def test_an_earlier_process_leftovers_are_removed(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    (pool.root / "7").mkdir(parents=True)
    (pool.root / "7" / "k.bin").write_bytes(b"old")
    pool.take(NAMES)
    _wait_ready(pool, PER_SET)
    assert not (pool.root / "7").exists()
    assert len(list(pool.root.iterdir())) == PER_SET


def test_a_forgotten_set_directories_are_removed(tmp_path: Path) -> None:
    pool = _pool(tmp_path, max_sets=1)
    pool.take(NAMES)
    _wait_ready(pool, PER_SET)
    first = set(pool.root.iterdir())
    pool.take(["other.bin"])  # the first set is forgotten
    _wait_ready(pool, PER_SET)
    deadline = time.monotonic() + 10
    while first & set(pool.root.iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert all(_files(d) == {"other.bin": b""} for d in pool.root.iterdir())


def test_a_removed_data_path_is_not_made_again(tmp_path: Path) -> None:
    pool = _pool(tmp_path)
    (tmp_path / "tmp").rmdir()
    pool.refill()  # nothing to make yet
    pool.take(NAMES)
    time.sleep(0.2)
    pool.refill()
    assert not (tmp_path / "tmp").exists() and pool.ready() == 0


def test_one_pool_per_data_path_and_none_without_the_table_directory(tmp_path: Path) -> None:
    a, b = tmp_path / "data" / "db" / "a", tmp_path / "data" / "db" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    pa_, pb = prepared_for(tmp_path, a), prepared_for(tmp_path, b)
    assert pa_ is not None and pa_ is pb and pa_.root == tmp_path / "tmp" / "prepared"
    assert prepared_for(tmp_path, tmp_path / "data" / "db" / "missing") is None


def _write(path: Path, table: pa.Table, prepared: PreparedDirs | None) -> WrittenPart:
    with SmallPartWriter(path, COLS, WriterSettings(fsync=False), primary_key=["k"], prepared=prepared) as w:
        w.write(table)
        return w.finish()


TABLE = pa.table({"k": pa.array(range(50), pa.uint64()),
                  "s": pa.array([f"v{i}".encode() * (i % 7) for i in range(50)], pa.binary())})


def _ready_pool(tmp_path: Path) -> tuple[PreparedDirs, WrittenPart]:
    """A pool with directories of the part's file names, and the same part written into a fresh directory."""
    fresh = _write(tmp_path / "fresh", TABLE, None)
    pool = _pool(tmp_path)
    assert pool.take(_files(fresh.path)) is None
    _wait_ready(pool, PER_SET)
    return pool, fresh


def test_a_part_written_into_a_taken_directory_has_the_fresh_bytes(tmp_path: Path) -> None:
    pool, fresh = _ready_pool(tmp_path)
    for d in pool.root.iterdir():  # what a taken directory holds beyond the written bytes is cut off
        (d / "k.bin").write_bytes(b"\xff" * 100_000)
        (d / "primary.idx").write_bytes(b"stale")
    written = _write(tmp_path / "tmp_insert_x", TABLE, pool)
    assert written.path.parent == pool.root and pool.hits == 1
    assert not (tmp_path / "tmp_insert_x").exists()
    assert _files(written.path) == _files(fresh.path)
    assert (written.checksums, written.bytes_on_disk) == (fresh.checksums, fresh.bytes_on_disk)


def test_a_taken_directory_removed_meanwhile_falls_back_to_the_planned_one(tmp_path: Path) -> None:
    pool, fresh = _ready_pool(tmp_path)
    for d in pool.root.iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    written = _write(tmp_path / "tmp_insert_y", TABLE, pool)
    assert written.path == tmp_path / "tmp_insert_y"
    assert _files(written.path) == _files(fresh.path)


def test_a_failed_write_removes_the_taken_directory(tmp_path: Path) -> None:
    pool, _fresh = _ready_pool(tmp_path)
    for d in pool.root.iterdir():
        (d / "count.txt").unlink()
        (d / "count.txt").mkdir()  # opening it for writing fails
    before = set(pool.root.iterdir())
    with pytest.raises(IsADirectoryError):
        _write(tmp_path / "tmp_insert_z", TABLE, pool)
    taken = before - set(pool.root.iterdir())
    assert len(taken) == 1 and not next(iter(taken)).exists()
    assert not (tmp_path / "tmp_insert_z").exists()
    assert os.path.isdir(pool.root)
