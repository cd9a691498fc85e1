"""DROP / DETACH PARTITION and TRUNCATE in a replicad-only replica set on a real ZooKeeper."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from tests.support.table_cluster import (
    ZK_PATH,
    Cluster,
    converged,
    leaders,
    part_checksums,
    rows,
    sorted_rows,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def partitions(replica_parts: dict[str, bytes]) -> set[str]:
    return {name.split("_", 1)[0] for name in replica_parts}


async def test_drop_partition_everywhere(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    for i, month in enumerate((9, 10, 11, 10, 9, 10)):
        await (r1, r2, r3)[i % 3].insert_table(rows(range(i * 100, i * 100 + 10), month=month))
    await wait_for(lambda: converged([r1, r2, r3]), what="inserts everywhere")
    paths = TablePaths.create(ZK_PATH, "r1")
    blocks_before = await keeper.get_children(paths.blocks)
    assert sum(b.startswith("202610_") for b in blocks_before) == 3

    # issued on a replica that does not lead; waits for every replica (sync = 2)
    await wait_for(lambda: leaders(cluster) == ["r1"], what="r1 leads")
    await cluster.execute(
        "r3", "ALTER TABLE db.events DROP PARTITION 202610", replication_alter_partitions_sync=2
    )
    for r in (r1, r2, r3):
        assert partitions(part_checksums(r)) == {"202609", "202611"}
        assert await r.count(None) == 30
        assert await r.count("toYYYYMM(ctime) = 202610") == 0
        registered = await keeper.get_children(paths.replica(r.paths.replica_name).parts)
        assert not [p for p in registered if p.startswith("202610_")]
    names = sorted(await keeper.get_children(paths.log))
    last = LogEntry.parse((await keeper.get(paths.log_entry(names[-1])))[0])
    assert (last.type, last.new_part_name, last.detach, last.source_replica) == (
        LogEntryType.DROP_RANGE,
        "202610_0_2_999999999",  # blocks 0..2 were inserted, 3 was taken by the drop
        False,
        "r3",
    )
    assert last.to_text().endswith("block_id: \ndrop\n202610_0_2_999999999\n")
    # deduplication ids of the range are gone: the very same block can be inserted again
    assert not [b for b in await keeper.get_children(paths.blocks) if b.startswith("202610_")]
    again = await r2.insert_table(rows(range(100, 110), month=10))
    assert again.written_parts == 1
    await wait_for(lambda: converged([r1, r2, r3]), what="re-insert everywhere")
    assert sorted(part_checksums(r1)) == sorted(
        [n for n in part_checksums(r2)]
    ) and "202610_4_4_0" in part_checksums(r1)
    # dropped parts leave the disk with the next cleanup (no old_parts_lifetime wait)
    await r1.cleanup.run_once()
    assert not [p for p in r1.store.all_parts() if p.info.partition_id == "202610" and p.info.max_block < 4]


async def test_detach_partition_and_truncate(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(0, 5), month=10))
    await r2.insert_table(rows(range(5, 10), month=10))
    await r2.insert_table(rows(range(10, 15), month=11))
    await wait_for(lambda: converged([r1, r2]), what="inserts everywhere")
    await cluster.execute(
        "r1", "ALTER TABLE db.events DETACH PARTITION 202610", replication_alter_partitions_sync=2
    )
    for r in (r1, r2):
        assert sorted(r.layout.list_detached()) == ["202610_0_0_0", "202610_1_1_0"]
        assert partitions(part_checksums(r)) == {"202611"}
    await cluster.execute("r2", "TRUNCATE TABLE db.events")
    for r in (r1, r2):

        def empty(r: object = r) -> bool:
            return not part_checksums(r)  # type: ignore[arg-type]

        await wait_for(empty, what="empty table")
        assert await r.count(None) == 0
    # a partition that never had data gets no entry (its first block number, 0, is consumed, as in 18.16)
    log_before = len(await keeper.get_children(f"{ZK_PATH}/log"))
    await cluster.execute("r1", "ALTER TABLE db.events DROP PARTITION 202501")
    assert len(await keeper.get_children(f"{ZK_PATH}/log")) == log_before


async def test_drop_races_with_inserts_and_merges(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")

    async def insert(replica: object, base: int) -> None:
        for i in range(8):
            await replica.insert_table(rows(range(base + i * 10, base + i * 10 + 10), month=10 + i % 2))  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)

    async def drops() -> None:
        for _ in range(3):
            await asyncio.sleep(0.15)
            await cluster.execute(
                "r2", "ALTER TABLE db.events DROP PARTITION 202610", replication_alter_partitions_sync=0
            )

    await asyncio.gather(insert(r1, 0), insert(r3, 1000), drops())
    for r in (r1, r2, r3):
        await r.sync_replica()
    await wait_for(lambda: converged([r1, r2, r3]), timeout=90, what="replicas to agree")
    contents = [await sorted_rows(r) for r in (r1, r2, r3)]
    assert contents[0] == contents[1] == contents[2]
    assert len([x for x in contents[0] if x["ctime"].month == 11]) == 80  # untouched partition


class _FailingMulti:
    """The keeper as DropRanges sees it, with the multi writing the DROP_RANGE log entry lost on the way."""

    def __init__(self, keeper: Keeper) -> None:
        self._keeper = keeper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._keeper, name)

    async def multi(self, ops: list[Any]) -> Any:
        if any(op.path.startswith(f"{ZK_PATH}/log/log-") for op in ops):
            raise KeeperConnectionLossError("connection lost (planted)")
        return await self._keeper.multi(ops)


async def test_a_drop_whose_log_entry_was_not_written_keeps_the_partition_mergeable(cluster: Cluster) -> None:
    """Found chasing the chaos suite's mutation stall (S3 replays: ZooKeeper partitioned while the admin
    client dropped partitions): the replica marks the range as being dropped in its virtual parts before
    writing the DROP_RANGE entry; when that write failed the mark stayed, and no merge or mutation of the
    partition was assigned again until a restart."""
    r1 = await cluster.start("r1")
    for i in range(2):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10), month=11))
    await wait_for(lambda: len(r1.queue_state) == 0 and r1.puller.log_pointer == 2, what="r1 read its log")
    drops = r1.ops.drops
    real = drops.keeper
    drops.keeper = _FailingMulti(real)  # type: ignore[assignment]
    try:
        with pytest.raises(KeeperConnectionLossError):
            await cluster.execute("r1", "ALTER TABLE db.events DROP PARTITION 202611")
    finally:
        drops.keeper = real
    assert await r1.count(None) == 20
    await cluster.execute("r1", "OPTIMIZE TABLE db.events PARTITION 202611 FINAL", optimize_throw_if_noop=1)
    await wait_for(lambda: len([p for p in r1.store.active() if p.info.partition_id == "202611"]) == 1,
                   what="the partition's two parts merged")
    assert await r1.count(None) == 20
