"""queueUpdatingTask: copy new entries of the shared ``log/`` into this replica's ``queue/``.

As 18.16's ``pullLogsToQueue``: read ``log_pointer`` and the children of ``log/`` (arming a watch that wakes
the task), drop entries below the pointer (an empty pointer starts at the smallest entry and is written at
once), and in batches of at most 100 run one multi that creates ``queue/queue-`` nodes with the log nodes'
bytes unchanged, sets ``log_pointer`` to the last index + 1 and, when it moved,
``min_unprocessed_insert_time``.
Only after the multi succeeded are the entries handed to the in-memory queue.

``log_pointer`` is read once; after that the value and version this replica wrote last are used, and the
multi sets it only at that version (18.16 reads it on every pass: one request per replica per log entry).
Only this replica's puller moves it, but a clone of a lost replica sets it too: the multi then fails on the
version, and the pass reads the pointer again.  After any failed pass it is read again as well.

A batch of only this replica's own inserts, done here (replicad.replication.own_inserts), needs no queue
node: its pass writes nothing at once.  The pointer moves in memory, and ZooKeeper's copy follows at most
:data:`POINTER_FLUSH_DELAY_S` later (one ``set`` for all the batches deferred meanwhile), or with the next
pass that writes queue nodes.  Until then ZooKeeper's pointer is behind, never ahead: a restart (or a clone
copying it) pulls those entries again and finds their parts here, as after a crash between commit and
pull in 18.16.  An active replica is never marked lost, so the lag only keeps a few log entries longer.

``load_queue`` reads ``queue/`` back at start-up (the queue survives restarts in ZooKeeper).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from replicad import fault_plant
from replicad.errors import (
    KeeperBadVersionError,
    KeeperConnectionLossError,
    KeeperError,
    KeeperMultiError,
    KeeperOperationTimeoutError,
    KeeperSessionExpiredError,
    ZnodeFormatError,
)
from replicad.keeper.client import Keeper, WatchEvent
from replicad.keeper.ops import Create, Op, Set, ZnodeStat
from replicad.keeper.paths import TablePaths, basename, pad_index, sequence_number
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replication.own_inserts import OwnInserts
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)

#: ZooKeeper closes the connection when a request exceeds jute.maxbuffer (1 MB): 18.16's batch size.
MAX_MULTI_OPS = 100
QUEUE_UPDATE_ERROR_SLEEP_S = 1.0
#: how long ZooKeeper's ``log_pointer`` may stay behind the own entries done here without a queue node
POINTER_FLUSH_DELAY_S = 0.5


def parse_entry(data: bytes, znode_name: str, ctime_ms: int, tz: str) -> LogEntry:
    return LogEntry.parse(data, tz=tz, znode_name=znode_name, ctime=ctime_ms // 1000)


async def load_queue(keeper: Keeper, paths: TablePaths, tz: str = "UTC") -> tuple[list[LogEntry], int]:
    """Every entry of ``replicas/<me>/queue`` in order, and the log pointer (0 when empty)."""
    me = paths.me
    raw_pointer, _ = await keeper.get(me.log_pointer)
    pointer = int(raw_pointer) if raw_pointer.strip() else 0
    names = sorted(await keeper.get_children(me.queue))
    nodes = await keeper.get_many([me.queue_entry(n) for n in names])
    entries: list[LogEntry] = []
    for name, node in zip(names, nodes, strict=True):
        if node is None:
            continue
        data, stat = node
        entries.append(parse_entry(data, name, stat.ctime_ms, tz))
    return entries, pointer


class LogPuller:
    """Pulls the shared log into our queue; ``on_entries`` receives what was appended (in order)."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        on_entries: Callable[[list[LogEntry]], None],
        *,
        tz: str = "UTC",
        min_unprocessed_insert_time: Callable[[], int] = lambda: 0,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.on_entries = on_entries
        self.tz = tz
        self._min_unprocessed = min_unprocessed_insert_time
        self.log_pointer = 0
        self.wake: Callable[[], None] = lambda: None
        #: told the entries read from the log before they are copied into the queue (the fetcher starts
        #: checking their sources, so that this overlaps with the copy)
        self.on_read: Callable[[list[LogEntry]], None] | None = None
        #: pull_logs_to_queue_mutex: the merge predicate, SYNC REPLICA and the task pull concurrently
        self._pull_lock = asyncio.Lock()
        #: is this ``queue/`` node in the in-memory queue (set by the replica; see :meth:`_resync`)
        self.known: Callable[[str], bool] | None = None
        self._resync_needed = False
        #: the version of ``log_pointer`` as this replica last read or wrote it (None: read it first)
        self._pointer_version: int | None = None
        #: this replica's own inserts, done when read back: not queued (replicad.replication.own_inserts)
        self.own: OwnInserts | None = None
        #: 0: every pass writes the pointer it moved (as 18.16)
        self.pointer_flush_delay_s = POINTER_FLUSH_DELAY_S
        #: when the pointer first moved without being written (monotonic; None: ZooKeeper's is current)
        self._deferred_since: float | None = None
        #: deferred pointer writes made (tests)
        self.pointer_flushes = 0

    def reset_pointer(self, pointer: int) -> None:
        """The pointer as just read from ZooKeeper with the queue (start-up): the next pass reads it again."""
        self.log_pointer = pointer
        self._pointer_version = None
        self._deferred_since = None

    def flush_in(self, now: float | None = None) -> float | None:
        """Seconds until the deferred pointer write is due (0: now); None when nothing is deferred."""
        since = self._deferred_since
        if since is None:
            return None
        t = time.monotonic() if now is None else now
        return max(0.0, since + self.pointer_flush_delay_s - t)

    async def flush_pointer(self) -> bool:
        """Write the pointer moved by deferred passes (at the version written last); True when one was
        written.  A failure leaves the pointer to be read again by the next pass (it then pulls the deferred
        entries again: they are queued and found done)."""
        async with self._pull_lock:
            if self._deferred_since is None:
                return False
            self._deferred_since = None
            version = self._pointer_version
            if version is None:  # read again by the next pass, which writes it
                return False
            try:
                stat = await self.keeper.set(self.paths.me.log_pointer, str(self.log_pointer).encode(),
                                             version)
            except KeeperBadVersionError:  # moved by someone else (a clone): the next pass reads it
                self._pointer_version = None
                log.info("log_pointer_moved_rereading", log_pointer=self.log_pointer)
                return False
            except BaseException:
                self._pointer_version = None
                raise
            self._pointer_version = stat.version
            self.pointer_flushes += 1
            return True

    def _on_watch(self, _event: WatchEvent) -> None:
        self.wake()

    async def pull(self) -> int:
        """One pullLogsToQueue pass; returns the number of entries copied."""
        async with self._pull_lock:
            for attempt in range(3):
                try:
                    return await self._pull()
                except _PointerMoved:
                    log.info("log_pointer_moved_rereading", log_pointer=self.log_pointer)
                    if attempt == 2:
                        raise
                except BaseException:
                    self._pointer_version = None
                    raise
            raise AssertionError("unreachable")

    async def _pull(self) -> int:
        me = self.paths.me
        if self._resync_needed:
            await self._resync()
        if self._pointer_version is not None:  # ours as last written: the multi checks its version
            children = await self.keeper.get_children(self.paths.log, watch=self._on_watch)
            index = self.log_pointer
        else:
            # one pipelined round: the pointer is read before the log is listed, as ZooKeeper answers in order
            (raw_pointer, stat), children = await asyncio.gather(
                self.keeper.get(me.log_pointer),
                self.keeper.get_children(self.paths.log, watch=self._on_watch),
            )
            if not raw_pointer.strip():
                logs = [c for c in children if c.startswith("log-")]
                index = sequence_number(min(logs)) if logs else 0
                stat = await self.keeper.set(me.log_pointer, str(index).encode())
            else:
                index = int(raw_pointer)
            self._pointer_version = stat.version
            self.log_pointer = index
            self._deferred_since = None  # read back: what was deferred is pulled again
        first = f"log-{pad_index(index)}"
        # only the entries at or past the pointer are sorted (the log keeps ~100 and more already pulled)
        todo = sorted(c for c in children if c >= first and c.startswith("log-"))
        copied = 0
        for start in range(0, len(todo), MAX_MULTI_OPS):
            copied += await self._copy_batch(todo[start : start + MAX_MULTI_OPS])
        return copied

    async def _read_entries(self, names: list[str]) -> list[tuple[LogEntry, bytes]]:
        """The entries ``names`` and their bytes: those this process wrote itself from memory
        (:meth:`OwnInserts.known`), the others read in one pipelined round."""
        own = self.own
        known = [None if own is None else own.known(n) for n in names]
        unread = [n for n, k in zip(names, known, strict=True) if k is None]
        nodes = iter(await self.keeper.get_many([self.paths.log_entry(n) for n in unread]) if unread else ())
        out: list[tuple[LogEntry, bytes]] = []
        for name, mine in zip(names, known, strict=True):
            if mine is not None:
                out.append(mine)
                continue
            node = next(nodes)
            if node is None:  # removed by the cleanup thread between list and get: it was pulled by all
                raise KeeperError(
                    f"log entry {name} disappeared while pulling (log_pointer moved?)", retriable=True
                )
            data, stat = node
            try:
                out.append((parse_entry(data, name, stat.ctime_ms, self.tz), data))
            except ZnodeFormatError as e:
                raise ZnodeFormatError(f"cannot parse {self.paths.log_entry(name)}: {e}") from e
        return out

    async def _copy_batch(self, names: list[str]) -> int:
        me = self.paths.me
        ops: list[Op] = []
        entries: list[LogEntry] = []
        done: list[LogEntry] = []  # read in order: entries queued and done, for OwnInserts.take
        read: list[LogEntry] = []
        min_insert_time = self._min_unprocessed()
        new_min: int | None = None
        for entry, data in await self._read_entries(names):
            if entry.type is LogEntryType.GET_PART and fault_plant.once("drop_log_entry"):
                continue  # test-only planted bug: the entry is lost, the log pointer moves past it
            taken = self.own is not None and self.own.take(entry, read)
            read.append(entry)
            if taken:
                done.append(entry)
                continue
            entries.append(entry)
            ops.append(Create(me.queue_prefix, data, sequence=True))
            if entry.type is LogEntryType.GET_PART and entry.create_time:
                current = new_min if new_min is not None else min_insert_time
                if not current or entry.create_time < current:
                    new_min = entry.create_time
        if self.on_read is not None:
            self.on_read(entries)
        last_index = sequence_number(names[-1])
        deferrable = self._pointer_version is not None and self.pointer_flush_delay_s > 0
        if not ops and new_min is None and deferrable:
            # only own entries done here: nothing to write now (see the module's docstring)
            self.log_pointer = last_index + 1
            if self._deferred_since is None:
                self._deferred_since = time.monotonic()
            log.debug("pulled_own_entries", done_here=len(done), first=names[0], last=names[-1])
            if self.own is not None:
                self.own.apply(done)
            return len(done)
        pointer_op = len(ops)
        version = self._pointer_version
        ops.append(Set(me.log_pointer, str(last_index + 1).encode(), -1 if version is None else version))
        if new_min is not None:
            ops.append(Set(me.min_unprocessed_insert_time, str(new_min).encode()))
        try:
            results = await self.keeper.multi(ops)
        except (KeeperConnectionLossError, KeeperOperationTimeoutError):
            # Applied or not, we cannot tell: if it was, the pointer has moved past these entries and only
            # ZooKeeper's queue/ has them.  The next pull looks there first.
            self._resync_needed = True
            raise
        except KeeperMultiError as e:
            if e.index == pointer_op and isinstance(e.cause, KeeperBadVersionError):
                self._pointer_version = None  # moved by someone else (a clone): read it again
                raise _PointerMoved() from e
            raise
        written = results[pointer_op]
        self._pointer_version = written.version if isinstance(written, ZnodeStat) else None
        self._deferred_since = None  # this write covers every deferred pass
        entries = [e.with_znode(basename(str(results[i]))) for i, e in enumerate(entries)]
        self.log_pointer = last_index + 1
        log.debug("pulled_log_entries", count=len(entries), done_here=len(done), first=names[0],
                  last=names[-1])
        if done and self.own is not None:
            self.own.apply(done)
        if entries or not done:
            self.on_entries(entries)
        return len(entries) + len(done)


    async def _resync(self) -> None:
        """After a copy whose outcome is unknown: hand over the ``queue/`` nodes the in-memory queue lacks (a
        kazoo session survives a connection loss, so nothing else would reload the queue)."""
        entries, _pointer = await load_queue(self.keeper, self.paths, self.tz)
        self._resync_needed = False
        known = self.known
        missing = [e for e in entries if known is not None and not known(e.znode_name)]
        if missing:
            log.warning("queue_resynced", entries=[e.znode_name for e in missing])
            self.on_entries(missing)


