"""Early downloads: a GET_PART read from the log is downloaded while it is still being copied into the queue;
the queue executor then commits the downloaded directory.  Real ZooKeeper, two in-process replicas with their
own DataPartsExchange servers."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest
import pytest_asyncio

from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.paths import TablePaths
from replicad.replica import TableReplica
from replicad.replication import early_fetch
from replicad.replication import fetcher as fetcher_mod
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
    assert r2.fetcher.whole_fetches == 6  # small bodies: read whole, received in one worker-thread trip
    assert table_cluster.part_checksums(r1) == table_cluster.part_checksums(r2)
    assert await r2.count(None) == 30
    assert leftovers(r2) == []
    assert not r2.fetcher._early


async def test_a_body_larger_than_the_whole_limit_is_streamed(cluster: Cluster) -> None:
    """A part whose body is over WHOLE_BODY_MAX_BYTES (incompressible names: ~3 MB of files) goes through the
    streaming receiver, byte-identical to the sender's."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    big = rows(range(3000))
    names = pa.array([random.Random(i).randbytes(1000).hex() for i in range(3000)], pa.string())
    await r1.insert_table(big.set_column(big.schema.get_field_index("name"), "name", names))
    await wait_for(lambda: holds([r1, r2], 1), what="the big part on r2")
    assert r2.fetcher.fetches_total == 1 and r2.fetcher.whole_fetches == 0
    assert table_cluster.part_checksums(r1) == table_cluster.part_checksums(r2)
    assert await r2.count(None) == 3000 and leftovers(r2) == []


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


async def test_a_download_longer_than_the_ttl_is_not_thrown_away(cluster: Cluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A big part takes longer to arrive than ``EARLY_TTL_S``: newer log entries read meanwhile must not
    cancel its download (which would start the same download again); the TTL counts from its arrival."""
    monkeypatch.setattr(early_fetch, "EARLY_TTL_S", 0.5)
    real = fetcher_mod.receive_whole_body  # a small part's body is read whole, received in a worker thread

    def slow(*args: object, **kwargs: object) -> object:
        time.sleep(1.5)  # a long download
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fetcher_mod, "receive_whole_body", slow)
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    for r in (r1, r2):
        r.blockers.merges = True
    await r1.insert_table(rows([1, 2, 3]))
    await wait_for(lambda: bool(r2.fetcher._early), what="the first early download to start")
    await asyncio.sleep(0.8)  # past the TTL, still downloading
    await r1.insert_table(rows([4, 5, 6]))  # its entry is read meanwhile: expiry runs
    await wait_for(lambda: holds([r1, r2], 2), what="both parts on r2")
    assert r2.fetcher.fetches_total == 2
    assert r2.fetcher.early_fetches_taken == 2  # neither download was done twice
    assert leftovers(r2) == []
