"""A fetched part is compared with its source's registration only (replicad.replication.checksum_compare:
``compare_with_source``), not with every replica's as 18.16 does, so that a fetch's ZooKeeper requests do not
grow with the replica count.  Real ZooKeeper, in-process replicas; the fetching replica's queue leaves the
part alone (``blockers.fetches``) and the test fetches it itself.

- with four replicas holding the part, the fetch reads nothing of the two that are not its source, and sends
  as many requests as with one;
- the source's registration differing from the bytes it serves refuses the part, nothing committed;
- when the source's registration cannot be compared (gone by the time it is read) every replica is read and
  compared, as 18.16 does: a replica whose registration differs refuses the part, and when they agree the
  part is committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from replicad.errors import CorruptedDataError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create
from replicad.replica import TableReplica
from replicad.storage.checksums import Checksums, MinimalisticChecksums
from tests.support.table_cluster import Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Requests:
    """Every ZooKeeper request sent, by session: (kind, what) in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[int, str]] = []
        real = Keeper._submit

        def submit(keeper: Keeper, kind: str, what: str, start: Callable[[], Any]) -> Any:
            self.sent.append((id(keeper), what))
            return real(keeper, kind, what, start)

        monkeypatch.setattr(Keeper, "_submit", submit)

    def mark(self) -> int:
        return len(self.sent)

    def of(self, keeper: Keeper, since: int) -> list[str]:
        return [what for k, what in self.sent[since:] if k == id(keeper)]


def other_checksums(r: TableReplica, part: str) -> bytes:
    """A registration of ``part`` whose checksums differ from the part's (one file's hash changed)."""
    cs = r.store.get(part)
    assert cs is not None
    files = dict(cs.directory.checksums.files)
    name = next(n for n in files if n.endswith(".bin"))
    files[name] = dataclasses.replace(files[name], file_hash=b"\x01" * 16, uncompressed_hash=b"\x02" * 16)
    return MinimalisticChecksums.from_checksums(Checksums(files)).to_bytes()


async def nothing_committed(r: TableReplica, part: str) -> None:
    assert r.store.get(part) is None
    assert await r.keeper.exists(r.paths.me.part(part)) is None
    assert [p.name for p in r.layout.path.iterdir() if p.name.startswith("tmp")] == []


async def one_fetch(r: TableReplica, part: str, source: str, requests: Requests) -> list[str]:
    since = requests.mark()
    await r.fetcher.fetch_part(part, source)
    return requests.of(r.keeper, since)


async def test_a_fetch_reads_only_its_source_whatever_the_replica_count(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = Requests(monkeypatch)
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.blockers.fetches = True
    await r1.insert_table(rows(range(0, 50), month=10))
    first = r1.store.active_names()[0]
    sent_two = await one_fetch(r2, first, "r1", requests)

    r3, r4 = await cluster.start("r3"), await cluster.start("r4")
    await wait_for(lambda: r3.store.get(first) is not None and r4.store.get(first) is not None,
                   what="r3 and r4 to fetch the first part")
    r5 = await cluster.start("r5")
    r5.blockers.fetches = True
    await r1.insert_table(rows(range(100, 150), month=11))
    second = next(n for n in r1.store.active_names() if n != first)
    await wait_for(lambda: r3.store.get(second) is not None and r4.store.get(second) is not None,
                   what="r3 and r4 to fetch the second part")
    sent_five = await one_fetch(r5, second, "r1", requests)

    for name in ("r2", "r3", "r4"):  # holding the part, not the source: never read
        assert not [w for w in sent_five if f"/replicas/{name}/" in w], (name, sent_five)
    assert not [w for w in sent_five if w.startswith("get_children") and w.endswith("/replicas")], sent_five
    # the registrations read (the source's columns and checksums): as many as with two replicas (the
    # session's other tasks may send requests meanwhile, e.g. the puller's check of the source, so only these
    # are compared)
    def registrations(sent: list[str], part: str) -> list[str]:
        return [w for w in sent if w.startswith("get ") and f"/parts/{part}/" in w]

    src = r1.paths.me.root
    for sent, part in ((sent_two, first), (sent_five, second)):
        expected = [f"get {src}/parts/{part}/{child}" for child in ("columns", "checksums")]
        assert registrations(sent, part) == expected, sent
    assert r5.store.get(second) is not None
    assert await r5.keeper.exists(r5.paths.me.part(second)) is not None


async def test_a_source_whose_registration_differs_is_refused(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.blockers.fetches = True
    await r1.insert_table(rows(range(0, 50), month=10))
    part = r1.store.active_names()[0]
    node = r1.paths.me.part_checksums(part)
    genuine = (await r1.keeper.get(node))[0]
    await r1.keeper.set(node, other_checksums(r1, part))
    with pytest.raises(CorruptedDataError):
        await r2.fetcher.fetch_part(part, "r1")
    await nothing_committed(r2, part)

    await r1.keeper.set(node, genuine)
    await r2.fetcher.fetch_part(part, "r1")
    assert await sorted_rows(r2) == await sorted_rows(r1)


@pytest.mark.parametrize("third_agrees", [False, True])
async def test_without_the_sources_registration_every_replica_is_compared(
    cluster: Cluster, third_agrees: bool
) -> None:
    """r1 serves the part but its registration is gone when the fetch reads it (removed meanwhile): the
    fetch falls back to 18.16's comparison with every replica, here a third replica (registration only)
    that registered the part, with the genuine checksums or others."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.blockers.fetches = True
    await r1.insert_table(rows(range(0, 50), month=10))
    part = r1.store.active_names()[0]
    mine = r1.paths.me
    columns = (await r1.keeper.get(mine.part_columns(part)))[0]
    checksums = (await r1.keeper.get(mine.part_checksums(part)))[0]
    third = r1.paths.replica("r3")
    await r1.keeper.ensure_path(third.parts)
    await r1.keeper.multi([
        Create(third.part(part), b""),
        Create(third.part_columns(part), columns),
        Create(third.part_checksums(part), checksums if third_agrees else other_checksums(r1, part)),
    ])
    await r1.keeper.delete(mine.part(part), recursive=True)
    if third_agrees:
        await r2.fetcher.fetch_part(part, "r1")
        assert await sorted_rows(r2) == await sorted_rows(r1)
        assert await r2.keeper.exists(r2.paths.me.part_checksums(part)) is not None
    else:
        with pytest.raises(CorruptedDataError):
            await r2.fetcher.fetch_part(part, "r1")
        await nothing_committed(r2, part)
