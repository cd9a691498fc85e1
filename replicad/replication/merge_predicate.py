"""Which parts may be merged (or mutated) together now: ClickHouse 18.16's ReplicatedMergeTreeMergePredicate.

The hard part is making sure no new part can ever appear between two parts chosen for a merge.  Inserts take
their block number (an abandonable ``block-`` lock) some time before their log entry is committed, so the log
alone does not tell which numbers are still coming.  Hence the snapshot, taken in this order:

1. ``prev_virtual_parts`` — a copy of the queue's virtual parts (the log executed up to some point);
2. ``committing_blocks`` — block numbers whose ``block_numbers/<pid>/block-N`` lock is held by a live insert
   or mutation: the node's data names an existing ``temp/abandonable_lock-*`` holder (18.16, 22.11+ writes the
   persistent ``…-insert`` / ``…-other`` holders, which match the same way) or is the newest
   ``operation: …`` form;
3. the mutations and the log are pulled again (fresh ``virtual_parts``).

Then a part present in ``prev_virtual_parts`` has every part with a smaller number either committing or in the
fresh virtual parts, and every mutation with a smaller number either committing or loaded.  ``can_merge``
checks neighbours against that: same partition; both already known; no committing block and no virtual part
in the gap; neither already assigned to a merge/mutation (the fresh virtual part containing it is itself); not
a quorum part in progress or the latest quorum part; the same current mutation version.

The ``/log`` version is read first: assignment multis ``set /log`` with it (modern ClickHouse's optimistic
lock), so two assigners (a new leader and an old one that has not noticed yet, modern replicas, an OPTIMIZE
racing the merge selector) never write conflicting entries from the same snapshot.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from replicad.errors import KeeperNoNodeError, ZnodeFormatError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.mutation_entry import MutationEntry
from replicad.model.part_info import MAX_LEVEL, PartInfo
from replicad.model.part_set import ActivePartSet
from replicad.model.queue_state import QueueState
from replicad.model.quorum import QuorumEntry, QuorumLastPart
from replicad.replication.mutations import MAX_BLOCK_NUMBER, MutationsState, count_parts_to_mutate

log = get_logger(__name__)

HOLDER_PREFIX = "abandonable_lock-"


@dataclass
class MergePredicate:
    queue: QueueState
    mutations: MutationsState
    prev_virtual_parts: ActivePartSet
    #: partition id -> sorted block numbers still being committed
    committing_blocks: dict[str, list[int]] = field(default_factory=dict)
    last_quorum_parts: frozenset[str] = frozenset()
    inprogress_quorum_part: str = ""
    #: version of ``<zk>/log`` read before the snapshot (-1: unknown)
    log_version: int = -1

    # -- merges -----------------------------------------------------------------------------------------

    def merge_blocker(self, left: PartInfo, right: PartInfo) -> str | None:
        """Why neighbours ``left`` and ``right`` may not end up in one merge; None = they may."""
        if left.partition_id != right.partition_id:
            return f"Parts {left.name} and {right.name} belong to different partitions"
        for part in (left, right):
            if part.name in self.last_quorum_parts:
                return f"Part {part.name} is the most recent part with a satisfied quorum"
            if part.name == self.inprogress_quorum_part:
                return f"Quorum insert for part {part.name} is currently in progress"
            if self.prev_virtual_parts.get_containing_part(part) is None:
                return f"Entry for part {part.name} hasn't been read from the replication log yet"
        left_max, right_min = left.max_block, right.min_block
        if left_max > right_min:
            left_max, right_min = right_min, left_max
        if left_max + 1 < right_min:
            blocks = self.committing_blocks.get(left.partition_id, [])
            i = bisect.bisect_right(blocks, left_max)
            if i < len(blocks) and blocks[i] < right_min:
                return (
                    f"Block number {blocks[i]} is still being inserted "
                    f"between parts {left.name} and {right.name}"
                )
        for part in (left, right):
            containing = self.queue.virtual_parts.get_containing_part(part)
            if containing != part.name:
                return f"Part {part.name} has already been assigned a merge into {containing}"
        if left_max + 1 < right_min:
            gap = PartInfo(left.partition_id, left_max + 1, right_min - 1, MAX_LEVEL, MAX_BLOCK_NUMBER)
            covered = self.queue.virtual_parts.get_parts_covered_by(gap)
            if covered:
                return (
                    f"There are {len(covered)} parts (from {covered[0]} to {covered[-1]}) that are still not "
                    f"present on this replica between {left.name} and {right.name}"
                )
        left_version = self.mutations.current_version(left.partition_id, left.data_version)
        right_version = self.mutations.current_version(left.partition_id, right.data_version)
        if left_version != right_version:
            return (
                f"Current mutation versions of parts {left.name} and {right.name} differ: "
                f"{left_version} and {right_version} respectively"
            )
        return None

    def can_merge(self, left: PartInfo, right: PartInfo) -> bool:
        return self.merge_blocker(left, right) is None

    # -- mutations ---------------------------------------------------------------------------------------

    def desired_mutation_version(self, part: PartInfo) -> int | None:
        """The mutation version ``part`` should be mutated to now, or None (``getDesiredMutationVersion``)."""
        if part.name in self.last_quorum_parts or part.name == self.inprogress_quorum_part:
            return None
        if self.queue.virtual_parts.get_containing_part(part) != part.name:
            return None
        top = self.mutations.max_version(part.partition_id)
        if top is None:
            return None
        if self.mutations.current_version(part.partition_id, part.data_version) >= top:
            return None
        return top

    def is_mutation_finished(self, entry: MutationEntry) -> bool:
        for partition_id, block_number in entry.block_numbers:
            blocks = self.committing_blocks.get(partition_id, [])
            pending = bisect.bisect_left(blocks, block_number)
            if pending:
                log.debug(
                    "mutation_waits_for_inserts",
                    mutation=entry.znode_name,
                    partition=partition_id,
                    blocks=pending,
                )
                return False
        appeared = count_parts_to_mutate(entry, self.queue.virtual_parts)
        if appeared:
            log.debug("mutation_parts_appeared", mutation=entry.znode_name, parts=appeared)
            return False
        return True


def is_committing(data: bytes, holders: set[str]) -> bool:
    """Whether a ``block-N`` lock node's data says an insert/mutation holding it is still alive."""
    text = data.decode("utf-8", "replace")
    return text in holders or text.startswith("operation:")


