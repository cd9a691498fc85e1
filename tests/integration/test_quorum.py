"""Quorum inserts (``insert_quorum``) in a replicad-only replica set on a real ZooKeeper, with the 18.16 node
texts: an insert is acknowledged only once ``insert_quorum`` replicas hold its part, fails at once when too
few replicas are alive, times out (UnknownInsertStatusError, never success) when they cannot fetch it, and a
quorum nobody can complete any more is marked failed.  Modern ClickHouse's ``quorum/parallel/<part>`` nodes
are updated as modern replicas do."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from replicad.errors import QuorumError, UnknownInsertStatusError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.quorum import QuorumEntry, QuorumLastPart
from replicad.replica import TableReplica
from replicad.replication.quorum import (
    check_quorum_precondition,
    fail_quorum_for_part,
    parallel_status_path,
    update_quorum,
)
from replicad.service import InsertSettings
from tests.support.table_cluster import ZK_PATH, Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PATHS = TablePaths.create(ZK_PATH, "test")
STATUS = PATHS.quorum_status


def freeze(replica: TableReplica, frozen: bool = True) -> None:
    """The replica stays active (its ``is_active`` lives) but executes nothing: it never fetches."""
    replica.executor.is_paused = (lambda: True) if frozen else (lambda: replica.is_readonly)
    replica.executor.wakeup()


async def holders(keeper: Keeper, part: str) -> list[str]:
    out = []
    for r in await keeper.get_children(PATHS.replicas):
        if await keeper.exists(PATHS.replica(r).part(part)) is not None:
            out.append(r)
    return sorted(out)


async def test_quorum_2_with_one_of_three_stopped_succeeds(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    await cluster.start("r2")
    await cluster.start("r3")
    await cluster.stop("r3")
    summary = await r1.insert_table(rows([1, 2, 3]), InsertSettings(insert_quorum=2))
    # acknowledged only once it holds: two replicas list the part at the moment the insert returns
    assert len(await holders(keeper, "202611_0_0_0")) >= 2
    assert summary.written_parts == 1
    assert await keeper.exists(STATUS) is None
    last = QuorumLastPart.parse((await keeper.get(PATHS.quorum_last_part))[0])
    assert last.parts == {"202611": "202611_0_0_0"}
    raw_last = (await keeper.get(PATHS.quorum_last_part))[0]
    assert raw_last == b"version: 2\nparts count: 1\n202611\t202611_0_0_0\n"


async def test_quorum_2_with_two_of_three_stopped_fails_at_once(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    await cluster.start("r2")
    await cluster.start("r3")
    await cluster.stop("r2")
    await cluster.stop("r3")
    started = time.monotonic()
    too_few = r"Number of alive replicas \(1\) is less than requested quorum \(2\)"
    with pytest.raises(QuorumError, match=too_few):
        await r1.insert_table(rows([1]), InsertSettings(insert_quorum=2))
    assert time.monotonic() - started < 2
    assert r1.store.active_names() == []  # nothing was written


async def test_quorum_times_out_then_completes_when_a_replica_catches_up(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    freeze(r2)
    freeze(r3)  # alive for the precondition, but nobody fetches
    started = time.monotonic()
    with pytest.raises(UnknownInsertStatusError, match="Timeout while waiting for quorum"):
        await r1.insert_table(rows([1, 2]), InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=1500))
    assert 1.4 < time.monotonic() - started < 5
    status = QuorumEntry.parse((await keeper.get(STATUS))[0])
    assert (status.part_name, status.required_number_of_replicas) == ("202611_0_0_0", 2)
    assert status.replicas == ("r1",)
    # another quorum insert is refused while this one is pending (18.16's rule)
    with pytest.raises(QuorumError, match="Quorum for previous write has not been satisfied yet"):
        await r1.insert_table(rows([3]), InsertSettings(insert_quorum=2))
    freeze(r2, False)
    await wait_for(lambda: _gone(keeper, STATUS), what="the quorum to be reached")
    last = QuorumLastPart.parse((await keeper.get(PATHS.quorum_last_part))[0])
    assert last.parts == {"202611": "202611_0_0_0"}
    summary = await r1.insert_table(rows([3]), InsertSettings(insert_quorum=2))
    assert summary.written_parts == 1 and len(await holders(keeper, "202611_1_1_0")) >= 2


async def _gone(keeper: Keeper, path: str) -> bool:
    return await keeper.exists(path) is None


async def test_quorum_nobody_can_complete_is_marked_failed(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    freeze(r2)
    token = InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=1000, insert_deduplication_token="t1")
    with pytest.raises(UnknownInsertStatusError):
        await r1.insert_table(rows([1, 2]), token)
    (block,) = await keeper.get_children(PATHS.blocks)
    await cluster.stop("r1")  # the only holder of the part goes away
    freeze(r2, False)
    failed = f"{PATHS.quorum_failed_parts}/202611_0_0_0"
    await wait_for(lambda: keeper.exists(failed), what="the quorum to be marked failed")
    assert await keeper.exists(STATUS) is None
    assert await keeper.exists(PATHS.block(block)) is None  # the insert may be retried
    await wait_for(lambda: len(r2.queue_state) == 0, what="r2's queue to drain")
    retry = await r2.insert_table(rows([1, 2]), InsertSettings(insert_deduplication_token="t1"))
    assert retry.written_parts == 1 and retry.deduplicated_blocks == 0
    assert await r2.count(None) == 2


async def test_parallel_quorum_nodes_are_updated(keeper: Keeper) -> None:
    """Modern ClickHouse (insert_quorum_parallel=1) tracks each part in ``quorum/parallel/<part>``."""
    for path in (PATHS.quorum, f"{PATHS.quorum}/parallel", PATHS.quorum_failed_parts):
        await keeper.ensure_path(path)
    await keeper.create(PATHS.quorum_last_part, b"")
    r2 = TablePaths.create(ZK_PATH, "r2")
    r3 = TablePaths.create(ZK_PATH, "r3")
    node = parallel_status_path(PATHS, "all_1_1_0")
    await keeper.create(node, QuorumEntry("all_1_1_0", 3, ("r1",)).to_bytes())
    assert await update_quorum(keeper, r2, "all_1_1_0") is False
    assert (await keeper.get(node))[0] == (
        b"version: 1\npart_name: all_1_1_0\nrequired_number_of_replicas: 3\nactual_number_of_replicas: 2\n"
        b"replicas:\nr1\nr2\n"
    )
    assert await update_quorum(keeper, r2, "all_1_1_0") is False  # counted once
    assert await update_quorum(keeper, r3, "all_1_1_0") is True
    assert await keeper.exists(node) is None
    assert (await keeper.get(PATHS.quorum_last_part))[0] == b""  # parallel quorums leave last_part alone
    # a part nobody tracks: nothing to do
    assert await update_quorum(keeper, r3, "all_2_2_0") is False


async def test_dropping_the_partition_of_a_pending_quorum_part_fails_that_quorum(
    cluster: Cluster, keeper: Keeper
) -> None:
    """Found by the chaos suite (seed 8): a quorum insert still waiting when its partition was dropped
    kept ``quorum/status`` forever (every replica drops the GET_PART), so every later quorum insert of the
    table was refused.  The drop must mark that quorum failed."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    freeze(r2)
    with pytest.raises(UnknownInsertStatusError, match="Timeout while waiting for quorum"):
        await r1.insert_table(rows([1, 2]), InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=1000))
    assert await keeper.exists(STATUS) is not None
    await cluster.execute("r1", "ALTER TABLE db.events DROP PARTITION 202611")
    await wait_for(lambda: _gone(keeper, STATUS), timeout=15, what="the dropped part's quorum to be settled")
    assert await keeper.exists(f"{PATHS.quorum_failed_parts}/202611_0_0_0") is not None
    freeze(r2, False)
    summary = await r1.insert_table(rows([3]), InsertSettings(insert_quorum=2))
    assert summary.written_parts == 1


