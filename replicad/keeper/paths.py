"""ZooKeeper paths of one ReplicatedMergeTree table and of one of its replicas (ClickHouse 18.16 layout).

Only string building lives here: no I/O.  ``TablePaths`` mirrors ``zookeeper_path`` and ``ReplicaPaths``
mirrors ``replica_path`` of StorageReplicatedMergeTree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from replicad.errors import BadInputError

_SEQ_DIGITS = 10


def expand_macros(text: str, macros: Mapping[str, str], database: str = "", table: str = "") -> str:
    """Substitute ``{name}`` macros like ClickHouse's Macros::expand (explicit macros win over the implicit
    ``{database}`` / ``{table}``; the result is expanded again, at most 10 levels deep)."""
    for _level in range(10):
        if "{" not in text:
            return text
        out: list[str] = []
        pos = 0
        while True:
            begin = text.find("{", pos)
            if begin < 0:
                out.append(text[pos:])
                break
            out.append(text[pos:begin])
            end = text.find("}", begin + 1)
            if end < 0:
                raise BadInputError(f"Unbalanced {{ and }} in string with macros: '{text}'", code=62)
            name = text[begin + 1 : end]
            if name in macros:
                out.append(macros[name])
            elif name == "database" and database:
                out.append(database)
            elif name == "table" and table:
                out.append(table)
            else:
                raise BadInputError(f"No macro {name} in config", code=62)
            pos = end + 1
        text = "".join(out)
    if "{" in text:
        raise BadInputError(f"Too deep recursion while expanding macros: '{text}'", code=62)
    return text


def normalize_zk_path(path: str) -> str:
    """Drop one trailing '/' and make the path absolute, as StorageReplicatedMergeTree does."""
    if path.endswith("/"):
        path = path[:-1]
    if path and not path.startswith("/"):
        path = "/" + path
    return path


def pad_index(n: int) -> str:
    """The 10-digit zero-padded suffix of a sequential znode (``padIndex``)."""
    return f"{n:0{_SEQ_DIGITS}d}"


def sequence_number(znode_name_or_path: str) -> int:
    """The number of a sequential znode: trailing digits of ``log-0000000007`` / ``.../block-0000000003``."""
    name = znode_name_or_path.rsplit("/", 1)[-1]
    digits = name[len(name.rstrip("0123456789")) :]
    if not digits:
        raise ValueError(f"not a sequential znode name: {znode_name_or_path!r}")
    return int(digits)


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ReplicaPaths:
    """``<zk>/replicas/<name>`` and its children."""

    table: TablePaths
    name: str

    @property
    def root(self) -> str:
        return f"{self.table.replicas}/{self.name}"

    def _child(self, child: str) -> str:
        return f"{self.root}/{child}"

    @property
    def host(self) -> str:
        return self._child("host")

    @property
    def is_active(self) -> str:
        return self._child("is_active")

    @property
    def is_lost(self) -> str:
        return self._child("is_lost")

    @property
    def log_pointer(self) -> str:
        return self._child("log_pointer")

    @property
    def queue(self) -> str:
        return self._child("queue")

    @property
    def queue_prefix(self) -> str:
        return self._child("queue/queue-")

    def queue_entry(self, znode_name: str) -> str:
        return f"{self.queue}/{znode_name}"

    @property
    def parts(self) -> str:
        return self._child("parts")

    def part(self, part_name: str) -> str:
        return f"{self.parts}/{part_name}"

    def part_columns(self, part_name: str) -> str:
        return f"{self.parts}/{part_name}/columns"

    def part_checksums(self, part_name: str) -> str:
        return f"{self.parts}/{part_name}/checksums"

    @property
    def flags(self) -> str:
        return self._child("flags")

    @property
    def force_restore_data_flag(self) -> str:
        return self._child("flags/force_restore_data")

    @property
    def columns(self) -> str:
        return self._child("columns")

    @property
    def metadata(self) -> str:
        return self._child("metadata")

    @property
    def min_unprocessed_insert_time(self) -> str:
        return self._child("min_unprocessed_insert_time")

    @property
    def max_processed_insert_time(self) -> str:
        return self._child("max_processed_insert_time")

    @property
    def mutation_pointer(self) -> str:
        return self._child("mutation_pointer")


@dataclass(frozen=True)
class TablePaths:
    """``zookeeper_path`` of a table (already macro-expanded) and the name of this replica."""

    zk_path: str
    replica_name: str

    @classmethod
    def create(cls, zk_path: str, replica_name: str) -> TablePaths:
        if not replica_name or "/" in replica_name:
            raise BadInputError(f"bad replica name {replica_name!r}", code=36)
        path = normalize_zk_path(zk_path)
        if not path or path == "/":
            raise BadInputError(f"bad ZooKeeper path {zk_path!r}", code=36)
        return cls(path, replica_name)

    def _child(self, child: str) -> str:
        return f"{self.zk_path}/{child}"

    # ---- table-level nodes (createTableIfNotExists / createNewZooKeeperNodes) ----
    @property
    def metadata(self) -> str:
        return self._child("metadata")

    @property
    def columns(self) -> str:
        return self._child("columns")

    @property
    def log(self) -> str:
        return self._child("log")

    @property
    def log_prefix(self) -> str:
        return self._child("log/log-")

    def log_entry(self, znode_name: str) -> str:
        return f"{self.log}/{znode_name}"

    @property
    def blocks(self) -> str:
        return self._child("blocks")

    def block(self, block_id: str) -> str:
        return f"{self.blocks}/{block_id}"

    @property
    def block_numbers(self) -> str:
        return self._child("block_numbers")

    def partition_block_numbers(self, partition_id: str) -> str:
        return f"{self.block_numbers}/{partition_id}"

    def block_number_prefix(self, partition_id: str) -> str:
        return f"{self.block_numbers}/{partition_id}/block-"

    @property
    def nonincrement_block_numbers(self) -> str:
        return self._child("nonincrement_block_numbers")

    @property
    def leader_election(self) -> str:
        return self._child("leader_election")

    @property
    def temp(self) -> str:
        return self._child("temp")

    @property
    def abandonable_lock_prefix(self) -> str:
        return self._child("temp/abandonable_lock-")

    @property
    def replicas(self) -> str:
        return self._child("replicas")

    @property
    def quorum(self) -> str:
        return self._child("quorum")

    @property
    def quorum_status(self) -> str:
        return self._child("quorum/status")

    @property
    def quorum_last_part(self) -> str:
        return self._child("quorum/last_part")

    @property
    def quorum_failed_parts(self) -> str:
        return self._child("quorum/failed_parts")

    @property
    def mutations(self) -> str:
        return self._child("mutations")

    # ---- replicas ----
    def replica(self, name: str) -> ReplicaPaths:
        return ReplicaPaths(self, name)

    @property
    def me(self) -> ReplicaPaths:
        return ReplicaPaths(self, self.replica_name)

    @property
    def endpoint_id(self) -> str:
        """The DataPartsExchange endpoint id served for this replica."""
        return f"DataPartsExchange:{self.me.root}"
