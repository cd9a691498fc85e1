"""Block-number lock of an insert (EphemeralLockInZooKeeper), taken in one ZooKeeper round trip.

Allocating a block number for an insert into partition ``P``:

1. ``block_numbers/P`` is created if missing, in one multi with ``set block_numbers ""`` (the version bump
   lets mutations detect new partitions); an existing node is fine.  Once per partition and process.
2. One multi: ``create blocks/<id>; remove blocks/<id>`` (the early deduplication probe, only when a block id
   is given: ZNODEEXISTS on the blocks path means the block was already inserted, no lock, ``None`` is
   returned); ``check temp/abandonable_lock-insert`` (exists); ``create block_numbers/P/block-
   EPHEMERAL_SEQUENTIAL`` whose data is that holder's path.  The 10-digit suffix is the block number.

This is ClickHouse 22.11+'s form: the holder ``temp/abandonable_lock-insert`` (``…-other`` without a block
id) is a persistent node shared by all inserts, created once, and the lock is the ephemeral ``block-`` node
alone.  18.16 took the lock in two round trips (an ``EPHEMERAL_SEQUENTIAL`` holder
``temp/abandonable_lock-NNNNNNNNNN`` first, then ``block-`` naming it).  Both forms mean the same to every
version's merge predicate: a ``block-`` node is "being committed" while it exists and its data names an
existing ``temp/abandonable_lock-*`` node; when the session dies the ``block-`` node vanishes and the number
is abandoned (a gap).

The lock is released either by the commit multi (``unlock_ops``) or explicitly with ``unlock``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from replicad import stage_times
from replicad.errors import KeeperError, KeeperMultiError, KeeperNodeExistsError, KeeperNoNodeError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Create, Delete, Op, Set
from replicad.keeper.paths import TablePaths, sequence_number
from replicad.logging import get_logger
from replicad.model.part_info import is_valid_partition_id

log = get_logger(__name__)

#: the shared persistent holders of ClickHouse 22.11+ (EphemeralLockInZooKeeper::LEGACY_LOCK_INSERT / _OTHER)
HOLDER_INSERT = "abandonable_lock-insert"
HOLDER_OTHER = "abandonable_lock-other"


@dataclass(frozen=True)
class BlockNumberLock:
    """A held block number.

    ``path`` = ``block_numbers/P/block-N``, ``holder_path`` = ``temp/abandonable_lock-…`` (its data).
    ``shared_holder``: the holder is a persistent node of all inserts (never removed with the lock).
    """

    partition_id: str
    number: int
    path: str
    holder_path: str
    shared_holder: bool = False

    def unlock_ops(self) -> list[Op]:
        """The removals that release the lock, to be appended to a commit multi (18.16 order)."""
        if self.shared_holder:
            return [Delete(self.path)]
        return [Delete(self.path), Delete(self.holder_path)]

    async def unlock(self, keeper: Keeper) -> None:
        await keeper.multi(self.unlock_ops())


@dataclass(frozen=True)
class SentLock:
    """A lock's multi already sent (:meth:`BlockNumberAllocator.send`); its answer is read on the loop."""

    partition_id: str
    block_id: str | None
    ops: list[Op]
    future: asyncio.Future[Any] = field(compare=False)


