"""replicad.storage.fresh_files: the files of a part just written whole are kept a few seconds for the
replicas that fetch it, and its DataPartsExchange body made from them (part_transfer.body_from_files) is the
very body the server makes from the part's directory, which the receiver takes; the body is made without a
read of the directory, never from another part's files, and from the directory when the files do not fit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from replicad.datatypes import parse_type
from replicad.replication.sink import TableSchema, write_parts
from replicad.server import small_bodies
from replicad.server.small_bodies import SmallBodies
from replicad.storage import fresh_files
from replicad.storage.checksums import Checksum, Checksums
from replicad.storage.fresh_files import FreshFiles
from replicad.storage.layout import TableDataLayout
from replicad.storage.part_receive import receive_whole_body
from replicad.storage.part_transfer import body_from_files, build_part_body
from replicad.storage.writer import WriterSettings
from replicad.storage.written_part import WrittenPart
from tests.support.call_log import record_first_arguments

COLUMNS = (("d", parse_type("Date")), ("k", parse_type("UInt64")), ("s", parse_type("String")),
           ("n", parse_type("Nullable(Int32)")), ("a", parse_type("Array(UInt8)")))


def written(tmp_path: Path, rows: int = 300, partition: str | None = "toYYYYMM(d)",
            noise: bool = False) -> list[WrittenPart]:
    schema = TableSchema(COLUMNS, partition, "k", "k")
    blob = np.random.default_rng(5).bytes(16 * rows) if noise else b""
    table = pa.table({
        "d": pa.array(np.arange(rows, dtype=np.int32) % 60 + 19_000, pa.date32()),
        "k": pa.array(np.arange(rows, 0, -1, dtype=np.uint64)),
        "s": pa.array([blob[16 * i:16 * i + 16] if noise else b"v%d" % i for i in range(rows)], pa.binary()),
        "n": pa.array([None if i % 3 else i for i in range(rows)], pa.int32()),
        "a": pa.array([[i % 7] * (i % 4) for i in range(rows)], pa.list_(pa.uint8())),
    })
    layout = TableDataLayout(tmp_path, "db", "t")
    return [w for _pid, w in write_parts(table, schema, layout, WriterSettings(fsync=False, threads=1))]


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_the_body_from_memory_is_the_body_from_disk(tmp_path: Path, version: int) -> None:
    parts = written(tmp_path)
    assert len(parts) == 3  # three months: three parts, each with its files held
    for part in parts:
        names = {n for n, _d in part.files}
        assert names == {p.name for p in part.path.iterdir()}  # every file of the directory
        assert all((part.path / n).read_bytes() == d for n, d in part.files)
        body = body_from_files(part.checksums, version, part.files)
        assert body is not None and body == build_part_body(part.path, part.checksums, version)
        target = tmp_path / f"tmp-fetch_{part.path.name}_{version}"
        got = receive_whole_body(body, target, version, part.checksums)
        assert got.checksums == part.checksums
        assert {p.name: p.read_bytes() for p in got.path.iterdir()} == dict(part.files)


def test_files_that_are_not_the_parts_are_not_made_into_a_body(tmp_path: Path) -> None:
    part = written(tmp_path, partition=None)[0]
    files = list(part.files)
    assert body_from_files(part.checksums, 0, files[:-1]) is None  # one missing
    assert body_from_files(part.checksums, 0, [*files, ("extra.txt", b"x")]) is None  # one more
    assert body_from_files(part.checksums, 0, [*files, files[0]]) is None  # one twice
    name = next(n for n, _d in files if n in part.checksums.files)
    cut = [(n, d[:-1] if n == name else d) for n, d in files]
    assert body_from_files(part.checksums, 0, cut) is None  # a size checksums.txt does not list


def test_a_big_part_keeps_no_files(tmp_path: Path) -> None:
    rows = 80_000  # ~2.5 MiB of files (16 random bytes a row): above fresh_files.MAX_PART_BYTES
    part = written(tmp_path, rows=rows, partition=None, noise=True)[0]
    assert sum(f.stat().st_size for f in part.path.iterdir()) > fresh_files.MAX_PART_BYTES
    assert part.files == ()


def test_kept_by_name_and_checksums_object_for_a_while_and_a_few_mebibytes() -> None:
    now = [100.0]
    fresh = FreshFiles(ttl_s=5.0, max_bytes=1000, clock=lambda: now[0])
    cs = Checksums({"a.bin": Checksum(3, b"\0" * 16)})
    assert fresh.keep("p1", cs, [("a.bin", b"abc"), ("checksums.txt", b"x" * 97)])
    assert fresh.get("p1", cs) == (("a.bin", b"abc"), ("checksums.txt", b"x" * 97))
    assert fresh.get("p1", Checksums(dict(cs.files))) is None  # an equal but other object: another part
    assert fresh.get("p2", cs) is None
    assert not fresh.keep("big", cs, [("a.bin", b"x" * 1001)]) and fresh.get("big", cs) is None
    for i in range(2, 12):  # 100 bytes each: the oldest go first once more than 1000 are kept
        assert fresh.keep(f"p{i}", cs, [("a.bin", b"x" * 100)])
    assert fresh.bytes == 1000 and fresh.get("p1", cs) is None and fresh.get("p2", cs) is not None
    assert fresh.keep("p12", cs, [("a.bin", b"x" * 100)])
    assert fresh.get("p2", cs) is None and fresh.get("p11", cs) is not None
    now[0] += 5.1
    assert fresh.get("p11", cs) is None and len(fresh) == 0 and fresh.bytes == 0
    fresh.keep("p1", cs, [("a.bin", b"abc")])
    fresh.forget("p1")
    assert fresh.get("p1", cs) is None and fresh.bytes == 0


async def test_small_bodies_make_the_body_from_the_files_without_reading_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = written(tmp_path, partition=None)[0]
    reads = record_first_arguments(monkeypatch, small_bodies, "build_part_body")  # the part read from disk
    bodies = SmallBodies()
    expected = build_part_body(part.path, part.checksums, 3)
    got = await asyncio.gather(*(bodies.body(part.path, part.checksums, 3, part.files) for _ in range(3)))
    assert got == [expected] * 3 and reads == [] and bodies.from_memory == 1 and bodies.shared == 2
    # files that do not fit the part: its directory is read instead
    other = written(tmp_path / "other", partition=None)[0]
    assert await bodies.body(part.path, part.checksums, 1, other.files[:-1]) == \
        build_part_body(part.path, part.checksums, 1)
    assert reads == [part.path]
