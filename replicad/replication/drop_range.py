"""DROP PARTITION / DETACH PARTITION / TRUNCATE: DROP_RANGE entries, as ClickHouse 18.16 writes and runs them.

Writing (``dropPartsInPartition``):

1. take (and at once release) a fresh block number N of the partition — every part inserted later gets a
   bigger number, so nothing new can be merged with the dropped parts; N = 0 means the partition never had
   data: nothing is written;
2. the range is the fake part ``<pid>_0_<N-1>_999999999[_<m>]``, ``m`` being the partition's current mutation
   version at N (so mutated parts are inside it);
3. ``blocks/<pid>_*`` deduplication ids of the range are deleted (re-inserting the same data works again);
4. merges inside the range are disabled in our own queue (its virtual parts), then one multi creates the
   ``drop``/``detach`` entry in ``log/`` and bumps ``/log`` (a concurrent merge assignment that read the log
   before then fails and looks again — modern ClickHouse's rule; 18.16 relies on the leader writing both).

Executing (``executeDropRange``) on every replica: queue entries producing parts inside the range are removed
(the queue does not start the drop while one of them runs); every local part whose blocks lie inside the range
leaves the working set — active ones are moved to ``detached/`` for DETACH, everything else is removed by the
cleanup at once — and their ``replicas/<me>/parts`` nodes are removed.  Parts still being committed by a local
insert are left alone: their GET_PART comes after the drop in the log, so every replica keeps them alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from replicad.errors import KeeperError, KeeperNoNodeError, KeeperNotEmptyError, ZnodeFormatError
from replicad.keeper.block_lock import BlockNumberAllocator, valid_partitions
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Op, Set
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_entry import Selected
from replicad.model.queue_state import QueueState
from replicad.model.quorum import QuorumEntry
from replicad.replication.executor import EntryNotReadyError, remove_parts_from_zookeeper
from replicad.replication.part_store import PartState, PartStore
from replicad.replication.quorum import fail_quorum_for_part

log = get_logger(__name__)


def inside_range(drop: PartInfo, part: PartInfo) -> bool:
    """18.16's removePartsInRangeFromWorkingSet test: the part's blocks lie inside the drop range (levels and
    mutation numbers do not matter)."""
    return (
        part.partition_id == drop.partition_id
        and drop.min_block <= part.min_block
        and part.max_block <= drop.max_block
    )


def _block_in_range(data: bytes, partition_id: str, lo: int, hi: int) -> bool:
    """Whether a ``blocks/<id>`` node (data: the part that inserted it) belongs to the dropped range.  18.16
    reads the data as a block number and removes everything it cannot parse; we read part names too."""
    text = data.decode("utf-8", "replace").strip()
    if text.lstrip("-").isdigit():
        return lo <= int(text) <= hi
    info = PartInfo.try_parse(text)
    if info is None or info.partition_id != partition_id:
        return True
    return lo <= info.min_block and info.max_block <= hi


async def clear_blocks_in_partition(
    keeper: Keeper, paths: TablePaths, partition_id: str, lo: int, hi: int
) -> int:
    """clearBlocksInPartition: delete the deduplication ids of the partition's blocks lo..hi."""
    prefix = partition_id + "_"
    names = [b for b in await keeper.get_children(paths.blocks) if b.startswith(prefix)]
    nodes = await keeper.get_many([paths.block(b) for b in names])
    removed = 0
    for name, node in zip(names, nodes, strict=True):
        if node is None or not _block_in_range(node[0], partition_id, lo, hi):
            continue
        try:
            await keeper.delete(paths.block(name))
            removed += 1
        except KeeperNoNodeError:
            pass
        except KeeperNotEmptyError:  # leftover children from old server versions
            await keeper.delete(paths.block(name), recursive=True)
            removed += 1
        except KeeperError as e:
            log.warning("block_id_removal_failed", block=name, error=str(e))
    log.debug("deleted_block_ids", partition=partition_id, count=removed)
    return removed


