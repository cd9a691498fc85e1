"""Receiving a part's files: one writer thread per part (a pooled daemon thread), fed by the event loop in
bounded batches.

:class:`PartSink` is the file side of :func:`replicad.storage.part_receive.receive_part`: the loop parses
the DataPartsExchange body and hands each file's bytes over as :class:`Write` jobs (slices of the network
buffers, no copies); the thread creates the directory, writes and hashes every file and compares each
file's hash with the one that followed it in the body.
"""

from __future__ import annotations

import asyncio
import errno
import os
import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from replicad import fault_plant
from replicad.errors import CorruptedDataError
from replicad.model.cityhash import FileHasher
from replicad.storage.part import create_file, fsync_dir, write_all
from replicad.storage.prepared_dirs import PreparedDirs, prepared_for

_PREPARED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC

#: the loop hands the writer thread about this many bytes at a time (with BATCHES_PENDING and the fetcher's
#: read_bufsize, what a fetch holds: well under 1 MiB, whatever the part; the peak RSS of a fetch was +20 MiB
#: with 4 MiB batches, +6 with 1 MiB ones, +3 with 256 KiB and 2 pending, +2 with 1 pending and aiohttp's
#: default read buffer (200-400 MB parts, the receiving daemon's CPU time the same within the noise)
BATCH_SIZE = 1 << 18
#: batches handed over but not yet written before the loop waits (memory bound): the thread writes one
#: while the loop gathers the next
BATCHES_PENDING = 1


@dataclass(frozen=True)
class ReceivedFile:
    size: int
    file_hash: bytes


@dataclass(frozen=True)
class Write:
    """Bytes of one file for the writer thread: ``first`` creates the file, ``last`` closes it and checks the
    hash of everything written against ``sent_hash`` (the hash that followed the file in the body)."""

    name: str
    pieces: list[memoryview]
    nbytes: int
    first: bool
    last: bool
    sent_hash: bytes = b""


