"""A done entry whose queue node could not be removed (found by the chaos suite: after a ZooKeeper leader kill
and a SIGSTOP, r3's queue/ kept two done entries for more than 60 s while its in-memory queue was empty).

kazoo keeps the session across a connection loss, so no reload ever comes back for such a node: the executor
must remove it itself once ZooKeeper answers again."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError
from replicad.keeper.ops import Delete, Op
from tests.support.table_cluster import Cluster, rows, wait_for

pytestmark = pytest.mark.integration


async def test_queue_node_of_a_done_entry_is_removed_after_a_failed_delete(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    keeper = r2.keeper
    real_delete, real_multi = keeper.delete, keeper.multi
    failed: list[str] = []

    async def flaky_delete(path: str, *args: Any, **kwargs: Any) -> Any:
        if "/queue/queue-" in path and not failed:
            failed.append(path)
            raise KeeperConnectionLossError(f"delete {path}: connection loss")
        return await real_delete(path, *args, **kwargs)

    async def flaky_multi(ops: list[Op], *args: Any, **kwargs: Any) -> Any:
        # the removal goes with the entry's insert times in one multi
        removal = [op.path for op in ops if isinstance(op, Delete) and "/queue/queue-" in op.path]
        if removal and not failed:
            failed.append(removal[0])
            raise KeeperConnectionLossError(f"multi (delete {removal[0]}): connection loss")
        return await real_multi(ops, *args, **kwargs)

    keeper.delete = flaky_delete  # type: ignore[method-assign]
    keeper.multi = flaky_multi  # type: ignore[method-assign]
    try:
        await r1.insert_table(rows([1, 2, 3]))
        await wait_for(lambda: failed and len(r2.queue_state) == 0, what="r2 to run the GET_PART")

        async def queue_empty_in_zookeeper() -> bool:
            return not await keeper.get_children(r2.paths.me.queue)

        await wait_for(queue_empty_in_zookeeper, timeout=15, what="the leftover queue node to be removed")
    finally:
        keeper.delete = real_delete  # type: ignore[method-assign]
        keeper.multi = real_multi  # type: ignore[method-assign]