async def test_a_part_whose_quorum_failed_is_detached_when_its_replica_restarts(
    cluster: Cluster, keeper: Keeper
) -> None:
    """Found by the chaos suite (seed 19): the inserting replica was paused past its session, the others
    found no active holder and marked the quorum failed, the client retried elsewhere; the paused replica came
    back still serving the failed part (duplicate rows, replicas diverged).  Like modern ClickHouse it moves
    such a part to detached/noquorum_<part> when it (re)starts."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    freeze(r2)
    with pytest.raises(UnknownInsertStatusError, match="Timeout while waiting for quorum"):
        await r1.insert_table(rows([1, 2]), InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=1000))
    await cluster.stop("r1")
    assert await fail_quorum_for_part(keeper, PATHS, "202611_0_0_0")  # what r2 does finding no active holder
    freeze(r2, False)
    r1 = await cluster.start("r1")
    assert r1.store.get("202611_0_0_0") is None
    assert [p.name for p in r1.layout.detached_path.iterdir()] == ["noquorum_202611_0_0_0"]
    assert await keeper.exists(PATHS.replica("r1").part("202611_0_0_0")) is None
    assert await r1.count(None) == 0


async def _waiting_quorum_insert(
    cluster: Cluster, keeper: Keeper
) -> tuple[TableReplica, asyncio.Future[Any]]:
    """r1's quorum-2 insert, committed and waiting for r2, which is frozen; (r2, the insert)."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    freeze(r2)
    settings = InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=30_000)
    insert = asyncio.ensure_future(r1.insert_table(rows([1, 2]), settings))
    await wait_for(lambda: keeper.exists(STATUS), what="the quorum insert to commit")
    return r2, insert