class _Workers:
    """Daemon threads kept between parts: starting a thread per part made the event loop wait for each new
    thread to come up (``Thread.start`` blocks until it runs), the slowest step of receiving a small part on a
    busy machine.  A worker is started only when none is idle; workers never exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self.started = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self.started += 1
                threading.Thread(target=self._work, name=f"{self.name}-{self.started}", daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # pragma: no cover - jobs report their own errors
                pass
            with self._lock:
                self._idle += 1


_WORKERS = _Workers("part-receiver")


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class PartSink:
    """The file side of receiving a part into ``path`` (which must not exist yet): created before the request
    is sent, so that the directory is made while the request travels.

    One thread creates the directory, then writes and hashes every file
    and compares each file's hash with the one sent after it.  The event loop hands it batches of about
    BATCH_SIZE bytes and waits while BATCHES_PENDING batches are handed over but not yet written, so memory
    stays bounded whatever the part's size; a small part is one hand-off."""

    def __init__(self, path: Path, fsync: bool, *, replace_stale: bool = False,
                 prepared_in: Path | None = None) -> None:
        self.path = path
        self.fsync = fsync
        #: the data path whose directories made ahead (storage/prepared_dirs.py) the part may be written into:
        #: one of the files the table's last part had, renamed to ``path``; what the body does not bring of
        #: them is removed at the end
        self.prepared_in = prepared_in
        self._prepared: frozenset[str] = frozenset()
        self._opened: set[str] = set()
        #: a directory already at ``path`` (a fetch's leftover) is removed by the thread before it makes its
        #: own, instead of a check on the event loop (a stat there per fetched part); ``replaced_stale`` tells
        self.replace_stale = replace_stale
        self.replaced_stale = False
        self.created = False
        self.error: Exception | None = None
        self.files: dict[str, ReceivedFile] = {}
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[list[Write] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # bytes handed over, not yet written (guarded by _lock)
        self._space: asyncio.Future[None] | None = None  # the loop waits here for _pending to drop
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._batch: list[Write] = []
        self._batch_bytes = 0
        self._batch_limit = BATCH_SIZE
        self._budget = BATCHES_PENDING * BATCH_SIZE
        self._ended = False
        self._aborted = False
        self._fd = -1  # the file being written (writer thread only)
        self._hasher = FileHasher()
        _WORKERS.submit(self._run)

    # ---- event loop side

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    async def add(self, job: Write) -> None:
        self._batch.append(job)
        self._batch_bytes += job.nbytes
        if self._batch_bytes >= self._batch_limit:
            await self._flush()

    async def _flush(self) -> None:
        self._check()
        if not self._batch:
            return
        n = self._batch_bytes
        while True:
            with self._lock:
                if self._pending == 0 or self._pending + n <= self._budget:
                    self._pending += n
                    break
                space = self._space = self._loop.create_future()
            await space
            self._check()
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        self._jobs.put(batch)

    async def finish(self) -> dict[str, ReceivedFile]:
        """Everything written (and fsynced if asked); raises what went wrong in the thread."""
        await self._flush()
        self._ended = True
        self._jobs.put(None)
        await asyncio.shield(self._done)
        self._check()
        return self.files

    async def abort(self) -> None:
        """Stop the thread (skipping what is still queued) and wait for it."""
        self._aborted = True
        if not self._ended:
            self._ended = True
            self._jobs.put(None)
        await asyncio.shield(self._done)

    async def discard(self) -> None:
        """Abort and remove the directory (not when it existed before: it is not ours).  Idempotent."""
        await self.abort()
        if self.created:
            self.created = False
            await asyncio.to_thread(shutil.rmtree, self.path, True)

    # ---- thread side

    def _release(self, n: int) -> None:
        with self._lock:
            self._pending -= n
            space, self._space = self._space, None
        if space is not None:
            self._loop.call_soon_threadsafe(_resolve, space)

    def _run(self) -> None:
        pool: PreparedDirs | None = None
        try:
            if self.prepared_in is not None:
                pool = prepared_for(self.prepared_in, self.path.parent)
            try:
                if pool is None or not self._adopt(pool):
                    self.path.mkdir()
            except FileExistsError:
                if not self.replace_stale:
                    raise
                shutil.rmtree(self.path, True)
                self.replaced_stale = True
                self.path.mkdir()
            self.created = True
        except Exception as e:
            self.error = e
        try:
            while (batch := self._jobs.get()) is not None:
                for job in batch:
                    if self.error is None and not self._aborted:
                        try:
                            self._write(job)
                        except Exception as e:
                            self.error = e
                self._release(sum(job.nbytes for job in batch))
            if self.error is None and not self._aborted:
                for name in self._prepared - self._opened:  # made ahead, not in this part
                    os.unlink(f"{self.path}/{name}")
                if self.fsync:
                    fsync_dir(self.path)
                if pool is not None:
                    pool.note(self.files, self.path.parent)
        except Exception as e:  # an unlink or fsync_dir failing
            self.error = e
        finally:
            self._close()
            try:
                self._loop.call_soon_threadsafe(_resolve, self._done)
            except RuntimeError:  # pragma: no cover - the loop is gone
                pass

    def _adopt(self, pool: PreparedDirs) -> bool:
        """Rename a directory made ahead to ``path``; False (and the directory dropped) if there is none, or
        something is at ``path`` already (the caller's mkdir then decides, as without one)."""
        got = pool.take_for(self.path.parent)
        if got is None:
            return False
        ready, names = got
        try:
            if os.path.lexists(self.path):
                raise FileExistsError(self.path)
            os.rename(ready, self.path)
        except OSError:
            shutil.rmtree(ready, True)
            return False
        self._prepared = names
        return True

    def _close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _write(self, job: Write) -> None:
        # plain descriptors: a Python file object costs three more system calls per file (fstat, ioctl,
        # lseek), each a hand-over of the GIL to a busy event loop
        if job.first:
            self._close()
            path = f"{self.path}/{job.name}"
            if job.name in self._opened:  # as the exclusive creation fails on a name sent twice
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            self._opened.add(job.name)
            made = job.name in self._prepared  # empty: opened, not created (nor truncated: a journal update)
            self._fd = os.open(path, _PREPARED_FLAGS, 0o666) if made else create_file(path, exclusive=True)
            self._hasher = FileHasher()
        fd, hasher = self._fd, self._hasher
        for piece in job.pieces:
            hasher.update(piece)
            write_all(fd, piece)
        if not job.last:
            return
        try:
            if job.name in self._prepared and os.fstat(fd).st_size > hasher.size:
                os.ftruncate(fd, hasher.size)  # cannot be: made empty, never handed out twice
            if self.fsync:
                os.fsync(fd)
        finally:
            self._close()
        digest = hasher.digest()
        if digest != job.sent_hash and not fault_plant.planted("skip_fetch_checksum"):
            raise CorruptedDataError(f"Checksum mismatch for file {job.name} transferred from other replica")
        self.files[job.name] = ReceivedFile(hasher.size, digest)
