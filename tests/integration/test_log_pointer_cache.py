"""The log puller reads ``log_pointer`` once and then sets it only at the version it wrote last (real
ZooKeeper): a pass that finds new entries costs the log listing, the entries' reads and the multi; a pointer
moved by another writer (a clone of a lost replica sets it) makes the multi fail on its version, and the pass
reads the pointer again and copies from there, never an entry below it."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.replication import init as zk_init
from replicad.replication.log_puller import LogPuller

pytestmark = pytest.mark.integration

COLUMNS = "columns format version: 1\n1 columns:\n`id` UInt64\n"
METADATA = ("metadata format version: 1\ndate column: \nsampling expression: \nindex granularity: 8192\n"
            "mode: 0\nsign column: \nprimary key: id\ndata format version: 1\npartition key: \n")


async def add_entries(keeper: Keeper, paths: TablePaths, first: int, n: int) -> None:
    for i in range(first, first + n):
        entry = LogEntry.get_part(f"all_{i}_{i}_0", source_replica="r2", create_time=1_700_000_000 + i)
        await keeper.create(paths.log_prefix, entry.to_bytes(), sequence=True)


@pytest.fixture
async def table(keeper: Keeper) -> TablePaths:
    paths = TablePaths.create("/clickhouse/tables/01/t", "r1")
    await zk_init.create_table_if_not_exists(keeper, paths, METADATA, COLUMNS)
    await zk_init.create_replica(keeper, paths, COLUMNS)
    await zk_init.create_new_nodes(keeper, paths, METADATA)
    return paths


async def test_the_pointer_is_read_once(keeper: Keeper, table: TablePaths) -> None:
    handed: list[str] = []
    puller = LogPuller(keeper, table, lambda es: handed.extend(e.new_part_name for e in es))
    await add_entries(keeper, table, 0, 2)
    assert await puller.pull() == 2
    for i in range(2, 5):
        await add_entries(keeper, table, i, 1)
        before = dict(keeper.requests)
        assert await puller.pull() == 1
        sent = {k: v - before.get(k, 0) for k, v in keeper.requests.items() if v != before.get(k, 0)}
        assert sent == {"get_children": 1, "get": 1, "multi": 1}, sent  # no read of log_pointer
    assert handed == [f"all_{i}_{i}_0" for i in range(5)]
    assert (await keeper.get(table.me.log_pointer))[0] == b"5"


async def test_a_pointer_moved_by_another_writer_is_read_again(keeper: Keeper, table: TablePaths) -> None:
    handed: list[str] = []
    puller = LogPuller(keeper, table, lambda es: handed.extend(e.new_part_name for e in es))
    await add_entries(keeper, table, 0, 1)
    assert await puller.pull() == 1
    await add_entries(keeper, table, 1, 3)  # log-1 .. log-3
    await keeper.set(table.me.log_pointer, b"3")  # as a clone does: entries 1 and 2 are not ours to copy
    assert await puller.pull() == 1
    assert handed == ["all_0_0_0", "all_3_3_0"]
    assert (await keeper.get(table.me.log_pointer))[0] == b"4"
    assert len(await keeper.get_children(table.me.queue)) == 2
    await add_entries(keeper, table, 4, 1)
    assert await puller.pull() == 1  # and the version it wrote is kept again
    assert handed[-1] == "all_4_4_0"


async def test_a_failed_pass_reads_the_pointer_again(keeper: Keeper, table: TablePaths) -> None:
    puller = LogPuller(keeper, table, lambda es: None)
    await add_entries(keeper, table, 0, 1)
    await puller.pull()
    real_get_children = keeper.get_children

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    keeper.get_children = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError):
            await puller.pull()
    finally:
        keeper.get_children = real_get_children  # type: ignore[method-assign]
    await add_entries(keeper, table, 1, 1)
    before = keeper.requests["get"]
    assert await puller.pull() == 1
    assert keeper.requests["get"] - before == 2  # log_pointer and the entry
