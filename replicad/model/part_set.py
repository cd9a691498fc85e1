"""A set of parts none of which covers or overlaps another (ClickHouse's ``ActiveDataPartSet``).

Used for the replication queue's ``virtual_parts`` (every part that will exist once the queue is executed)
and ``current_parts``, and for a replica's active parts.  Adding a part drops the parts it covers; a part
already covered is not added; a part that overlaps another without one containing the other is refused
(``AddOutcome.INTERSECTS``; modern ClickHouse throws LOGICAL_ERROR there, 18.16 silently kept both).

Two containment rules exist (CLICKHOUSE_FACTS §6.2): 18.16 ("OLD") — same partition, block range inside,
level and mutation not smaller; modern ("NEW") additionally requires equal block ranges, a strictly higher
level, or a fake drop-range level.  ``new_contains=True`` selects the modern rule.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum

from replicad.model.part_info import PartInfo


class AddOutcome(Enum):
    ADDED = "added"
    #: An existing part (``AddResult.conflict``) already contains the new one: nothing changed.
    COVERED = "covered"
    #: The new part overlaps ``AddResult.conflict`` without either containing the other: refused.
    INTERSECTS = "intersects"


@dataclass(frozen=True)
class AddResult:
    outcome: AddOutcome
    #: Parts removed because the new part covers them (ADDED only), in order.
    replaced: tuple[str, ...] = ()
    conflict: str | None = None

    @property
    def added(self) -> bool:
        return self.outcome is AddOutcome.ADDED


def _info(part: str | PartInfo) -> tuple[PartInfo, str]:
    if isinstance(part, PartInfo):
        return part, part.name
    return PartInfo.parse(part), part


class _Partition:
    """Parts of one partition, sorted; pairwise disjoint, so sorted by min_block and by max_block alike."""

    __slots__ = ("infos", "maxes", "mins", "names")

    def __init__(self) -> None:
        self.infos: list[PartInfo] = []
        self.names: list[str] = []
        self.mins: list[int] = []
        self.maxes: list[int] = []

    def overlapping(self, info: PartInfo) -> range:
        lo = bisect.bisect_left(self.maxes, info.min_block)
        hi = bisect.bisect_right(self.mins, info.max_block)
        return range(lo, max(lo, hi))

    def insert(self, info: PartInfo, name: str) -> None:
        i = bisect.bisect_left(self.mins, info.min_block)
        self.infos.insert(i, info)
        self.names.insert(i, name)
        self.mins.insert(i, info.min_block)
        self.maxes.insert(i, info.max_block)

    def delete(self, span: range) -> None:
        for lst in (self.infos, self.names, self.mins, self.maxes):
            del lst[span.start : span.stop]


class ActivePartSet:
    """Mutable set of non-overlapping parts, grouped by partition."""

    def __init__(self, parts: Iterable[str | PartInfo] = (), *, new_contains: bool = False) -> None:
        self.new_contains = new_contains
        self._partitions: dict[str, _Partition] = {}
        self._size = 0
        for p in parts:
            self.add(p)

    def contains_rule(self, outer: PartInfo, inner: PartInfo) -> bool:
        return outer.contains(inner, strict=self.new_contains)

    # -- changes --------------------------------------------------------------------------------------------
    def add(self, part: str | PartInfo) -> AddResult:
        info, name = _info(part)
        bucket = self._partitions.setdefault(info.partition_id, _Partition())
        span = bucket.overlapping(info)
        for i in span:
            if self.contains_rule(bucket.infos[i], info):
                return AddResult(AddOutcome.COVERED, conflict=bucket.names[i])
        for i in span:
            if not self.contains_rule(info, bucket.infos[i]):
                return AddResult(AddOutcome.INTERSECTS, conflict=bucket.names[i])
        replaced = tuple(bucket.names[i] for i in span)
        bucket.delete(span)
        bucket.insert(info, name)
        self._size += 1 - len(replaced)
        return AddResult(AddOutcome.ADDED, replaced)

    def remove(self, part: str | PartInfo) -> bool:
        """Remove exactly this part (not the parts it covers); False if it is not in the set."""
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        if bucket is None:
            return False
        for i in bucket.overlapping(info):
            if bucket.infos[i] == info:
                bucket.delete(range(i, i + 1))
                self._size -= 1
                if not bucket.infos:
                    del self._partitions[info.partition_id]
                return True
        return False

    def remove_covered_by(self, part: str | PartInfo) -> list[str]:
        """Remove every part contained in ``part`` (a drop range); returns their names."""
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        if bucket is None:
            return []
        doomed = [i for i in bucket.overlapping(info) if self.contains_rule(info, bucket.infos[i])]
        names = [bucket.names[i] for i in doomed]
        for i in reversed(doomed):
            bucket.delete(range(i, i + 1))
        self._size -= len(doomed)
        if not bucket.infos:
            del self._partitions[info.partition_id]
        return names

    def clear(self) -> None:
        self._partitions.clear()
        self._size = 0

    # -- queries --------------------------------------------------------------------------------------------
    def get_containing_part(self, part: str | PartInfo) -> str | None:
        """The part of the set that contains ``part`` (possibly ``part`` itself), if any."""
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        if bucket is None:
            return None
        for i in bucket.overlapping(info):
            if self.contains_rule(bucket.infos[i], info):
                return bucket.names[i]
        return None

    def get_overlapping_parts(self, part: str | PartInfo) -> list[str]:
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        return [] if bucket is None else [bucket.names[i] for i in bucket.overlapping(info)]

    def get_parts_covered_by(self, part: str | PartInfo) -> list[str]:
        """Parts contained in ``part``; empty if ``part`` is itself inside a bigger part of the set
        (``getPartsCoveredBy``)."""
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        if bucket is None:
            return []
        out: list[str] = []
        for i in bucket.overlapping(info):
            other = bucket.infos[i]
            if self.contains_rule(info, other):
                out.append(bucket.names[i])
            elif self.contains_rule(other, info):
                return []
        return out

    def parts_in_partition(self, partition_id: str) -> list[str]:
        bucket = self._partitions.get(partition_id)
        return [] if bucket is None else list(bucket.names)

    def partition_ids(self) -> list[str]:
        return sorted(self._partitions)

    def parts(self) -> list[str]:
        """All parts, sorted like ClickHouse (partition id, then block range)."""
        return [n for pid in sorted(self._partitions) for n in self._partitions[pid].names]

    def infos(self) -> list[PartInfo]:
        return [i for pid in sorted(self._partitions) for i in self._partitions[pid].infos]

    def __contains__(self, part: object) -> bool:
        if not isinstance(part, str | PartInfo):
            return False
        info, _ = _info(part)
        bucket = self._partitions.get(info.partition_id)
        return bucket is not None and any(bucket.infos[i] == info for i in bucket.overlapping(info))

    def __iter__(self) -> Iterator[str]:
        return iter(self.parts())

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ActivePartSet({self.parts()!r})"