class BlockNumberAllocator:
    """Allocates block numbers for one table, remembering which ``block_numbers/<pid>`` nodes and holders
    exist."""

    def __init__(self, paths: TablePaths) -> None:
        self._paths = paths
        self._known_partitions: set[str] = set()
        self._known_holders: set[str] = set()

    async def ensure_partition(self, keeper: Keeper, partition_id: str) -> None:
        if partition_id in self._known_partitions:
            return
        ops: list[Op] = [
            Create(self._paths.partition_block_numbers(partition_id), b""),
            Set(self._paths.block_numbers, b"", -1),
        ]
        try:
            await keeper.multi(ops)
        except KeeperMultiError as e:
            if not isinstance(e.cause, KeeperNodeExistsError):
                raise
        stage_times.mark("zk_partition")
        self._known_partitions.add(partition_id)

    async def _ensure_holder(self, keeper: Keeper, holder: str) -> None:
        if holder in self._known_holders:
            return
        try:
            await keeper.create(holder, b"")
        except KeeperNodeExistsError:
            pass
        stage_times.mark("zk_holder")
        self._known_holders.add(holder)

    def _lock_ops(self, partition_id: str, block_id: str | None) -> tuple[str, str, list[Op]]:
        """(holder path, ``block-`` prefix, the lock's multi)."""
        holder = f"{self._paths.temp}/{HOLDER_INSERT if block_id else HOLDER_OTHER}"
        prefix = self._paths.block_number_prefix(partition_id)
        ops: list[Op] = []
        if block_id:
            block_path = self._paths.block(block_id)
            ops += [Create(block_path, b""), Delete(block_path)]
        ops += [Check(holder, -1), Create(prefix, holder.encode(), ephemeral=True, sequence=True)]
        return holder, prefix, ops

    def send(self, keeper: Keeper, partition_id: str, block_id: str | None = None) -> SentLock | None:
        """(any thread) The lock's multi of :meth:`allocate` sent now, from the calling thread, when the
        partition's node and the holder are known to exist (else None: :meth:`allocate` makes them first).
        Pass the result to :meth:`allocate` as ``sent``."""
        holder, _prefix, ops = self._lock_ops(partition_id, block_id)
        if partition_id not in self._known_partitions or holder not in self._known_holders:
            return None
        return SentLock(partition_id, block_id, ops, keeper.send_multi(ops))

    async def allocate(
        self, keeper: Keeper, partition_id: str, block_id: str | None = None, *, sent: SentLock | None = None
    ) -> BlockNumberLock | None:
        """Take the next block number of ``partition_id``.

        ``None`` when ``blocks/<block_id>`` exists (a duplicate block).  ``sent``: the multi already sent by
        :meth:`send` for the same partition and block id (its answer is taken as this call's first attempt).
        """
        if sent is not None and (sent.partition_id, sent.block_id) != (partition_id, block_id):
            raise ValueError("the lock sent was for another partition or block")
        for attempt in (0, 1):
            if sent is not None and attempt == 0:
                holder, prefix, ops = self._lock_ops(partition_id, block_id)
                answer = keeper.multi_answer(sent.future, sent.ops)
            else:
                await self.ensure_partition(keeper, partition_id)
                holder, prefix, ops = self._lock_ops(partition_id, block_id)
                await self._ensure_holder(keeper, holder)
                answer = keeper.multi(ops)
            try:
                results = await answer
            except KeeperMultiError as e:
                if block_id and e.index == 0 and isinstance(e.cause, KeeperNodeExistsError):
                    return None
                if attempt == 0 and isinstance(e.cause, KeeperNoNodeError) and e.index >= len(ops) - 2:
                    # the holder or the partition's node was removed behind our back: create them again
                    log.info("block_lock_nodes_missing", path=ops[e.index].path)
                    self._known_holders.discard(holder)
                    self._known_partitions.discard(partition_id)
                    continue
                raise KeeperError(
                    f"Cannot allocate block number in ZooKeeper: {e}", retriable=e.retriable
                ) from e
            stage_times.mark("zk_lock_multi")
            path = str(results[-1])
            if len(path) <= len(prefix):
                raise KeeperError(f"name of the sequential node {path!r} is shorter than its prefix")
            return BlockNumberLock(partition_id, sequence_number(path), path, holder, shared_holder=True)
        raise AssertionError("unreachable")


def valid_partitions(children: list[str]) -> list[str]:
    """``block_numbers`` children that are partition IDs, sorted; anything else (left by a bug or a hand edit)
    is skipped with a warning, so it cannot break mutations and TRUNCATE."""
    bad = [c for c in children if not is_valid_partition_id(c)]
    if bad:
        log.warning("invalid_block_numbers_children_skipped", children=bad[:10])
    return sorted(c for c in children if is_valid_partition_id(c))
