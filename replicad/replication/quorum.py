"""Quorum inserts (``insert_quorum`` ≥ 2), as ClickHouse 18.16 runs them through ``<zk>/quorum/status``.

Inserting replica: before writing, ``quorum/status`` must not exist (the previous quorum insert is done), our
``is_active`` and ``host`` must exist, and enough replicas must be alive; the commit multi additionally
creates ``quorum/status`` (``QuorumEntry`` naming the part, us as the first replica) and checks the versions
of our ``is_active`` and ``host`` (so a re-activated replica cannot complete an old insert).  After the commit
we wait until ``quorum/status`` disappears or names another part (``insert_quorum_timeout``; on timeout the
insert fails with UnknownInsertStatusError — the part may still reach its quorum later, never a success
without it), then check that ``is_active`` is still ours.

Fetching replica (``update_quorum``): after committing a part that ``quorum/status`` — or modern ClickHouse's
``quorum/parallel/<part>`` (insert_quorum_parallel=1) — names, add ourselves; the replica that completes the
quorum removes the node and, for ``quorum/status``, records the part in ``quorum/last_part`` in the same
multi (modern ClickHouse does not touch ``last_part`` for parallel quorums).
Failing quorum (``try_mark_quorum_failed`` for a GET_PART no active replica can serve,
``fail_quorum_for_part`` for a part the part check found lost forever): remove the status node, create
``quorum/failed_parts/<part>`` and remove the block id, in one multi, so the insert can be retried.

Live replicas are counted as replicas with ``is_active`` (as modern ClickHouse does); 18.16 counted
``leader_election`` children — replicad stands in the election too, so both counts agree.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicad.errors import (
    KeeperBadVersionError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    QuorumError,
    ReadOnlyError,
    UnknownInsertStatusError,
)
from replicad.keeper.client import Keeper, WatchEvent
from replicad.keeper.ops import Check, Create, Delete, Op, Set
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry
from replicad.model.part_info import PartInfo
from replicad.model.quorum import QuorumEntry, QuorumLastPart

if TYPE_CHECKING:
    from replicad.replication.part_store import PartStore

log = get_logger(__name__)


@dataclass(frozen=True)
class QuorumPrecondition:
    """What the commit multi checks (taken before the part is written)."""

    quorum: int
    is_active_value: bytes
    is_active_version: int
    host_version: int


async def count_live_replicas(keeper: Keeper, paths: TablePaths) -> int:
    names = await keeper.get_children(paths.replicas)
    stats = await asyncio.gather(*(keeper.exists(paths.replica(n).is_active) for n in names))
    return sum(1 for s in stats if s is not None)


async def check_quorum_precondition(keeper: Keeper, paths: TablePaths, quorum: int) -> QuorumPrecondition:
    live = await count_live_replicas(keeper, paths)
    if live < quorum:
        raise QuorumError(
            f"Number of alive replicas ({live}) is less than requested quorum ({quorum}).", code=285
        )
    status = await keeper.exists(paths.quorum_status)
    if status is not None:
        try:
            data, _ = await keeper.get(paths.quorum_status)
        except KeeperNoNodeError:
            data = b""
        raise QuorumError(
            f"Quorum for previous write has not been satisfied yet. Status: {data.decode(errors='replace')}",
            code=286,
        )
    try:
        is_active, active_stat = await keeper.get(paths.me.is_active)
        host_stat = await keeper.exists(paths.me.host)
    except KeeperNoNodeError:
        raise ReadOnlyError("Replica is not active right now") from None
    if host_stat is None:
        raise ReadOnlyError("Replica is not active right now")
    return QuorumPrecondition(quorum, is_active, active_stat.version, host_stat.version)


def quorum_commit_ops(paths: TablePaths, part_name: str, pre: QuorumPrecondition) -> list[Op]:
    entry = QuorumEntry(part_name, pre.quorum, (paths.replica_name,))
    return [
        Create(paths.quorum_status, entry.to_bytes()),
        Check(paths.me.is_active, pre.is_active_version),
        Check(paths.me.host, pre.host_version),
    ]


async def wait_for_quorum(
    keeper: Keeper, paths: TablePaths, part_name: str, pre: QuorumPrecondition, timeout_s: float
) -> None:
    """Return when the quorum for ``part_name`` is reached (``quorum/status`` gone or about another part)."""
    await _wait_status_moves_on(keeper, paths, part_name, timeout_s)
    # The status node is gone: the quorum was reached, or the others gave up on it while we were away (no
    # active holder: quorum/failed_parts, the block id removed, our part detached when we re-activate).
    # 18.16 looks only at is_active, whose re-created node has the same text (and version 0) after a lost
    # session: our re-activation also rewrote ``host``, so its version tells it.
    try:
        value, _ = await keeper.get(paths.me.is_active)
    except KeeperNoNodeError:
        value = b""
    host = await keeper.exists(paths.me.host)
    if value != pre.is_active_value or host is None or host.version != pre.host_version:
        raise UnknownInsertStatusError("Replica become inactive while waiting for quorum", code=254)
    await _raise_if_failed(keeper, paths, part_name)


async def wait_for_existing_quorum(
    keeper: Keeper, paths: TablePaths, block_id: str, timeout_s: float
) -> None:
    """A quorum insert found to be a duplicate (its block id is taken) is acknowledged only once the part
    holding that block has its quorum, as modern ClickHouse waits for it: a retry sent while the first
    attempt still waited, or before it committed, was acknowledged at once."""
    try:
        data, _ = await keeper.get(paths.block(block_id))
    except KeeperNoNodeError:  # removed since: a failed quorum (or a dropped partition) took the block id
        raise UnknownInsertStatusError(
            f"Unknown status, client must retry. Reason: block {block_id} was removed while its insert was "
            "checked for a quorum", code=319) from None
    part_name = data.decode("utf-8", "replace")
    await _wait_status_moves_on(keeper, paths, part_name, timeout_s)
    await _raise_if_failed(keeper, paths, part_name)


async def _raise_if_failed(keeper: Keeper, paths: TablePaths, part_name: str) -> None:
    if await keeper.exists(f"{paths.quorum_failed_parts}/{part_name}") is not None:
        raise UnknownInsertStatusError(
            f"Unknown status, client must retry. Reason: the quorum for part {part_name} was marked failed "
            "(no other replica could fetch it); the part will not be kept and the insert may be retried",
            code=319)


async def _wait_status_moves_on(keeper: Keeper, paths: TablePaths, part_name: str, timeout_s: float) -> None:
    """Until ``quorum/status`` is gone or names another part (UnknownInsertStatusError 159 on timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        changed = asyncio.Event()

        def on_change(_event: WatchEvent, ev: asyncio.Event = changed) -> None:
            ev.set()

        try:
            data, _ = await keeper.get(paths.quorum_status, watch=on_change)
        except KeeperNoNodeError:
            break
        status = QuorumEntry.parse(data)
        if status.part_name != part_name:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            # 18.16's text and code (TIMEOUT_EXCEEDED); the part stays and may still reach its quorum later
            raise UnknownInsertStatusError(
                f"Timeout while waiting for quorum: part {part_name} is on "
                f"{status.actual_number_of_replicas} of {status.required_number_of_replicas} replicas "
                f"({', '.join(status.replicas)}) after "
                f"{timeout_s:g} s; the insert is not confirmed and may still complete",
                code=159,
            )
        try:
            await asyncio.wait_for(changed.wait(), timeout=min(remaining, 1.0))
        except TimeoutError:
            pass


def parallel_status_path(paths: TablePaths, part_name: str) -> str:
    """Modern ClickHouse's per-part quorum node (``insert_quorum_parallel=1``)."""
    return f"{paths.quorum}/parallel/{part_name}"


async def _status_node(
    keeper: Keeper, paths: TablePaths, part_name: str
) -> tuple[str, bool, QuorumEntry, int] | None:
    """(path, is_parallel, entry, version) of the quorum node tracking ``part_name``, if any."""
    for path, parallel in ((parallel_status_path(paths, part_name), True), (paths.quorum_status, False)):
        try:
            data, stat = await keeper.get(path)
        except KeeperNoNodeError:
            continue
        entry = QuorumEntry.parse(data)
        if entry.part_name == part_name:
            return path, parallel, entry, stat.version
    return None


async def update_quorum(keeper: Keeper, paths: TablePaths, part_name: str) -> bool:
    """We now have ``part_name``: count ourselves in its quorum node (``updateQuorum``).  True when we
    completed the quorum."""
    while True:
        found = await _status_node(keeper, paths, part_name)
        if found is None:
            return False  # reached already (or never a quorum insert)
        path, parallel, entry, version = found
        if paths.replica_name in entry.replicas:
            return False
        entry = entry.with_replica(paths.replica_name)
        try:
            if entry.is_reached:
                ops: list[Op] = [Delete(path, version)]
                if not parallel:
                    raw_last, last_stat = await keeper.get(paths.quorum_last_part)
                    last = QuorumLastPart.parse(raw_last)
                    last = last.with_part(PartInfo.parse(part_name).partition_id, part_name)
                    ops.append(Set(paths.quorum_last_part, last.to_bytes(), last_stat.version))
                await keeper.multi(ops)
                log.info("quorum_reached", part=part_name, parallel=parallel)
                return True
            await keeper.set(path, entry.to_bytes(), version)
            log.info("quorum_updated", part=part_name, replicas=list(entry.replicas))
            return False
        except KeeperMultiError as e:
            if isinstance(e.cause, KeeperNoNodeError):
                return False
            if isinstance(e.cause, KeeperBadVersionError):
                continue
            raise
        except KeeperNoNodeError:
            return False
        except KeeperBadVersionError:
            continue


async def update_quorum_if_we_have_part(
    keeper: Keeper, paths: TablePaths, has_part: Callable[[str], bool]
) -> None:
    """At start-up: a quorum insert we fetched before a restart may still be waiting for us."""
    names: list[str] = []
    try:
        data, _ = await keeper.get(paths.quorum_status)
        names.append(QuorumEntry.parse(data).part_name)
    except KeeperNoNodeError:
        pass
    try:
        names += await keeper.get_children(f"{paths.quorum}/parallel")
    except KeeperNoNodeError:
        pass
    for name in names:
        if has_part(name):
            await update_quorum(keeper, paths, name)


async def _fail_quorum(
    keeper: Keeper, paths: TablePaths, part_name: str, block_id: str, guard: list[Op]
) -> bool:
    found = await _status_node(keeper, paths, part_name)
    if found is None:
        return False
    path, _parallel, _entry, version = found
    ops = [*guard, Delete(path, version), Create(f"{paths.quorum_failed_parts}/{part_name}", b"")]
    if block_id and await keeper.exists(paths.block(block_id)) is not None:
        ops.append(Delete(paths.block(block_id)))
    try:
        await keeper.multi(ops)
    except KeeperMultiError as e:
        if isinstance(e.cause, KeeperBadVersionError | KeeperNoNodeError | KeeperNodeExistsError):
            log.info("quorum_state_changed_retry", part=part_name, error=str(e))
            return False
        raise
    log.warning("quorum_marked_failed", part=part_name, block_id=block_id)
    return True


async def fail_quorum_for_part(keeper: Keeper, paths: TablePaths, part_name: str, block_id: str = "") -> bool:
    """A part lost forever: if a quorum insert waits for it, mark that quorum failed.  True if done."""
    return await _fail_quorum(keeper, paths, part_name, block_id, [])


async def try_mark_quorum_failed(
    keeper: Keeper,
    paths: TablePaths,
    entry: LogEntry,
    find_active_holder: Callable[[str], Awaitable[str | None]],
) -> bool:
    """No active replica has the part of a quorum GET_PART: settle the insert as failed.  True if done.

    As 18.16: guarded by the versions of every replica's ``host`` (a replica coming back meanwhile, which may
    hold the part, changes its ``host``), and only after looking for an active holder once more."""
    replicas = await keeper.get_children(paths.replicas)
    guard: list[Op] = []
    for r in replicas:
        stat = await keeper.exists(paths.replica(r).host)
        if stat is not None:
            guard.append(Check(paths.replica(r).host, stat.version))
    if await find_active_holder(entry.new_part_name):
        return False  # it came alive meanwhile: fetch it
    return await _fail_quorum(keeper, paths, entry.new_part_name, entry.block_id, guard)


async def remove_failed_quorum_parts(keeper: Keeper, paths: TablePaths, store: PartStore) -> list[str]:
    """At every (re)start: a local part whose quorum was marked failed (``quorum/failed_parts``: nobody else
    will ever fetch it, and its insert was answered with an error, so it may have been retried) is not data:
    its ``parts/`` node is removed and it moves to ``detached/noquorum_<name>``, as modern ClickHouse's
    removeFailedQuorumParts.  Kept, the replica that wrote it (typically paused past its session while the
    others gave up on the quorum) would serve rows nobody else has.  Returns the parts moved."""
    try:
        failed = await keeper.get_children(paths.quorum_failed_parts)
    except KeeperNoNodeError:
        return []
    moved = []
    for name in sorted(failed):
        part = store.get(name)
        if part is None:
            continue
        for path in (paths.me.part_checksums(name), paths.me.part_columns(name), paths.me.part(name)):
            try:
                await keeper.delete(path)
            except KeeperNoNodeError:
                pass
        await store.detach(name, "noquorum")
        log.warning("failed_quorum_part_detached", part=name)
        moved.append(name)
    return moved
