"""Repairing a lost replica by mimicking a healthy one (``cloneReplicaIfNeeded`` / ``cloneReplica``).

A replica is *lost* when ``replicas/<me>/is_lost`` is ``"1"``: it was created in a table that already had
replicas (18.16's ``createReplica``), or the cleanup thread of the leader marked it because it stayed
inactive while more than ``max_replicated_logs_to_keep`` log entries went by (the entries it still needed
are gone).  At start-up (and after every re-activation) such a replica:

1. picks a source: a replica whose ``is_lost`` is ``"0"`` (or absent: a pre-``is_lost`` server), preferring an
   active one, then the largest ``log_pointer``;
2. forgets its own queue (ZooKeeper nodes and the in-memory entries);
3. copies the source's ``log_pointer`` in a multi that also checks the source's ``is_lost`` version (it must
   not become lost meanwhile; for a source without ``is_lost`` a create+remove pair proves that) and the
   version of the source's ``log_pointer`` read together with the source's queue names, so the copied queue
   and pointer belong together (retried when the pointer moved);
4. keeps a local part only when the source has exactly that part (active, or to be produced by an entry of
   its queue) and ZooKeeper lists it for us; every other local part moves to ``detached/clone_<name>`` and
   its ``replicas/<me>/parts`` node is removed (parts are set aside, never deleted);
5. writes one ``get`` entry with an empty ``source replica:`` (as ClickHouse's cloneReplica) for every active
   part of the source that we lack — parts inside a DROP_RANGE still waiting in the source's queue are
   skipped — then copies the source's GET_PART / ATTACH_PART / MERGE_PARTS / MUTATE_PART queue entries
   byte for byte (as modern ClickHouse; drops are already reflected by the source's part set);
6. sets ``is_lost`` back to ``"0"``.  Any failure leaves ``is_lost`` at ``"1"``: the next start-up retries.

The queue nodes are created through multis of at most 100 operations; the entries are loaded by the
caller's queue loading afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from replicad.errors import (
    KeeperBadVersionError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
    ZnodeFormatError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Create, Delete, Op, Set
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.part_set import ActivePartSet
from replicad.model.queue_state import QueueState
from replicad.replication.executor import remove_parts_from_zookeeper
from replicad.replication.part_store import PartStore

log = get_logger(__name__)
T_ = TypeVar("T_")

T = LogEntryType
#: Queue entries a clone copies from its source (ClickHouse copies only part-producing entries).
COPIED_TYPES = frozenset((T.GET_PART, T.ATTACH_PART, T.MERGE_PARTS, T.MUTATE_PART))
DETACH_PREFIX = "clone"
MAX_MULTI_OPS = 100


class AllReplicasLostError(ReplicadError):
    code = 415  # ALL_REPLICAS_LOST
    retriable = True


class ReplicaStatusChangedError(ReplicadError):
    code = 416  # REPLICA_STATUS_CHANGED
    retriable = True


@dataclass(frozen=True)
class CloneSource:
    name: str
    #: version of its ``is_lost`` node, -1 when it has none (a replica created by a pre-is_lost server)
    is_lost_version: int
    active: bool
    log_pointer: int


@dataclass(frozen=True)
class CloneResult:
    source: str  # "" when there was nobody to copy from (a new table whose replicas have no data)
    log_pointer: int
    fetch_entries: int  # ``get`` entries written for parts of the source we lack
    copied_entries: int  # entries copied from the source's queue
    kept_parts: tuple[str, ...]
    detached_parts: tuple[str, ...]


async def choose_source(keeper: Keeper, paths: TablePaths) -> CloneSource | None:
    """A replica that is not lost: active ones first, then the one that has pulled the most of the log."""
    best: CloneSource | None = None
    for name in sorted(await keeper.get_children(paths.replicas)):
        if name == paths.replica_name:
            continue
        rp = paths.replica(name)
        try:
            lost, stat = await keeper.get(rp.is_lost)
            version = stat.version
        except KeeperNoNodeError:
            lost, version = b"0", -1
        if lost != b"0":
            continue
        try:
            raw, _ = await keeper.get(rp.log_pointer)
        except KeeperNoNodeError:
            continue  # half-created replica
        pointer = int(raw) if raw.strip().isdigit() else 0
        active = await keeper.exists(rp.is_active) is not None
        candidate = CloneSource(name, version, active, pointer)
        if best is None or (candidate.active, candidate.log_pointer) > (best.active, best.log_pointer):
            best = candidate
    return best


async def _gather(calls: list[Awaitable[T_]], window: int = 500) -> list[T_]:
    """Run the calls with at most ``window`` in flight (ZooKeeper requests are pipelined by kazoo)."""
    out: list[T_] = []
    for start in range(0, len(calls), window):
        out += await asyncio.gather(*calls[start : start + window])
    return out


async def _delete_quietly(keeper: Keeper, path: str) -> None:
    try:
        await keeper.delete(path)
    except KeeperNoNodeError:
        pass


async def _multi_batched(keeper: Keeper, ops: list[Op]) -> None:
    for start in range(0, len(ops), MAX_MULTI_OPS):
        await keeper.multi(ops[start : start + MAX_MULTI_OPS])


async def _clear_own_queue(keeper: Keeper, paths: TablePaths, queue_state: QueueState | None) -> int:
    names = await keeper.get_children(paths.me.queue)
    await _gather([_delete_quietly(keeper, paths.me.queue_entry(n)) for n in names])
    if queue_state is not None:
        for znode in sorted(queue_state.znode_names()):
            queue_state.remove_entry(znode)
    return len(names)


async def _copy_log_pointer(
    keeper: Keeper, paths: TablePaths, source: CloneSource
) -> tuple[bytes, list[str]]:
    """Copy the source's log pointer; returns it with the source's queue names read in the same snapshot."""
    src = paths.replica(source.name)
    while True:
        raw_pointer, pointer_stat = await keeper.get(src.log_pointer)
        ops: list[Op] = [Set(paths.me.log_pointer, raw_pointer)]
        if source.is_lost_version < 0:
            ops += [Create(src.is_lost, b"0"), Delete(src.is_lost)]
        else:
            ops.append(Check(src.is_lost, source.is_lost_version))
        queue_names = await keeper.get_children(src.queue)
        ops.append(Check(src.log_pointer, pointer_stat.version))
        try:
            await keeper.multi(ops)
            return raw_pointer, sorted(queue_names)
        except KeeperMultiError as e:
            if isinstance(e.cause, KeeperNodeExistsError):
                raise ReplicaStatusChangedError(
                    f"Can not clone replica, because the {source.name} updated to new ClickHouse version"
                ) from e
            if isinstance(e.cause, KeeperBadVersionError) and e.index == len(ops) - 1:
                log.info("clone_source_log_pointer_moved_retrying", source=source.name)
                continue
            if isinstance(e.cause, KeeperBadVersionError | KeeperNoNodeError):
                raise ReplicaStatusChangedError(
                    f"Can not clone replica, because the {source.name} became lost"
                ) from e
            raise


async def clone_replica(
    keeper: Keeper,
    paths: TablePaths,
    source: CloneSource,
    store: PartStore,
    *,
    queue_state: QueueState | None = None,
    tz: str = "UTC",
) -> CloneResult:
    """Mimic ``source`` (steps 2–5 of the module docstring)."""
    me = paths.me
    src = paths.replica(source.name)
    if await keeper.exists(src.columns) is None:  # only a replica created by a pre-2018 server, half-way
        raise ReplicaStatusChangedError(f"Replica {src.root} is not fully created yet")
    log.info("cloning_replica", source=source.name, source_active=source.active)
    await _clear_own_queue(keeper, paths, queue_state)
    raw_pointer, queue_names = await _copy_log_pointer(keeper, paths, source)

    # the source's queue: the entries to copy, the parts they will produce, the ranges they will drop
    nodes = await keeper.get_many([src.queue_entry(n) for n in queue_names])
    copied: list[bytes] = []
    virtual = ActivePartSet()
    drop_ranges: list[PartInfo] = []
    for name, node in zip(queue_names, nodes, strict=True):
        if node is None:
            continue
        data, stat = node
        try:
            entry = LogEntry.parse(data, tz=tz, znode_name=name, ctime=stat.ctime_ms // 1000)
        except ZnodeFormatError as e:
            log.warning("clone_skipping_unreadable_entry", entry=name, error=str(e))
            continue
        if entry.type in COPIED_TYPES:
            copied.append(data)
            virtual.add(entry.new_part_name)
        elif entry.drop_range_name:
            drop_ranges.append(PartInfo.parse(entry.drop_range_name))

    source_parts = ActivePartSet(await keeper.get_children(src.parts))
    wanted = [
        p for p in source_parts.infos() if not any(r.contains(p) and r != p for r in drop_ranges)
    ]
    keep_set = ActivePartSet(wanted)
    for name in virtual.parts():
        keep_set.add(name)

    # local parts: keep exact matches that ZooKeeper lists for us, set every other one aside
    ours_in_zk = set(await keeper.get_children(me.parts))
    kept: list[str] = []
    detached: list[str] = []
    for part in store.active():
        if keep_set.get_containing_part(part.name) == part.name and part.name in ours_in_zk:
            kept.append(part.name)
            continue
        log.warning("clone_detaching_local_part", part=part.name, source=source.name)
        await store.detach(part.name, DETACH_PREFIX)
        detached.append(part.name)
    stale_zk = [n for n in ours_in_zk if n not in kept]
    if stale_zk:
        log.warning("clone_removing_parts_from_zookeeper", parts=sorted(stale_zk), source=source.name)
        await remove_parts_from_zookeeper(keeper, paths, sorted(stale_zk))

    have = set(kept)
    missing = [p.name for p in wanted if p.name not in have]
    stats = await _gather([keeper.exists(src.part(n)) for n in missing])
    ops: list[Op] = []
    for name, st in zip(missing, stats, strict=True):
        create_time = 0 if st is None else st.ctime_ms // 1000
        entry = LogEntry.get_part(name, source_replica="", create_time=create_time)
        ops.append(Create(me.queue_prefix, entry.to_bytes(tz), sequence=True))
    ops += [Create(me.queue_prefix, data, sequence=True) for data in copied]
    await _multi_batched(keeper, ops)
    result = CloneResult(
        source.name,
        int(raw_pointer) if raw_pointer.strip().isdigit() else 0,
        len(missing),
        len(copied),
        tuple(kept),
        tuple(detached),
    )
    log.info(
        "replica_cloned",
        source=source.name,
        log_pointer=result.log_pointer,
        fetch_entries=result.fetch_entries,
        copied_entries=result.copied_entries,
        kept_parts=len(kept),
        detached_parts=list(detached),
    )
    return result


async def clone_replica_if_needed(
    keeper: Keeper,
    paths: TablePaths,
    store: PartStore,
    *,
    queue_state: QueueState | None = None,
    tz: str = "UTC",
) -> CloneResult | None:
    """Clone a healthy replica if ``is_lost`` is ``"1"``, then clear the flag.  None when not lost."""
    me = paths.me
    try:
        value, _ = await keeper.get(me.is_lost)
    except KeeperNoNodeError:
        # created by a server without lost replicas: it cannot be lost
        try:
            await keeper.create(me.is_lost, b"0")
        except KeeperNodeExistsError:
            pass
        return None
    if value == b"0":
        return None
    source = await choose_source(keeper, paths)
    if source is None:
        # Nobody to copy from.  Legitimate only for a table in which no replica holds or awaits data (its
        # first replica went away before writing anything): then there is nothing to clone.
        for name in await keeper.get_children(paths.replicas):
            if name == paths.replica_name:
                continue
            rp = paths.replica(name)
            if await keeper.get_children(rp.parts) or await keeper.get_children(rp.queue):
                raise AllReplicasLostError("All replicas are lost")
        result = CloneResult("", 0, 0, 0, (), ())
    else:
        result = await clone_replica(keeper, paths, source, store, queue_state=queue_state, tz=tz)
    await keeper.set(me.is_lost, b"0")
    return result
