"""ALTER TABLE … DELETE / UPDATE on a replicated table: the ``<zk>/mutations`` records, as ClickHouse 18.16.

Creating a mutation (``StorageReplicatedMergeTree::mutate``): read the version of ``/mutations``; take one
block number in *every* partition at once (``lock_all_partitions``: an abandonable ``block-`` lock per
``block_numbers/<pid>`` plus ``check block_numbers`` in one multi, retried when a partition appeared
meanwhile); then ``multi[set /mutations "" (version check), create /mutations/NNNNNNNNNN]`` — the version
check keeps mutation znodes in the order of their block numbers — and release the locks.  A part of
partition P needs the mutation when its data version (mutation number, else first block) is below the
mutation's number in P; parts inserted afterwards get bigger numbers and are left alone.

Every replica loads the records (``MutationsState.update``, woken by a watch on ``/mutations``); the leader
turns them into MUTATE_PART log entries (see ``merge_assigner``), every replica executes those (see
``merge_executor``) with the commands of all mutations between the part's version and the target version.
A replica considers a mutation done when no part it has, or will have once its queue is executed, still needs
it and no insert below the mutation's numbers is still committing; it then records the mutation's znode name
in ``replicas/<r>/mutation_pointer`` (``tryFinalizeMutations``).  ``mutations_sync`` waits on those pointers.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from replicad.errors import (
    KeeperBadVersionError,
    KeeperError,
    KeeperMultiError,
    KeeperNoNodeError,
    ReplicadError,
    ZnodeFormatError,
)
from replicad.keeper.block_lock import BlockNumberLock, valid_partitions
from replicad.keeper.client import Keeper, WatchEvent
from replicad.keeper.ops import Check, Create, Delete, Set
from replicad.keeper.paths import TablePaths, basename, sequence_number
from replicad.logging import get_logger
from replicad.model.mutation_entry import MutationEntry
from replicad.model.part_info import MAX_LEVEL, PartInfo
from replicad.model.part_set import ActivePartSet
from replicad.model.queue_state import QueueState
from replicad.storage.mutate import MutationCommand

log = get_logger(__name__)


class FinishedMutations(Protocol):
    """What :meth:`MutationsState.finalize` asks of a fresh merge predicate (``merge_predicate.py``)."""

    def is_mutation_finished(self, entry: MutationEntry) -> bool: ...


#: 18.16's MergeTreePartInfo::MAX_BLOCK_NUMBER, used as the mutation of a covering "fake" part
MAX_BLOCK_NUMBER = 999_999_999
TIMEOUT_EXCEEDED = 159


class MutationTimeoutError(ReplicadError):
    code = TIMEOUT_EXCEEDED
    retriable = True


# ------------------------------------------------------------------------------------------ block locks


async def lock_all_partitions(keeper: Keeper, paths: TablePaths) -> list[BlockNumberLock]:
    """18.16's EphemeralLocksInAllPartitions: one new block number in every partition, atomically."""
    holders: list[str] = []
    try:
        while True:
            partitions, stat = await keeper.get_children(paths.block_numbers, include_data=True)
            partitions = valid_partitions(partitions)
            while len(holders) < len(partitions):
                holders.append(
                    await keeper.create(paths.abandonable_lock_prefix, b"", ephemeral=True, sequence=True)
                )
            ops: list[Create | Check] = [
                Create(paths.block_number_prefix(p), holders[i].encode(), ephemeral=True, sequence=True)
                for i, p in enumerate(partitions)
            ]
            ops.append(Check(paths.block_numbers, stat.version))
            try:
                results = await keeper.multi(ops)
            except KeeperMultiError as e:
                if isinstance(e.cause, KeeperBadVersionError):
                    log.debug("new_partition_while_locking_retrying")
                    continue
                raise
            locks = [
                BlockNumberLock(p, sequence_number(str(results[i])), str(results[i]), holders[i])
                for i, p in enumerate(partitions)
            ]
            for extra in holders[len(partitions) :]:  # partitions vanished between attempts
                await _delete_quietly(keeper, extra)
            return locks
    except BaseException:
        for h in holders:
            await _delete_quietly(keeper, h)
        raise


