"""The part check repairs damaged or inconsistent local data (replicad-only replica sets on a real ZooKeeper):
a deleted part directory and a truncated ``.bin`` file are noticed by a SELECT, set aside and fetched again;
parts planted or lost while a replica was down are reconciled at start-up; a part no replica has any more is
declared lost forever without blocking the queue."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.replica import TableReplica
from tests.support.table_cluster import ZK_PATH, Cluster, part_checksums, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: no merges in these tests: the part names stay put
NO_MERGES: dict[str, Any] = {"max_replicated_merges_in_queue": 1, "cleanup_delay_period": 1}


async def start_pair(cluster: Cluster) -> tuple[TableReplica, TableReplica]:
    r1 = await cluster.start("r1", NO_MERGES)
    r2 = await cluster.start("r2", NO_MERGES)
    # stop merge assignment: the leader's assigner would merge the parts away under the test
    for name in ("r1", "r2"):
        cluster.ops[name].assigner.request_stop()
    await r1.insert_table(rows(range(1, 6), month=11))
    await r1.insert_table(rows(range(6, 9), month=10))
    await wait_for(lambda: part_checksums(r2) == part_checksums(r1) and len(part_checksums(r2)) == 2)
    return r1, r2


async def same_data(r1: TableReplica, r2: TableReplica) -> bool:
    try:
        return part_checksums(r1) == part_checksums(r2) and await sorted_rows(r1) == await sorted_rows(r2)
    except Exception:
        return False


async def test_deleted_part_directory_is_fetched_again(cluster: Cluster) -> None:
    r1, r2 = await start_pair(cluster)
    victim = r2.store.get("202611_0_0_0")
    assert victim is not None
    shutil.rmtree(victim.path)
    with pytest.raises(Exception):  # noqa: B017 - whatever the reader says about the vanished files
        await r2.read_all()
    await wait_for(lambda: same_data(r1, r2), what="r2 to fetch the part again")
    assert r2.part_check.broken_total == 1 and r2.part_check.fetches_enqueued_total == 1
    assert await r2.count(None) == 8
    assert r2.layout.list_detached() == []  # nothing was left to set aside


async def test_truncated_bin_file_is_set_aside_and_fetched_again(cluster: Cluster) -> None:
    r1, r2 = await start_pair(cluster)
    victim = r2.store.get("202610_0_0_0")
    assert victim is not None
    data = (victim.path / "name.bin").read_bytes()
    (victim.path / "name.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception):  # noqa: B017 - CorruptedDataError or a short read
        await r2.read_all()
    await wait_for(lambda: same_data(r1, r2), what="r2 to replace the broken part")
    assert r2.layout.list_detached() == ["broken_202610_0_0_0"]
    broken = r2.layout.detached_path / "broken_202610_0_0_0" / "name.bin"
    assert broken.read_bytes() == data[: len(data) // 2]  # set aside as it was, not deleted
    assert (r2.store.get("202610_0_0_0") or victim).path.joinpath("name.bin").read_bytes() == data
    assert r2.part_check.broken_total == 1
    assert r2.part_check.status()["recent"][0]["outcome"] == "detached_broken"


async def test_start_up_reconciles_planted_and_missing_parts(cluster: Cluster) -> None:
    r1, r2 = await start_pair(cluster)
    await cluster.stop("r2")
    # while r2 is down: one of its parts vanishes, an unknown part appears
    shutil.rmtree(r2.layout.part_path("202611_0_0_0"))
    shutil.copytree(r2.layout.part_path("202610_0_0_0"), r2.layout.part_path("202610_7_7_0"))
    r2 = await cluster.start("r2", NO_MERGES)
    cluster.ops["r2"].assigner.request_stop()
    await wait_for(lambda: same_data(r1, r2), what="r2 to converge after its start-up check")
    assert r2.layout.list_detached() == ["ignored_202610_7_7_0"]
    assert sorted(r2.store.active_names()) == ["202610_0_0_0", "202611_0_0_0"]
    assert await r2.count(None) == 8


async def test_part_lost_forever_does_not_block_the_queue(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1", NO_MERGES)
    r2 = await cluster.start("r2", NO_MERGES)
    await cluster.stop("r2")
    await r1.insert_table(rows([1, 2, 3]))  # only r1 ever has this part
    await cluster.stop("r1")
    # r1's disk is gone and so is its record of the part: nobody can provide 202611_0_0_0 any more
    paths = TablePaths.create(ZK_PATH, "r1")
    await keeper.delete(paths.me.part("202611_0_0_0"), recursive=True)
    shutil.rmtree(r1.layout.part_path("202611_0_0_0"))
    r2 = await cluster.start("r2", NO_MERGES)
    r1 = await cluster.start("r1", NO_MERGES)
    await r1.insert_table(rows([4, 5], month=10))
    await wait_for(lambda: r2.part_check.lost_forever_total == 1, timeout=60, what="the part to be lost")
    await wait_for(lambda: same_data(r1, r2), what="later inserts to replicate regardless")
    await wait_for(lambda: len(r2.queue_state) == 0, what="r2's queue to drain")
    assert r2.part_check.lost_parts == ["202611_0_0_0"]
    assert r2.store.active_names() == ["202610_0_0_0"]
    assert await keeper.get_children(TablePaths.create(ZK_PATH, "r2").me.queue) == []
