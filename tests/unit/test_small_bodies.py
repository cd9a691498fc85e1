"""replicad.server.small_bodies: a small part's body is read once for the sends that want it together, is the
same bytes as build_part_body's, and is never taken for another part, another protocol or after a failure."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from replicad.errors import CorruptedDataError
from replicad.server import small_bodies
from replicad.server.small_bodies import SmallBodies
from replicad.storage.checksums import Checksums
from replicad.storage.part_transfer import build_part_body
from tests.support.call_log import record_first_arguments

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ch18_part_basic" / "202611_1_1_0"


@pytest.fixture
def part(tmp_path: Path) -> tuple[Path, Checksums]:
    path = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, path)
    return path, Checksums.parse((path / "checksums.txt").read_bytes())


async def test_sends_together_share_one_read(
    part: tuple[Path, Checksums], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cs = part
    reads = record_first_arguments(monkeypatch, small_bodies, "build_part_body")  # the part read from disk
    bodies = SmallBodies()
    got = await asyncio.gather(*(bodies.body(path, cs, 3) for _ in range(4)))
    assert got == [build_part_body(path, cs, 3)] * 4
    assert len(reads) == 1 and bodies.builds == 1 and bodies.shared == 3
    assert await bodies.body(path, cs, 3) == got[0] and len(reads) == 1  # kept for a later send
    # another protocol version: another body
    assert await bodies.body(path, cs, 0) == build_part_body(path, cs, 0) and len(reads) == 2
    # the same name made again (another Checksums object from the store): read afresh
    again = Checksums.parse((path / "checksums.txt").read_bytes())
    assert await bodies.body(path, again, 3) == got[0] and len(reads) == 3


async def test_a_failed_read_is_not_kept(part: tuple[Path, Checksums]) -> None:
    path, cs = part
    bin_file = next(p for p in path.iterdir() if p.suffix == ".bin")
    good = bin_file.read_bytes()
    bin_file.write_bytes(b"\0" * len(good))  # same size, other bytes: the hash check fails
    bodies = SmallBodies()
    results = await asyncio.gather(*(bodies.body(path, cs, 3) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, CorruptedDataError) for r in results)
    assert len(bodies) == 0
    bin_file.write_bytes(good)
    assert await bodies.body(path, cs, 3) == build_part_body(path, cs, 3)


async def test_kept_bodies_expire_and_stay_within_the_memory_bound(part: tuple[Path, Checksums]) -> None:
    path, cs = part
    size = max(len(build_part_body(path, cs, v)) for v in (0, 3))
    bodies = SmallBodies(ttl_s=0.05, max_bytes=size)
    await bodies.body(path, cs, 3)
    await bodies.body(path, cs, 0)  # over the bound: the oldest goes
    assert len(bodies) == 1
    await asyncio.sleep(0.1)
    await bodies.body(path, cs, 2)  # the expired one goes
    assert len(bodies) == 1 and bodies.builds == 3


async def test_a_cancelled_sender_does_not_stop_the_read_for_the_others(part: tuple[Path, Checksums]) -> None:
    path, cs = part
    bodies = SmallBodies()
    first = asyncio.ensure_future(bodies.body(path, cs, 3))
    second = asyncio.ensure_future(bodies.body(path, cs, 3))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == build_part_body(path, cs, 3)
