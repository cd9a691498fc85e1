"""What a table replica is built from: its spec (from the DDL) and the process-wide environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicad.datatypes import DataType
from replicad.replication.exchange import PartsExchange
from replicad.replication.fetcher import FetchCredentials
from replicad.service import TableName
from replicad.storage.writer import WriterSettings

if TYPE_CHECKING:
    from replicad.storage.disk_s3 import S3Disk


@dataclass(frozen=True)
class TableSpec:
    """Everything a replica needs to know about its table (built from the DDL by the catalog)."""

    name: TableName
    zk_path: str  # macros expanded
    replica_name: str
    columns: tuple[tuple[str, DataType], ...]
    metadata_text: str  # the table ``metadata`` znode as 18.16 writes it
    columns_text: str  # the table ``columns`` znode as 18.16 writes it
    partition_by: str | None
    order_by: str | None
    primary_key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    ddl: str = ""  # the CREATE statement (macros unexpanded) the table was created from, or "" (unknown)


@dataclass(frozen=True)
class ReplicaEnv:
    """Process-wide things a replica uses."""

    data_path: Path
    interserver: PartsExchange  # the DataPartsExchange transport (server.parts_exchange adapts the HTTP one)
    interserver_host: str  # published in replicas/<r>/host
    tz: str = "UTC"
    credentials: FetchCredentials = field(default_factory=FetchCredentials)
    #: ``tcp_port`` in ``replicas/<r>/host``: the native-protocol port ClickHouse forwards OPTIMIZE / ALTER
    #: PARTITION to when this replica leads.  replicad has none; 0 makes such a forward fail at once instead
    #: of reaching whatever else listens on 9000.
    tcp_port: int = 0
    #: False: never fsync, whatever fsync_after_insert / fsync_part_directory /
    #: min_compressed_bytes_to_fsync_after_fetch say (tests)
    fsync: bool = True
    writer: WriterSettings | None = None
    #: entries that download a part, running at once per table: 18.16 runs up to background_pool_size (16)
    #: queue entries at once, fetches included; 8 halved the drain rate of a long backlog of small parts
    max_parallel_fetches: int = 16
    max_fetch_part_bytes: int = 1 << 40  # interserver.max_fetch_part_bytes
    activation_timeout_s: float = 0.0
    #: the config's ``storage:``: disks by name, and each policy's disk (a table's ``storage_policy``)
    disks: dict[str, S3Disk] = field(default_factory=dict)
    storage_policies: dict[str, str] = field(default_factory=dict)
