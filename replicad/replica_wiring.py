"""The collaborators of one :class:`replicad.replica.TableReplica`, built and wired by one function.

:func:`build_collaborators` creates, in dependency order, what a replica is made of (ClickHouse builds the
same units in ``StorageReplicatedMergeTree``'s constructor): the local parts and their layout, the insert
schema and the reader, the queue, the committer and the fetcher, the log puller and the queue executor, leader
election, and the self-healing threads (cleanup, part check, restarting).  What they call back into the
replica (read-only state, start-up, wake-ups) is the narrow :class:`ReplicaHooks`; the replica itself is the
hooks object, and the callbacks are bound lazily, so nothing is called before the replica is complete.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.model.queue_entry import BackoffSettings
from replicad.model.queue_state import QueueState
from replicad.replication.cleanup import CleanupSettings, CleanupThread
from replicad.replication.commit import PartCommitter
from replicad.replication.executor import QueueExecutor
from replicad.replication.fetcher import PartFetcher
from replicad.replication.init import TableStructure
from replicad.replication.insert_delay import PartsLimit
from replicad.replication.leader import LeaderElection
from replicad.replication.log_puller import LogPuller, QueueUpdatingTask
from replicad.replication.own_inserts import OwnInserts
from replicad.replication.part_check import PartCheckThread
from replicad.replication.part_store import PartState, PartStore
from replicad.replication.restarting import RestartingThread
from replicad.replication.sink import TableSchema, column_defaults
from replicad.replication.table_context import ActionBlockers
from replicad.replication.zero_copy import remote_parts_for
from replicad.storage.layout import TableDataLayout
from replicad.storage.part import columns_text as part_columns_text
from replicad.storage.writer import WriterSettings
from replicad.table_reader import TableReader
from replicad.table_spec import ReplicaEnv, TableSpec


class ReplicaHooks(Protocol):
    """What the collaborators call back into their replica for."""

    @property
    def is_readonly(self) -> bool: ...

    @property
    def structure(self) -> TableStructure | None: ...

    def enqueue_part_check(self, name: str, delay_s: float = 0.0) -> None: ...

    def _on_pulled(self, entries: list[LogEntry]) -> None: ...

    def _startup_zookeeper(self) -> Awaitable[None]: ...

    def _on_restarted(self) -> None: ...


@dataclass
class Collaborators:
    layout: TableDataLayout
    store: PartStore
    schema: TableSchema
    reader: TableReader  # SELECT / count / full reads of the active parts
    writer_settings: WriterSettings
    parts_limit: PartsLimit  # parts_to_delay_insert / parts_to_throw_insert / max_delay_to_insert
    queue_state: QueueState
    committer: PartCommitter
    fetcher: PartFetcher
    puller: LogPuller
    queue_updating: QueueUpdatingTask
    executor: QueueExecutor
    leader: LeaderElection
    cleanup: CleanupThread
    part_check: PartCheckThread
    restarting: RestartingThread
    blockers: ActionBlockers  # SYSTEM STOP FETCHES / MERGES


def build_collaborators(
    spec: TableSpec, keeper: Keeper, env: ReplicaEnv, paths: TablePaths, identifier: str, hooks: ReplicaHooks
) -> Collaborators:
    s = spec.settings
    # ClickHouse's durability settings, all off by default (env.fsync=False: never fsync)
    fsync_files = env.fsync and bool(int(s.get("fsync_after_insert", 0)))
    fsync_dirs = env.fsync and bool(int(s.get("fsync_part_directory", 0)))
    fsync_fetched = int(s.get("min_compressed_bytes_to_fsync_after_fetch", 0)) if env.fsync else 0
    layout = TableDataLayout(env.data_path, spec.name.database, spec.name.table, fsync_dirs)
    store = PartStore(layout, float(s.get("old_parts_lifetime", 480)))
    store.remote = remote_parts_for(  # parts on an S3 disk (storage_policy), shared with zero-copy
        s, database=spec.name.database, table=spec.name.table, table_zk_path=spec.zk_path,
        replica=spec.replica_name, disks=env.disks, policies=env.storage_policies, keeper=keeper,
    )
    schema = TableSchema(spec.columns, spec.partition_by, spec.order_by, spec.primary_key, env.tz,
                         defaults=column_defaults(spec.columns_text))
    reader = TableReader(spec.columns, [n for n, _t in schema.insertable_columns], store, env.tz,
                         on_broken_part=hooks.enqueue_part_check, schema=schema)
    base = env.writer or WriterSettings()
    writer_settings = WriterSettings(
        index_granularity=int(s.get("index_granularity", base.index_granularity)),
        min_compress_block_size=base.min_compress_block_size,
        max_compress_block_size=base.max_compress_block_size,
        method=base.method,
        level=base.level,
        fsync=fsync_files,
        threads=base.threads,
    )
    # 18.16 retries a failed entry after a few seconds; fetches are cheap to retry, so start short
    queue_state = QueueState(backoff=BackoffSettings(initial_s=0.5, max_fetch_s=10.0, max_merge_s=10.0))
    committer = PartCommitter(
        keeper,
        paths,
        store,
        columns_version=lambda: hooks.structure.columns_version if hooks.structure else 0,
        tz=env.tz,
        enqueue_part_check=hooks.enqueue_part_check,
    )
    own_inserts = OwnInserts(spec.replica_name, queue_state,
                             lambda name: (p := store.get(name)) is not None and p.state is PartState.ACTIVE)
    committer.on_committed = own_inserts.committed
    fetcher = PartFetcher(keeper, paths, store, table_columns_text=spec.columns_text,
                          credentials=env.credentials, min_bytes_to_fsync=fsync_fetched,
                          max_part_bytes=env.max_fetch_part_bytes)
    fetcher.part_columns_text = part_columns_text(spec.columns)
    fetcher.known_columns_version = lambda: hooks.structure.columns_version if hooks.structure else None
    puller = LogPuller(keeper, paths, hooks._on_pulled, tz=env.tz,
                       min_unprocessed_insert_time=lambda: queue_state.min_unprocessed_insert_time)
    puller.on_read = fetcher.precheck_sources
    puller.own = own_inserts
    puller.known = lambda znode: znode in queue_state
    blockers = ActionBlockers()
    executor = QueueExecutor(f"{spec.name}:queue_executing", keeper, paths, queue_state, store, fetcher,
                             max_parallel_fetches=env.max_parallel_fetches)
    fetcher.early_allowed = lambda: not executor.is_paused() and not blockers.fetches
    leader = LeaderElection(keeper, paths)
    # self-healing (replicad.replication.cleanup / part_check / restarting / clone)
    cleanup = CleanupThread(f"{spec.name}:cleanup", keeper, paths, store, CleanupSettings.from_settings(s),
                            is_leader=lambda: leader.is_leader, is_readonly=lambda: hooks.is_readonly)
    part_check = PartCheckThread(f"{spec.name}:part_check", keeper, paths, store, queue_state, tz=env.tz,
                                 is_readonly=lambda: hooks.is_readonly, on_queue_changed=executor.wakeup)
    restarting = RestartingThread(f"{spec.name}:restarting", keeper, paths, identifier=identifier,
                                  startup=hooks._startup_zookeeper, queue_state=queue_state,
                                  on_restarted=hooks._on_restarted)
    executor.is_paused = lambda: hooks.is_readonly
    executor.blocked = blockers.reason
    executor.on_part_missing = lambda name: part_check.enqueue(name, delay_s=5.0)
    return Collaborators(
        layout=layout,
        store=store,
        schema=schema,
        reader=reader,
        writer_settings=writer_settings,
        parts_limit=PartsLimit(
            int(s.get("parts_to_delay_insert", 150)), int(s.get("parts_to_throw_insert", 300)),
            float(s.get("max_delay_to_insert", 1))),
        queue_state=queue_state,
        committer=committer,
        fetcher=fetcher,
        puller=puller,
        queue_updating=QueueUpdatingTask(f"{spec.name}:queue_updating", puller),
        executor=executor,
        leader=leader,
        cleanup=cleanup,
        part_check=part_check,
        restarting=restarting,
        blockers=blockers,
    )
