"""TableReplica: one ReplicatedMergeTree table on this replica (the engine behind ``TableService``).

It owns the table's local parts (:class:`PartStore`), its ZooKeeper state (created or joined at start-up as
18.16 does), the DataPartsExchange endpoint, and the background tasks: queue updating (log → queue),
queue executing (fetches, drops), cleanup (outdated parts, part checks) and restarting (re-activation after
a ZooKeeper session loss).  Inserts go through :mod:`replicad.replication.sink` and
:mod:`replicad.replication.commit`; SELECT reads the active parts through :mod:`replicad.table_reader`;
the introspection rows (``system.replicas`` / ``system.parts``) come from :mod:`replicad.replica_status`.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from replicad import fault_plant, replica_status, stage_times
from replicad.datatypes import DataType
from replicad.errors import (
    BadInputError,
    KeeperError,
    KeeperNoNodeError,
    ReadOnlyError,
    ReplicadError,
)
from replicad.keeper.client import Keeper, SessionState
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.address import ReplicaAddress
from replicad.model.log_entry import LogEntry
from replicad.model.part_info import PartInfo
from replicad.model.staged_job import StagedTask
from replicad.replica_wiring import build_collaborators
from replicad.replication import init as zk_init
from replicad.replication.admin import TableAdmin
from replicad.replication.alter_columns import TableAlter
from replicad.replication.clone import clone_replica_if_needed
from replicad.replication.commit import CommitResult, TempPart
from replicad.replication.exchange import ServedPart
from replicad.replication.log_puller import load_queue
from replicad.replication.part_check import check_parts_at_startup
from replicad.replication.quorum import (
    QuorumPrecondition,
    check_quorum_precondition,
    remove_failed_quorum_parts,
    update_quorum_if_we_have_part,
)
from replicad.replication.restarting import CONNECTION_ERRORS
from replicad.replication.sink import InsertContext
from replicad.replication.staging import StagingContext, StagingSettings, TableStaging
from replicad.replication.table_ops import TableOperations
from replicad.replication.zero_copy_moves import PartMover
from replicad.replication.zero_copy_scan import DEFAULT_GRACE_S, OrphanScan
from replicad.service import (
    ExecuteResult,
    InsertSettings,
    InsertSummary,
    QueryResult,
    SelectQuery,
    Statement,
    StatementKind,
    TableName,
)
from replicad.storage.staging_area import StagingArea
from replicad.table_spec import ReplicaEnv as ReplicaEnv
from replicad.table_spec import TableSpec as TableSpec
from replicad.tasks import BackgroundTask, Supervisor, stop_in_reverse

log = get_logger(__name__)

#: how old the ZooKeeper fields of status() may be when a /metrics scrape reads them (the cleanup's cadence,
#: at which they used to be refreshed)
ZK_SUMMARY_MAX_AGE_S = 30.0

TASK_STOP_TIMEOUT_S = 10.0  # each background task's grace to finish its unit of work at stop (then cancelled)

_OPS_STATEMENTS = frozenset(
    (
        StatementKind.OPTIMIZE,
        StatementKind.TRUNCATE,
        StatementKind.ALTER_DELETE,
        StatementKind.ALTER_UPDATE,
        StatementKind.DROP_PARTITION,
        StatementKind.DETACH_PARTITION,
    )
)


class TableReplica:
    """One replicated table: implements :class:`replicad.service.TableService`."""

    def __init__(
        self, spec: TableSpec, keeper: Keeper, env: ReplicaEnv, supervisor: Supervisor | None = None
    ) -> None:
        self.spec, self.keeper, self.env, self.supervisor = spec, keeper, env, supervisor
        self.paths = TablePaths.create(spec.zk_path, spec.replica_name)
        self.structure: zk_init.TableStructure | None = None  # the table's columns version, once started
        self.identifier = zk_init.active_node_identifier()
        self._own_runners: list[tuple[BackgroundTask, asyncio.Task[None]]] = []  # without a supervisor
        self._parts_checked = False  # the start-up part check runs once, when the table is loaded
        self._stopping = False
        self._inserts_in_flight = 0
        self._task_group = f"table:{spec.name}:{id(self):x}"
        # total/active replicas, log_max_index: read when asked for (refresh_zk_summary)
        self._zk_summary: dict[str, int] = {}
        self._zk_summary_at = float("-inf")  # time.monotonic() of the last read
        c = build_collaborators(spec, keeper, env, self.paths, self.identifier, hooks=self)
        self.layout, self.store, self.schema, self.reader = c.layout, c.store, c.schema, c.reader
        self.writer_settings, self.parts_limit = c.writer_settings, c.parts_limit
        self.queue_state, self.committer, self.fetcher = c.queue_state, c.committer, c.fetcher
        self.puller, self.queue_updating, self.executor = c.puller, c.queue_updating, c.executor
        self.leader, self.blockers = c.leader, c.blockers
        self.cleanup, self.part_check, self.restarting = c.cleanup, c.part_check, c.restarting
        #: merges, mutations, partition drops and the leader's duties (replicad.replication.table_ops)
        self.ops = TableOperations(self)
        #: ATTACH / DROP DETACHED, SYSTEM DROP|RESTART REPLICA, STOP|START FETCHES|MERGES
        self.admin = TableAdmin(self)
        #: two-phase writes: staged inserts and their publishing (replicad.replication.staging)
        self.staging = TableStaging(f"{spec.name}:staging", StagingContext(
            keeper, self.paths.zk_path, spec.replica_name,
            StagingArea(env.data_path, spec.name.database, spec.name.table), self.layout, self.schema,
            self.writer_settings, self.committer, StagingSettings.from_settings(spec.settings),
            is_readonly=lambda: self.is_readonly, is_leader=lambda: self.leader.is_leader))
        #: the background tasks, in start order (stopped in reverse): what ClickHouse keeps per table
        self.tasks: dict[str, BackgroundTask] = {
            "queue_updating": self.queue_updating,
            "queue_executing": self.executor,
            "cleanup": self.cleanup,
            "part_check": self.part_check,
            "restarting": self.restarting,
            **{task.name.removeprefix(f"{spec.name}:"): task for task in self.ops.tasks},
            "staging": self.staging.task,
        }
        if self.store.remote is not None:  # S3 disk: local parts of a table whose policy became an S3 one
            self.mover = PartMover(self.store, self.store.remote, self.fetcher, self.paths)
            self.tasks["zero_copy_mover"] = self.mover
            scan_period = float(spec.settings.get("remote_fs_orphan_scan_period_s", 0))
            if self.store.remote.zero_copy and scan_period > 0:
                grace = float(spec.settings.get("remote_fs_orphan_scan_grace_s", DEFAULT_GRACE_S))
                self.tasks["zero_copy_orphan_scan"] = OrphanScan(self.store.remote, scan_period,
                                                                 grace_s=grace)
        #: statements other modules implement (OPTIMIZE, ALTER … DELETE/UPDATE, DROP PARTITION …)
        self.statement_handlers: dict[StatementKind, Callable[[Statement], Awaitable[ExecuteResult]]] = {
            **self.admin.handlers()}
        #: ALTER … ADD/DROP/MODIFY COLUMN and the alter task following the table's columns (alter_columns)
        self.alter = TableAlter(self)
        self.tasks["alter"] = self.alter.task
        self.statement_handlers.update(self.alter.handlers())

    # ------------------------------------------------------------------------------------------- protocol

    @property
    def name(self) -> TableName:
        return self.spec.name

    @property
    def columns(self) -> Sequence[tuple[str, DataType]]:
        return self.spec.columns

    @property
    def is_readonly(self) -> bool:
        return (
            self.restarting.readonly
            or self._stopping
            or self.keeper.session_state is not SessionState.CONNECTED
        )

    @property
    def _parts_to_check(self) -> dict[str, float]:
        """Parts waiting for the part check (name -> due time)."""
        return self.part_check.pending

    # ------------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Load local parts, create/join the table in ZooKeeper, activate, load the queue, start the tasks."""
        await self.store.load()
        await self.staging.start()
        try:
            await self.restarting.startup()
        except CONNECTION_ERRORS as e:
            # no ZooKeeper: serve reads; the restarting task completes the start-up once it answers
            log.warning("replica_started_readonly", table=str(self.spec.name), error=str(e))
        remote = self.store.remote
        if remote is not None and remote.zero_copy:  # peers sharing the bucket get the metadata only
            self.env.interserver.serve(self.paths.me.root, self._part_for_send, self.enqueue_part_check,
                                       zero_copy=remote.serialized_metadata)
        else:
            self.env.interserver.serve(self.paths.me.root, self._part_for_send, self.enqueue_part_check)
        self.executor.on_parts_changed = self._on_parts_changed
        self.ops.install()
        for task in self.tasks.values():
            if self.supervisor is not None:
                taken = {t.name for t in self.supervisor.tasks}
                base, n = task.name, 1
                while task.name in taken:  # a dropped and re-created table: its old tasks stay registered
                    n += 1
                    task.name = f"{base}#{n}"
                self.supervisor.add(task, group=self._task_group)
            else:
                self._own_runners.append((task, asyncio.get_running_loop().create_task(task.run(),
                                                                                        name=task.name)))
        self.queue_updating.wakeup()
        log.info("replica_started", table=str(self.spec.name), replica_path=self.paths.me.root)

    async def _startup_zookeeper(self) -> None:
        """tryStartup: create/join the table, activate, clone if lost, check parts (once), load the queue."""
        first = not self._parts_checked
        spec, keeper, paths = self.spec, self.keeper, self.paths
        await zk_init.create_table_if_not_exists(keeper, paths, spec.metadata_text, spec.columns_text)
        exists = await zk_init.replica_exists(keeper, paths)
        # as 18.16 attaching a table: an existing replica takes the columns an ALTER wrote while it was
        # away (the alter task applies them); a new replica must match them
        self.structure = await zk_init.check_table_structure(
            keeper, paths, spec.metadata_text, spec.columns_text,
            **({"compare_columns": lambda _local, _zk: []} if exists else {}),
        )
        if not exists:
            if first and self.store.active():
                raise ReplicadError(
                    f"Data directory {self.layout.path} already contains parts but replica "
                    f"{paths.me.root} does not exist in ZooKeeper",
                    code=32,
                )
            await zk_init.create_replica(keeper, paths, spec.columns_text)
        await zk_init.create_new_nodes(keeper, paths, self.structure.metadata_text)
        await self._activate()
        await self.leader.join()
        await clone_replica_if_needed(keeper, paths, self.store, queue_state=self.queue_state, tz=self.env.tz)
        if first:  # as 18.16: only when the table is loaded (later, parts may be in flight)
            await check_parts_at_startup(
                keeper,
                paths,
                self.store,
                columns_version=self.structure.columns_version,
                tz=self.env.tz,
            )
            self._parts_checked = True
        await self._load_queue()
        await remove_failed_quorum_parts(keeper, paths, self.store)
        await update_quorum_if_we_have_part(
            self.keeper,
            self.paths,
            lambda name: self.store.active_containing(PartInfo.parse(name)) is not None,
        )

    async def _activate(self) -> None:
        address = ReplicaAddress(
            host=self.env.interserver_host,
            replication_port=self.env.interserver.port,
            queries_port=self.env.tcp_port,
            database=self.spec.name.database,
            table=self.spec.name.table,
            scheme=self.env.interserver.scheme,
        )
        deadline = time.monotonic() + self.env.activation_timeout_s
        while True:
            try:
                await zk_init.activate_replica(self.keeper, self.paths, address.to_text(), self.identifier)
                return
            except zk_init.ReplicaIsAlreadyActiveError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _load_queue(self) -> None:
        entries, pointer = await load_queue(self.keeper, self.paths, self.env.tz)
        known = self.queue_state.znode_names()
        fresh = [(e.znode_name, e) for e in entries if e.znode_name not in known]
        for gone in known - {e.znode_name for e in entries}:  # ZooKeeper is the truth (e.g. after a clone)
            self.queue_state.remove_entry(gone)
        self.queue_state.load(fresh, time.time())
        self.queue_state.initialize(self.store.active_names())  # no part of a removed entry lingers
        self.puller.reset_pointer(pointer)

    async def stop(self) -> None:
        """Undo :meth:`start` in reverse order: the background tasks (last started first, each awaited before
        the next is asked: :func:`replicad.tasks.stop_in_reverse`) and the queue work in flight, the
        DataPartsExchange endpoint, then the ZooKeeper start-up's leader candidacy and ``is_active`` (the data
        stays)."""
        self._stopping = True
        if self.supervisor is not None:
            await self.supervisor.stop_group(self._task_group, TASK_STOP_TIMEOUT_S)
        await stop_in_reverse(self._own_runners, TASK_STOP_TIMEOUT_S)
        self._own_runners.clear()
        for task in reversed(self.tasks.values()):  # the ones a failed start never started: never later
            task.request_stop()
        await self.executor.cancel_running()
        self.env.interserver.withdraw(self.paths.me.root)
        await self.fetcher.close()
        if self.keeper.session_state is SessionState.CONNECTED:
            await self.leader.leave()
        await self.deactivate()
        self.restarting.close()

    async def stop_inserts(self, timeout_s: float = 30.0) -> None:
        """Refuse new inserts and wait (bounded) for the ones in flight."""
        self._stopping = True
        deadline = time.monotonic() + timeout_s
        while self._inserts_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def deactivate(self) -> None:
        if self.keeper.session_state is not SessionState.CONNECTED:
            return
        try:
            data, stat = await self.keeper.get(self.paths.me.is_active)
            if data.decode() == self.identifier:
                await self.keeper.delete(self.paths.me.is_active, stat.version)
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            log.warning("deactivate_failed", error=str(e))

    # ------------------------------------------------------------------------------------------- tasks

    def _on_pulled(self, entries: list[LogEntry]) -> None:
        now = time.time()
        for e in entries:
            self.queue_state.insert(e.znode_name, e, now)
        self.executor.wakeup()

    def _on_parts_changed(self) -> None:
        # An executed entry may have made parts outdated (waking the cleanup after every fetch cost ZooKeeper
        # reads and a directory scan per insert: see CleanupThread.parts_outdated).
        self.cleanup.parts_outdated()

    def enqueue_part_check(self, name: str, delay_s: float = 0.0) -> None:
        self.part_check.enqueue(name, delay_s)

    async def refresh_zk_summary(self, max_age_s: float = ZK_SUMMARY_MAX_AGE_S) -> None:
        """Re-read the ZooKeeper fields of :meth:`status` unless they are younger than ``max_age_s`` (the
        ``/metrics`` scrape asks before it reads them).  On demand, as 18.16 reads them for
        ``system.replicas``: refreshing them in every cleanup round cost 2 + N ZooKeeper requests per table
        per 30-40 s on a daemon nobody was looking at, the largest part of its idle cost with many tables."""
        now = time.monotonic()
        if now - self._zk_summary_at < max_age_s or self.is_readonly:
            return
        self._zk_summary = await self.replicas_summary()
        self._zk_summary_at = now

    def _on_restarted(self) -> None:
        self.queue_updating.wakeup()
        self.executor.wakeup()
        self.part_check.wakeup()
        self.cleanup.wakeup()

    def _part_for_send(self, name: str) -> ServedPart | None:
        part = self.store.for_send(name)
        if part is None:
            return None
        checksums = part.directory.checksums
        return ServedPart(part.path, checksums, self.store.fresh.get(name, checksums) or ())

    # ------------------------------------------------------------------------------------------- insert

    async def insert(
        self, batches: AsyncIterator[pa.RecordBatch], columns: list[str] | None, settings: InsertSettings
    ) -> InsertSummary:
        if settings.stage is not None:
            if settings.insert_quorum > 1:
                raise BadInputError("insert_quorum cannot be used with a staged insert (replicad_stage_run)",
                                    code=36)
            s = await self.staging.stage(settings.stage, batches, columns)
            return InsertSummary(written_rows=s.rows, written_parts=s.parts,
                                 deduplicated_blocks=int(s.deduplicated), staged_on=self.spec.replica_name)
        ctx = InsertContext(
            deduplicate=settings.insert_deduplicate, token=settings.insert_deduplication_token,
            max_partitions=settings.max_partitions_per_insert_block,
        )
        quorum_timeout_s = settings.insert_quorum_timeout_ms / 1000.0
        rows = parts = dedup = nbytes = 0
        self._inserts_in_flight += 1
        try:
            async for batch in batches:
                stage_times.mark("parse_rows")
                if self.is_readonly:
                    raise ReadOnlyError(f"Table {self.spec.name} is in readonly mode")
                await self._delay_if_many_parts()
                quorum = None
                if settings.insert_quorum > 1:  # as 18.16: checked once per block, before writing it
                    quorum = await check_quorum_precondition(self.keeper, self.paths, settings.insert_quorum)
                    stage_times.mark("zk_quorum_check")
                table = pa.Table.from_batches([batch])
                if columns is not None and list(table.column_names) != list(columns):
                    table = table.rename_columns(list(columns))
                nbytes += table.nbytes

                async def commit(tp: TempPart, quorum: QuorumPrecondition | None = quorum) -> CommitResult:
                    if fault_plant.planted("ack_before_commit"):  # test-only planted bug
                        fault_plant.later(self.committer.commit(tp, quorum, quorum_timeout_s))
                        return CommitResult("", False)
                    return await self.committer.commit(tp, quorum, quorum_timeout_s)

                # written and committed under the table structure of the moment (again after an ALTER)
                for tp, result in await self.alter.write_and_commit(table, ctx, commit):
                    if result.deduplicated:
                        dedup += 1
                    else:
                        parts += 1
                        rows += tp.rows
                # let the block go before the parser builds the next one (``async for`` rebinds ``batch``
                # only once the next block is ready: two blocks were held at once)
                del table, batch
            stage_times.mark("parse_end")
        except BaseException:
            # parts written but not committed (a later part of the block failed): never left behind.  A part
            # that got as far as the commit was renamed away from its tmp path, so this removes only those.
            leftovers = [tp.path for tp in ctx.parts if tp.path.exists()]
            if leftovers:
                await asyncio.to_thread(_remove_dirs, leftovers)
            raise
        finally:
            self._inserts_in_flight -= 1
        return InsertSummary(
            written_rows=rows, written_parts=parts, deduplicated_blocks=dedup, written_bytes=nbytes
        )

    async def insert_table(self, table: pa.Table, settings: InsertSettings | None = None) -> InsertSummary:
        """Convenience: insert one Arrow table as one block."""

        async def gen() -> AsyncIterator[pa.RecordBatch]:
            for b in table.combine_chunks().to_batches(max_chunksize=max(table.num_rows, 1)):
                yield b

        return await self.insert(gen(), list(table.column_names), settings or InsertSettings())

    async def _delay_if_many_parts(self) -> None:
        """Before each block: wait while the busiest partition holds parts_to_delay_insert parts or more, or
        refuse the block from parts_to_throw_insert on (replicad.replication.insert_delay)."""
        worst = self.store.max_active_in_partition()
        delay = self.parts_limit.delay_s(worst)
        if delay > 0:
            log.info("delaying_insert", table=self.spec.name, ms=round(delay * 1000, 3), parts=worst)
            await asyncio.sleep(delay)

    # ------------------------------------------------------------------------------------------- select

    async def iter_rows(
        self, names: Sequence[str], where: str | None = None, granules_per_batch: int = 16
    ) -> AsyncIterator[pa.Table]:
        """The active parts' rows, a few granules at a time, filtered by ``where`` (see TableReader)."""
        async for batch in self.reader.iter_rows(names, where, granules_per_batch):
            yield batch

    async def read_all(self, columns: Sequence[str] | None = None, where: str | None = None) -> pa.Table:
        """Every (matching) row of the active parts, in storage Arrow."""
        return await self.reader.read_all(columns, where)

    async def select(self, query: SelectQuery) -> QueryResult:
        return await self.reader.select(query)

    async def count(self, where: str | None) -> int:
        return await self.reader.count(where)

    async def execute(self, statement: Statement) -> ExecuteResult:
        handler = self.statement_handlers.get(statement.kind)
        if handler is not None:
            return await handler(statement)
        if statement.kind is StatementKind.SYNC_REPLICA:
            await self.sync_replica()
            return ExecuteResult()
        if statement.kind in _OPS_STATEMENTS:
            if self.is_readonly:
                raise ReadOnlyError(f"Table {self.spec.name} is in readonly mode")
            return await self.ops.execute(statement)
        raise ReplicadError(f"{statement.kind.value} is not supported by this replica yet", code=48)

    async def sync_replica(self, timeout_s: float = 300.0) -> None:
        """Pull the log and wait until every entry present now has been executed."""
        await self.puller.pull()
        target = self.queue_state.znode_names()
        deadline = time.monotonic() + timeout_s
        while target & self.queue_state.znode_names():
            if time.monotonic() > deadline:
                raise ReplicadError("SYSTEM SYNC REPLICA timed out", code=159, retriable=True)
            self.executor.wakeup()
            await asyncio.sleep(0.05)

    # ---------------------------------------------------------------------------------------- introspection

    def status(self) -> dict[str, Any]:
        """The ``system.replicas`` row and replicad's own health fields."""
        return replica_status.replicas_row(self, self._zk_summary, list(self.tasks.values()))

    async def replicas_summary(self) -> dict[str, int]:
        """``total_replicas`` / ``active_replicas`` / ``log_max_index`` (need ZooKeeper)."""
        return await replica_status.zookeeper_summary(self.keeper, self.paths)

    async def replicas_view(self) -> list[dict[str, Any]]:
        """Every replica of the table as ZooKeeper shows it (the cluster view)."""
        return await replica_status.replicas_view(self.keeper, self.paths)

    def parts(self) -> list[dict[str, Any]]:
        """``system.parts`` rows (every part the store knows, active or not)."""
        return replica_status.parts_rows(self.store)

    def queue_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "database": self.spec.name.database,
                "table": self.spec.name.table,
                "replica_name": self.paths.replica_name,
                **row,
            }
            for row in self.queue_state.replication_queue_rows()
        ]

    def queue(self) -> list[dict[str, Any]]:
        return self.queue_rows()

    def mutations(self) -> list[dict[str, Any]]:
        return self.ops.mutation_rows()

    async def staged_commit(self, job_id: str, run: str, tasks: list[StagedTask]) -> dict[str, Any]:
        return await self.staging.commit(job_id, run, tasks)

    async def staged_abort(self, run: str, job_id: str) -> dict[str, Any]:
        return await self.staging.abort(run, job_id)

    async def staged_status(self, run: str) -> dict[str, Any]:
        return await self.staging.status(run)


def _remove_dirs(paths: list[Path]) -> None:
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
