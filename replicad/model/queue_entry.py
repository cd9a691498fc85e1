"""One entry of a replica's replication queue (a ``queue/queue-`` node with its in-memory bookkeeping, a
row of system.replication_queue), the entry chosen for execution, and the back-off of a failed one.
:class:`replicad.model.queue_state.QueueState` holds and orders them."""

from __future__ import annotations

from dataclasses import dataclass

from replicad.model.log_entry import LogEntry, LogEntryType

T = LogEntryType
_FETCHES = frozenset((T.GET_PART, T.ATTACH_PART, T.CLONE_PART_FROM_SHARD))


@dataclass(frozen=True)
class BackoffSettings:
    """Delay before retrying a failed entry: ``initial_s * 2**(failures-1)``, capped by the kind of work
    (modern ClickHouse: max_postpone_time_for_failed_replicated_fetches_ms / _merges_ms / _tasks_ms and
    max_postpone_time_for_failed_mutations_ms)."""

    initial_s: float = 1.0
    max_fetch_s: float = 60.0
    max_merge_s: float = 60.0
    max_mutation_s: float = 300.0
    max_other_s: float = 300.0

    def delay(self, entry_type: LogEntryType, failures: int) -> float:
        if failures <= 0:
            return 0.0
        cap = (self.max_fetch_s if entry_type in _FETCHES else self.max_merge_s if entry_type is T.MERGE_PARTS
               else self.max_mutation_s if entry_type is T.MUTATE_PART else self.max_other_s)
        return float(min(cap, self.initial_s * 2.0 ** min(failures - 1, 62)))


@dataclass
class QueueEntry:
    """One queue node and its in-memory bookkeeping (system.replication_queue)."""

    znode_name: str
    entry: LogEntry
    currently_executing: bool = False
    num_tries: int = 0
    #: Consecutive failures (reset by a success); drives the back-off.
    num_failures: int = 0
    last_exception: str = ""
    last_exception_time: float = 0.0
    last_attempt_time: float = 0.0
    num_postponed: int = 0
    postpone_reason: str = ""
    last_postpone_time: float = 0.0
    retry_not_before: float = 0.0
    #: GET_PART may fetch a covering part instead; tagged as a future part while executing.
    actual_new_part_name: str = ""
    removed: bool = False
    #: counted in QueueState's waiting entries by type (queued, neither executing nor gone)
    waiting: bool = False

    @property
    def type(self) -> LogEntryType:
        return self.entry.type

    def describe(self) -> str:
        target = self.entry.new_part_name or (self.entry.drop_range_name or "")
        return f"{self.znode_name} ({self.type.value} {target})".replace(" )", ")")


@dataclass(frozen=True)
class Selected:
    queue_entry: QueueEntry
    #: For part-producing entries: a current part that already contains the result, if any.
    covering_part: str | None = None

    @property
    def entry(self) -> LogEntry:
        return self.queue_entry.entry
