"""The leader's merge selecting task and OPTIMIZE: MERGE_PARTS / MUTATE_PART entries in the shared log.

As 18.16's ``mergeSelectingTask``: only while this replica leads, at most every ``sleep_s`` (5 s) unless the
last round assigned something, under one lock shared with OPTIMIZE:

1. take a :class:`~replicad.replication.merge_predicate.MergePredicate` snapshot (pulls the log);
2. if the queue already holds ``max_replicated_merges_in_queue`` merges and part mutations, stop; else the
   biggest merge allowed shrinks as the queue fills (``getMaxSourcePartsSize``: exponential between
   ``max_bytes_to_merge_at_min_space_in_pool`` and ``…_at_max_space_in_pool`` once fewer than
   ``number_of_free_entries_in_pool_to_lower_max_size_of_merge`` slots are free; at most half the free disk);
3. pick a merge among this replica's active parts with
   :func:`~replicad.replication.merge_selector.select_merge` (neighbours must satisfy the predicate);
4. if there is none and mutations exist, pick the first part (not bigger than that size) whose desired
   mutation version is newer than its own and assign a MUTATE_PART to that version;
5. write the entry: every source must be registered under ``replicas/<me>/parts`` (a local part missing there
   for 5 minutes is sent to the part check), then one multi creates ``log/log-`` and sets ``/log`` with the
   version read before the snapshot (a concurrent assignment makes it fail; we simply try again).

``optimize`` is OPTIMIZE TABLE [PARTITION p] [FINAL]: all parts of a partition (of every partition with
FINAL and no PARTITION) in one merge, or one aggressively chosen merge otherwise.  It waits for pending
merges of the partition instead of giving up at once (18.16 returns immediately), and, with
``replication_alter_partitions_sync``, for the replicas to execute the entries.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from replicad.errors import KeeperBadVersionError, KeeperMultiError, ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Op, Set
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_state import QueueState
from replicad.replication.merge_predicate import MergePredicate
from replicad.replication.merge_selector import (
    MergeCandidate,
    MergeChoice,
    MergeSelectorSettings,
    NoMerge,
    select_all_in_partition,
    select_merge,
)
from replicad.replication.part_store import LocalPart, PartStore
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)

MAX_AGE_OF_LOCAL_PART_THAT_WASNT_ADDED_TO_ZOOKEEPER = 300
DISK_USAGE_COEFFICIENT_TO_SELECT = 2
CANNOT_ASSIGN_OPTIMIZE = 388
NOT_IMPLEMENTED = 48


class CannotAssignOptimizeError(ReplicadError):
    code = CANNOT_ASSIGN_OPTIMIZE
    http_status = 500


@dataclass(frozen=True)
class AssignerSettings:
    """MergeTree settings (ClickHouse names and 18.16 defaults) the assignment uses."""

    max_replicated_merges_in_queue: int = 16
    number_of_free_entries_in_pool_to_lower_max_size_of_merge: int = 8
    max_bytes_to_merge_at_min_space_in_pool: int = 1 << 20
    max_bytes_to_merge_at_max_space_in_pool: int = 150 << 30
    #: MERGE_SELECTING_SLEEP_MS: pause after a round that assigned nothing
    sleep_s: float = 5.0
    selector: MergeSelectorSettings = field(default_factory=MergeSelectorSettings)

    @classmethod
    def from_settings(cls, s: dict[str, Any], **overrides: Any) -> AssignerSettings:
        base = cls()

        def get(name: str) -> int:
            return int(s.get(name, getattr(base, name)))

        max_at_max = get("max_bytes_to_merge_at_max_space_in_pool")
        return replace(
            cls(
                max_replicated_merges_in_queue=get("max_replicated_merges_in_queue"),
                number_of_free_entries_in_pool_to_lower_max_size_of_merge=get(
                    "number_of_free_entries_in_pool_to_lower_max_size_of_merge"
                ),
                max_bytes_to_merge_at_min_space_in_pool=get("max_bytes_to_merge_at_min_space_in_pool"),
                max_bytes_to_merge_at_max_space_in_pool=max_at_max,
                selector=MergeSelectorSettings(max_bytes_to_merge_at_max_space_in_pool=max_at_max),
            ),
            **overrides,
        )

    def max_source_parts_size(self, queued: int, free_disk: int) -> int:
        """``getMaxSourcePartsSize(max_replicated_merges_in_queue, queued)``."""
        pool = self.max_replicated_merges_in_queue
        free_entries = max(pool - queued, 0)
        lower_at = self.number_of_free_entries_in_pool_to_lower_max_size_of_merge
        lo, hi = self.max_bytes_to_merge_at_min_space_in_pool, self.max_bytes_to_merge_at_max_space_in_pool
        if free_entries >= lower_at:
            size = hi
        else:
            ratio = free_entries / lower_at if lower_at else 1.0
            size = int(lo * (hi / lo) ** ratio) if lo > 0 else 0
        return min(size, free_disk // DISK_USAGE_COEFFICIENT_TO_SELECT)


@dataclass(frozen=True)
class Assigned:
    entries: tuple[LogEntry, ...] = ()
    reason: str = ""


def _candidates(parts: Sequence[LocalPart], now: float) -> list[MergeCandidate]:
    """Blocking (``bytes_on_disk`` stats the files the first time): run in a thread."""
    return [
        MergeCandidate(p.name, p.directory.bytes_on_disk, max(0.0, now - p.modification_time), p.info)
        for p in parts
    ]


class MergeAssigner(BackgroundTask):
    """mergeSelectingTask + OPTIMIZE for one table."""

    def __init__(
        self,
        name: str,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        queue: QueueState,
        load_predicate: Callable[[], Awaitable[MergePredicate]],
        is_leader: Callable[[], bool],
        *,
        settings: AssignerSettings | None = None,
        tz: str = "UTC",
        has_mutations: Callable[[], bool] = lambda: False,
        on_assigned: Callable[[], None] = lambda: None,
        enqueue_part_check: Callable[[str], None] = lambda _name: None,
    ) -> None:
        self.settings = settings or AssignerSettings()
        super().__init__(name, self.settings.sleep_s)
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.queue = queue
        self.load_predicate = load_predicate
        self.is_leader = is_leader
        self.tz = tz
        self.has_mutations = has_mutations
        self.on_assigned = on_assigned
        self.enqueue_part_check = enqueue_part_check
        #: merge_selecting_mutex: the task and OPTIMIZE never select at the same time
        self.selecting_lock = asyncio.Lock()
        self.assigned_merges = 0
        self.assigned_mutations = 0
        #: the last round found at most one part per partition and no mutation: nothing to look at again
        #: until woken (a new part, a mutation, leadership); parts merely ageing cannot change it
        self._structurally_idle = False
        self._round_free_disk: int | None = None

    # ------------------------------------------------------------------------------------------ the task

    async def run_once(self) -> Outcome:
        if not self.is_leader():
            return Outcome("not_leader", delay_s=self.settings.sleep_s)
        try:
            result = await self.assign_once()
        except ReplicadError as e:
            log.warning("merge_selecting_failed", error=str(e))
            return Outcome("failed", delay_s=self.settings.sleep_s, fields={"error": str(e)})
        fields = {"entries": [e.new_part_name for e in result.entries], "reason": result.reason}
        if result.entries:
            return Outcome("assigned", did_work=True, fields=fields)
        if self._structurally_idle:
            return Outcome("nothing_to_merge", delay_s=IDLE_RECHECK_S, fields=fields)
        return Outcome("nothing_to_merge", fields=fields)

    def _queued(self) -> int:
        return sum(
            1 for qe in self.queue.entries if qe.type in (LogEntryType.MERGE_PARTS, LogEntryType.MUTATE_PART)
        )

    async def _free_disk(self) -> int:
        path: Path = self.store.layout.path
        try:
            return (await asyncio.to_thread(shutil.disk_usage, path)).free
        except OSError:
            return 1 << 62

    async def _candidates(self, parts: Sequence[LocalPart]) -> list[MergeCandidate]:
        """The parts as merge candidates: on the loop when every part's size is known already (the parts
        this process wrote, fetched or merged: no file to stat), else in a thread."""
        if all("bytes_on_disk" in p.directory.__dict__ for p in parts):  # cached_property's cache
            return _candidates(parts, time.time())
        return await asyncio.to_thread(_candidates, parts, time.time())

    async def _free_disk_this_round(self) -> int:
        """The free disk space, asked once per round (a statvfs in a thread), only when the round gets that
        far (an idle table's round never asks)."""
        if self._round_free_disk is None:
            self._round_free_disk = await self._free_disk()
        return self._round_free_disk

    async def _nothing_to_select(self) -> bool:
        """True when no merge could be selected whatever ZooKeeper says, so the round may skip the snapshot
        (the ZooKeeper reads that make an idle table cost something).  Exact, not a guess: the predicate only
        cuts the partitions into smaller ranges, and a smaller range allows no window the whole partition
        does not (fewer parts lower the base less; every start is scanned here); only mutations need it."""
        if self.has_mutations():
            return False
        parts = self.store.active()
        if len({p.info.partition_id for p in parts}) == len(parts):  # at most one part per partition
            self._structurally_idle = True  # only a new part (which wakes the task) can change that
            return True
        max_size = self.settings.max_source_parts_size(self._queued(), await self._free_disk_this_round())
        if max_size <= 0:
            return True
        candidates = await self._candidates(parts)
        everything = replace(self.settings.selector, max_window_starts=max(len(candidates), 1))
        return select_merge(candidates, lambda _l, _r: True, everything, max_size) is None

    async def assign_once(self) -> Assigned:
        async with self.selecting_lock:
            self._structurally_idle = False
            self._round_free_disk = None
            if await self._nothing_to_select():
                return Assigned(reason="nothing to merge")
            predicate = await self.load_predicate()
            queued = self._queued()
            s = self.settings
            if queued >= s.max_replicated_merges_in_queue:
                return Assigned(reason=f"{queued} merges and mutations already in the queue")
            max_size = s.max_source_parts_size(queued, await self._free_disk_this_round())
            if max_size <= 0:
                return Assigned(reason="no room for merges")
            parts = self.store.active()
            candidates = await self._candidates(parts)
            choice = select_merge(candidates, predicate.can_merge, s.selector, max_size)
            if choice is not None:
                entry = await self.create_merge_entry(predicate, choice.parts, choice.new_part_name)
                return Assigned((entry,) if entry else ())
            if not self.has_mutations():
                return Assigned(reason="nothing to merge")
            for cand in candidates:
                if cand.size_bytes > max_size:
                    continue
                info = cand.info
                version = predicate.desired_mutation_version(info)
                if version is None:
                    continue
                entry = await self.create_mutate_entry(predicate, info, version)
                if entry is not None:
                    return Assigned((entry,))
            return Assigned(reason="nothing to merge or mutate")

    # ------------------------------------------------------------------------------------------ entries

    async def _all_registered(self, names: Sequence[str]) -> bool:
        """Whether every part is under ``replicas/<me>/parts`` (18.16 asks ZooKeeper for each; the parts this
        process registered itself are known to be: LocalPart.registered)."""
        unknown = [n for n in names if not ((p := self.store.get(n)) is not None and p.registered)]
        stats = await asyncio.gather(*(self.keeper.exists(self.paths.me.part(n)) for n in unknown))
        ok = True
        now = time.time()
        for name, stat in zip(unknown, stats, strict=True):
            if stat is not None:
                continue
            ok = False
            part = self.store.get(name)
            if (
                part is not None
                and now - part.modification_time > MAX_AGE_OF_LOCAL_PART_THAT_WASNT_ADDED_TO_ZOOKEEPER
            ):
                log.warning("part_selected_for_merge_not_in_zookeeper", part=name)
                self.enqueue_part_check(name)
        return ok

    async def _write_entry(self, predicate: MergePredicate, entry: LogEntry) -> LogEntry | None:
        ops: list[Op] = [
            Create(self.paths.log_prefix, entry.to_bytes(self.tz), sequence=True),
            Set(self.paths.log, b"", predicate.log_version),
        ]
        try:
            results = await self.keeper.multi(ops)
        except KeeperMultiError as e:
            if isinstance(e.cause, KeeperBadVersionError):
                log.info("log_changed_while_assigning", part=entry.new_part_name)
                return None
            raise
        created = entry.with_znode(basename(str(results[0])))
        predicate.log_version += 1  # our own Set: the snapshot is still ours for further entries
        self.on_assigned()
        return created

    async def create_merge_entry(
        self,
        predicate: MergePredicate,
        parts: Sequence[str],
        new_part_name: str,
        *,
        deduplicate: bool = False,
    ) -> LogEntry | None:
        """createLogEntryToMergeParts; None when a source is not registered or the log moved on."""
        if not await self._all_registered(parts):
            return None
        entry = LogEntry.merge_parts(
            list(parts),
            new_part_name,
            source_replica=self.paths.replica_name,
            create_time=int(time.time()),
            deduplicate=deduplicate,
        )
        created = await self._write_entry(predicate, entry)
        if created is not None:
            self.assigned_merges += 1
            log.info("assigned_merge", part=new_part_name, sources=list(parts), log_entry=created.znode_name)
        return created

    async def create_mutate_entry(
        self, predicate: MergePredicate, part: PartInfo, version: int
    ) -> LogEntry | None:
        """createLogEntryToMutatePart."""
        if not await self._all_registered([part.name]):
            return None
        new_name = part.with_mutation(version).name
        entry = LogEntry.mutate_part(
            part.name, new_name, source_replica=self.paths.replica_name, create_time=int(time.time())
        )
        created = await self._write_entry(predicate, entry)
        if created is not None:
            self.assigned_mutations += 1
            log.info("assigned_mutation", part=part.name, new_part=new_name, log_entry=created.znode_name)
        return created

    # ------------------------------------------------------------------------------------------ OPTIMIZE

    async def optimize(
        self,
        partition_id: str | None,
        *,
        final: bool,
        deduplicate: bool = False,
        throw_if_noop: bool = False,
        patience_s: float = 60.0,
    ) -> list[LogEntry]:
        """Assign the merge(s) OPTIMIZE asks for; [] if none could be (CannotAssignOptimizeError with
        ``throw_if_noop``).  A partition whose parts are still being fetched, merged or mutated by the queue
        is waited for (up to ``patience_s``), so that FINAL really leaves one part."""
        if deduplicate:
            raise ReplicadError("OPTIMIZE … DEDUPLICATE is not supported by replicad", code=NOT_IMPLEMENTED)
        deadline = time.monotonic() + patience_s
        entries: list[LogEntry] = []
        todo: list[str] | None = None if partition_id is None else [partition_id]
        while True:
            patient = time.monotonic() < deadline
            done, reason, todo = await self._optimize_once(partition_id, final, todo, patient)
            entries += done
            if not todo or not patient:
                break
            await asyncio.sleep(0.2)
        if not entries and reason:
            log.info("cannot_select_parts_for_optimization", reason=reason)
            if throw_if_noop:
                raise CannotAssignOptimizeError(reason)
        return entries

    async def _optimize_once(
        self, partition_id: str | None, final: bool, todo: list[str] | None, patient: bool
    ) -> tuple[list[LogEntry], str, list[str]]:
        """One attempt: (entries written, why nothing was for some partition, partitions to try again)."""
        async with self.selecting_lock:
            predicate = await self.load_predicate()
            if todo is None and (partition_id is not None or final):
                todo = sorted({p.info.partition_id for p in self.store.active()})
            # queue first, parts second: a fetch activates its part before its entry leaves the queue
            pending = {pid for pid in todo or () if patient and self._merging_pending(pid)}
            parts = self.store.active()
            candidates = await asyncio.to_thread(_candidates, parts, time.time())
            free = await self._free_disk()
            if partition_id is None and not final:
                aggressive = replace(self.settings.selector, base=1.0)
                limit = self.settings.max_bytes_to_merge_at_max_space_in_pool
                best = select_merge(candidates, predicate.can_merge, aggressive, limit)
                if best is None:
                    retry = ["*"] if self._merging_pending(None) else []
                    return [], "Cannot select parts for optimization", retry
                entry = await self.create_merge_entry(predicate, best.parts, best.new_part_name)
                if entry is None:
                    return [], "Can't create merge queue node in ZooKeeper", ["*"]
                return [entry], "", []
            entries: list[LogEntry] = []
            reasons: list[str] = []
            again: list[str] = []
            for pid in todo or ():
                if pid in pending:
                    reasons.append(f"Entries producing parts of partition {pid} are still in the queue")
                    again.append(pid)
                    continue
                choice = self._select_partition(candidates, pid, predicate, free, final)
                if isinstance(choice, NoMerge):
                    if partition_id is not None or not choice.reason.startswith("There are no parts"):
                        reasons.append(choice.reason)
                    continue
                entry = await self.create_merge_entry(predicate, choice.parts, choice.new_part_name)
                if entry is None:
                    reasons.append("Can't create merge queue node in ZooKeeper")
                    again.append(pid)
                    continue
                entries.append(entry)
            return entries, "; ".join(reasons), again

    def _select_partition(
        self, candidates: list[MergeCandidate], pid: str, predicate: MergePredicate, free: int, final: bool
    ) -> MergeChoice | NoMerge:
        mine = [c for c in candidates if c.info.partition_id == pid]
        if len(mine) == 1 and final:
            reason = predicate.merge_blocker(mine[0].info, mine[0].info)  # 18.16: "merge with itself"
            if reason is not None:
                return NoMerge(reason)
        reasons: list[str] = []

        def can_merge(left: PartInfo, right: PartInfo) -> bool:
            r = predicate.merge_blocker(left, right)
            if r is not None:
                reasons.append(r)
            return r is None

        choice = select_all_in_partition(
            candidates, pid, can_merge, final=final, max_total_size=free // DISK_USAGE_COEFFICIENT_TO_SELECT
        )
        if isinstance(choice, NoMerge) and reasons:
            return NoMerge(reasons[0])
        return choice

    def _merging_pending(self, partition_id: str | None) -> bool:
        """Whether entries that produce parts of the partition are queued (worth waiting for)."""
        for qe in self.queue.entries:
            info = PartInfo.try_parse(qe.entry.new_part_name) if qe.entry.new_part_name else None
            if info is None or info.is_fake_drop_range:
                continue
            if partition_id is None or info.partition_id == partition_id:
                return True
        return False