async def unlock_all(keeper: Keeper, locks: Iterable[BlockNumberLock]) -> None:
    for lock in locks:
        try:
            await keeper.multi([Delete(lock.path), Delete(lock.holder_path)])
        except KeeperError as e:  # ephemeral: gone with the session at the latest
            log.warning("block_lock_release_failed", path=lock.path, error=str(e))


async def _delete_quietly(keeper: Keeper, path: str) -> None:
    try:
        await keeper.delete(path)
    except KeeperError:
        pass


# ------------------------------------------------------------------------------------------ helpers


def count_parts_to_mutate(entry: MutationEntry, parts: ActivePartSet) -> int:
    """Parts of ``parts`` whose data version is below the mutation's number in their partition."""
    count = 0
    for partition_id, block_number in entry.block_numbers:
        cover = PartInfo(partition_id, 0, block_number, MAX_LEVEL, MAX_BLOCK_NUMBER)
        for name in parts.get_parts_covered_by(cover):
            if PartInfo.parse(name).data_version < block_number:
                count += 1
    return count


def storage_commands(commands_text: str) -> list[MutationCommand]:
    """The commands of a mutation record (``DELETE WHERE x = 2, UPDATE …``) for ``storage.mutate``."""
    from replicad.sql.statements import parse_mutation_commands

    out: list[MutationCommand] = []
    for c in parse_mutation_commands(commands_text):
        if c.kind == "DELETE":
            out.append(MutationCommand.delete(c.predicate.text))
        else:
            out.append(MutationCommand.update([(col, e.text) for col, e in c.assignments], c.predicate.text))
    return out


@dataclass
class MutationStatus:
    entry: MutationEntry
    is_done: bool = False

    @property
    def znode_name(self) -> str:
        return self.entry.znode_name


# ------------------------------------------------------------------------------------------ state


