"""An insert that fails half-way leaves no temporary part directory behind (real ZooKeeper, in-process
replica): the block number cannot be allocated for the second of three partitions."""

from __future__ import annotations

import pytest

from replicad.errors import KeeperConnectionLossError
from tests.support.table_cluster import Cluster, rows, sorted_rows

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_allocation_failure_mid_block_leaves_no_tmp_directories(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    r1 = await cluster.start("r1")
    allocator = r1.committer.allocator
    real = allocator.allocate
    calls = 0

    async def flaky(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeeperConnectionLossError("injected: no block number")
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(allocator, "allocate", flaky)
    table = rows(range(0, 10), month=9)
    for month in (10, 11):
        more = rows(range(month * 100, month * 100 + 10), month=month)
        table = table.__class__.from_batches([*table.to_batches(), *more.to_batches()])
    with pytest.raises(KeeperConnectionLossError):
        await r1.insert_table(table)
    leftovers = [p.name for p in r1.layout.path.iterdir() if p.name.startswith("tmp")]
    assert leftovers == []
    assert len(await sorted_rows(r1)) == 10  # the first partition's part was committed, as in ClickHouse


async def test_a_fetched_part_with_other_columns_is_refused(cluster: Cluster) -> None:
    """A part whose columns.txt is neither the table's nor what a replica registered for it would skip the
    checksum comparison with the replicas (ClickHouse compares only parts of equal columns): the fetch
    refuses it and leaves nothing behind.  (A part registered with other columns, written before an ALTER,
    is taken: see test_alter_columns.)"""
    import asyncio

    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    good = r2.fetcher.part_columns_text
    assert good is not None and good.startswith("columns format version: 1\n")
    real = r2.fetcher.commit_new_part
    lying = True

    async def sender_changed_columns(tmp_dir, info, checksums, columns_text=None, **kw):  # type: ignore[no-untyped-def]
        if lying and columns_text is not None:
            columns_text = columns_text.replace("`v` UInt32", "`v` UInt64", 1)
        return await real(tmp_dir, info, checksums, columns_text, **kw)

    r2.fetcher.commit_new_part = sender_changed_columns  # type: ignore[method-assign]
    await r1.insert_table(rows(range(0, 10), month=9))
    await asyncio.sleep(3.0)
    assert await sorted_rows(r2) == []
    assert [p.name for p in r2.layout.path.iterdir() if p.name.startswith("tmp")] == []
    failures = [q for q in r2.queue_rows() if "other columns than the table" in str(q.get("last_exception"))]
    assert failures, r2.queue_rows()
    lying = False
    await r2.sync_replica(60)
    assert len(await sorted_rows(r2)) == 10
