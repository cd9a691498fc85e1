"""The pure core of a replica's replication queue (ClickHouse's ``ReplicatedMergeTreeQueue``).

It knows the queue entries (in execution-preference order), ``virtual_parts`` (every part that will exist
once the whole queue has been executed, plus drop ranges that must block merge assignment),
``current_parts`` (parts that exist now or are produced by entries already executed) and ``future_parts``
(ranges being produced right now, each tagged by the entry producing it).  ``select_entry_to_process``
applies ``shouldExecuteLogEntry``'s rules and records why the other entries were postponed; ``finish``
applies an entry's outcome.  No I/O: the replication/ package persists queue nodes and runs the entries.

Rules (18.16 plus the modern refinements that matter for correctness):

* an entry producing a part (GET/ATTACH/MERGE/MUTATE/CLONE) waits while that part, or a part covering or
  overlapping it, is being produced by another entry;
* MERGE_PARTS / MUTATE_PART wait while one of their source parts is being produced, or overlaps a part
  another executing entry produces (it is being merged away or dropped);
* DROP_RANGE / DROP_PART / REPLACE_RANGE / CLEAR_COLUMN / CLEAR_INDEX wait while an executing entry
  produces a part that intersects their range; while they execute, their range is a future part, so
  nothing inside it starts;
* ALTER_METADATA entries run in alter-version order; an ALTER's MUTATE_PART waits for its metadata change;
* after a failure an entry is retried with exponential back-off (capped per kind of work; monotonic clock);
* an entry whose result is covered by a current part is still selected, with ``covering_part`` set, so the
  executor just confirms and drops it (ClickHouse's executeLogEntry shortcut).
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.part_set import ActivePartSet, AddOutcome
from replicad.model.queue_entry import BackoffSettings, QueueEntry, Selected

T = LogEntryType
_PRODUCING = frozenset((T.GET_PART, T.ATTACH_PART, T.MERGE_PARTS, T.MUTATE_PART, T.CLONE_PART_FROM_SHARD))
_RANGE_OPS = frozenset((T.DROP_RANGE, T.DROP_PART, T.REPLACE_RANGE, T.CLEAR_COLUMN, T.CLEAR_INDEX))
_INSERTS = frozenset((T.GET_PART, T.ATTACH_PART))

#: Part names parsed once: the selection compares every candidate with every future part, for every entry
#: started (a drain of 10,000 entries spent half its CPU parsing the same few names again).
_parse = functools.lru_cache(maxsize=1 << 14)(PartInfo.parse)


@dataclass(frozen=True)
class FinishResult:
    #: Current parts that the executed entry made obsolete.
    replaced_parts: tuple[str, ...] = ()
    #: Result parts that could not be recorded because they intersect a current part (a bug elsewhere).
    intersecting: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class QueueStatus:
    """The queue's share of system.replicas."""

    queue_size: int
    inserts_in_queue: int
    merges_in_queue: int
    part_mutations_in_queue: int
    future_parts: int
    queue_oldest_time: int
    inserts_oldest_time: int
    merges_oldest_time: int
    part_mutations_oldest_time: int
    oldest_part_to_get: str
    oldest_part_to_merge_to: str
    oldest_part_to_mutate_to: str
    last_queue_update: float


ExtraCheck = Callable[[LogEntry], str | None]


