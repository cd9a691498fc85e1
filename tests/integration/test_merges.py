"""Leader election and merges in a replicad-only replica set on a real ZooKeeper."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replication.merge_assigner import AssignerSettings
from replicad.replication.table_ops import MERGE_SELECTING_MIN_INTERVAL_S
from tests.support.table_cluster import (
    ZK_PATH,
    Cluster,
    converged,
    leaders,
    part_checksums,
    parts_per_partition,
    rows,
    sorted_rows,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def log_entries(keeper: Keeper) -> list[LogEntry]:
    paths = TablePaths.create(ZK_PATH, "x")
    names = sorted(await keeper.get_children(paths.log))
    out = []
    for n in names:
        data, _ = await keeper.get(paths.log_entry(n))
        out.append(LogEntry.parse(data, znode_name=n))
    return out


async def test_leader_election_as_18_16(cluster: Cluster, keeper: Keeper) -> None:
    await cluster.start("r1")
    await cluster.start("r2")
    await cluster.start("r3")
    await wait_for(lambda: leaders(cluster) == ["r1"], what="r1 to lead")
    election = f"{ZK_PATH}/leader_election"
    children = sorted(await keeper.get_children(election))
    assert len(children) == 3 and all(c.startswith("leader_election-") and len(c) == 26 for c in children)
    datas = [(await keeper.get(f"{election}/{c}"))[0] for c in children]
    assert datas == [b"r1", b"r2", b"r3"]
    for c in children:
        assert (await keeper.exists(f"{election}/{c}")).ephemeral_owner != 0  # type: ignore[union-attr]
    assert cluster.replicas["r1"].status()["is_leader"] is True or cluster.ops["r1"].status()["is_leader"]

    # a clean stop hands leadership to the next candidate
    await cluster.stop("r1")
    await wait_for(lambda: leaders(cluster) == ["r2"], what="r2 to take over")
    # a lost session too: r2's session expires, r3 leads, r2 stands again at the end of the line
    creds = cluster.keepers["r2"].session_id_and_password
    assert creds is not None
    await asyncio.to_thread(cluster.zookeeper.expire_session, *creds)
    await wait_for(lambda: leaders(cluster) == ["r3"], timeout=40, what="r3 to take over after r2's expiry")

    async def candidates() -> list[bytes]:
        return sorted([(await keeper.get(f"{election}/{c}"))[0] for c in await keeper.get_children(election)])

    async def rejoined() -> bool:
        return await candidates() == [b"r2", b"r3"]

    await wait_for(rejoined, timeout=40, what="r2 to rejoin the election")
    await asyncio.sleep(0.5)
    assert leaders(cluster) == ["r3"]


async def test_merges_keep_parts_bounded_and_optimize_final(cluster: Cluster, keeper: Keeper) -> None:
    names = ["r1", "r2", "r3"]
    for n in names:
        await cluster.start(n)
    replicas = [cluster.replicas[n] for n in names]
    await wait_for(lambda: leaders(cluster) == ["r1"], what="a leader")
    rnd = random.Random(7)
    worst = 0
    expected_ids: list[int] = []
    for i in range(50):
        month = 9 + i % 3
        ids = list(range(i * 100, i * 100 + 20 + rnd.randrange(30)))
        expected_ids += ids
        target = replicas[rnd.randrange(3)]
        await target.insert_table(rows(ids, month=month))
        worst = max(worst, max(parts_per_partition(target).values()))
        await asyncio.sleep(0.05)
    # merges ran while inserting: ~17 inserts per partition never piled up
    print("worst parts per partition while inserting:", worst)
    assert worst <= 12, worst
    entries = await log_entries(keeper)
    merges = [e for e in entries if e.type is LogEntryType.MERGE_PARTS]
    assert merges and all(e.source_replica == "r1" and e.readable_by_18_16 for e in merges)

    await cluster.execute("r2", "OPTIMIZE TABLE db.events FINAL")  # a non-leader assigns it itself
    await wait_for(lambda: converged(replicas), timeout=90, what="replicas to converge")
    await wait_for(
        lambda: all(set(parts_per_partition(r).values()) == {1} for r in replicas),
        timeout=90,
        what="one part per partition",
    )
    await wait_for(lambda: converged(replicas), timeout=60, what="replicas to converge")
    sums = [part_checksums(r) for r in replicas]
    assert len(sums[0]) == 3 and sums[0] == sums[1] == sums[2]
    expected = sorted(expected_ids)
    for r in replicas:
        got = await sorted_rows(r)
        assert [x["id"] for x in got] == expected
        assert all(x["v"] == x["id"] * 10 for x in got)
    # sources are outdated, not deleted at once; all replicas registered the merged parts in ZooKeeper
    paths = TablePaths.create(ZK_PATH, "r1")
    for n in names:
        registered = set(await keeper.get_children(paths.replica(n).parts))
        assert set(sums[0]) <= registered
    assert any(p.state.value == "Outdated" for p in replicas[0].store.all_parts())


async def test_optimize_partition_final_and_merge_executed_everywhere(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2", settings={"always_fetch_merged_part": 1})
    for i in range(3):
        await r1.insert_table(rows(range(i * 10, i * 10 + 5), month=10))
    await r2.insert_table(rows(range(100, 105), month=11))
    await wait_for(lambda: converged([r1, r2]), what="inserts everywhere")
    await cluster.execute(
        "r1", "OPTIMIZE TABLE db.events PARTITION 202610 FINAL", replication_alter_partitions_sync=2
    )
    assert sorted(part_checksums(r1)) == ["202610_0_2_1", "202611_0_0_0"]
    await wait_for(lambda: converged([r1, r2]), what="merge on r2")
    assert cluster.ops["r1"].producer.merged_total == 1
    assert (
        cluster.ops["r2"].producer.merged_total == 0 and cluster.ops["r2"].producer.fetched_instead_total == 1
    )
    # FINAL on a partition with one part rewrites it one level up
    await cluster.execute("r2", "OPTIMIZE TABLE db.events PARTITION 202611 FINAL")
    await wait_for(lambda: "202611_0_0_1" in part_checksums(r1), what="lone part re-merged")
    # nothing to do: OPTIMIZE without FINAL on single-part partitions is a no-op (an error if asked)
    from replicad.replication.merge_assigner import CannotAssignOptimizeError

    await wait_for(lambda: converged([r1, r2]), what="converged")
    with pytest.raises(CannotAssignOptimizeError):
        await cluster.ops["r1"].assigner.optimize("202610", final=False, throw_if_noop=True, patience_s=0.5)


async def test_no_merge_over_a_committing_insert(cluster: Cluster, keeper: Keeper) -> None:
    """A block number held by an in-flight insert between two parts keeps them apart."""
    from replicad.keeper.block_lock import BlockNumberAllocator

    r1 = await cluster.start("r1")
    paths = TablePaths.create(ZK_PATH, "r1")
    await r1.insert_table(rows([1], month=10))
    allocator = BlockNumberAllocator(paths)
    lock = await allocator.allocate(keeper, "202610")  # an insert that took number 1 and is still writing
    assert lock is not None and lock.number == 1
    await r1.insert_table(rows([2], month=10))
    await r1.insert_table(rows([3], month=10))
    await r1.sync_replica()
    predicate = await cluster.ops["r1"].load_predicate()
    from replicad.model.part_info import PartInfo

    a, b, c = (PartInfo.parse(n) for n in ("202610_0_0_0", "202610_2_2_0", "202610_3_3_0"))
    assert "still being inserted" in (predicate.merge_blocker(a, b) or "")
    assert predicate.merge_blocker(b, c) is None
    # all parts of the partition cannot be merged now; OPTIMIZE without PARTITION finds what can
    await cluster.execute("r1", "OPTIMIZE TABLE db.events PARTITION 202610 FINAL")
    assert len(part_checksums(r1)) == 3
    await cluster.execute("r1", "OPTIMIZE TABLE db.events")
    await wait_for(lambda: sorted(part_checksums(r1)) == ["202610_0_0_0", "202610_2_3_1"], what="2_3 merge")
    await lock.unlock(keeper)  # abandoned: the gap stays empty forever, the merge may now span it
    await cluster.execute("r1", "OPTIMIZE TABLE db.events PARTITION 202610 FINAL")
    await wait_for(
        lambda: sorted(part_checksums(r1)) == ["202610_0_3_2"], what="merge over the abandoned gap"
    )
    assert await r1.count(None) == 3


async def test_leader_killed_mid_merge(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    await wait_for(lambda: leaders(cluster) == ["r1"], what="r1 to lead")
    expected: list[int] = []
    for i in range(6):
        t = (r1, r2, r3)[i % 3]
        ids = range(i * 10000, i * 10000 + 3000)
        await t.insert_table(rows(ids, month=11))
        expected += ids
    await cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL", replication_alter_partitions_sync=0)
    # the leader dies while the merge it assigned is executing (or about to)
    await cluster.kill("r1")
    await wait_for(lambda: leaders(cluster) == ["r2"], what="r2 to take over")
    await wait_for(lambda: converged([r2, r3]), timeout=60, what="r2 and r3 to finish the merge")
    for r in (r2, r3):
        assert await r.count(None) == len(expected)
    # the new leader keeps merging: more inserts, then OPTIMIZE on it
    for i in range(6, 9):
        ids = range(i * 10000, i * 10000 + 10)
        await r3.insert_table(rows(ids, month=11))
        expected += ids
    await r2.sync_replica()  # OPTIMIZE merges the parts this replica has
    await cluster.execute("r2", "OPTIMIZE TABLE db.events FINAL")

    async def one_part() -> bool:
        return await converged([r2, r3]) and len(part_checksums(r2)) == 1

    await wait_for(one_part, timeout=60, what="one part")
    # the dead leader comes back and catches up: nothing lost, nothing twice
    r1 = await cluster.start("r1")
    await wait_for(lambda: converged([r1, r2, r3]), timeout=90, what="r1 to catch up")
    for r in (r1, r2, r3):
        assert [x["id"] for x in await sorted_rows(r)] == sorted(expected)
    assert leaders(cluster) == ["r2"]


async def test_new_entries_wake_the_merge_selection(cluster: Cluster) -> None:
    """As 18.16 schedules merge selection after pulling new log entries: with the periodic selection an hour
    away, a stream of inserts still gets merged."""
    slow = AssignerSettings(sleep_s=3600.0)
    r1 = await cluster.start("r1", assigner=slow)
    r2 = await cluster.start("r2", assigner=slow)
    await wait_for(lambda: len(leaders(cluster)) == 1, what="a leader")
    for i in range(40):
        await r1.insert_table(rows([i]))
    ops = cluster.ops[leaders(cluster)[0]]
    await wait_for(lambda: ops.assigner.assigned_merges > 0, what="a merge assigned after the inserts")

    async def merged() -> bool:
        return len(r2.store.active_names()) < 40 and await converged([r1, r2])

    await wait_for(merged, what="merged parts on both replicas")
    assert await r2.count(None) == 40


async def test_merge_selection_rounds_are_rate_limited(cluster: Cluster) -> None:
    """A stream of inserts (each pull of new entries) and of merges (each part made) wakes the selection at
    most once per MERGE_SELECTING_MIN_INTERVAL_S; each round that assigns a merge runs once more at once.
    The stream is still merged."""
    slow = AssignerSettings(sleep_s=3600.0)
    r1 = await cluster.start("r1", assigner=slow)
    r2 = await cluster.start("r2", assigner=slow)
    await wait_for(lambda: len(leaders(cluster)) == 1, what="a leader")
    assigner = cluster.ops[leaders(cluster)[0]].assigner
    await asyncio.sleep(MERGE_SELECTING_MIN_INTERVAL_S)  # start-up wakes are behind
    runs0, assigned0, t0 = assigner.runs, assigner.assigned_merges, time.monotonic()
    n = 0
    while time.monotonic() - t0 < 4 * MERGE_SELECTING_MIN_INTERVAL_S:
        await r1.insert_table(rows([n]))
        n += 1
    await asyncio.sleep(0.5)
    elapsed = time.monotonic() - t0
    rounds, assigned = assigner.runs - runs0, assigner.assigned_merges - assigned0
    wakes = elapsed / MERGE_SELECTING_MIN_INTERVAL_S + 1
    assert n >= 20, n
    assert assigned > 0
    assert rounds <= wakes + assigned + 1, (rounds, wakes, assigned, n)

    async def merged() -> bool:
        return len(r2.store.active_names()) < n and await converged([r1, r2])

    await wait_for(merged, what="merged parts on both replicas")
    assert await r2.count(None) == n
