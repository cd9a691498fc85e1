"""EarlyLock: an insert abandoned while its writer's thread is renaming the part leaves no part directory
behind (the rename and the release's removal cannot interleave)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from replicad.keeper.block_lock import BlockNumberLock, SentLock
from replicad.replication.early_lock import EarlyLock
from replicad.storage.layout import TableDataLayout


class _Keeper:
    def __init__(self) -> None:
        self.multis: list[list[Any]] = []

    async def multi(self, ops: list[Any]) -> list[Any]:
        self.multis.append(ops)
        return []


async def test_an_abandon_racing_the_rename_removes_the_renamed_part(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    layout = TableDataLayout(tmp_path, "db", "t")
    tmp_dir = layout.path / "tmp_insert_all_1_1_0"
    tmp_dir.mkdir(parents=True)
    (tmp_dir / "count.txt").write_text("1")
    lock = BlockNumberLock("all", 7, "/t/block_numbers/all/block-0000000007", "/t/temp/abandonable_lock-1")
    in_known, abandoned = threading.Event(), threading.Event()

    def known(name: str) -> bool:  # the writer's thread, between its look at the abandon flag and the rename
        in_known.set()
        assert abandoned.wait(10)
        return False

    async def take(partition_id: str, block_id: str, sent: SentLock | None) -> BlockNumberLock | None:
        return lock

    keeper = _Keeper()
    early = EarlyLock(loop, keeper, lambda p, b: None, take, deduplicate=False, token=None,  # type: ignore[arg-type]
                      ordinal=0, layout=layout, known=known)
    early.sealed("all", {})
    assert await early.lock() is lock
    renaming = asyncio.create_task(asyncio.to_thread(early.rename_if_locked, tmp_dir, 1.0))
    assert await asyncio.to_thread(in_known.wait, 10)
    early.abandon()  # the insert is cancelled while its thread is about to rename
    abandoned.set()
    result = await renaming
    for _ in range(200):  # the release runs in the background
        if keeper.multis:
            break
        await asyncio.sleep(0.01)
    assert keeper.multis, "the abandoned lock was not released"
    assert result == tmp_dir or not result.exists()  # not renamed (the clean-up takes tmp_), or removed
    assert not (layout.path / "all_7_7_0").exists(), "a renamed part was left behind by the abandoned insert"
