"""Before a merge entry is written, every source part must be under ``replicas/<me>/parts`` (18.16 asks
ZooKeeper about each).  The parts this process registered itself (an insert's, a fetch's or a merge's commit)
are known to be there (LocalPart.registered): only the others are asked about.  Real ZooKeeper."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.replica import TableReplica
from tests.support.table_cluster import Cluster, parts_per_partition, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def record_part_probes(replica: TableReplica) -> list[str]:
    """The part names ``replica`` asks ``exists`` of ``replicas/<me>/parts/<part>`` about from now on."""
    asked: list[str] = []
    keeper = replica.keeper
    prefix = replica.paths.me.part("")
    real = keeper.exists

    async def exists(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith(prefix) and "/" not in path[len(prefix):]:
            asked.append(path[len(prefix):])
        return await real(path, *args, **kwargs)

    keeper.exists = exists  # type: ignore[method-assign]
    return asked


async def test_merge_selection_asks_only_about_parts_it_did_not_register(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    asked = record_part_probes(r1)
    for i in range(6):  # enough equal parts for the merge selector (base 5) to merge them unasked
        await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
    await wait_for(lambda: parts_per_partition(r1) == {"202611": 1}, timeout=60, what="the parts merged")
    (merged,) = r1.store.active()
    assert asked == []  # six parts committed here, then merged: nothing to ask
    assert merged.registered

    await cluster.stop("r1")
    r1 = await cluster.start("r1")  # the merged part is loaded from disk: not known to be registered
    (loaded,) = r1.store.active()
    assert not loaded.registered
    asked = record_part_probes(r1)
    for i in range(6, 9):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10)))
    own = r1.puller.own
    assert own is not None
    await wait_for(lambda: own.done_total >= 3, what="r1 to read its entries back")  # else OPTIMIZE refuses
    await cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL")
    await wait_for(lambda: parts_per_partition(r1) == {"202611": 1}, timeout=60, what="OPTIMIZE FINAL")
    assert set(asked) == {loaded.name}, asked  # the new parts are r1's own
    assert [r["id"] for r in await sorted_rows(r1)] == list(range(90))