async def load_committing_blocks(keeper: Keeper, paths: TablePaths) -> dict[str, list[int]]:
    temp_children = await keeper.get_children(paths.temp)
    holders = {f"{paths.temp}/{c}" for c in temp_children if c.startswith(HOLDER_PREFIX)}
    partitions = sorted(await keeper.get_children(paths.block_numbers))
    listed = await keeper.get_children_many([paths.partition_block_numbers(p) for p in partitions])
    nodes: list[tuple[str, int, str]] = []
    for pid, children in zip(partitions, listed, strict=True):
        for c in children or ():
            if c.startswith("block-") and c[6:].isdigit():
                nodes.append((pid, int(c[6:]), f"{paths.partition_block_numbers(pid)}/{c}"))
    datas = await keeper.get_many([p for _, _, p in nodes])
    out: dict[str, list[int]] = {}
    for (pid, number, _path), node in zip(nodes, datas, strict=True):
        if node is not None and is_committing(node[0], holders):
            out.setdefault(pid, []).append(number)
    for numbers in out.values():
        numbers.sort()
    return out


async def load_merge_predicate(
    keeper: Keeper,
    paths: TablePaths,
    queue: QueueState,
    mutations: MutationsState,
    pull: Callable[[], Awaitable[object]],
) -> MergePredicate:
    """Take the snapshot described in the module docstring (``pull`` runs pullLogsToQueue)."""
    stat = await keeper.exists(paths.log)
    log_version = stat.version if stat is not None else -1
    prev = ActivePartSet(queue.virtual_parts.infos(), new_contains=queue.new_contains)
    last_quorum_parts: frozenset[str] = frozenset()
    inprogress = ""
    quorum = await keeper.get_many([paths.quorum_last_part, paths.quorum_status])
    if quorum[0] is not None and quorum[0][0].strip():
        try:
            last_quorum_parts = frozenset(QuorumLastPart.parse(quorum[0][0]).parts.values())
        except ZnodeFormatError as e:
            log.warning("cannot_parse_quorum_last_part", error=str(e))
    if quorum[1] is not None:
        try:
            inprogress = QuorumEntry.parse(quorum[1][0]).part_name
        except ZnodeFormatError as e:
            log.warning("cannot_parse_quorum_status", error=str(e))
    try:
        committing = await load_committing_blocks(keeper, paths)
    except KeeperNoNodeError:
        committing = {}
    await mutations.update()
    await pull()
    return MergePredicate(queue, mutations, prev, committing, last_quorum_parts, inprogress, log_version)
