"""Merges, mutations and partition drops of one replicated table, wired into its :class:`TableReplica`.

``TableOperations(replica)`` takes the table's :class:`.table_context.TableContext` (the replica itself, seen
through that narrow protocol), builds the pieces and hooks them into the replica's seams:

* the queue executor's ``handlers`` run MERGE_PARTS / MUTATE_PART (:mod:`.merge_executor`) and
  DROP_RANGE / DROP_PART (:mod:`.drop_range`);
* background tasks: ``leader_election`` (re-checks the candidacy when the predecessor's watch fires),
  ``merge_selecting`` (:mod:`.merge_assigner`, only while leading), ``mutations_updating`` (watch on
  ``/mutations``) and ``mutations_finalizing`` (``mutation_pointer``);
* ``execute`` runs the statements: ALTER … DELETE / UPDATE (a mutation; ``mutations_sync`` 1/2 waits for
  this / every replica), ALTER … DROP / DETACH PARTITION and TRUNCATE (DROP_RANGE entries;
  ``replication_alter_partitions_sync`` 1/2 waits for this / every active replica), OPTIMIZE.

18.16 forwards OPTIMIZE / DROP PARTITION / TRUNCATE from a non-leader to the leader over the native
protocol.  replicad has no native-protocol client, so a non-leader assigns them itself; its entries carry the
``/log`` version check (see :mod:`.merge_predicate`), which keeps it safe against replicad and modern
leaders (an 18.16 leader does not check it: a merge it assigns in the same instant could still conflict).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from replicad.errors import BadInputError, KeeperNoNodeError, ReplicadError
from replicad.keeper.paths import TablePaths, sequence_number
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replication.drop_range import DropRanges
from replicad.replication.merge_assigner import AssignerSettings, MergeAssigner
from replicad.replication.merge_executor import ExecutorSettings, PartProducer
from replicad.replication.merge_predicate import MergePredicate, load_merge_predicate
from replicad.replication.mutations import (
    MutationsState,
    clear_old_mutations,
    count_finished,
    create_mutation,
    storage_commands,
    wait_for_mutation,
)
from replicad.replication.table_context import TableContext
from replicad.service import ExecuteResult, Statement, StatementKind
from replicad.storage.merge import TableKeys
from replicad.storage.mutate import compile_commands
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, FunctionTask, Outcome

if TYPE_CHECKING:
    from replicad.keeper.client import Keeper
    from replicad.sql.statements import PartitionSpec

log = get_logger(__name__)

DEFAULT_WAIT_S = 600.0
#: merge selection runs after new log entries are pulled (as 18.16's pullLogsToQueue schedules it) and after
#: a part is merged or mutated here, at most this often: a stream of small inserts would otherwise reload
#: the merge predicate for every one of them.  A round costs a ZooKeeper snapshot (~6 requests) and two
#: scans of the partition's parts (1-6 ms for 10-60 parts); at 0.2 s it took ~10 % of the leader's GIL
#: time under a stream of 10k-row inserts, and a merge needs a handful of new parts anyway (the selector's
#: base), so waking more often mostly re-reads the same snapshot
MERGE_SELECTING_MIN_INTERVAL_S = 1.0


async def wait_for_log_entry(
    keeper: Keeper,
    paths: TablePaths,
    entry: LogEntry,
    replica: str,
    *,
    tz: str,
    timeout_s: float = DEFAULT_WAIT_S,
) -> bool:
    """waitForReplicaToProcessLogEntry: until ``replica`` pulled the ``log-`` entry and its queue copy is
    gone.  False on timeout."""
    deadline = time.monotonic() + timeout_s
    index = sequence_number(entry.znode_name)
    rp = paths.replica(replica)
    while True:
        try:
            raw, _ = await keeper.get(rp.log_pointer)
        except KeeperNoNodeError:
            return True  # the replica is gone
        if raw.strip() and int(raw) > index:
            break
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    text = entry.to_bytes(tz)
    names = await keeper.get_children(rp.queue)
    nodes = await keeper.get_many([rp.queue_entry(n) for n in names])
    mine = [n for n, node in zip(names, nodes, strict=True) if node is not None and node[0] == text]
    for name in mine:
        while await keeper.exists(rp.queue_entry(name)) is not None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
    return True


class TableOperations:
    """The merges / mutations / drops side of one :class:`TableReplica`."""

    def __init__(self, replica: TableContext, *, assigner_settings: AssignerSettings | None = None) -> None:
        r = self.replica = replica
        s: dict[str, Any] = dict(r.spec.settings)
        name = str(r.spec.name)
        self.tz = r.env.tz
        self.leader = r.leader
        self.leader.can_become_leader = bool(int(s.get("replicated_can_become_leader", 1)))
        self.mutations = MutationsState(r.keeper, r.paths, r.queue_state, tz=self.tz)
        self.producer = PartProducer(
            r.keeper,
            r.paths,
            r.store,
            r.queue_state,
            r.fetcher,
            self.mutations,
            r.schema,
            r.writer_settings,
            settings=ExecutorSettings.from_settings(s),
            on_part_made=self._on_part_made,
            on_broken_part=r.enqueue_part_check,
        )
        self.drops = DropRanges(
            r.keeper,
            r.paths,
            r.store,
            r.queue_state,
            r.committer.allocator,
            mutation_version=self.mutations.current_version,
            tz=self.tz,
            on_parts_removed=r.cleanup.wakeup,
        )
        self.assigner = MergeAssigner(
            f"{name}:merge_selecting",
            r.keeper,
            r.paths,
            r.store,
            r.queue_state,
            self.load_predicate,
            lambda: self.leader.is_leader and not r.is_readonly and not r.blockers.merges,
            settings=assigner_settings or AssignerSettings.from_settings(s),
            tz=self.tz,
            has_mutations=lambda: len(self.mutations) > 0,
            on_assigned=r.queue_updating.wakeup,
            enqueue_part_check=r.enqueue_part_check,
        )
        self.election = FunctionTask(f"{name}:leader_election", self._check_leader, period_s=IDLE_RECHECK_S)
        self.mutations_updating = FunctionTask(
            f"{name}:mutations_updating", self._update_mutations, period_s=IDLE_RECHECK_S
        )
        self.mutations_finalizing = FunctionTask(
            f"{name}:mutations_finalizing", self._finalize_mutations, period_s=IDLE_RECHECK_S
        )
        self.leader.wake = self.election.wakeup
        self.leader.on_change.append(self._on_leader_change)
        self.mutations.wake = self.mutations_updating.wakeup
        self.mutations.on_new.extend([self.assigner.wakeup, self.mutations_finalizing.wakeup])
        self._mutations_session: int | None = None
        self._assigner_woken_at = 0.0
        self._assigner_wake_pending = False

    # ------------------------------------------------------------------------------------------ wiring

    @property
    def tasks(self) -> list[BackgroundTask]:
        return [self.election, self.assigner, self.mutations_updating, self.mutations_finalizing]

    def install(self) -> None:
        """Register the entry handlers with the replica's queue executor."""
        handlers = self.replica.executor.handlers
        handlers.update(self.producer.handlers())
        handlers[LogEntryType.DROP_RANGE] = self.drops.execute
        handlers[LogEntryType.DROP_PART] = self.drops.execute
        executor = self.replica.executor
        previous = executor.on_parts_changed

        def parts_changed() -> None:  # an entry finished: the queue's parts moved on
            if previous is not None:
                previous()
            if self.mutations.pending():
                self.mutations_finalizing.wakeup()

        executor.on_parts_changed = parts_changed
        pulled_before = self.replica.puller.on_entries

        def pulled(entries: list[LogEntry]) -> None:  # new parts may be mergeable now
            pulled_before(entries)
            if entries and self.leader.is_leader:
                self._wake_assigner_soon()

        self.replica.puller.on_entries = pulled
        own = self.replica.puller.own
        if own is not None:  # our own inserts' entries, done as they are pulled: new parts all the same
            own.on_done.append(self._wake_assigner_if_leader)

    def _wake_assigner_if_leader(self) -> None:
        if self.leader.is_leader:
            self._wake_assigner_soon()

    def _wake_assigner_soon(self) -> None:
        if self._assigner_wake_pending:
            return
        delay = self._assigner_woken_at + MERGE_SELECTING_MIN_INTERVAL_S - time.monotonic()
        if delay <= 0:
            self._wake_assigner()
            return
        self._assigner_wake_pending = True
        asyncio.get_running_loop().call_later(delay, self._wake_assigner)

    def _wake_assigner(self) -> None:
        self._assigner_wake_pending = False
        self._assigner_woken_at = time.monotonic()
        self.assigner.wakeup()

    def _on_leader_change(self, leading: bool) -> None:
        if leading:
            self.assigner.wakeup()

    def _on_part_made(self) -> None:
        self.replica.cleanup.parts_outdated()  # the merged-away sources are outdated now
        self.mutations_finalizing.wakeup()
        if self.leader.is_leader:  # as after a pull: a stream of merges re-selects at most every interval
            self._wake_assigner_soon()

    async def load_predicate(self) -> MergePredicate:
        r = self.replica
        return await load_merge_predicate(r.keeper, r.paths, r.queue_state, self.mutations, r.puller.pull)

    # ------------------------------------------------------------------------------------------ tasks

    async def _check_leader(self) -> Outcome | None:
        if self.replica.is_readonly:
            return Outcome("readonly")
        if self.leader.node is None:
            if not self.leader.can_become_leader:
                return None
            await self.leader.join()  # our node vanished (removed by hand, or a lost session): stand again
        leading = await self.leader.check()
        return Outcome("leader" if leading else "candidate", fields=self.leader.status())

    async def _update_mutations(self) -> Outcome | None:
        r = self.replica
        if r.is_readonly:
            return Outcome("readonly")
        if self._mutations_session != r.keeper.session_id:
            await self.mutations.load_pointer()
            self._mutations_session = r.keeper.session_id
        loaded = await self.mutations.update()
        return Outcome("loaded_mutations", fields={"loaded": loaded}) if loaded else None

    async def _finalize_mutations(self) -> Outcome | None:
        r = self.replica
        if r.is_readonly or self._mutations_session is None:
            return None
        again = await self.mutations.finalize(self.load_predicate)
        if self.leader.is_leader:  # 18.16's cleanup thread does this on the leader
            keep = int(r.spec.settings.get("finished_mutations_to_keep", 100))
            await clear_old_mutations(r.keeper, r.paths, self.mutations, keep)
            # records still to remove (another replica's mutation_pointer lags): look again soon; with
            # nothing to remove the task sleeps until woken (no ZooKeeper reads for an idle table)
            again = again or 0 < keep < count_finished(self.mutations)
        return Outcome("mutations_pending", delay_s=5.0) if again else None

    # ------------------------------------------------------------------------------------------ statements

    async def execute(self, statement: Statement) -> ExecuteResult:
        from replicad.sql import statements as sql

        parsed = statement.parsed if statement.parsed is not None else sql.parse_statement(statement.text)
        settings = statement.settings
        if statement.kind is StatementKind.OPTIMIZE and isinstance(parsed, sql.Optimize):
            return await self.optimize(parsed, settings)
        if statement.kind is StatementKind.TRUNCATE:
            entries = await self.drops.truncate()
            await self._wait_entries(entries, 2)
            return ExecuteResult(fields={"entries": [e.znode_name for e in entries]})
        if isinstance(parsed, sql.Alter):
            fields: dict[str, Any] = {}
            if parsed.mutation_commands:
                fields["mutation_id"] = await self.mutate(parsed.mutation_commands_text(), settings)
            dropped: list[LogEntry] = []
            for cmd in parsed.partition_commands:
                pid = self.partition_id(cmd.partition)
                entry = await self.drops.drop_partition(pid, detach=cmd.kind == "DETACH")
                if entry is not None:
                    dropped.append(entry)
            await self._wait_entries(dropped, int(settings.get("replication_alter_partitions_sync", 1)))
            if dropped:
                fields["entries"] = [e.znode_name for e in dropped]
            return ExecuteResult(fields=fields)
        raise ReplicadError(f"{statement.kind.value} is not handled by merges/mutations", code=48)

    def partition_id(self, spec: PartitionSpec) -> str:
        key_types = TableKeys(self.replica.schema).partition_types
        return spec.resolve(key_types, self.tz)

    async def optimize(self, parsed: Any, settings: dict[str, Any]) -> ExecuteResult:
        pid = self.partition_id(parsed.partition) if parsed.partition is not None else None
        entries = await self.assigner.optimize(
            pid,
            final=parsed.final,
            deduplicate=parsed.deduplicate,
            throw_if_noop=bool(int(settings.get("optimize_throw_if_noop", 0))),
        )
        sync = int(settings.get("replication_alter_partitions_sync", 1))
        await self._wait_entries(entries, 2 if sync else 0)  # 18.16 waits for all replicas here
        return ExecuteResult(fields={"entries": [e.znode_name for e in entries]})

    async def mutate(self, commands_text: str, settings: dict[str, Any]) -> str:
        """ALTER … DELETE/UPDATE: validate, write the mutation record, optionally wait (mutations_sync)."""
        r = self.replica
        try:
            compile_commands(TableKeys(r.schema), storage_commands(commands_text))
        except BadInputError:
            raise
        except ReplicadError as e:
            raise BadInputError(str(e), code=e.code) from e
        entry = await create_mutation(r.keeper, r.paths, commands_text, tz=self.tz)
        self.mutations_updating.wakeup()
        sync = int(settings.get("mutations_sync", 0))
        if sync:
            replicas = [r.paths.replica_name]
            if sync >= 2:
                replicas = sorted(await r.keeper.get_children(r.paths.replicas))
            await self.mutations.update()
            self.mutations_finalizing.wakeup()
            await wait_for_mutation(r.keeper, r.paths, entry.znode_name, replicas)
        return entry.znode_name

    async def _wait_entries(self, entries: list[LogEntry], sync: int) -> None:
        if not entries or sync <= 0:
            return
        r = self.replica
        replicas = [r.paths.replica_name]
        if sync >= 2:
            replicas = []
            for name in sorted(await r.keeper.get_children(r.paths.replicas)):
                if await r.keeper.exists(r.paths.replica(name).is_active) is not None:
                    replicas.append(name)
        r.queue_updating.wakeup()
        for entry in entries:
            for replica in replicas:
                ok = await wait_for_log_entry(r.keeper, r.paths, entry, replica, tz=self.tz)
                if not ok:
                    log.warning("timed_out_waiting_for_replica", replica=replica, entry=entry.znode_name)

    # ------------------------------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        return {
            **self.leader.status(),
            "assigned_merges": self.assigner.assigned_merges,
            "assigned_mutations": self.assigner.assigned_mutations,
            "mutations": len(self.mutations),
            "mutations_pending": self.mutations.pending(),
            "mutation_pointer": self.mutations.mutation_pointer,
            **self.producer.status(),
            "dropped_parts": self.drops.dropped_parts_total,
            "detached_parts": self.drops.detached_parts_total,
        }

    def mutation_rows(self) -> list[dict[str, Any]]:
        r = self.replica
        return [
            {"database": r.spec.name.database, "table": r.spec.name.table, **row}
            for row in self.mutations.rows()
        ]
