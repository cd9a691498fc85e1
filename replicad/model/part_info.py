"""Part names of custom-partitioned MergeTree tables (format_version >= 1).

``<partition_id>_<min_block>_<max_block>_<level>[_<mutation>]``; the mutation suffix is present only when it
is not 0.  Names are parsed strictly: the partition id is made of ``[A-Za-z0-9-]`` only, numbers are
canonical non-negative decimals within ClickHouse's ranges (blocks and mutation Int64, level UInt32), the
range is not inverted, and nothing may follow.  So ``PartInfo.parse(name).name == name`` for every name
accepted, and a name that passed :meth:`PartInfo.parse` is safe to use as a directory name.

Old-syntax names (``YYYYMMDD_YYYYMMDD_min_max_level``, format_version 0) are not supported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from replicad.errors import BadPartNameError

MAX_LEVEL = 999_999_999  # level of the fake part covering a DROP/DETACH range
LEGACY_MAX_LEVEL = 4_294_967_295  # the same for REPLACE/ATTACH PARTITION ranges written by 18.16
MAX_INT64 = (1 << 63) - 1
MAX_UINT32 = (1 << 32) - 1
MAX_PARTITION_ID_LENGTH = 128

_NUM = r"(0|[1-9][0-9]{0,18})"
_NAME_RE = re.compile(rf"([A-Za-z0-9-]{{1,{MAX_PARTITION_ID_LENGTH}}})_{_NUM}_{_NUM}_{_NUM}(?:_{_NUM})?")
_OLD_SYNTAX_RE = re.compile(r"[0-9]{8}_[0-9]{8}_[0-9]+_[0-9]+_[0-9]+(_[0-9]+)?")


#: PartInfo.parse's cache: name -> PartInfo (emptied when full)
_PARSED: dict[str, PartInfo] = {}
_PARSED_MAX = 4096


@dataclass(frozen=True, order=True, slots=True)
class PartInfo:
    """A part's identity.  Ordering is (partition_id, min_block, max_block, level, mutation)."""

    partition_id: str
    min_block: int
    max_block: int
    level: int
    mutation: int = 0

    def __post_init__(self) -> None:
        problem = _check_fields(self.partition_id, self.min_block, self.max_block, self.level, self.mutation)
        if problem:
            raise BadPartNameError(
                f"Invalid part {self.partition_id}_{self.min_block}_{self.max_block}: {problem}"
            )

    # ------------------------------------------------------------------ text

    @classmethod
    def parse(cls, name: str) -> Self:
        """Parse a part name; :class:`BadPartNameError` ("Unexpected part name: ...") on anything else.  A
        name parsed before is answered from a bounded cache (the value is immutable): a replica parses the
        same few names again and again (queue, part set, merges, the interserver's routes)."""
        if type(name) is str and cls is PartInfo:
            hit = _PARSED.get(name)
            if hit is not None:
                return hit  # type: ignore[return-value]
        info = cls._parse(name)
        if cls is PartInfo:
            if len(_PARSED) >= _PARSED_MAX:
                _PARSED.clear()
            _PARSED[name] = info
        return info

    @classmethod
    def _parse(cls, name: str) -> Self:
        if not isinstance(name, str):
            raise BadPartNameError(f"Unexpected part name: {name!r}")
        m = _NAME_RE.fullmatch(name)
        if m is None:
            hint = ""
            if _OLD_SYNTAX_RE.fullmatch(name):
                hint = " (old-syntax part names of format_version 0 tables are not supported)"
            raise BadPartNameError(f"Unexpected part name: {name!r}{hint}")
        pid, lo, hi, level, mutation = m.groups()
        problem = _check_fields(pid, int(lo), int(hi), int(level), int(mutation or 0))
        if not problem and mutation == "0":
            problem = "zero mutation suffix"
        if problem:
            if _OLD_SYNTAX_RE.fullmatch(name):
                problem += "; old-syntax part names of format_version 0 tables are not supported"
            raise BadPartNameError(f"Unexpected part name: {name!r} ({problem})")
        return cls(pid, int(lo), int(hi), int(level), int(mutation or 0))

    @classmethod
    def try_parse(cls, name: str) -> Self | None:
        try:
            return cls.parse(name)
        except BadPartNameError:
            return None

    @property
    def name(self) -> str:
        base = f"{self.partition_id}_{self.min_block}_{self.max_block}_{self.level}"
        return f"{base}_{self.mutation}" if self.mutation else base

    def __str__(self) -> str:
        return self.name

    # ------------------------------------------------------------------ relations

    def contains(self, other: PartInfo, *, strict: bool = False) -> bool:
        """True if this part's range covers ``other`` (ClickHouse 18.16 rule: same partition, block range
        includes, level and mutation not lower).  ``strict`` adds the modern rule: additionally the ranges
        are equal, or this level is higher, or this is a fake drop range."""
        covers = (
            self.partition_id == other.partition_id
            and self.min_block <= other.min_block
            and self.max_block >= other.max_block
            and self.level >= other.level
            and self.mutation >= other.mutation
        )
        if not covers or not strict:
            return covers
        same_range = self.min_block == other.min_block and self.max_block == other.max_block
        return same_range or self.level > other.level or self.is_fake_drop_range

    def is_disjoint(self, other: PartInfo) -> bool:
        """True if the block ranges cannot overlap (different partitions or non-intersecting ranges)."""
        return (
            self.partition_id != other.partition_id
            or self.max_block < other.min_block
            or self.min_block > other.max_block
        )

    @property
    def is_fake_drop_range(self) -> bool:
        return self.level in (MAX_LEVEL, LEGACY_MAX_LEVEL)

    @property
    def data_version(self) -> int:
        """Version of the data in the part: the mutation that produced it, else its first block."""
        return self.mutation or self.min_block

    # ------------------------------------------------------------------ derived parts

    def with_mutation(self, mutation: int) -> PartInfo:
        return PartInfo(self.partition_id, self.min_block, self.max_block, self.level, mutation)

    @classmethod
    def for_insert(cls, partition_id: str, block_number: int) -> Self:
        return cls(partition_id, block_number, block_number, 0)

    @classmethod
    def for_merge(cls, parts: Iterable[PartInfo]) -> PartInfo:
        """The name a merge of ``parts`` (same partition) gets: whole range, max level + 1, max mutation."""
        src = list(parts)
        if not src:
            raise ValueError("nothing to merge")
        pid = src[0].partition_id
        if any(p.partition_id != pid for p in src):
            raise ValueError("cannot merge parts of different partitions")
        return PartInfo(
            pid,
            min(p.min_block for p in src),
            max(p.max_block for p in src),
            max(p.level for p in src) + 1,
            max(p.mutation for p in src),
        )

    @classmethod
    def drop_range(cls, partition_id: str, next_block: int, mutation: int = 0) -> Self:
        """Fake part covering every block of the partition below ``next_block`` (DROP/DETACH PARTITION)."""
        if next_block < 1:
            raise ValueError("an empty partition needs no drop range")
        return cls(partition_id, 0, next_block - 1, MAX_LEVEL, mutation)


_PARTITION_ID_RE = re.compile(rf"[A-Za-z0-9-]{{1,{MAX_PARTITION_ID_LENGTH}}}")


def is_valid_partition_id(pid: object) -> bool:
    """What a partition ID can be (digits, ``all``, hex hashes, ``-``-joined values): one part-name field, so
    never ``_``, ``/``, whitespace or anything a ZooKeeper path or file name would read differently."""
    return isinstance(pid, str) and _PARTITION_ID_RE.fullmatch(pid) is not None


def _check_fields(pid: object, lo: object, hi: object, level: object, mutation: object) -> str:
    if not is_valid_partition_id(pid):
        return "bad partition id"
    for v in (lo, hi, level, mutation):
        if not isinstance(v, int) or isinstance(v, bool):
            return "numbers must be integers"
    assert (
        isinstance(lo, int) and isinstance(hi, int) and isinstance(level, int) and isinstance(mutation, int)
    )
    if not (0 <= lo <= MAX_INT64 and 0 <= hi <= MAX_INT64):
        return "block number out of range"
    if lo > hi:
        return "min block greater than max block"
    if not 0 <= level <= MAX_UINT32:
        return "level out of range"
    if not 0 <= mutation <= MAX_INT64:
        return "mutation out of range"
    return ""
