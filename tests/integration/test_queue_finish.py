"""A fetched part's queue entry is removed by the multi that commits the part
(replicad.replication.queue_finish); when those ops cannot be applied the part is committed without them and
the entry is removed on its own, as before.  Real ZooKeeper, two replicas."""

from __future__ import annotations

import pytest

from replicad.keeper.ops import Delete, Op
from replicad.replication.queue_finish import QueueFinish
from tests.support.table_cluster import Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_fetched_parts_leave_the_queue_with_their_commit(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    for i in range(3):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10), month=1 + i))  # three partitions: no merge
    await wait_for(lambda: len(r2.store.active()) == 3 and len(r2.queue_state) == 0, what="r2 to fetch")
    assert r2.executor.removed_in_commit == 3
    assert not await r2.keeper.get_children(r2.paths.me.queue)
    assert [r["id"] for r in await sorted_rows(r2)] == list(range(30))


async def test_a_commit_whose_queue_ops_fail_is_made_without_them(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = QueueFinish.ops

    def failing(self: QueueFinish) -> list[Op]:  # the removal of a node that is not there fails the multi
        return [Delete(self.me.queue_entry("queue-9999999999")), *real(self)]

    monkeypatch.setattr(QueueFinish, "ops", failing)
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    for i in range(3):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10), month=1 + i))
    await wait_for(lambda: len(r2.store.active()) == 3 and len(r2.queue_state) == 0, what="r2 to fetch")
    assert r2.executor.removed_in_commit == 0  # each entry removed on its own after its commit
    assert not await r2.keeper.get_children(r2.paths.me.queue)
    registered = await r2.keeper.get_children(r2.paths.me.parts)
    assert sorted(registered) == sorted(p.name for p in r2.store.active())
    assert [r["id"] for r in await sorted_rows(r2)] == list(range(30))
