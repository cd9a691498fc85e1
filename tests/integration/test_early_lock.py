"""The first part of an insert block takes its block-number lock while its files are written
(replicad/replication/early_lock.py), and is renamed by the writer's thread when the lock is back by then.
Real ZooKeeper, in-process replicas: the lock overlaps the writing, duplicates (one after the other or
racing) leave one part and nothing else, and a write or commit that fails after the lock was started leaves
no directory and no ``block-`` lock node behind."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replicad.errors import KeeperMultiError, KeeperNoNodeError, ReplicadError
from replicad.keeper.ops import Create
from replicad.model.block_id import block_id_from_checksums
from replicad.replica import TableReplica
from replicad.storage.checksums import Checksums
from replicad.storage.layout import TableDataLayout
from replicad.storage.small_part import SmallPartWriter
from replicad.storage.writer import PartWriter
from tests.support.table_cluster import Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dirs(replica: TableReplica) -> list[str]:
    return sorted(p.name for p in replica.layout.path.iterdir() if p.is_dir() and p.name != "detached")


async def lock_nodes(replica: TableReplica) -> list[str]:
    out: list[str] = []
    for pid in await replica.keeper.get_children(replica.paths.block_numbers):
        out += await replica.keeper.get_children(replica.paths.partition_block_numbers(pid))
    return out


def patch_finish(monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Any], Callable[[Any], Any]]) -> None:
    """``finish`` of both part writers (a small insert's one-granule part is SmallPartWriter's) replaced by
    ``wrap(the real finish)``."""
    for cls in (PartWriter, SmallPartWriter):
        monkeypatch.setattr(cls, "finish", wrap(cls.finish))


def slow_finish(monkeypatch: pytest.MonkeyPatch, until: threading.Event, record: list[bool]) -> None:
    """The part writer's finish waits (in the writer's thread) until ``until`` is set, at most 5 s, and
    records whether it was: the lock, set by the allocator, came back while the part was being written."""
    def wrap(real: Any) -> Callable[[Any], Any]:
        def finish(self: Any) -> Any:
            record.append(until.wait(5.0))
            return real(self)
        return finish

    patch_finish(monkeypatch, wrap)


def lock_event(replica: TableReplica, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    allocator = replica.committer.allocator
    real = allocator.allocate
    done = threading.Event()

    async def allocate(*args: Any, **kwargs: Any) -> Any:
        try:
            return await real(*args, **kwargs)
        finally:
            done.set()

    monkeypatch.setattr(allocator, "allocate", allocate)
    return done


async def test_lock_taken_while_the_part_is_written_and_renamed_by_the_writer(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    r1 = await cluster.start("r1")
    done = lock_event(r1, monkeypatch)
    record: list[bool] = []
    slow_finish(monkeypatch, done, record)
    rename_threads: list[str] = []
    real_commit = TableDataLayout.commit

    def commit(self: TableDataLayout, *args: Any, **kwargs: Any) -> Path:
        rename_threads.append(threading.current_thread().name)
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(TableDataLayout, "commit", commit)
    summary = await r1.insert_table(rows(range(10), month=11))
    assert summary.written_parts == 1
    assert record == [True]  # the lock was back before the files were made
    assert len(rename_threads) == 1 and rename_threads[0] != threading.main_thread().name
    (part,) = r1.store.active_names()
    assert dirs(r1) == [part]
    assert len(await sorted_rows(r1)) == 10
    # the block id is the one of the part's checksums on disk, and names the part
    on_disk = Checksums.parse((r1.layout.part_path(part) / "checksums.txt").read_bytes())
    bid = block_id_from_checksums(part.split("_")[0], [
        (n, c.uncompressed_size, c.uncompressed_hash) for n, c in on_disk.files.items()])
    data, _stat = await r1.keeper.get(r1.paths.block(bid))
    assert data.decode() == part
    assert await lock_nodes(r1) == []


async def test_duplicates_in_turn_and_racing_leave_one_part(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    block = rows(range(20), month=11)
    first = await r1.insert_table(block)
    again = await r1.insert_table(block)
    assert (first.written_parts, again.written_parts, again.deduplicated_blocks) == (1, 0, 1)
    other = rows(range(100, 120), month=11)
    racing = await asyncio.gather(*(r1.insert_table(other) for _ in range(4)))
    assert sum(s.written_parts for s in racing) == 1
    assert sum(s.deduplicated_blocks for s in racing) == 3
    assert len(await sorted_rows(r1)) == 40
    assert dirs(r1) == sorted(r1.store.active_names())
    assert len(dirs(r1)) == 2
    assert await lock_nodes(r1) == []


async def test_a_write_failing_after_the_lock_started_releases_it(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    r1 = await cluster.start("r1")
    done = lock_event(r1, monkeypatch)
    failing = True

    def wrap(real: Any) -> Callable[[Any], Any]:
        def finish(self: Any) -> Any:
            if failing:
                assert done.wait(5.0)  # the lock is held now
                raise OSError(28, "injected: no space left on device")
            return real(self)
        return finish

    patch_finish(monkeypatch, wrap)
    with pytest.raises(OSError, match="injected"):
        await r1.insert_table(rows(range(10), month=11))
    await wait_for(lambda: _no_locks(r1), timeout=10.0)
    assert dirs(r1) == []
    failing = False
    summary = await r1.insert_table(rows(range(10), month=11))  # same block: not a duplicate
    assert summary.written_parts == 1
    assert len(await sorted_rows(r1)) == 10


async def _no_locks(replica: TableReplica) -> bool:
    return await lock_nodes(replica) == []


async def test_a_failed_commit_after_the_writer_renamed_leaves_nothing(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    r1 = await cluster.start("r1")
    done = lock_event(r1, monkeypatch)
    record: list[bool] = []
    slow_finish(monkeypatch, done, record)
    keeper = r1.keeper
    real_multi = keeper.multi
    fail = True

    async def multi(ops: Any) -> Any:
        ops = list(ops)
        if fail and any(isinstance(op, Create) and op.path.startswith(r1.paths.log_prefix) for op in ops):
            raise KeeperMultiError("injected multi failure", index=1, cause=KeeperNoNodeError("injected"))
        return await real_multi(ops)

    monkeypatch.setattr(keeper, "multi", multi)
    with pytest.raises(ReplicadError, match="injected"):
        await r1.insert_table(rows(range(10), month=11))
    assert record == [True]  # renamed by the writer's thread before the commit failed
    assert dirs(r1) == []
    assert r1.store.active_names() == []
    assert await lock_nodes(r1) == []
    fail = False
    started = time.monotonic()
    summary = await r1.insert_table(rows(range(10), month=11))
    assert summary.written_parts == 1, time.monotonic() - started
    assert dirs(r1) == r1.store.active_names()


async def test_a_later_part_failing_after_the_first_was_renamed_leaves_nothing(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions: the first part is locked and renamed by the writer's thread, the second part's
    write fails; neither the renamed directory nor the lock survives the insert's error."""
    r1 = await cluster.start("r1")
    done = lock_event(r1, monkeypatch)
    finished = 0

    def wrap(real: Any) -> Callable[[Any], Any]:
        def finish(self: Any) -> Any:
            nonlocal finished
            finished += 1
            if finished == 1:
                assert done.wait(5.0)  # the first part's lock is back: its thread renames it
                return real(self)
            raise OSError(5, "injected: the second part cannot be written")
        return finish

    patch_finish(monkeypatch, wrap)
    block = rows(range(10), month=10)
    more = rows(range(100, 110), month=11)
    both = block.__class__.from_batches([*block.to_batches(), *more.to_batches()])
    with pytest.raises(OSError, match="injected"):
        await r1.insert_table(both)
    await wait_for(lambda: _no_locks(r1), timeout=10.0)
    assert finished == 2
    assert dirs(r1) == []
    assert r1.store.active_names() == []


