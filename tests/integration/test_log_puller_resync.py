"""The log puller after a copy whose outcome was unknown (found by the chaos suite: a replica's queue kept an
entry for more than 60 s after a ZooKeeper leader kill, on a real ensemble).

kazoo keeps the session across a connection loss, so nothing reloads the queue: if the multi that copied log
entries into ``queue/`` (and moved ``log_pointer``) was applied but its answer lost, those entries existed
only in ZooKeeper.  The next pull must find them there."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.replication import init as zk_init
from replicad.replication.log_puller import LogPuller

pytestmark = pytest.mark.integration

COLUMNS = "columns format version: 1\n1 columns:\n`id` UInt64\n"
METADATA = ("metadata format version: 1\ndate column: \nsampling expression: \nindex granularity: 8192\n"
            "mode: 0\nsign column: \nprimary key: id\ndata format version: 1\npartition key: \n")


async def test_entries_of_a_lost_answer_are_found_in_the_queue(keeper: Keeper) -> None:
    paths = TablePaths.create("/clickhouse/tables/01/t", "r1")
    await zk_init.create_table_if_not_exists(keeper, paths, METADATA, COLUMNS)
    await zk_init.create_replica(keeper, paths, COLUMNS)
    await zk_init.create_new_nodes(keeper, paths, METADATA)
    for i in range(3):
        entry = LogEntry.get_part(f"all_{i}_{i}_0", source_replica="r2", create_time=1_700_000_000 + i)
        await keeper.create(paths.log_prefix, entry.to_bytes(), sequence=True)

    handed: list[str] = []
    puller = LogPuller(keeper, paths, lambda es: handed.extend(e.new_part_name for e in es))
    puller.known = lambda znode: False  # nothing is in memory yet

    real_multi = keeper.multi
    calls = 0

    async def lossy_multi(ops: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        result = await real_multi(ops, *args, **kwargs)
        if calls == 1:
            raise KeeperConnectionLossError("connection loss (the multi was applied)")
        return result

    keeper.multi = lossy_multi  # type: ignore[method-assign]
    try:
        with pytest.raises(KeeperConnectionLossError):
            await puller.pull()
        assert handed == []
        assert (await keeper.get(paths.me.log_pointer))[0] == b"3"  # applied: the pointer moved past them
        await puller.pull()
    finally:
        keeper.multi = real_multi  # type: ignore[method-assign]
    assert sorted(handed) == ["all_0_0_0", "all_1_1_0", "all_2_2_0"]
    assert len(await keeper.get_children(paths.me.queue)) == 3


async def test_only_entries_from_the_pointer_on_are_copied_in_order(keeper: Keeper) -> None:
    """An empty pointer starts at the oldest entry; a set one copies the entries at or past it, in log order,
    however many older ones the log still keeps."""
    paths = TablePaths.create("/clickhouse/tables/01/t2", "r1")
    await zk_init.create_table_if_not_exists(keeper, paths, METADATA, COLUMNS)
    await zk_init.create_replica(keeper, paths, COLUMNS)
    await zk_init.create_new_nodes(keeper, paths, METADATA)
    for i in range(12):
        entry = LogEntry.get_part(f"all_{i}_{i}_0", source_replica="r2", create_time=1_700_000_000 + i)
        await keeper.create(paths.log_prefix, entry.to_bytes(), sequence=True)
    await keeper.set(paths.me.log_pointer, b"")
    handed: list[str] = []
    puller = LogPuller(keeper, paths, lambda es: handed.extend(e.new_part_name for e in es))
    assert await puller.pull() == 12
    assert handed == [f"all_{i}_{i}_0" for i in range(12)]
    handed.clear()
    await keeper.set(paths.me.log_pointer, b"9")
    puller = LogPuller(keeper, paths, lambda es: handed.extend(e.new_part_name for e in es))  # reads it
    assert await puller.pull() == 3
    assert handed == ["all_9_9_0", "all_10_10_0", "all_11_11_0"]
    assert (await keeper.get(paths.me.log_pointer))[0] == b"12"