class QueueState:
    def __init__(self, *, new_contains: bool = False, backoff: BackoffSettings | None = None) -> None:
        self.new_contains = new_contains
        self.backoff = backoff or BackoffSettings()
        self.entries: list[QueueEntry] = []
        self._by_znode: dict[str, QueueEntry] = {}
        self._executing: dict[str, QueueEntry] = {}
        self.virtual_parts = ActivePartSet(new_contains=new_contains)
        self.current_parts = ActivePartSet(new_contains=new_contains)
        #: part (range) name -> znode name of the entry producing it.
        self.future_parts: dict[str, str] = {}
        self.min_unprocessed_insert_time = 0
        self.max_processed_insert_time = 0
        self.last_queue_update = 0.0
        #: entries that may be selected (not executing), by type: a selection that skips some types (the
        #: fetch pool is full) ends at once when only those wait, instead of walking the whole queue
        self._waiting = Counter[LogEntryType]()
        #: create_time -> inserts queued with it (min_unprocessed_insert_time without a scan per entry)
        self._insert_times = Counter[int]()
        #: the distinct times of ``_insert_times``, ascending (the least without a scan when it leaves: a
        #: backlog of 10,000 inserts of distinct times took 1.2 s more to finish with a scan per finish)
        self._insert_time_order: list[int] = []
        #: entries that failed and wait for their back-off (the next retry without a scan of the queue)
        self._backing_off: dict[str, QueueEntry] = {}

    def _set_waiting(self, qe: QueueEntry, waiting: bool) -> None:
        if qe.waiting != waiting:
            qe.waiting = waiting
            self._waiting[qe.type] += 1 if waiting else -1

    # -- loading --------------------------------------------------------------------------------------------
    def initialize(self, active_parts: Iterable[str]) -> None:
        """Rebuild the part sets from the replica's active local parts and the entries queued (at each start
        of replication, as ClickHouse clears them: a part of an entry removed unexecuted must not linger)."""
        self.current_parts = ActivePartSet(active_parts, new_contains=self.new_contains)
        self.virtual_parts = ActivePartSet(self.current_parts.parts(), new_contains=self.new_contains)
        for qe in self.entries:
            for name in qe.entry.virtual_part_names():
                self.virtual_parts.add(name)

    def insert(self, znode_name: str, entry: LogEntry, now: float = 0.0) -> QueueEntry:
        if znode_name in self._by_znode:
            return self._by_znode[znode_name]
        qe = QueueEntry(znode_name, entry.with_znode(znode_name))
        for name in entry.virtual_part_names():
            self.virtual_parts.add(name)
        if entry.type in (T.DROP_RANGE, T.DROP_PART):
            # Drops go first: no point fetching or merging parts that are about to disappear.
            self.entries.insert(0, qe)
        else:
            self.entries.append(qe)
        self._by_znode[znode_name] = qe
        self._set_waiting(qe, True)
        if entry.type in _INSERTS and entry.create_time:
            self._insert_times[entry.create_time] += 1
            if self._insert_times[entry.create_time] == 1:
                bisect.insort(self._insert_time_order, entry.create_time)
            self.min_unprocessed_insert_time = self._insert_time_order[0]
        if now:
            self.last_queue_update = now
        return qe

    def load(self, entries: Iterable[tuple[str, LogEntry]], now: float = 0.0) -> None:
        """Queue nodes read at start-up, in znode order."""
        for znode_name, entry in sorted(entries, key=lambda e: e[0]):
            self.insert(znode_name, entry, now)

    # -- selection ------------------------------------------------------------------------------------------
    def select_entry_to_process(
        self, now: float, extra_check: ExtraCheck | None = None, skip: Collection[LogEntryType] = (),
        mono: float | None = None,
    ) -> Selected | None:
        """The first runnable entry, marked as executing (its parts become future parts) and moved to the
        end of the queue; the entries skipped on the way get their ``postpone_reason``.  ``extra_check`` may
        veto an entry with a reason (merges cancelled, pool too small for the merge, fetch limits …);
        entries of a type in ``skip`` are not looked at (the caller could not start them anyway); back-offs
        are judged on ``mono`` when given (else on ``now``, the wall clock stamped on the entries)."""
        if skip and all(n <= 0 or t in skip for t, n in self._waiting.items()):
            return None
        for i, qe in enumerate(self.entries):
            if qe.currently_executing or (skip and qe.type in skip):
                continue
            reason = self.postpone_reason(qe, now if mono is None else mono)
            if reason is None and extra_check is not None:
                reason = extra_check(qe.entry)
            if reason is not None:
                qe.num_postponed += 1
                qe.postpone_reason = reason
                qe.last_postpone_time = now
                continue
            del self.entries[i]
            self.entries.append(qe)
            qe.currently_executing = True
            self._set_waiting(qe, False)
            self._backing_off.pop(qe.znode_name, None)
            qe.num_tries += 1
            qe.last_attempt_time = now
            qe.postpone_reason = ""
            for name in qe.entry.blocking_part_names():
                self.future_parts[name] = qe.znode_name
            self._executing[qe.znode_name] = qe
            covering = None
            if qe.type in _PRODUCING and qe.entry.new_part_name:
                covering = self.current_parts.get_containing_part(qe.entry.new_part_name)
            return Selected(qe, covering)
        return None

    def postpone_reason(self, qe: QueueEntry, now: float) -> str | None:
        """Why ``qe`` cannot start now (None = it can)."""
        e = qe.entry
        if qe.retry_not_before > now:
            return (
                f"Not executing log entry {qe.describe()} because it failed {qe.num_failures} times "
                "recently; "
                f"retrying in {qe.retry_not_before - now:.1f} s. Last exception: {qe.last_exception}"
            )
        if e.type in _PRODUCING:
            for name in e.blocking_part_names():
                reason = self._future_conflict(name, qe.znode_name)
                if reason:
                    return reason
        if e.type in (T.MERGE_PARTS, T.MUTATE_PART):
            for name in e.source_parts:
                if name in self.future_parts:
                    return (
                        f"Not merging into part {e.new_part_name} because part {name} is not ready yet "
                        "(log entry for that part is being processed)."
                    )
            for name in e.source_parts:
                reason = self._source_consumed(name, qe.znode_name)
                if reason:
                    return f"Not executing log entry for part {e.new_part_name} because {reason}"
        if e.type in _RANGE_OPS:
            range_name = e.drop_range_name or e.new_part_name
            conflicts = self._range_conflicts(range_name, qe.znode_name)
            if conflicts:
                listed = "".join(f"{self._by_type(z)} part {p}, " for p, z in conflicts)
                return (
                    f"Can't execute command for range {range_name} (entry {qe.znode_name}). "
                    f"There are {len(conflicts)} currently executing entries blocking it: {listed}"
                )
        if e.type is T.ALTER_METADATA:
            head = self._head_alter_version()
            if head is not None and e.alter_version > head:
                return (
                    f"Cannot execute alter metadata with version: {e.alter_version} because another alter "
                    f"{head} must be executed before"
                )
        if e.is_alter_mutation:
            head = self._head_alter_version()
            if head is not None and e.alter_version >= head:
                if head == e.alter_version:
                    return (
                        f"Cannot execute alter data with version: {e.alter_version} because metadata still "
                        "not altered"
                    )
                return (
                    f"Cannot execute alter data with version: {e.alter_version} because another alter {head} "
                    "must be executed before"
                )
        return None

    def _by_type(self, znode_name: str) -> str:
        qe = self._executing.get(znode_name)
        return qe.type.value if qe else "?"

    def _future_conflict(self, name: str, own_znode: str) -> str | None:
        owner = self.future_parts.get(name)
        if owner is not None and owner != own_znode:
            return (
                f"Not executing log entry for part {name} because another log entry for the same part is "
                "being processed. This shouldn't happen often."
            )
        info = _parse(name)
        for future, znode in self.future_parts.items():
            if znode == own_znode:
                continue
            finfo = _parse(future)
            if finfo.contains(info, strict=self.new_contains):
                return (
                    f"Not executing log entry for part {name} because it is covered by part {future} "
                    "that is currently executing"
                )
            if not finfo.is_disjoint(info) and not info.contains(finfo, strict=self.new_contains):
                return (
                    f"Not executing log entry for part {name} because it intersects part {future} "
                    "that is currently executing"
                )
        return None

    def _source_consumed(self, source: str, own_znode: str) -> str | None:
        """A source part that another executing entry is turning into a bigger part (merging it, or
        dropping its range) cannot be relied on: wait instead of racing for it."""
        info = _parse(source)
        for future, znode in self.future_parts.items():
            if znode != own_znode and not _parse(future).is_disjoint(info):
                return f"source part {source} overlaps part {future} that is currently executing"
        return None

    def _range_conflicts(self, range_name: str, own_znode: str) -> list[tuple[str, str]]:
        info = _parse(range_name)
        return [
            (future, znode)
            for future, znode in self.future_parts.items()
            if znode != own_znode and not _parse(future).is_disjoint(info)
        ]

    def _head_alter_version(self) -> int | None:
        versions = [qe.entry.alter_version for qe in self.entries if qe.type is T.ALTER_METADATA]
        return min(versions) if versions else None

    def add_future_part_if_not_covered(self, znode_name: str, part_name: str) -> str | None:
        """GET_PART decided to fetch ``part_name`` (a part covering its target): tag it, unless another
        executing entry produces or covers it (then the reason is returned and nothing changes)."""
        qe = self._executing.get(znode_name)
        if qe is None:
            raise KeyError(f"entry {znode_name} is not executing")
        if part_name == qe.entry.new_part_name:
            qe.actual_new_part_name = part_name
            return None
        reason = self._future_conflict(part_name, znode_name)
        if reason is not None:
            return reason
        qe.actual_new_part_name = part_name
        self.future_parts[part_name] = znode_name
        return None

    # -- outcomes -------------------------------------------------------------------------------------------
    def finish(self, znode_name: str, *, success: bool, now: float, error: str = "",
               mono: float | None = None) -> FinishResult:
        """Record the end of an execution.  On success the entry leaves the queue (the caller removes its
        node) and its parts become current; on failure it stays, with back-off."""
        qe = self._executing.pop(znode_name, None)
        if qe is None:
            raise KeyError(f"entry {znode_name} is not executing")
        self._release_future_parts(qe)
        qe.currently_executing = False
        if qe.removed:
            return FinishResult()
        if not success:
            qe.num_failures += 1
            qe.last_exception, qe.last_exception_time = error, now
            gate = now if mono is None else mono
            qe.retry_not_before = gate + self.backoff.delay(qe.type, qe.num_failures)
            self._backing_off[qe.znode_name] = qe
            self._set_waiting(qe, True)
            return FinishResult()
        qe.num_failures = 0
        qe.last_exception = ""
        self._drop(qe)
        return self._apply_success(qe.entry)

    def times_if_done(self, znode_name: str) -> tuple[int, int]:
        """``(min_unprocessed_insert_time, max_processed_insert_time)`` as they will be once the entry
        ``znode_name`` leaves the queue executed (the others as they are now)."""
        low, high = self.min_unprocessed_insert_time, self.max_processed_insert_time
        qe = self._by_znode.get(znode_name)
        if qe is None or qe.type not in _INSERTS:
            return low, high
        ct = qe.entry.create_time
        high = max(high, ct)
        order = self._insert_time_order
        if ct and order and order[0] == ct and self._insert_times.get(ct, 0) <= 1:
            low = order[1] if len(order) > 1 else 0
        return low, high

    def mark_done(self, entry: LogEntry) -> None:
        """An entry executed without being queued (replicad.replication.own_inserts: this replica's own
        insert): its parts are virtual and current as after its execution."""
        for name in entry.virtual_part_names():
            self.virtual_parts.add(name)
        self._apply_success(entry)
        if entry.type in _INSERTS and entry.create_time > self.max_processed_insert_time:
            self.max_processed_insert_time = entry.create_time

    def _release_future_parts(self, qe: QueueEntry) -> None:
        for name in (*qe.entry.blocking_part_names(), qe.actual_new_part_name):
            if name and self.future_parts.get(name) == qe.znode_name:
                del self.future_parts[name]
        qe.actual_new_part_name = ""

    def _apply_success(self, entry: LogEntry) -> FinishResult:
        replaced: list[str] = []
        intersecting: list[tuple[str, str]] = []
        for name in entry.virtual_part_names():
            res = self.current_parts.add(name)
            replaced.extend(res.replaced)
            if res.outcome is AddOutcome.INTERSECTS and res.conflict is not None:
                intersecting.append((name, res.conflict))
        drop = entry.drop_range_name
        if drop:
            self.current_parts.remove(drop)
            self.virtual_parts.remove(drop)
            replaced = [p for p in replaced if p != drop]
        return FinishResult(tuple(replaced), tuple(intersecting))

    def _drop(self, qe: QueueEntry) -> None:
        """Take ``qe`` out of the queue (executed, or removed without execution)."""
        if self._by_znode.pop(qe.znode_name, None) is None:
            return
        entries = self.entries
        for i in range(len(entries) - 1, -1, -1):  # an executed entry was moved to the end when selected
            if entries[i] is qe:
                del entries[i]
                break
        self._set_waiting(qe, False)
        self._backing_off.pop(qe.znode_name, None)
        if qe.type in _INSERTS:
            ct = qe.entry.create_time
            if ct > self.max_processed_insert_time:
                self.max_processed_insert_time = ct
            if ct:
                left = self._insert_times[ct] - 1
                if left > 0:
                    self._insert_times[ct] = left
                else:
                    del self._insert_times[ct]
                    order = self._insert_time_order
                    i = bisect.bisect_left(order, ct)
                    if i < len(order) and order[i] == ct:
                        del order[i]
                    self.min_unprocessed_insert_time = order[0] if order else 0

    def next_retry_delay(self, now: float) -> float | None:
        """Seconds until the first entry backing off after a failure may run again (None: none waits)."""
        waits = [qe.retry_not_before - now for qe in self._backing_off.values() if qe.retry_not_before > now]
        return max(0.05, min(waits)) if waits else None

    def remove_entry(self, znode_name: str) -> QueueEntry | None:
        """Forget an entry without executing it (its node was removed).  An executing entry is marked removed
        and leaves when it finishes."""
        qe = self._by_znode.get(znode_name)
        if qe is None:
            return None
        qe.removed = True
        self._drop(qe)
        return qe

    def remove_part_producing_ops_in_range(
        self, range_name: str, current_znode: str
    ) -> tuple[list[str], list[str]]:
        """For an executing DROP_RANGE/REPLACE_RANGE: remove the entries that only produce parts inside the
        range.  Returns (removed znode names, those among them still executing — wait for them).

        Only entries pulled before the range's own entry (a smaller queue znode: queue znodes follow the log)
        are removed.  One pulled after it was logged after the drop: an insert that took its block number
        before the drop and committed after it (its part is kept by the replicas that ran the drop before
        that GET_PART was logged, so every replica keeps it), or a mutation of such a part.  Removing it
        only on a replica that pulled both entries at once made the replicas diverge (found by the chaos
        suite's S3 runs; ClickHouse fixed the same race in #94123)."""
        info = PartInfo.parse(range_name)
        removed: list[str] = []
        waiting: list[str] = []
        for qe in list(self.entries):
            if qe.znode_name == current_znode or (current_znode and qe.znode_name > current_znode):
                continue
            e = qe.entry
            doomed = False
            if e.type in (T.GET_PART, T.ATTACH_PART, T.MERGE_PARTS, T.MUTATE_PART) and e.new_part_name:
                doomed = info.contains(PartInfo.parse(e.new_part_name), strict=self.new_contains)
            elif e.type is T.REPLACE_RANGE and e.replace_range is not None:
                doomed = bool(e.replace_range.new_part_names) and all(
                    info.contains(PartInfo.parse(p), strict=self.new_contains)
                    for p in e.replace_range.new_part_names
                )
            if doomed:
                removed.append(qe.znode_name)
                if qe.currently_executing:
                    waiting.append(qe.znode_name)
                self.remove_entry(qe.znode_name)
        return removed, waiting

    def move_sibling_parts_for_merge_to_end_of_queue(self, part_name: str) -> set[str]:
        """A part could not be fetched: push the entries producing the other sources of the merge that
        uses it behind that merge, so the merge can be fetched whole instead (``moveSiblingParts…``)."""
        merge_index = -1
        sources: set[str] = set()
        for i, qe in enumerate(self.entries):
            if qe.type in (T.MERGE_PARTS, T.MUTATE_PART) and part_name in qe.entry.source_parts:
                merge_index, sources = i, set(qe.entry.source_parts)
                break
        if merge_index < 0:
            return set()
        head, tail = self.entries[:merge_index], self.entries[merge_index:]
        moved = [
            qe
            for qe in head
            if qe.type in (T.MERGE_PARTS, T.GET_PART, T.MUTATE_PART) and qe.entry.new_part_name in sources
        ]
        kept = [qe for qe in head if all(qe is not m for m in moved)]
        self.entries = kept + tail + moved
        return sources

    def disable_merges_in_range(self, range_name: str) -> None:
        self.virtual_parts.add(range_name)

    # -- merge assignment helpers ---------------------------------------------------------------------------
    def merge_blocker(self, part_name: str) -> str | None:
        """Why ``part_name`` cannot be a source of a newly assigned merge, judged from the queue."""
        containing = self.virtual_parts.get_containing_part(part_name)
        if containing is None:
            return f"Entry for part {part_name} hasn't been read from the replication log yet"
        if containing != part_name:
            return f"Part {part_name} has already been assigned a merge into {containing}"
        return None

    # -- inspection -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, znode_name: object) -> bool:
        return znode_name in self._by_znode

    def get(self, znode_name: str) -> QueueEntry | None:
        return self._by_znode.get(znode_name)

    def znode_names(self) -> set[str]:
        return set(self._by_znode)

    def status(self) -> QueueStatus:
        counts = {"insert": 0, "merge": 0, "mutate": 0}
        oldest = {"queue": 0, "insert": 0, "merge": 0, "mutate": 0}
        names = {"insert": "", "merge": "", "mutate": ""}

        def older(kind: str, ct: int) -> bool:
            return bool(ct) and (not oldest[kind] or ct < oldest[kind])

        for qe in self.entries:
            ct = qe.entry.create_time
            if older("queue", ct):
                oldest["queue"] = ct
            kind = (
                "insert"
                if qe.type in _INSERTS
                else "merge"
                if qe.type is T.MERGE_PARTS
                else "mutate"
                if qe.type is T.MUTATE_PART
                else None
            )
            if kind is None:
                continue
            counts[kind] += 1
            if older(kind, ct):
                oldest[kind] = ct
                names[kind] = qe.entry.new_part_name
        return QueueStatus(
            queue_size=len(self.entries),
            inserts_in_queue=counts["insert"],
            merges_in_queue=counts["merge"],
            part_mutations_in_queue=counts["mutate"],
            future_parts=len(self.future_parts),
            queue_oldest_time=oldest["queue"],
            inserts_oldest_time=oldest["insert"],
            merges_oldest_time=oldest["merge"],
            part_mutations_oldest_time=oldest["mutate"],
            oldest_part_to_get=names["insert"],
            oldest_part_to_merge_to=names["merge"],
            oldest_part_to_mutate_to=names["mutate"],
            last_queue_update=self.last_queue_update,
        )

    def replication_queue_rows(self) -> list[dict[str, object]]:
        """system.replication_queue columns (position = order of preference)."""
        rows: list[dict[str, object]] = []
        for pos, qe in enumerate(self.entries):
            e = qe.entry
            rows.append(
                {
                    "position": pos,
                    "node_name": qe.znode_name,
                    "type": e.type.value,
                    "create_time": e.create_time,
                    "required_quorum": e.quorum,
                    "source_replica": e.source_replica,
                    "new_part_name": e.new_part_name or (e.drop_range_name or ""),
                    "parts_to_merge": list(e.source_parts),
                    "is_detach": e.detach,
                    "is_currently_executing": qe.currently_executing,
                    "num_tries": qe.num_tries,
                    "last_exception": qe.last_exception,
                    "last_attempt_time": qe.last_attempt_time,
                    "num_postponed": qe.num_postponed,
                    "postpone_reason": qe.postpone_reason,
                    "last_postpone_time": qe.last_postpone_time,
                }
            )
        return rows
