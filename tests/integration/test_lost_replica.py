"""Lost replicas (replicad-only replica sets on a real ZooKeeper, small ``max_replicated_logs_to_keep``):
a replica that stays down while more log entries pass than the log keeps is marked ``is_lost`` by the
leader's cleanup, and when it returns it clones a healthy replica (log pointer, queue, ``get`` entries for
the parts it lacks) and converges without duplicates or loss; a new empty replica joining a table with data
clones too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replica import TableReplica
from tests.support.table_cluster import ZK_PATH, Cluster, part_checksums, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SMALL_LOG: dict[str, Any] = {
    "min_replicated_logs_to_keep": 5,
    "max_replicated_logs_to_keep": 20,
    "cleanup_delay_period": 1,
    "cleanup_delay_period_random_add": 0,
}
PATHS = TablePaths.create(ZK_PATH, "test")


async def in_sync(replicas: list[TableReplica]) -> bool:
    sets = [part_checksums(r) for r in replicas]
    if any(s != sets[0] for s in sets) or any(len(r.queue_state) for r in replicas):
        return False
    data = [await sorted_rows(r) for r in replicas]
    return all(d == data[0] for d in data)


async def is_lost(keeper: Keeper, replica: str) -> bytes:
    return (await keeper.get(PATHS.replica(replica).is_lost))[0]


async def test_replica_down_too_long_is_marked_lost_and_clones(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1", SMALL_LOG)
    r2 = await cluster.start("r2", SMALL_LOG)
    r3 = await cluster.start("r3", SMALL_LOG)
    await r1.insert_table(rows([1, 2], month=11))
    await wait_for(lambda: in_sync([r1, r2, r3]), what="the first part everywhere")
    await cluster.stop("r3")
    r3_pointer = int((await keeper.get(PATHS.replica("r3").log_pointer))[0])

    expected = [1, 2]
    for i in range(40):
        ids = [100 + 2 * i, 101 + 2 * i]
        await (r1 if i % 2 else r2).insert_table(rows(ids, month=10 + i % 2))
        expected += ids
    await wait_for(lambda: is_lost(keeper, "r3"), what="r3 to be marked")
    await wait_for(lambda: _equals(is_lost(keeper, "r3"), b"1"), timeout=60, what="r3 to be marked lost")
    log_names = sorted(await keeper.get_children(PATHS.log))
    assert int(log_names[0][4:]) > r3_pointer, "the entries r3 still needed are gone"
    assert await is_lost(keeper, "r1") == b"0" and await is_lost(keeper, "r2") == b"0"

    r3 = await cluster.start("r3", SMALL_LOG)
    assert await is_lost(keeper, "r3") == b"0"
    await wait_for(lambda: in_sync([r1, r2, r3]), timeout=90, what="r3 to converge after cloning")
    ids = sorted(r["id"] for r in await sorted_rows(r3))
    assert ids == sorted(expected), "every row exactly once"
    # what r3 had that no longer exists as such (merged away meanwhile) was set aside, not deleted
    assert all(d.startswith("clone_") for d in r3.layout.list_detached())
    assert int((await keeper.get(PATHS.replica("r3").log_pointer))[0]) >= int(log_names[0][4:])


async def _equals(value: Any, expected: bytes) -> bool:
    return bool(await value == expected)


async def test_new_empty_replica_joining_clones_and_converges(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1", SMALL_LOG)
    await r1.insert_table(rows([1, 2], month=11))
    await r1.insert_table(rows([3], month=10))
    r2 = await cluster.start("r2", SMALL_LOG)  # created with is_lost = "1": it clones r1 first
    assert await is_lost(keeper, "r2") == b"0"
    await wait_for(lambda: in_sync([r1, r2]), what="r2 to converge")
    assert await r2.count(None) == 3


async def test_clone_copies_pointer_and_part_producing_entries(
    cluster: Cluster, keeper: Keeper, tmp_path: Path
) -> None:
    """cloneReplica against a (stopped) source with a hand-made queue: fresh ``get`` entries with an empty
    ``source replica:`` for its active parts, then its GET/MERGE entries byte for byte; a pending DROP_RANGE
    is not copied and the parts it will drop are not fetched."""
    from replicad.replication import init as zk_init
    from replicad.replication.clone import clone_replica_if_needed
    from replicad.replication.part_store import PartStore
    from replicad.storage.layout import TableDataLayout

    r1 = await cluster.start("r1", SMALL_LOG)
    await r1.insert_table(rows([1, 2], month=11))
    await r1.insert_table(rows([3], month=10))
    await r1.insert_table(rows([4], month=11))
    await wait_for(
        lambda: r1.puller.log_pointer == 3 and len(r1.queue_state) == 0, what="r1's own entries to be done"
    )
    await cluster.stop("r1")
    src = PATHS.replica("r1")
    pointer = (await keeper.get(src.log_pointer))[0]
    queued = [
        LogEntry.get_part("202611_5_5_0", source_replica="r1", create_time=1_700_000_000),
        LogEntry.drop_range("202610_0_0_999999999", source_replica="r1", create_time=1_700_000_001),
        LogEntry.merge_parts(
            ["202611_0_0_0", "202611_1_1_0"], "202611_0_1_1", source_replica="r1", create_time=1_700_000_002
        ),
    ]
    raw = [e.to_bytes() for e in queued]
    for data in raw:
        await keeper.create(src.queue_prefix, data, sequence=True)

    me = TablePaths.create(ZK_PATH, "r9")
    await zk_init.create_replica(keeper, me, (await keeper.get(PATHS.columns))[0].decode())
    assert (await keeper.get(me.me.is_lost))[0] == b"1"
    store = PartStore(TableDataLayout(tmp_path / "r9", "db", "events"))
    await store.load()
    result = await clone_replica_if_needed(keeper, me, store)
    assert result is not None and result.source == "r1"
    assert (await keeper.get(me.me.is_lost))[0] == b"0"
    assert (await keeper.get(me.me.log_pointer))[0] == pointer
    names = sorted(await keeper.get_children(me.me.queue))
    got = [(await keeper.get(me.me.queue_entry(n)))[0] for n in names]
    fetches = [LogEntry.parse(d) for d in got[: result.fetch_entries]]
    assert [(e.type, e.new_part_name, e.source_replica) for e in fetches] == [
        (LogEntryType.GET_PART, "202611_0_0_0", ""),
        (LogEntryType.GET_PART, "202611_1_1_0", ""),
    ]
    assert all(e.create_time > 0 for e in fetches)  # the source part node's ctime
    assert got[result.fetch_entries :] == [raw[0], raw[2]]
