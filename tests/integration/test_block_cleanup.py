"""``blocks/`` trimmed to the deduplication window (replicad.replication.cleanup.clear_old_blocks): the old
blocks go in multis of up to LOG_REMOVE_BATCH deletes (18.16 sends one request per block), and a batch a
node of which cannot be deleted that way (gone meanwhile, or with children from an ancient server) is
removed block by block.  Real ZooKeeper."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.replication.cleanup import LOG_REMOVE_BATCH, clear_old_blocks

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PATHS = TablePaths.create("/clickhouse/tables/01/blocks_cleanup", "r1")


def record(keeper: Keeper) -> Counter[str]:
    """The multis and deletes ``keeper`` sends from now on."""
    sent: Counter[str] = Counter()
    real_multi, real_delete = keeper.multi, keeper.delete

    async def multi(ops: Any, *args: Any, **kwargs: Any) -> Any:
        sent["multi"] += 1
        return await real_multi(ops, *args, **kwargs)

    async def delete(*args: Any, **kwargs: Any) -> Any:
        sent["delete"] += 1
        return await real_delete(*args, **kwargs)

    keeper.multi = multi  # type: ignore[method-assign]
    keeper.delete = delete  # type: ignore[method-assign]
    return sent


async def make_blocks(keeper: Keeper, n: int) -> list[str]:
    names = [f"202611_{i:05d}_{i * 7}" for i in range(n)]  # name order = creation order (ctime ties)
    await keeper.ensure_path(PATHS.blocks)
    for name in names:  # one by one: each a later ctime than the one before (or the same millisecond)
        await keeper.create(PATHS.block(name), b"")
    return names


async def test_old_blocks_go_in_batches(keeper: Keeper) -> None:
    n = LOG_REMOVE_BATCH + 150
    await make_blocks(keeper, n)
    sent = record(keeper)
    removed = await clear_old_blocks(keeper, PATHS, window=100, window_seconds=3600, ctime_cache={})
    left = await keeper.get_children(PATHS.blocks)
    assert removed == n - 100 == n - len(left)
    assert sent == {"multi": 2}, sent  # 450 deletes in two multis, none on its own


async def test_a_batch_that_cannot_go_whole_goes_block_by_block(keeper: Keeper) -> None:
    names = await make_blocks(keeper, 150)
    await keeper.create(f"{PATHS.block(names[0])}/child", b"")  # the oldest: doomed, and not empty
    sent = record(keeper)
    removed = await clear_old_blocks(keeper, PATHS, window=100, window_seconds=3600, ctime_cache={})
    left = await keeper.get_children(PATHS.blocks)
    assert removed == 50 and sorted(left) == sorted(names[50:])
    assert sent["multi"] == 1 and sent["delete"] >= 50, sent  # the multi failed: each block on its own