def sends(replica: TableReplica, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, per early lock, whether its multi left from the writer's thread (allocator.send)."""
    allocator = replica.committer.allocator
    real = allocator.send
    out: list[bool] = []

    def send(*args: Any, **kwargs: Any) -> Any:
        sent = real(*args, **kwargs)
        out.append(sent is not None and threading.current_thread() is not threading.main_thread())
        return sent

    monkeypatch.setattr(allocator, "send", send)
    return out


async def test_the_lock_multi_sent_from_the_writer_thread(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the partition's block_numbers node and the holder are known, the lock's multi is sent by the
    writer's thread; the first insert of a partition makes them on the loop as before.  Numbers follow."""
    r1 = await cluster.start("r1")
    sent = sends(r1, monkeypatch)
    for i in range(3):
        await r1.insert_table(rows(range(i * 10, i * 10 + 10), month=11))
    assert sent == [False, True, True]
    assert sorted(r1.store.active_names()) == ["202611_0_0_0", "202611_1_1_0", "202611_2_2_0"]
    assert await lock_nodes(r1) == []


async def test_a_sent_lock_whose_holder_vanished_is_taken_again(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The multi sent from the writer's thread fails with NoNode when the shared holder
    (temp/abandonable_lock-insert) was removed behind the replica's back: the allocation makes it again and
    takes a number, as the loop's does."""
    r1 = await cluster.start("r1")
    sent = sends(r1, monkeypatch)
    await r1.insert_table(rows(range(10), month=11))
    await r1.keeper.delete(f"{r1.paths.temp}/abandonable_lock-insert")
    summary = await r1.insert_table(rows(range(10, 20), month=11))
    assert sent == [False, True]
    assert summary.written_parts == 1
    assert len(await sorted_rows(r1)) == 20
    assert await lock_nodes(r1) == []
    assert sorted(dirs(r1)) == sorted(r1.store.active_names())
