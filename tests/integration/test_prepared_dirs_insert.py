"""Small inserts and fetches write into part directories made ahead (replicad/storage/prepared_dirs.py):
after the first insert (fetch) of a table's file set, the next ones take a ready directory; the parts are
committed, read back and fetched by the other replica (whose fetch compares every file's hash with the
sender's), and no temporary directory is left in the tables' directories (real ZooKeeper, in-process
replicas)."""

from __future__ import annotations

import pytest

from replicad.storage.prepared_dirs import prepared_for
from tests.support.table_cluster import Cluster, rows, sorted_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_small_inserts_take_prepared_directories(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    pool = prepared_for(r1.layout.data_path, r1.layout.path)
    assert pool is not None
    fetching = prepared_for(r2.layout.data_path, r2.layout.path)
    assert fetching is not None and fetching is not pool
    hits, fetched = pool.hits, fetching.hits
    for i in range(5):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
        await r2.sync_replica(60)
    # the first insert (and fetch) made its own directory, the second maybe too if the refill was late
    assert pool.hits - hits >= 3 and fetching.hits - fetched >= 3
    expected = await sorted_rows(r1)
    assert [r["id"] for r in expected] == list(range(50))
    assert await sorted_rows(r2) == expected
    for r in (r1, r2):
        assert [p.name for p in r.layout.path.iterdir() if p.name.startswith("tmp")] == []
