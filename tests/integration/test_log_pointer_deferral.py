"""The inserting replica defers its ``log_pointer`` write past its own inserts' entries
(replicad.replication.log_puller: POINTER_FLUSH_DELAY_S): several passes share one write, ZooKeeper's pointer
catches up within the delay, and a write lost with the process (a crash in between) only makes the restarted
replica pull those entries again and find their parts here.  Real ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.ops import Op, Set
from replicad.replica import TableReplica
from tests.support.table_cluster import Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def record_pointer_writes(replica: TableReplica) -> list[bytes]:
    """The values ``replica`` writes to its ``log_pointer`` from now on (multis and sets)."""
    written: list[bytes] = []
    keeper = replica.keeper
    path = replica.paths.me.log_pointer
    real_multi, real_set = keeper.multi, keeper.set

    async def multi(given: Iterable[Op], *args: Any, **kwargs: Any) -> Any:
        ops = list(given)
        written.extend(op.data for op in ops if isinstance(op, Set) and op.path == path)
        return await real_multi(ops, *args, **kwargs)

    async def set_(p: str, data: bytes, version: int = -1) -> Any:
        if p == path:
            written.append(data)
        return await real_set(p, data, version)

    keeper.multi = multi  # type: ignore[method-assign,assignment]
    keeper.set = set_  # type: ignore[method-assign]
    return written


async def zk_pointer(keeper: Keeper, replica: TableReplica) -> int:
    return int((await keeper.get(replica.paths.me.log_pointer))[0])


async def log_end(keeper: Keeper, replica: TableReplica) -> int:
    """The index after the last log entry."""
    return max(int(n[len("log-"):]) for n in await keeper.get_children(replica.paths.log)) + 1


async def test_own_entries_share_one_pointer_write(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    own = r1.puller.own
    assert own is not None
    await wait_for(lambda: r1.puller.flush_in() is None, what="nothing deferred at start")
    written = record_pointer_writes(r1)
    r1.puller.pointer_flush_delay_s = 1.0
    started = time.monotonic()
    for i in range(5):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
    await wait_for(lambda: own.done_total >= 5, what="r1 to take its five entries back")
    end = await log_end(keeper, r1)
    assert r1.puller.log_pointer == end
    if time.monotonic() - started < 0.9:  # (a slow machine may have flushed already: then only once)
        assert await zk_pointer(keeper, r1) < end, "the write is deferred"

    async def caught_up() -> bool:
        return await zk_pointer(keeper, r1) == end

    await wait_for(caught_up, timeout=10, what="ZooKeeper's log_pointer to catch up")
    assert len(written) < 5, written  # one write for several passes (5 without the deferral)
    assert written[-1] == str(end).encode()
    assert r1.puller.pointer_flushes >= 1 and r1.puller.flush_in() is None
    assert not await keeper.get_children(r1.paths.me.queue)


async def test_a_pass_that_queues_entries_writes_the_deferred_pointer(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r1.puller.pointer_flush_delay_s = 3600.0  # only a pass writing queue nodes can move ZooKeeper's pointer
    await r1.insert_table(rows([1, 2, 3]))
    await wait_for(lambda: r1.puller.flush_in() is not None, what="r1 to defer its pointer")
    await r2.insert_table(rows([4, 5, 6]))  # r1 queues this one: its multi sets the pointer past both
    end = await log_end(keeper, r1)

    async def caught_up() -> bool:
        return await zk_pointer(keeper, r1) == end

    await wait_for(caught_up, what="r1's pointer written with its queue node")
    assert r1.puller.flush_in() is None
    await wait_for(lambda: len(r1.queue_state) == 0 and len(r1.store.active()) == 2, what="r1 to fetch")


async def test_a_deferred_write_lost_in_a_crash_only_pulls_the_entries_again(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1")
    r1.puller.pointer_flush_delay_s = 3600.0
    own = r1.puller.own
    assert own is not None
    for i in range(3):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
    await wait_for(lambda: own.done_total >= 3, what="r1 to take its entries back")
    end = await log_end(keeper, r1)
    behind = await zk_pointer(keeper, r1)
    assert behind < end

    async def never() -> bool:  # the process dies before the write
        return False

    r1.puller.flush_pointer = never  # type: ignore[method-assign]
    await cluster.kill("r1")
    assert await zk_pointer(keeper, r1) == behind
    r1 = await cluster.start("r1")  # pulls the three entries again: queued, their parts found here

    async def caught_up() -> bool:
        return await zk_pointer(keeper, r1) == end

    await wait_for(caught_up, what="the restarted replica's pointer")
    await wait_for(lambda: len(r1.queue_state) == 0, what="the entries pulled again to be done")
    assert r1.fetcher.fetches_total == 0  # nothing fetched (there is no other replica to fetch from)
    assert [r["id"] for r in await sorted_rows(r1)] == list(range(30))
