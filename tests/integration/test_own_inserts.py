"""The inserting replica's own GET_PART entries are done as they are pulled back
(replicad.replication.own_inserts): no queue node is made and removed for them, ``log_pointer`` moves past
them, their parts stay mergeable, and a quorum insert's entry is still queued (its execution counts the
replica).  Real ZooKeeper, two replicas."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Op
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replica import TableReplica
from replicad.service import InsertSettings
from tests.support.table_cluster import Cluster, leaders, parts_per_partition, rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def record_queued(replica: TableReplica) -> list[LogEntry]:
    """The entries ``replica`` copies into its ``queue/`` from now on (the creates of its multis)."""
    queued: list[LogEntry] = []
    keeper = replica.keeper
    real = keeper.multi
    prefix = replica.paths.me.queue_prefix

    async def multi(given: Iterable[Op], *args: Any, **kwargs: Any) -> Any:
        ops = list(given)
        queued.extend(LogEntry.parse(op.data) for op in ops if isinstance(op, Create) and op.path == prefix)
        return await real(ops, *args, **kwargs)

    keeper.multi = multi  # type: ignore[method-assign,assignment]
    return queued


def record_log_reads(replica: TableReplica) -> list[LogEntry]:
    """The log entries ``replica`` reads from ZooKeeper from now on."""
    read: list[LogEntry] = []
    keeper = replica.keeper
    real = keeper.get_many
    log_prefix = replica.paths.log_prefix

    async def get_many(paths: Sequence[str]) -> Any:
        nodes = await real(paths)
        read.extend(LogEntry.parse(node[0]) for path, node in zip(paths, nodes, strict=True)
                    if node is not None and path.startswith(log_prefix))
        return nodes

    keeper.get_many = get_many  # type: ignore[method-assign]
    return read


def own_get_parts(entries: list[LogEntry], replica: str) -> list[str]:
    return [e.new_part_name for e in entries
            if e.type is LogEntryType.GET_PART and e.source_replica == replica]


async def log_pointer(keeper: Keeper, replica: TableReplica) -> int:
    return int((await keeper.get(replica.paths.me.log_pointer))[0])


async def last_log_index(keeper: Keeper, replica: TableReplica) -> int:
    return max(int(n[len("log-"):]) for n in await keeper.get_children(replica.paths.log))


async def test_own_inserts_are_not_queued_and_stay_mergeable(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await wait_for(lambda: leaders(cluster) == ["r1"], what="r1 to lead")
    queued1, queued2 = record_queued(r1), record_queued(r2)
    read1, read2 = record_log_reads(r1), record_log_reads(r2)
    for i in range(6):  # enough equal parts for the merge selector (base 5) to merge them unasked
        summary = await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
        assert summary.written_parts == 1
    await wait_for(lambda: r1.puller.own is not None and r1.puller.own.done_total >= 6,
                   what="r1 to read its six entries back")
    assert own_get_parts(queued1, "r1") == []  # none of r1's own inserts went through its queue
    assert own_get_parts(read1, "r1") == []  # nor were they read back: r1 knows what it wrote
    # the other replica queues and fetches them as before
    await wait_for(lambda: len(own_get_parts(queued2, "r1")) >= 6, what="r2 to queue r1's inserts")
    assert len(own_get_parts(read2, "r1")) == 6

    async def pointer_past_log() -> bool:
        return await log_pointer(keeper, r1) > await last_log_index(keeper, r1) - 1

    await wait_for(pointer_past_log, what="r1's log_pointer past its own entries")
    # merged by the leader unasked (the parts are in the queue's virtual parts although never queued)
    await wait_for(lambda: all(parts_per_partition(r) == {"202611": 1} for r in (r1, r2)),
                   timeout=60, what="the six parts merged on both replicas")
    merged = r1.store.active()
    assert len(merged) == 1 and merged[0].directory.rows == 60 and merged[0].info.level == 1
    await wait_for(lambda: len(r1.queue_state) == 0, what="r1 to run the merge")
    assert not await keeper.get_children(r1.paths.me.queue)


async def test_a_quorum_insert_is_still_queued_on_the_inserting_replica(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    await cluster.start("r2")
    queued1 = record_queued(r1)
    await r1.insert_table(rows([1, 2, 3]), InsertSettings(insert_quorum=2, insert_quorum_timeout_ms=30_000))
    await r1.insert_table(rows([4, 5, 6]))
    own = r1.puller.own
    assert own is not None
    await wait_for(lambda: len(r1.queue_state) == 0 and own.done_total == 1, what="r1 to read both back")
    quorum = [e for e in queued1 if e.type is LogEntryType.GET_PART and e.source_replica == "r1"]
    assert [e.quorum for e in quorum] == [2]
