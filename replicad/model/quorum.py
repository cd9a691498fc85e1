"""Quorum insert records.

* ``<zk>/quorum/status`` (18.16; also modern with ``insert_quorum_parallel=0``) and modern
  ``<zk>/quorum/parallel/<part>``: ``QuorumEntry``::

      version: 1\\npart_name: all_4_4_0\\nrequired_number_of_replicas: 2\\nactual_number_of_replicas: 1\\n
      replicas:\\nch1\\n

  (replica names escaped, in byte order; ClickHouse does not check for trailing data).
* ``<zk>/quorum/last_part``: ``QuorumLastPart``, version 2 = ``version: 2\\nparts count: N\\n`` then
  ``<partition_id>\\t<part>\\n`` per partition; version 1 = a bare part name; empty = nothing yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from replicad.errors import ZnodeFormatError
from replicad.model.text_io import TextReader, check_raw, encode, escape


@dataclass(frozen=True)
class QuorumEntry:
    part_name: str
    required_number_of_replicas: int
    #: Replicas that already have the part, sorted (ClickHouse keeps a std::set).
    replicas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(sorted(set(self.replicas))))

    @property
    def actual_number_of_replicas(self) -> int:
        return len(self.replicas)

    @property
    def is_reached(self) -> bool:
        return self.actual_number_of_replicas >= self.required_number_of_replicas

    def with_replica(self, replica: str) -> QuorumEntry:
        return replace(self, replicas=(*self.replicas, replica))

    def to_text(self) -> str:
        return (
            "version: 1\n"
            f"part_name: {check_raw(self.part_name, 'part name')}\n"
            f"required_number_of_replicas: {self.required_number_of_replicas}\n"
            f"actual_number_of_replicas: {len(self.replicas)}\n"
            "replicas:\n" + "".join(f"{escape(r)}\n" for r in self.replicas)
        )

    def to_bytes(self) -> bytes:
        return encode(self.to_text())

    @classmethod
    def parse(cls, text: bytes | str) -> QuorumEntry:
        r = TextReader(text, "quorum entry")
        r.expect(b"version: 1\npart_name: ")
        part_name = r.raw()
        r.expect(b"\nrequired_number_of_replicas: ")
        required = r.unsigned()
        r.expect(b"\nactual_number_of_replicas: ")
        actual = r.unsigned()
        r.expect(b"\nreplicas:\n")
        replicas: list[str] = []
        for _ in range(actual):
            replicas.append(r.escaped())
            r.expect(b"\n")
        if not part_name:
            raise r.error("empty part name")
        return cls(part_name, required, tuple(replicas))


def _partition_of(part_name: str, data_format_version: int) -> str:
    if data_format_version >= 1:
        pid, sep, _ = part_name.partition("_")
        if sep and pid:
            return pid
    elif len(part_name) >= 8 and part_name[:8].isdigit():
        return part_name[:6]
    raise ZnodeFormatError(f"Unexpected part name: {part_name!r}")


@dataclass(frozen=True)
class QuorumLastPart:
    """Last part inserted with quorum, per partition (``ReplicatedMergeTreeQuorumAddedParts``)."""

    #: (partition_id, part_name), sorted by partition id.
    added_parts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        merged = dict(self.added_parts)
        object.__setattr__(self, "added_parts", tuple(sorted(merged.items())))

    @classmethod
    def from_mapping(cls, parts: Mapping[str, str]) -> QuorumLastPart:
        return cls(tuple(parts.items()))

    @property
    def parts(self) -> dict[str, str]:
        return dict(self.added_parts)

    def with_part(self, partition_id: str, part_name: str) -> QuorumLastPart:
        return QuorumLastPart((*self.added_parts, (partition_id, part_name)))

    def max_inserted_blocks(self, data_format_version: int = 1) -> dict[str, int]:
        """partition_id → max block of its last quorum part (the name's third ``_`` field from the right)."""
        out: dict[str, int] = {}
        for pid, name in self.added_parts:
            fields = name.split("_")
            idx = 2 if data_format_version >= 1 else 3
            if len(fields) <= idx or not fields[idx].lstrip("-").isdigit():
                raise ZnodeFormatError(f"Unexpected part name: {name!r}")
            out[pid] = int(fields[idx])
        return out

    def to_text(self) -> str:
        """Always version 2 (what 18.16 writes)."""
        return f"version: 2\nparts count: {len(self.added_parts)}\n" + "".join(
            f"{check_raw(p, 'partition id')}\t{check_raw(n, 'part name')}\n" for p, n in self.added_parts
        )

    def to_bytes(self) -> bytes:
        return encode(self.to_text())

    @classmethod
    def parse(cls, text: bytes | str, *, data_format_version: int = 1) -> QuorumLastPart:
        r = TextReader(text, "quorum/last_part")
        if r.eof():
            return cls()
        if not r.check(b"version: "):
            name = r.escaped()
            return cls(((_partition_of(name, data_format_version), name),))
        version = r.unsigned()
        r.expect(b"\n")
        if version != 2:
            return cls()  # as ClickHouse: an unknown version reads as "no parts"
        r.expect(b"parts count: ")
        return cls(tuple(r.counted_pairs(r.escaped, r.escaped)))
