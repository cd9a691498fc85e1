"""The narrow view of one table replica that lower modules take, instead of ``TableReplica`` itself.

``TableReplica`` (``replicad/replica.py``) builds the collaborators and satisfies :class:`TableContext`
structurally, so ``table_ops``, ``admin`` and ``replica_status`` use a table's collaborators without importing
the module that composes them (ClickHouse's ``StorageReplicatedMergeTree`` hands its units ``*this`` in the
same way; here the contract is written down).  Every member is read-only: a module may call into a
collaborator, never replace one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntryType
from replicad.model.queue_state import QueueState
from replicad.replication.cleanup import CleanupThread
from replicad.replication.commit import PartCommitter
from replicad.replication.executor import QueueExecutor
from replicad.replication.fetcher import PartFetcher
from replicad.replication.leader import LeaderElection
from replicad.replication.log_puller import LogPuller, QueueUpdatingTask
from replicad.replication.part_check import PartCheckThread
from replicad.replication.part_store import PartStore
from replicad.replication.restarting import RestartingThread
from replicad.replication.sink import TableSchema
from replicad.service import TableName
from replicad.storage.layout import TableDataLayout
from replicad.storage.types import DataType
from replicad.storage.writer import WriterSettings

_FETCHES = frozenset((LogEntryType.GET_PART,))
_MERGES = frozenset((LogEntryType.MERGE_PARTS, LogEntryType.MUTATE_PART))


@dataclass
class ActionBlockers:
    """SYSTEM STOP FETCHES / STOP MERGES of one table (in memory, as in ClickHouse: a restart clears them)."""

    fetches: bool = False
    merges: bool = False

    def reason(self, entry_type: LogEntryType) -> str | None:
        if self.fetches and entry_type in _FETCHES:
            return "Not executing fetch: fetches are stopped (SYSTEM STOP FETCHES)"
        if self.merges and entry_type in _MERGES:
            return "Not executing merge or mutation: merges are stopped (SYSTEM STOP MERGES)"
        return None


class TableSpecView(Protocol):
    """The table's definition (``replicad.table_spec.TableSpec``)."""

    @property
    def name(self) -> TableName: ...

    @property
    def columns(self) -> Sequence[tuple[str, DataType]]: ...

    @property
    def settings(self) -> Mapping[str, Any]: ...


class ReplicaEnvView(Protocol):
    """The process-wide environment (``replicad.table_spec.ReplicaEnv``)."""

    @property
    def tz(self) -> str: ...


class TableContext(Protocol):
    """One table's collaborators and state, as ``TableReplica`` holds them."""

    @property
    def spec(self) -> TableSpecView: ...

    @property
    def env(self) -> ReplicaEnvView: ...

    @property
    def keeper(self) -> Keeper: ...

    @property
    def paths(self) -> TablePaths: ...

    @property
    def layout(self) -> TableDataLayout: ...

    @property
    def store(self) -> PartStore: ...

    @property
    def schema(self) -> TableSchema: ...

    @property
    def writer_settings(self) -> WriterSettings: ...

    @property
    def queue_state(self) -> QueueState: ...

    @property
    def committer(self) -> PartCommitter: ...

    @property
    def fetcher(self) -> PartFetcher: ...

    @property
    def puller(self) -> LogPuller: ...

    @property
    def queue_updating(self) -> QueueUpdatingTask: ...

    @property
    def executor(self) -> QueueExecutor: ...

    @property
    def leader(self) -> LeaderElection: ...

    @property
    def cleanup(self) -> CleanupThread: ...

    @property
    def part_check(self) -> PartCheckThread: ...

    @property
    def restarting(self) -> RestartingThread: ...

    @property
    def blockers(self) -> ActionBlockers: ...

    @property
    def is_readonly(self) -> bool: ...

    def enqueue_part_check(self, name: str, delay_s: float = 0.0) -> None: ...
