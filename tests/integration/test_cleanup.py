"""The cleanup thread on a real ZooKeeper: outdated parts leave ZooKeeper before the disk, stale temporary
directories go, and the shared log and ``blocks/`` stay bounded under a long insert run (the figures are
printed: ``pytest -s`` shows them)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.replica import TableReplica
from tests.support.table_cluster import ZK_PATH, Cluster, part_checksums, rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PATHS = TablePaths.create(ZK_PATH, "r1")
FAST_CLEANUP: dict[str, Any] = {
    "cleanup_delay_period": 1,
    "cleanup_delay_period_random_add": 0,
    "old_parts_lifetime": 1,
    "temporary_directories_lifetime": 2,
}


async def merged_pair(cluster: Cluster) -> tuple[TableReplica, list[str]]:
    """r1 with two parts merged into one: the two sources become outdated (returned)."""
    r1 = await cluster.start("r1", {**FAST_CLEANUP, "old_parts_lifetime": 3600})
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3]))
    await optimize(cluster, r1)
    return r1, ["202611_0_0_0", "202611_1_1_0"]


async def optimize(cluster: Cluster, r1: TableReplica) -> None:
    await wait_for(lambda: r1.puller.log_pointer == 2 and not len(r1.queue_state), what="the log pulled")
    await cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL")
    await wait_for(lambda: r1.store.active_names() == ["202611_0_1_1"], what="the merge")


async def test_outdated_parts_leave_zookeeper_before_the_disk(cluster: Cluster, keeper: Keeper) -> None:
    r1, outdated = await merged_pair(cluster)
    r1.cleanup.settings = dataclasses.replace(r1.cleanup.settings, old_parts_lifetime=0)
    real_delete = r1.keeper.delete

    async def failing_delete(path: str, version: int = -1, recursive: bool = False) -> None:
        if "/parts/" in path:
            raise KeeperConnectionLossError(f"delete {path}: connection loss (injected)")
        await real_delete(path, version, recursive)

    r1.keeper.delete = failing_delete  # type: ignore[method-assign]
    try:
        with pytest.raises(KeeperConnectionLossError):
            await r1.cleanup.clear_old_parts()
        # ZooKeeper still lists them for us: the directories must stay
        assert all(r1.layout.part_path(n).exists() for n in outdated)
    finally:
        r1.keeper.delete = real_delete  # type: ignore[method-assign]
    assert sorted(await r1.cleanup.clear_old_parts()) == outdated
    assert not any(r1.layout.part_path(n).exists() for n in outdated)
    assert sorted(await keeper.get_children(PATHS.me.parts)) == ["202611_0_1_1"]
    assert r1.cleanup.status()["removed_parts_total"] == 2


async def test_old_parts_and_stale_tmp_dirs_are_removed_by_the_thread(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1", FAST_CLEANUP)
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3]))
    stale = r1.layout.path / "tmp_insert_202611_9_9_0"
    fresh = r1.layout.path / "tmp-fetch_202611_8_8_0"
    for d in (stale, fresh):
        d.mkdir()
        (d / "data.bin").write_bytes(b"x")
    old = time.time() - 3600
    os.utime(stale / "data.bin", (old, old))
    os.utime(stale, (old, old))
    await optimize(cluster, r1)
    await wait_for(
        lambda: sorted(p.name for p in r1.layout.path.iterdir() if p.name[0].isdigit()) == ["202611_0_1_1"],
        what="the outdated sources to be removed",
    )

    def stale_gone() -> bool:
        (fresh / "data.bin").write_bytes(b"x" * (time.monotonic_ns() % 97 + 1))  # a download still writing
        return not stale.exists()

    await wait_for(stale_gone, what="the stale temporary directory to go")
    assert fresh.exists()  # still being written: it may be a download in progress
    assert sorted(await keeper.get_children(PATHS.me.parts)) == ["202611_0_1_1"]


async def test_log_and_blocks_stay_bounded(cluster: Cluster, keeper: Keeper) -> None:
    """Many inserts (ClickHouse's defaults for the log and the deduplication window; cleanup every second)
    into three replicas: the log and ``blocks/`` never grow much past what ClickHouse keeps.  300 inserts by
    default (about 40 s); REPLICAD_CLEANUP_INSERTS=1000 for the long run."""
    settings = {"cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}
    replicas = [await cluster.start(n, settings) for n in ("r1", "r2", "r3")]
    inserts, max_log, max_blocks = int(os.environ.get("REPLICAD_CLEANUP_INSERTS", "300")), 0, 0
    started = time.monotonic()
    for i in range(inserts):
        await replicas[i % 3].insert_table(rows([i % 100, (i + 50) % 100], month=1 + i % 12, name=f"b{i}"))
        if i % 10 == 9:
            log_stat = await keeper.exists(PATHS.log)
            blocks_stat = await keeper.exists(PATHS.blocks)
            assert log_stat is not None and blocks_stat is not None
            max_log = max(max_log, log_stat.num_children)
            max_blocks = max(max_blocks, blocks_stat.num_children)
    elapsed = time.monotonic() - started

    async def settled() -> bool:
        sets = [part_checksums(r) for r in replicas]
        return all(s == sets[0] for s in sets) and not any(len(r.queue_state) for r in replicas)

    await wait_for(settled, timeout=120, what="the replicas to converge")
    await asyncio.sleep(2.5)  # two more cleanup rounds
    final_log = (await keeper.exists(PATHS.log)).num_children  # type: ignore[union-attr]
    final_blocks = (await keeper.exists(PATHS.blocks)).num_children  # type: ignore[union-attr]
    print(
        f"\n{inserts} inserts in {elapsed:.1f} s: max log {max_log} entries (final {final_log}), "
        f"max blocks {max_blocks} (final {final_blocks}); "
        f"log entries removed {sum(r.cleanup.stats.removed_log_entries_total for r in replicas)}, "
        f"blocks removed {sum(r.cleanup.stats.removed_blocks_total for r in replicas)}"
    )
    assert final_blocks <= 100  # replicated_deduplication_window
    assert final_log <= 110  # min_replicated_logs_to_keep * 1.1
    assert max_blocks <= 100 + 100 and max_log <= 110 + 200  # one cleanup period of slack
    assert [await r.count(None) for r in replicas] == [2 * inserts] * 3


async def test_idle_cleanup_rounds_read_no_replica_summary_a_scrape_reads_it(cluster: Cluster) -> None:
    """The system.replicas fields read from ZooKeeper (total/active replicas, log_max_index) are read when
    asked for, at most once per ZK_SUMMARY_MAX_AGE_S, no longer by every cleanup round of every idle table
    (2 + N requests per table per round: most of an idle daemon's ZooKeeper traffic with many tables)."""
    r1 = await cluster.start("r1", FAST_CLEANUP)
    r2 = await cluster.start("r2", FAST_CLEANUP)
    reads: list[str] = []
    for r in (r1, r2):
        for method in ("exists", "get_children", "get"):
            real = getattr(r.keeper, method)

            async def spy(path: str, *a: Any, _real: Any = real, **kw: Any) -> Any:
                reads.append(path)
                return await _real(path, *a, **kw)

            setattr(r.keeper, method, spy)
    runs = [r1.cleanup.stats.runs, r2.cleanup.stats.runs]
    await wait_for(lambda: r1.cleanup.stats.runs >= runs[0] + 3 and r2.cleanup.stats.runs >= runs[1] + 3,
                   timeout=30, what="three cleanup rounds on both replicas")
    summary_reads = [p for p in reads if p == PATHS.replicas or p.endswith("/is_active")]
    assert summary_reads == [], summary_reads

    # asked for: read once, then served from memory while younger than the maximum age
    await r1.refresh_zk_summary()
    assert {k: r1.status()[k] for k in ("total_replicas", "active_replicas", "log_max_index")} == {
        "total_replicas": 2, "active_replicas": 2, "log_max_index": 0}
    reads.clear()
    await r1.refresh_zk_summary()
    assert reads == []
    await r1.insert_table(rows([1]))
    await r1.insert_table(rows([2]))
    await cluster.kill("r2")
    await r1.refresh_zk_summary(max_age_s=0.0)
    status = r1.status()
    assert (status["total_replicas"], status["active_replicas"]) == (2, 1) and status["log_max_index"] >= 1
