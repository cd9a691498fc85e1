"""Early downloads: a GET_PART read from the log is downloaded while it is still being copied into the queue;
the queue executor then commits the downloaded directory.  Real ZooKeeper, two in-process replicas with their
own DataPartsExchange servers."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.paths import TablePaths
from replicad.replica import TableReplica
from replicad.storage.layout import TMP_FETCH
from tests.support import table_cluster
from tests.support.table_cluster import ZK_PATH, Cluster, converged, rows, spec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

wait_for = functools.partial(table_cluster.wait_for, timeout=30.0)


@pytest_asyncio.fixture
async def cluster(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(zookeeper, zk_root, tmp_path, make_spec=spec, assigner=None)
    try:
        yield c
    finally:
        await c.close()


async def holds(replicas: list[TableReplica], n_parts: int) -> bool:
    return await converged(replicas) and all(len(r.store.active_names()) == n_parts for r in replicas)


def leftovers(replica: TableReplica) -> list[str]:
    root = replica.store.layout.path
    return sorted(p.name for p in root.iterdir() if p.name.startswith(TMP_FETCH))


async def test_small_inserts_are_downloaded_early(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    for r in (r1, r2):  # six parts stay six parts (a merge of them made the count flaky)
        r.blockers.merges = True
    for i in range(6):
        await r1.insert_table(rows([10 * i + j for j in range(5)]))
        await wait_for(lambda n=i + 1: holds([r1, r2], n), what=f"part {i + 1} on r2")
    # every part came through an early download (taken by the executor), nothing left behind
    assert r2.fetcher.early_fetches_taken == 6
    assert r2.fetcher.fetches_total == 6
    assert table_cluster.part_checksums(r1) == table_cluster.part_checksums(r2)
    assert await r2.count(None) == 30
    assert leftovers(r2) == []
    assert not r2.fetcher._early


async def test_failed_early_download_falls_back_to_the_queue(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    # r1 refuses to send (as while shutting down): the early download fails, the queue entry is retried
    ep = r1.env.interserver.server.endpoints["DataPartsExchange:" + TablePaths.create(ZK_PATH, "r1").me.root]
    ep.blocked = True
    await r1.insert_table(rows([1, 2, 3]))
    await wait_for(lambda: r2.queue_state.status().queue_size == 1 and r2.fetcher.sources.recently_failed(
        "202611_0_0_0", "r1"), what="r2's fetch to fail once")
    assert r2.store.active_names() == [] and leftovers(r2) == []
    ep.blocked = False
    await wait_for(lambda: holds([r1, r2], 1), what="the part on r2")
    assert r2.fetcher.early_fetches_taken == 0
    assert await r2.count(None) == 3 and leftovers(r2) == []


async def test_no_early_download_while_the_executor_is_paused(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.executor.is_paused = lambda: True
    await r1.insert_table(rows([1, 2, 3]))
    await wait_for(lambda: len(r2.queue_state) == 1, what="the entry in r2's queue")
    assert not r2.fetcher._early and leftovers(r2) == [] and r2.store.active_names() == []
    r2.executor.is_paused = lambda: False
    r2.executor.wakeup()
    await wait_for(lambda: holds([r1, r2], 1), what="the part on r2")
    assert r2.fetcher.early_fetches_taken == 0