class MutationsState:
    """The mutations of one table as this replica knows them (``mutations_by_znode`` / ``_by_partition``)."""

    def __init__(self, keeper: Keeper, paths: TablePaths, queue: QueueState, *, tz: str = "UTC") -> None:
        self.keeper = keeper
        self.paths = paths
        self.queue = queue
        self.tz = tz
        self.by_znode: dict[str, MutationStatus] = {}
        #: partition id -> sorted block numbers, and (partition id, block number) -> znode name
        self._versions: dict[str, list[int]] = {}
        self._znode_at: dict[tuple[str, int], str] = {}
        self.mutation_pointer = ""
        self.wake: Callable[[], None] = lambda: None  # the watch on /mutations fired
        self.on_new: list[Callable[[], None]] = []  # new records were loaded
        self._lock = asyncio.Lock()

    # -- loading ----------------------------------------------------------------------------------------

    def _on_watch(self, _event: WatchEvent) -> None:
        self.wake()

    async def load_pointer(self) -> None:
        try:
            raw, _ = await self.keeper.get(self.paths.me.mutation_pointer)
            self.mutation_pointer = raw.decode().strip()
        except KeeperNoNodeError:
            self.mutation_pointer = ""

    async def update(self) -> int:
        """18.16's updateMutations: forget records removed from ZooKeeper, load new ones; returns how many
        were loaded."""
        async with self._lock:
            names = set(await self.keeper.get_children(self.paths.mutations, watch=self._on_watch))
            for gone in [z for z in self.by_znode if z not in names]:
                self._forget(gone)
            todo = sorted(n for n in names if n not in self.by_znode)
            if not todo:
                return 0
            nodes = await self.keeper.get_many([f"{self.paths.mutations}/{n}" for n in todo])
            loaded = 0
            for name, node in zip(todo, nodes, strict=True):
                if node is None:
                    continue
                try:
                    entry = MutationEntry.parse(node[0], tz=self.tz, znode_name=name)
                except ZnodeFormatError as e:
                    log.error("cannot_parse_mutation", mutation=name, error=str(e))
                    continue
                self._add(entry)
                loaded += 1
            log.info("loaded_mutations", count=loaded, first=todo[0], last=todo[-1])
        for cb in list(self.on_new):
            cb()
        return loaded

    def _add(self, entry: MutationEntry) -> None:
        self.by_znode[entry.znode_name] = MutationStatus(entry, entry.znode_name <= self.mutation_pointer)
        self.by_znode = dict(sorted(self.by_znode.items()))
        for pid, number in entry.block_numbers:
            bisect.insort(self._versions.setdefault(pid, []), number)
            self._znode_at[(pid, number)] = entry.znode_name

    def _forget(self, znode: str) -> None:
        st = self.by_znode.pop(znode)
        log.debug("removing_obsolete_mutation", mutation=znode)
        for pid, number in st.entry.block_numbers:
            versions = self._versions.get(pid, [])
            i = bisect.bisect_left(versions, number)
            if i < len(versions) and versions[i] == number:
                del versions[i]
            if not versions:
                self._versions.pop(pid, None)
            self._znode_at.pop((pid, number), None)

    # -- versions -----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.by_znode)

    def current_version(self, partition_id: str, data_version: int) -> int:
        """The newest mutation (its number in the partition) regarded as applied to data of that version
        (``getCurrentMutationVersion``): the largest number <= ``data_version``, else 0."""
        versions = self._versions.get(partition_id)
        if not versions:
            return 0
        i = bisect.bisect_right(versions, data_version)
        return versions[i - 1] if i else 0

    def max_version(self, partition_id: str) -> int | None:
        versions = self._versions.get(partition_id)
        return versions[-1] if versions else None

    def commands_for(self, part: PartInfo, desired_version: int) -> list[str] | None:
        """Command texts of the mutations a part of ``part``'s data version needs to reach
        ``desired_version`` (``getMutationCommands``); None when ``desired_version`` is unknown here."""
        versions = self._versions.get(part.partition_id, [])
        if part.data_version > desired_version:
            log.warning("part_already_newer_than_mutation", part=part.name, desired=desired_version)
            return []
        begin = bisect.bisect_right(versions, part.data_version)
        end = bisect.bisect_left(versions, desired_version)
        if end >= len(versions) or versions[end] != desired_version:
            return None
        return [
            self.by_znode[self._znode_at[(part.partition_id, v)]].entry.commands
            for v in versions[begin : end + 1]
        ]

    # -- progress ----------------------------------------------------------------------------------------

    def parts_to_do(self, entry: MutationEntry) -> int:
        """Parts this replica has or will produce (queue) that still need ``entry``."""
        count = count_parts_to_mutate(entry, self.queue.current_parts)
        numbers = dict(entry.block_numbers)
        for qe in self.queue.entries:
            for name in qe.entry.virtual_part_names():
                info = PartInfo.try_parse(name)
                if info is None or info.is_fake_drop_range:
                    continue
                bn = numbers.get(info.partition_id)
                if bn is not None and info.data_version < bn:
                    count += 1
        return count

    async def finalize(self, load_predicate: Callable[[], Awaitable[FinishedMutations]]) -> bool:
        """18.16's tryFinalizeMutations; True when some candidate is not finished yet (look again later)."""
        candidates: list[MutationStatus] = []
        for znode, st in self.by_znode.items():
            if st.is_done:
                continue
            if znode <= self.mutation_pointer:
                st.is_done = True
            elif self.parts_to_do(st.entry) == 0:
                candidates.append(st)
        if not candidates:
            return False
        predicate = await load_predicate()
        finished = [st for st in candidates if predicate.is_mutation_finished(st.entry)]
        if finished:
            last = finished[-1].znode_name
            await self.keeper.set(self.paths.me.mutation_pointer, last.encode())
            self.mutation_pointer = max(self.mutation_pointer, last)
            for st in finished:
                st.is_done = True
                log.info("mutation_done", mutation=st.znode_name)
        return len(finished) != len(candidates)

    def pending(self) -> bool:
        return any(not st.is_done for st in self.by_znode.values())

    def rows(self) -> list[dict[str, Any]]:
        """system.mutations rows (one per command, as 18.16 shows them)."""
        from replicad.sql.statements import parse_mutation_commands

        out: list[dict[str, Any]] = []
        for znode, st in self.by_znode.items():
            e = st.entry
            try:
                commands = [c.to_text() for c in parse_mutation_commands(e.commands)]
            except ReplicadError:
                commands = [e.commands.strip()]
            todo = 0 if st.is_done else self.parts_to_do(e)
            for command in commands:
                out.append(
                    {
                        "mutation_id": znode,
                        "command": command,
                        "create_time": e.create_time,
                        "block_numbers.partition_id": [p for p, _ in e.block_numbers],
                        "block_numbers.number": [n for _, n in e.block_numbers],
                        "parts_to_do": todo,
                        "is_done": int(st.is_done),
                        "source_replica": e.source_replica,
                    }
                )
        return out