async def test_a_quorum_marked_failed_while_waiting_is_never_acknowledged(
    cluster: Cluster, keeper: Keeper
) -> None:
    """Found reading the chaos suite's quorum violation (S3 seed 36): the waiting replica took the status
    node's disappearance for success, also when the others had given up on the quorum (no active holder:
    ``quorum/failed_parts``, block id removed, the part detached at re-activation): the rows would be
    acknowledged with quorum 2 and then exist nowhere else."""
    r2, insert = await _waiting_quorum_insert(cluster, keeper)
    assert await fail_quorum_for_part(keeper, PATHS, "202611_0_0_0")  # what r2 does finding no active holder
    with pytest.raises(UnknownInsertStatusError, match="marked failed"):
        await asyncio.wait_for(insert, 10)
    freeze(r2, False)


async def test_a_replica_reactivated_while_waiting_does_not_acknowledge(
    cluster: Cluster, keeper: Keeper
) -> None:
    """A re-activation (a lost session, ``is_active`` re-created with the same text) rewrites ``host``: a
    quorum seen complete afterwards is not ours to confirm (18.16 compared only is_active's text)."""
    r2, insert = await _waiting_quorum_insert(cluster, keeper)
    host = PATHS.replica("r1").host
    await keeper.set(host, (await keeper.get(host))[0])  # as activate_replica does after a lost session
    freeze(r2, False)
    with pytest.raises(UnknownInsertStatusError, match="inactive"):
        await asyncio.wait_for(insert, 20)


async def test_a_duplicate_of_a_waiting_quorum_insert_waits_for_that_quorum(
    cluster: Cluster, keeper: Keeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos suite (S3 replay of seed 32: a retry acknowledged with quorum 2 that no other
    replica had): a client's retry passed the quorum precondition before its first attempt committed, then
    found the block id taken and was answered "deduplicated" at once, while that attempt's quorum waited.
    The duplicate must wait for the quorum of the part that holds its block."""
    import replicad.replica

    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    pre = await check_quorum_precondition(keeper, r1.paths, 2)  # taken before the first attempt commits
    freeze(r2)
    settings = InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=30_000,
                              insert_deduplication_token="q1")
    first = asyncio.ensure_future(r1.insert_table(rows([1, 2]), settings))
    await wait_for(lambda: keeper.exists(STATUS), what="the first attempt to commit")

    async def passed(_keeper: Keeper, _paths: TablePaths, _quorum: int) -> object:
        return pre

    monkeypatch.setattr(replicad.replica, "check_quorum_precondition", passed)
    retry = asyncio.ensure_future(r1.insert_table(rows([1, 2]), settings))
    await asyncio.sleep(2.0)
    assert not retry.done() and not first.done()  # both wait for r2
    freeze(r2, False)
    summary = await asyncio.wait_for(retry, 20)
    assert summary.deduplicated_blocks == 1 and summary.written_parts == 0
    assert await r2.count(None) == 2  # acknowledged: the rows are on the second replica
    assert (await asyncio.wait_for(first, 20)).written_parts == 1


async def test_a_quorum_update_lost_after_the_fetch_is_made_on_the_retry(
        cluster: Cluster, keeper: Keeper, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetching replica commits the part, then loses its connection as it counts itself in the quorum
    (seen in the chaos suite: a ZooKeeper leader killed at that moment).  The entry's retry finds the part
    already here: it must still count itself, or the insert is never acknowledged and every later quorum
    insert is refused until a restart."""
    from replicad.errors import KeeperConnectionLossError
    from replicad.replication import executor

    real = executor.update_quorum
    lost: list[str] = []

    async def lose_the_first(k: Keeper, paths: TablePaths, part_name: str) -> bool:
        if not lost:
            lost.append(part_name)
            raise KeeperConnectionLossError("injected: connection lost after the fetch's commit")
        return await real(k, paths, part_name)

    monkeypatch.setattr(executor, "update_quorum", lose_the_first)
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    summary = await r1.insert_table(rows([1, 2, 3]), InsertSettings(insert_quorum=2,
                                                                     insert_quorum_timeout_ms=30_000))
    assert summary.written_parts == 1 and lost == ["202611_0_0_0"]
    assert await holders(keeper, "202611_0_0_0") == ["r1", "r2"]
    assert await keeper.exists(STATUS) is None
    # and the next quorum insert is not refused
    await r1.insert_table(rows([4]), InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=30_000))
    assert len(await sorted_rows(r2)) == 4
