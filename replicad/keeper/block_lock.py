"""Abandonable block-number lock, as ClickHouse 18.16 takes it (EphemeralLockInZooKeeper).

Allocating a block number for an insert into partition ``P``:

1. ``block_numbers/P`` is created if missing, in one multi with ``set block_numbers ""`` (the version bump
   lets mutations detect new partitions); an existing node is fine.
2. ``multi[create blocks/<id>; remove blocks/<id>; create temp/abandonable_lock- EPHEMERAL_SEQUENTIAL]`` —
   the first two ops are the early deduplication probe (only when a block id is given).  ZNODEEXISTS on the
   blocks path means the block was already inserted: no lock, ``None`` is returned.
3. ``create block_numbers/P/block- EPHEMERAL_SEQUENTIAL`` with the holder's path as data.  The 10-digit
   suffix is the block number.

The lock is released either by the commit multi (``unlock_ops``) or explicitly with ``unlock``; if the
session dies both nodes vanish and the number is simply abandoned (a gap).  18.16's merge predicate regards
a ``block-`` node as "being committed" only while its data names an existing ``temp/abandonable_lock-*``
node, which is why the holder is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.errors import KeeperError, KeeperMultiError, KeeperNodeExistsError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Delete, Op, Set
from replicad.keeper.paths import TablePaths, sequence_number
from replicad.logging import get_logger
from replicad.model.part_info import is_valid_partition_id

log = get_logger(__name__)


@dataclass(frozen=True)
class BlockNumberLock:
    """A held block number.

    ``path`` = ``block_numbers/P/block-N``, ``holder_path`` = ``temp/abandonable_lock-M``.
    """

    partition_id: str
    number: int
    path: str
    holder_path: str

    def unlock_ops(self) -> list[Op]:
        """The two removals that release the lock, to be appended to a commit multi (18.16 order)."""
        return [Delete(self.path), Delete(self.holder_path)]

    async def unlock(self, keeper: Keeper) -> None:
        await keeper.multi(self.unlock_ops())


class BlockNumberAllocator:
    """Allocates block numbers for one table, remembering which ``block_numbers/<pid>`` nodes exist."""

    def __init__(self, paths: TablePaths) -> None:
        self._paths = paths
        self._known_partitions: set[str] = set()

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
        self._known_partitions.add(partition_id)

    async def allocate(
        self, keeper: Keeper, partition_id: str, block_id: str | None = None
    ) -> BlockNumberLock | None:
        """Take the next block number of ``partition_id``.

        ``None`` when ``blocks/<block_id>`` exists (a duplicate block).
        """
        await self.ensure_partition(keeper, partition_id)
        holder_prefix = self._paths.abandonable_lock_prefix
        if block_id:
            block_path = self._paths.block(block_id)
            ops: list[Op] = [
                Create(block_path, b""),
                Delete(block_path),
                Create(holder_prefix, b"", ephemeral=True, sequence=True),
            ]
            try:
                results = await keeper.multi(ops)
            except KeeperMultiError as e:
                if e.index == 0 and isinstance(e.cause, KeeperNodeExistsError):
                    return None
                raise KeeperError(
                    f"Cannot allocate block number in ZooKeeper: {e}", retriable=e.retriable
                ) from e
            holder_path = str(results[-1])
        else:
            holder_path = await keeper.create(holder_prefix, b"", ephemeral=True, sequence=True)
        prefix = self._paths.block_number_prefix(partition_id)
        try:
            path = await keeper.create(prefix, holder_path.encode(), ephemeral=True, sequence=True)
        except BaseException:
            try:
                await keeper.multi([Delete(holder_path)])
            except KeeperError:
                pass  # ephemeral: it goes away with the session anyway
            raise
        if len(path) <= len(prefix):
            raise KeeperError(f"name of the sequential node {path!r} is shorter than its prefix")
        return BlockNumberLock(partition_id, sequence_number(path), path, holder_path)


def valid_partitions(children: list[str]) -> list[str]:
    """``block_numbers`` children that are partition IDs, sorted; anything else (left by a bug or a hand edit)
    is skipped with a warning, so it cannot break mutations and TRUNCATE."""
    bad = [c for c in children if not is_valid_partition_id(c)]
    if bad:
        log.warning("invalid_block_numbers_children_skipped", children=bad[:10])
    return sorted(c for c in children if is_valid_partition_id(c))