class _PointerMoved(KeeperError):
    """The multi's ``log_pointer`` version was not the one this replica last wrote."""

    def __init__(self) -> None:
        super().__init__("log_pointer was moved by another writer", retriable=True)


class QueueUpdatingTask(BackgroundTask):
    """Runs ``LogPuller.pull`` whenever the ``log/`` watch fires (and every ``period_s`` as a safety net), and
    writes a deferred ``log_pointer`` once it is due: a run the timer starts for that writes only the pointer.
    """

    def __init__(self, name: str, puller: LogPuller, period_s: float = IDLE_RECHECK_S) -> None:
        super().__init__(name, period_s)
        self.puller = puller
        puller.wake = self.wakeup
        self._woken = True  # the first run pulls

    async def wait(self, seconds: float) -> bool:
        self._woken = await super().wait(seconds)
        return self._woken

    async def run_once(self) -> Outcome:
        puller = self.puller
        woken, self._woken = self._woken, True
        n = 0
        try:
            if woken or puller.flush_in() is None:  # the watch, or the safety net: pull
                n = await puller.pull()
            if puller.flush_in() == 0.0:
                await puller.flush_pointer()
        except KeeperSessionExpiredError as e:
            return Outcome("session_expired", delay_s=QUEUE_UPDATE_ERROR_SLEEP_S, fields={"error": str(e)})
        except KeeperError as e:
            log.warning("queue_update_failed", error=str(e))
            return Outcome("keeper_error", delay_s=QUEUE_UPDATE_ERROR_SLEEP_S, fields={"error": str(e)})
        due = puller.flush_in()
        return Outcome("pulled_entries" if n else "idle",
                       delay_s=None if due is None else min(due, self.period_s),
                       fields={"entries": n, "log_pointer": puller.log_pointer})

    async def on_stop(self) -> None:
        """A deferred pointer is written before the task ends (a clean stop leaves ZooKeeper's current)."""
        if self.puller.flush_in() is None:
            return
        try:
            async with asyncio.timeout(2.0):
                await self.puller.flush_pointer()
        except (KeeperError, TimeoutError) as e:
            log.info("log_pointer_not_written_at_stop", error=str(e), log_pointer=self.puller.log_pointer)