class DropRanges:
    """Writes and executes DROP_RANGE entries for one table."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        queue: QueueState,
        allocator: BlockNumberAllocator,
        *,
        mutation_version: Callable[[str, int], int] = lambda _pid, _n: 0,
        tz: str = "UTC",
        on_parts_removed: Callable[[], None] = lambda: None,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.queue = queue
        self.allocator = allocator
        self.mutation_version = mutation_version
        self.tz = tz
        self.on_parts_removed = on_parts_removed
        self.dropped_parts_total = 0
        self.detached_parts_total = 0

    # ------------------------------------------------------------------------------------------ writing

    async def drop_range_for(self, partition_id: str) -> PartInfo | None:
        """getFakePartCoveringAllPartsInPartition: consumes one block number; None for an empty partition."""
        lock = await self.allocator.allocate(self.keeper, partition_id)
        if lock is None:  # pragma: no cover - no block id given, never a duplicate
            return None
        await lock.unlock(self.keeper)
        if lock.number == 0:
            return None
        return PartInfo.drop_range(
            partition_id, lock.number, self.mutation_version(partition_id, lock.number)
        )

    async def drop_partition(self, partition_id: str, *, detach: bool = False) -> LogEntry | None:
        """dropPartsInPartition: the DROP_RANGE entry written (None: the partition is empty)."""
        drop = await self.drop_range_for(partition_id)
        if drop is None:
            log.info("partition_empty_not_dropping", partition=partition_id)
            return None
        await clear_blocks_in_partition(self.keeper, self.paths, partition_id, drop.min_block, drop.max_block)
        self.queue.disable_merges_in_range(drop.name)
        entry = LogEntry.drop_range(
            drop.name, source_replica=self.paths.replica_name, detach=detach, create_time=int(time.time())
        )
        text = entry.to_bytes(self.tz)
        ops: list[Op] = [Create(self.paths.log_prefix, text, sequence=True), Set(self.paths.log, b"")]
        try:
            results = await self.keeper.multi(ops)
        except BaseException:
            # no DROP_RANGE of ours will remove the range (or, if the multi was applied after all, its entry
            # brings it back when pulled): left, it kept merges and mutations out of the partition for good
            self.queue.initialize(self.store.active_names())
            raise
        created = entry.with_znode(basename(str(results[0])))
        log.info("wrote_drop_range", range=drop.name, detach=detach, log_entry=created.znode_name)
        return created

    async def truncate(self) -> list[LogEntry]:
        """TRUNCATE: a DROP_RANGE in every partition that has block numbers."""
        entries: list[LogEntry] = []
        for pid in valid_partitions(await self.keeper.get_children(self.paths.block_numbers)):
            entry = await self.drop_partition(pid)
            if entry is not None:
                entries.append(entry)
        return entries

    # ------------------------------------------------------------------------------------------ executing

    async def _fail_quorums_inside(self, drop: PartInfo) -> None:
        """A quorum insert waiting for a part of the dropped range can never be satisfied (every replica
        drops its GET_PART): mark it failed, or ``quorum/status`` would refuse every later quorum insert of
        the table ("Another quorum insert has been already started").  Found by the chaos suite (seed 8)."""
        try:
            candidates = []
            raw = await self.keeper.get_many([self.paths.quorum_status])
            if raw[0] is not None:
                candidates.append(QuorumEntry.parse(raw[0][0]).part_name)
            try:
                candidates += await self.keeper.get_children(f"{self.paths.quorum}/parallel")
            except KeeperNoNodeError:
                pass
            for name in candidates:
                info = PartInfo.try_parse(name)
                if info is not None and inside_range(drop, info):
                    await fail_quorum_for_part(self.keeper, self.paths, name)
        except (KeeperError, ZnodeFormatError) as e:  # the drop itself is done either way
            log.warning("quorum_of_dropped_part_not_failed", range=drop.name, error=str(e))

    async def execute(self, selected: Selected) -> None:
        """executeDropRange (registered for DROP_RANGE and DROP_PART)."""
        entry, qe = selected.entry, selected.queue_entry
        range_name = entry.new_part_name
        drop = PartInfo.parse(range_name)
        removed, waiting = self.queue.remove_part_producing_ops_in_range(range_name, qe.znode_name)
        for znode in removed:
            try:
                await self.keeper.delete(self.paths.me.queue_entry(znode))
            except KeeperNoNodeError:
                pass
        if removed:
            log.info("removed_queue_entries_in_range", range=range_name, entries=removed)
        if waiting:
            raise EntryNotReadyError(f"Waiting for {len(waiting)} entries inside {range_name} to finish")
        victims = [
            p
            for p in self.store.all_parts()
            if p.state is not PartState.PRECOMMITTED and inside_range(drop, p.info)
        ]
        detached: list[str] = []
        for p in victims:
            if entry.detach and p.state is PartState.ACTIVE:
                await self.store.detach(p.name, "")
                detached.append(p.name)
            else:
                self.store.make_outdated(p.name)
                p.remove_time = 0.0  # clear_without_timeout: the cleanup deletes it on its next run
        names = [p.name for p in victims]
        await remove_parts_from_zookeeper(self.keeper, self.paths, names)
        await self._fail_quorums_inside(drop)
        self.dropped_parts_total += len(names) - len(detached)
        self.detached_parts_total += len(detached)
        log.info(
            "dropped_range",
            range=range_name,
            parts=names,
            detached=detached,
            type=LogEntryType.DROP_RANGE.value if drop.is_fake_drop_range else LogEntryType.DROP_PART.value,
        )
        self.on_parts_removed()
