"""An insert block's first part takes its block-number lock while its files are being written.

The lock's multi (the deduplication probe on ``blocks/<id>`` and the ``block-`` ephemeral node, see
:mod:`replicad.keeper.block_lock`) needs the part's block id, which hashes the ``.bin`` files' uncompressed
sizes and hashes only (``getZeroLevelPartBlockID``).  Those are known once the writer has compressed every
stream's last block (:meth:`PartWriter.seal`), before a single file of the part exists: a small part's
compressed bytes are still in memory.  So the writer's thread computes the block id there and starts the
lock on the event loop (:meth:`EarlyLock.sealed`), then makes the part's files while ZooKeeper answers: the
insert waits for the longer of the two, not their sum.  The ids, the ZooKeeper requests and the bytes are
those of the sequential path (the lock is the same multi, with the same block id; only its start moved).

When the lock has come back by the time the files are written, the same thread also renames the
``tmp_insert_`` directory to the part's name (:meth:`EarlyLock.rename_if_locked`), as the commit would have
done in a thread trip of its own: rename before the commit multi, ClickHouse's order, so a crash at any point
leaves what it left before (a ``tmp_`` directory removed at start-up, or a renamed part unknown to ZooKeeper,
which the start-up check moves to ``detached/``).

A lock that will not be used (the write failed after the lock was started) is released in the background
(:meth:`EarlyLock.abandon`); a duplicate block (``None`` lock) removes the written part as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import threading
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from replicad.errors import KeeperError
from replicad.keeper.block_lock import BlockNumberLock, SentLock
from replicad.keeper.client import Keeper
from replicad.logging import get_logger
from replicad.model.block_id import block_id_from_checksums, block_id_from_token, block_token
from replicad.model.part_info import PartInfo
from replicad.storage.checksums import Checksum
from replicad.storage.layout import TableDataLayout

log = get_logger(__name__)

#: background releases of abandoned locks (a reference keeps each task alive until it is done)
_RELEASING: set[asyncio.Task[None]] = set()

#: ``(partition id, block id)`` → the lock's multi sent from the calling thread (None: leave it to ``Take``)
Send = Callable[[str, str], SentLock | None]
#: ``(partition id, block id, the multi sent or None)`` → the allocation on the loop
Take = Callable[[str, str, SentLock | None], Coroutine[Any, Any, BlockNumberLock | None]]


def block_id_of(partition_id: str, files: Mapping[str, Checksum], deduplicate: bool, token: str | None,
                ordinal: int) -> str:
    """A part's deduplication block id ("" without deduplication): from the token and the part's ordinal in
    the INSERT when a token is given, else from the ``.bin`` entries of its checksums (``files`` may hold
    the other entries too: they are ignored)."""
    if not deduplicate:
        return ""
    if token:
        return block_id_from_token(partition_id, block_token(token, ordinal))
    return block_id_from_checksums(
        partition_id, [(name, c.uncompressed_size, c.uncompressed_hash) for name, c in files.items()]
    )


class EarlyLock:
    """The lock of one insert block's first part, started from the writer's thread once its block id is
    known.  ``take(partition_id, block_id)`` is the allocator's coroutine (``None``: duplicate block);
    ``known(name)`` tells whether the table already has a part of that name (then the rename is left to
    the commit, which deals with such a leftover)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keeper: Keeper, send: Send, take: Take, *,
                 deduplicate: bool, token: str | None, ordinal: int, layout: TableDataLayout | None,
                 known: Callable[[str], bool]) -> None:
        self._loop = loop
        self._keeper = keeper
        self._send = send
        self._take = take
        self._deduplicate, self._token, self._ordinal = deduplicate, token, ordinal
        self._layout = layout  # None: the part is never renamed by the writer's thread (S3 disk)
        self._known = known
        #: the lock's outcome for the writer's thread (set on the loop when the task ends)
        self._ready: concurrent.futures.Future[BlockNumberLock | None] | None = None
        #: the allocation on the loop (made by the first loop iteration after :meth:`sealed`)
        self._task: asyncio.Task[BlockNumberLock | None] | None = None
        self.partition_id = ""
        self.block_id = ""
        #: where the writer's thread renamed the part to (its final name), None if it did not
        self.renamed: Path | None = None
        self._abandoned = False
        #: held by the writer's thread from its look at ``_abandoned`` until ``renamed`` is set, and by the
        #: release's removal: a rename racing an abandon is either not done or removed
        self._rename_mutex = threading.Lock()

    @property
    def started(self) -> bool:
        return self._ready is not None

    def sealed(self, partition_id: str, files: Mapping[str, Checksum]) -> None:
        """(writer's thread) The first part's ``.bin`` checksums are known: start its lock on the loop."""
        if self._ready is not None:
            return
        self.partition_id = partition_id
        self.block_id = block_id_of(partition_id, files, self._deduplicate, self._token, self._ordinal)
        self._ready = concurrent.futures.Future()
        try:  # the multi goes out from this thread: no wait for the loop to wake up and send it
            sent = self._send(partition_id, self.block_id)
        except Exception:  # not sent (no connection, ...): the loop's allocation says why
            sent = None
        self._loop.call_soon_threadsafe(self._start, sent)  # the thread's context: the insert's stage clock

    def _start(self, sent: SentLock | None) -> None:
        task = self._task = self._loop.create_task(self._take(self.partition_id, self.block_id, sent))
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[BlockNumberLock | None]) -> None:
        ready = self._ready
        assert ready is not None
        if task.cancelled():
            ready.cancel()
        elif (exc := task.exception()) is not None:
            ready.set_exception(exc)
        else:
            ready.set_result(task.result())

    def rename_if_locked(self, tmp_dir: Path, wait_s: float = 0.0) -> Path:
        """(writer's thread, the part's files written) Rename ``tmp_dir`` to the part's name once the lock is
        held, waiting for it up to ``wait_s`` (the rest of a ZooKeeper round trip: a rename left to the
        commit costs a thread trip of its own); the part's directory is returned, renamed or not."""
        ready = self._ready
        if self._layout is None or ready is None:
            return tmp_dir
        try:
            lock = ready.result(wait_s)
        except (Exception, concurrent.futures.CancelledError):  # not yet, or no lock: the commit decides
            return tmp_dir
        if lock is None:
            return tmp_dir
        name = PartInfo.for_insert(self.partition_id, lock.number).name
        with self._rename_mutex:
            if self._abandoned or self._known(name) or self._layout.part_path(name).exists():
                return tmp_dir
            self.renamed = self._layout.commit(tmp_dir, name)
            return self.renamed

    async def lock(self) -> BlockNumberLock | None:
        """(loop) The lock, once ZooKeeper has answered (the allocator's errors are raised here)."""
        if self._ready is None:
            raise RuntimeError("the early lock was not started")
        task = self._task
        if task is None:  # its start is still queued on the loop (it was queued before the write ended)
            return await asyncio.wrap_future(self._ready)
        if task.done():
            return task.result()  # no loop iteration for an answer that is already there
        return await asyncio.shield(task)

    def abandon(self) -> None:
        """(loop) The lock will not be used (the block's write failed): released once it is held, in the
        background (left alone, its ephemeral node would hold back merges of the partition on every replica
        until our session ended)."""
        if self._ready is None:
            return
        self._abandoned = True  # a writer's thread still running (a cancelled insert) renames nothing now
        task = self._loop.create_task(self._release())
        _RELEASING.add(task)
        task.add_done_callback(_RELEASING.discard)

    async def _release(self) -> None:
        try:
            lock = await self.lock()
        except (Exception, asyncio.CancelledError):  # no lock was taken
            return
        await asyncio.to_thread(self._remove_renamed)
        if lock is None:
            return
        try:
            await lock.unlock(self._keeper)
        except KeeperError as e:
            log.warning("abandoned_block_lock_not_released", path=lock.path, error=str(e))

    def _remove_renamed(self) -> None:
        """(worker thread, after :meth:`abandon`) Removes the part the writer's thread renamed, if it did:
        under the part's name, never to be committed, it is not left behind."""
        with self._rename_mutex:
            if self.renamed is not None:
                shutil.rmtree(self.renamed, True)