def count_finished(state: MutationsState) -> int:
    """Finished mutations at the start of the sequence (``countFinishedMutations``)."""
    count = 0
    for st in state.by_znode.values():
        if not st.is_done:
            break
        count += 1
    return count


async def clear_old_mutations(keeper: Keeper, paths: TablePaths, state: MutationsState, keep: int) -> int:
    """The leader's clearOldMutations: remove finished mutation records, keeping the newest ``keep`` and
    everything some replica's ``mutation_pointer`` has not passed yet.  Returns how many were removed."""
    if keep <= 0 or count_finished(state) <= keep:
        return 0
    replicas, stat = await keeper.get_children(paths.replicas, include_data=True)
    pointers = await keeper.get_many([paths.replica(r).mutation_pointer for r in replicas])
    if not pointers or any(p is None or not p[0].strip() for p in pointers):
        return 0  # a replica has not finished anything yet
    min_pointer = min(p[0].decode().strip() for p in pointers if p is not None)
    entries = sorted(n for n in await keeper.get_children(paths.mutations) if n <= min_pointer)
    doomed = entries[: max(len(entries) - keep, 0)]
    for start in range(0, len(doomed), 400):
        batch = doomed[start : start + 400]
        ops: list[Delete | Check] = [Delete(f"{paths.mutations}/{n}") for n in batch]
        ops.append(Check(paths.replicas, stat.version))  # no replica was added meanwhile
        await keeper.multi(ops)
        log.info("removed_old_mutations", count=len(batch), first=batch[0], last=batch[-1])
    return len(doomed)


# ------------------------------------------------------------------------------------------ creation


async def create_mutation(
    keeper: Keeper, paths: TablePaths, commands_text: str, *, tz: str = "UTC"
) -> MutationEntry:
    """Write a new ``mutations/NNNNNNNNNN`` record (block numbers in all partitions) and return it."""
    while True:
        _, stat = await keeper.get(paths.mutations)
        locks = await lock_all_partitions(keeper, paths)
        try:
            entry = MutationEntry(
                paths.replica_name,
                tuple((lock.partition_id, lock.number) for lock in locks),
                commands_text,
                int(time.time()),
            )
            ops: list[Set | Create] = [
                Set(paths.mutations, b"", stat.version),
                Create(f"{paths.mutations}/", entry.to_bytes(tz), sequence=True),
            ]
            try:
                results = await keeper.multi(ops)
            except KeeperMultiError as e:
                if isinstance(e.cause, KeeperBadVersionError):
                    log.debug("mutations_version_conflict_retrying")
                    continue
                raise
        finally:
            await unlock_all(keeper, locks)
        name = basename(str(results[1]))
        log.info(
            "created_mutation",
            mutation=name,
            commands=commands_text.strip(),
            block_numbers=dict(entry.block_numbers),
        )
        return MutationEntry(
            entry.source_replica, entry.block_numbers, entry.commands, entry.create_time, None, name
        )


async def wait_for_mutation(
    keeper: Keeper,
    paths: TablePaths,
    znode: str,
    replicas: Sequence[str],
    *,
    timeout_s: float = 600.0,
    poll_s: float = 0.1,
) -> None:
    """Until ``mutation_pointer`` of every replica in ``replicas`` reaches ``znode`` (inactive replicas that
    are not there yet make this time out, as ClickHouse's wait does)."""
    deadline = time.monotonic() + timeout_s
    waiting = list(replicas)
    while waiting:
        still: list[str] = []
        for r in waiting:
            try:
                raw, _ = await keeper.get(paths.replica(r).mutation_pointer)
            except KeeperNoNodeError:
                continue  # the replica was dropped
            if raw.decode().strip() < znode:
                still.append(r)
        waiting = still
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise MutationTimeoutError(
                f"Mutation {znode} is not finished on replicas {', '.join(waiting)} after {timeout_s:.0f} s"
            )
        await asyncio.sleep(poll_s)
