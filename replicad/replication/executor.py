"""queueExecuting: run the replication queue's entries, a bounded number at a time.

The selection rules are :class:`replicad.model.queue_state.QueueState`'s; this module owns the I/O:

* GET_PART / ATTACH_PART / MERGE_PARTS / MUTATE_PART — if a local active part already contains the result
  and is registered under ``replicas/<me>/parts``, the entry is done.  A GET_PART whose quorum failed
  (``quorum/failed_parts/<part>``) is done.  Otherwise the result is fetched from a replica that has it or a
  covering part.  Merges and mutations are executed locally by the handlers
  :mod:`replicad.replication.table_ops` registers (``handlers``); without them their result is fetched.
* DROP_RANGE / DROP_PART — part-producing entries inside the range are removed from the queue, local parts
  inside it become outdated (or move to ``detached/`` for DETACH) and their ZooKeeper nodes are removed.
* other types — recorded as failing with an explanatory error (they stay in the queue for a replica that
  can run them; nothing is lost).

Success removes ``queue/<node>`` and updates ``min_unprocessed_insert_time`` / ``max_processed_insert_time``
(one multi; for a fetched part without quorum, in the multi that commits the part:
:mod:`replicad.replication.queue_finish`);
failure keeps the entry with ``num_tries``, ``last_exception`` and a back-off (``retry_not_before``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from replicad.errors import KeeperError, KeeperMultiError, KeeperNoNodeError, ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Delete, Op, Set
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_entry import Selected
from replicad.model.queue_state import QueueState
from replicad.replication.fetcher import NoReplicaHasPartError, PartFetcher
from replicad.replication.part_store import PartState, PartStore
from replicad.replication.queue_finish import QueueFinish
from replicad.replication.quorum import try_mark_quorum_failed, update_quorum
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)

T = LogEntryType
_PRODUCING = frozenset((T.GET_PART, T.ATTACH_PART, T.MERGE_PARTS, T.MUTATE_PART))


class EntryNotReadyError(ReplicadError):
    """The entry cannot complete yet (another part of it is still running); retried later."""

    code = 1000
    retriable = True


class UnsupportedEntryError(ReplicadError):
    code = 48  # NOT_IMPLEMENTED


async def remove_parts_from_zookeeper(keeper: Keeper, paths: TablePaths, names: list[str]) -> None:
    """Remove our ``parts/<name>`` nodes (children first); missing nodes are fine."""
    me = paths.me
    for name in names:
        for path in (me.part_checksums(name), me.part_columns(name), me.part(name)):
            try:
                await keeper.delete(path)
            except KeeperNoNodeError:
                pass


class QueueExecutor(BackgroundTask):
    """Selects runnable entries and runs up to ``max_parallel`` of them concurrently."""

    def __init__(
        self,
        name: str,
        keeper: Keeper,
        paths: TablePaths,
        state: QueueState,
        store: PartStore,
        fetcher: PartFetcher,
        *,
        max_parallel: int = 16,
        max_parallel_fetches: int = 16,
        period_s: float = 1.0,
        on_parts_changed: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name, period_s)
        self.keeper = keeper
        self.paths = paths
        self.state = state
        self.store = store
        self.fetcher = fetcher
        self.max_parallel = max_parallel
        self.max_parallel_fetches = max_parallel_fetches
        self.on_parts_changed = on_parts_changed
        self._running: dict[str, asyncio.Task[None]] = {}
        #: queue nodes of done entries that could not be removed yet (see _delete_leftover_nodes)
        self._undeleted: set[str] = set()
        self._fetches = 0
        #: the running fetches' queue removals, made by their commits (replicad.replication.queue_finish)
        self._finishes: dict[str, QueueFinish] = {}
        self.executed_total = 0
        self.failed_total = 0
        #: entries whose queue node the commit of their part removed
        self.removed_in_commit = 0
        #: hooks for entry types other modules implement: type -> coroutine(selected) -> None
        self.handlers: dict[LogEntryType, Callable[[Selected], Awaitable[None]]] = {}
        #: no new entries start while this says so (read-only: no ZooKeeper session)
        self.is_paused: Callable[[], bool] = lambda: False
        #: why an entry of this type may not start now (SYSTEM STOP FETCHES/MERGES), or None
        self.blocked: Callable[[LogEntryType], str | None] = lambda _t: None
        #: told the part of an entry no replica could provide (the part check looks for it)
        self.on_part_missing: Callable[[str], None] | None = None

    # ------------------------------------------------------------------------------------------ scheduling

    def _extra_check(self, entry: object) -> str | None:
        entry_type = getattr(entry, "type", None)
        if entry_type is not None:
            blocked = self.blocked(entry_type)
            if blocked:
                return blocked
        if getattr(entry, "type", None) in _PRODUCING and self._fetches >= self.max_parallel_fetches:
            return f"Not executing fetch because {self._fetches} fetches are already running"
        return None

    async def _delete_leftover_nodes(self) -> None:
        """Retry removing the queue nodes of done entries whose removal failed."""
        for znode in sorted(self._undeleted):
            try:
                await self.keeper.delete(self.paths.me.queue_entry(znode))
            except KeeperNoNodeError:
                pass
            except KeeperError:
                return  # still no ZooKeeper: next time
            self._undeleted.discard(znode)
            log.info("queue_node_removed_later", node=znode)

    async def run_once(self) -> Outcome:
        if self.is_paused():
            return Outcome("paused", delay_s=1.0, fields={"running": len(self._running)})
        if self._undeleted:
            await self._delete_leftover_nodes()
        started = 0
        now, mono = time.time(), time.monotonic()
        while len(self._running) < self.max_parallel:
            # with the fetch pool full, the fetches waiting in the queue are not even looked at (each start
            # of an entry used to walk the whole queue: quadratic in a drain of a long backlog)
            full = self._fetches >= self.max_parallel_fetches
            selected = self.state.select_entry_to_process(now, self._extra_check, _PRODUCING if full else (),
                                                          mono=mono)
            if selected is None:
                break
            znode = selected.queue_entry.znode_name
            if selected.entry.type in _PRODUCING:
                self._fetches += 1
            task = asyncio.get_running_loop().create_task(self._run(selected), name=f"queue-entry:{znode}")
            self._running[znode] = task
            started += 1
        delay = self._next_retry_delay(mono)
        if self._undeleted:
            delay = min(delay, 1.0) if delay is not None else 1.0
        fields = {"started": started, "running": len(self._running), "queue_size": len(self.state)}
        if started:
            return Outcome("started_entries", did_work=False, delay_s=delay, fields=fields)
        if delay is None and not self._running and len(self.state) == 0:
            # nothing queued: new or finished entries and SYSTEM START … wake the task (this is a safety net)
            delay = IDLE_RECHECK_S
        return Outcome("idle", delay_s=delay, fields=fields)

    def _next_retry_delay(self, now: float) -> float | None:
        return self.state.next_retry_delay(now)

    async def _run(self, selected: Selected) -> None:
        qe = selected.queue_entry
        znode = qe.znode_name
        error = ""
        try:
            await self.execute(selected)
            ok = True
        except asyncio.CancelledError:
            ok, error = False, "cancelled"
            raise
        except Exception as e:  # every failure is recorded on the entry
            ok, error = False, f"{type(e).__name__}: {e}"
            quiet = isinstance(e, NoReplicaHasPartError | EntryNotReadyError)
            if isinstance(e, NoReplicaHasPartError) and self.on_part_missing and selected.entry.new_part_name:
                self.on_part_missing(selected.entry.new_part_name)
            (log.info if quiet else log.warning)("queue_entry_failed", entry=qe.describe(), error=error)
        finally:
            if selected.entry.type in _PRODUCING:
                self._fetches -= 1
            self._running.pop(znode, None)
            finish = self._finishes.pop(znode, None)
            if not ok:
                self.failed_total += 1
                self.state.finish(znode, success=False, now=time.time(), error=error, mono=time.monotonic())
            self.wakeup()
        if ok:
            await self._on_success(znode, finish)

    async def _on_success(self, znode: str, finish: QueueFinish | None = None) -> None:
        """Remove the entry's queue node and write the insert times it changes, in one multi (one ZooKeeper
        request per executed entry instead of two).  The times are read and updated with no wait in between,
        so entries finishing together each write only their own change.  When the part's commit did both
        (``finish``), only the times that differ from those it wrote are written."""
        written = finish.written if finish is not None and finish.applied else None
        # the times ZooKeeper holds: those the commit wrote, else the queue's before this entry leaves it
        held = written if written is not None else (self.state.min_unprocessed_insert_time,
                                                    self.state.max_processed_insert_time)
        self.state.finish(znode, success=True, now=time.time())
        self.executed_total += 1
        removal = Delete(self.paths.me.queue_entry(znode))
        times = self._time_ops(*held)
        if written is not None:
            self.removed_in_commit += 1
            if times:
                await self._write_times(times)
        elif not times:
            await self._remove(znode)
        else:
            try:
                await self.keeper.multi([removal, *times])
            except KeeperMultiError as e:
                if e.index == 0 and not isinstance(e.cause, KeeperNoNodeError):
                    self._keep_undeleted(znode, e)
                elif e.index != 0:  # a time's write failed, and took the removal back with it
                    await self._remove(znode)
                    log.warning("insert_times_update_failed", error=str(e))
                    times = []
                if times:  # the node was gone or stays: the times on their own
                    await self._write_times(times)
            except KeeperError as e:  # unknown outcome (connection loss): removed again later if it stays
                self._keep_undeleted(znode, e)
                await self._write_times(times)
        if self.on_parts_changed is not None:
            self.on_parts_changed()

    async def _remove(self, znode: str) -> None:
        try:
            await self.keeper.delete(self.paths.me.queue_entry(znode))
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            self._keep_undeleted(znode, e)

    async def _write_times(self, ops: list[Op]) -> None:
        try:
            await self.keeper.multi(ops)
        except KeeperError as e:
            log.warning("insert_times_update_failed", error=str(e))

    def _keep_undeleted(self, znode: str, error: KeeperError) -> None:
        # The node stays: deleted again on the next runs (a kazoo session survives a connection loss, so
        # no reload would ever find it; left alone it stays in ZooKeeper's queue/ until a restart).
        log.error("queue_node_remove_failed", node=znode, error=str(error))
        self._undeleted.add(znode)

    def _time_ops(self, before_min: int, before_max: int) -> list[Op]:
        me = self.paths.me
        ops: list[Op] = []
        if self.state.min_unprocessed_insert_time != before_min:
            ops.append(
                Set(me.min_unprocessed_insert_time, str(self.state.min_unprocessed_insert_time).encode())
            )
        if self.state.max_processed_insert_time != before_max:
            ops.append(Set(me.max_processed_insert_time, str(self.state.max_processed_insert_time).encode()))
        return ops

    async def on_stop(self) -> None:
        await self.cancel_running()

    async def cancel_running(self) -> None:
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except BaseException:
                pass

    # ------------------------------------------------------------------------------------------ execution

    async def execute(self, selected: Selected) -> None:
        entry = selected.entry
        handler = self.handlers.get(entry.type)
        if handler is not None:
            await handler(selected)
            return
        if entry.type in _PRODUCING:
            await self._execute_producing(selected)
        else:
            raise UnsupportedEntryError(f"replicad cannot execute {entry.type.value} entries yet")

    async def _execute_producing(self, selected: Selected) -> None:
        entry = selected.entry
        qe = selected.queue_entry
        existing = self.store.get(entry.new_part_name)
        if existing is None or existing.state.value == "Outdated":
            existing = self.store.active_containing(PartInfo.parse(entry.new_part_name))
        if existing is not None and await self.keeper.exists(self.paths.me.part(existing.name)) is not None:
            log.debug("part_already_exists", part=entry.new_part_name, existing=existing.name)
            await self._quorum_of_held(entry, existing.name)
            return
        if (
            existing is not None
            and existing.name == entry.new_part_name
            and existing.state is PartState.ACTIVE
        ):
            # Here but not registered (a commit whose answer was lost, a restart in between): register it,
            # checked against the replicas that have it, instead of downloading it again.
            await self.fetcher.register_local_part(existing)
            await self._quorum_of_held(entry, existing.name)
            return
        if entry.quorum and await self.keeper.exists(
            f"{self.paths.quorum_failed_parts}/{entry.new_part_name}"
        ):
            log.info("skipping_part_with_failed_quorum", part=entry.new_part_name)
            return
        hint = entry.source_replica if entry.type is T.GET_PART else None
        source = await self.fetcher.find_source(entry.new_part_name, hint=hint)
        if source is None:
            if entry.quorum and entry.type is T.GET_PART:
                if await try_mark_quorum_failed(self.keeper, self.paths, entry, self._active_holder):
                    self.state.virtual_parts.remove(entry.new_part_name)
                    return
            raise NoReplicaHasPartError(f"No active replica has part {entry.new_part_name} or covering part")
        if source.part_name != entry.new_part_name:
            reason = self.state.add_future_part_if_not_covered(qe.znode_name, source.part_name)
            if reason is not None:
                raise EntryNotReadyError(
                    f"Will not fetch part {source.part_name} covering {entry.new_part_name}. {reason}"
                )
        else:
            self.state.add_future_part_if_not_covered(qe.znode_name, source.part_name)
        finish = None
        if not entry.quorum:  # a quorum entry stays queued until its quorum is updated
            finish = self._finishes[qe.znode_name] = QueueFinish(
                self.paths.me, qe.znode_name, lambda: self.state.times_if_done(qe.znode_name),
                lambda: (self.state.min_unprocessed_insert_time, self.state.max_processed_insert_time))
        result = await self.fetcher.fetch_part(source.part_name, source.replica, finish)
        if result is None:
            raise EntryNotReadyError(f"Part {source.part_name} is already being fetched")
        if entry.quorum:
            await update_quorum(self.keeper, self.paths, source.part_name)

    async def _quorum_of_held(self, entry: LogEntry, held: str) -> None:
        """A quorum insert's part fetched and committed here by an earlier try whose quorum update was lost
        (a connection loss after the commit): count ourselves now.  18.16 skips the entry and counts itself
        only at its next start-up (updateQuorumIfWeHavePart), leaving every later quorum insert refused
        until then."""
        if entry.quorum and entry.type is T.GET_PART and held == entry.new_part_name:
            await update_quorum(self.keeper, self.paths, held)

    async def _active_holder(self, part_name: str) -> str | None:
        source = await self.fetcher.find_source(part_name)
        return source.replica if source is not None and source.part_name == part_name else None
