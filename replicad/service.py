"""THE SEAM between the daemon shell (HTTP API, status, lifecycle) and the replication engine.

The engine implements three protocols:

* :class:`TableService` — one replicated table: insert, select, count, statements, introspection;
* :class:`Catalog` — the set of tables: lookup, CREATE TABLE, DROP TABLE, ZooKeeper session state;
* :class:`Engine` — lifecycle: start (ZooKeeper, parts, listeners), SIGHUP reload, and the ordered
  shutdown steps the daemon calls (see ``replicad.daemon.SHUTDOWN_ORDER``).

Data crosses the seam as Arrow.  Inserted batches are already **storage Arrow** (see the project
conventions) for exactly the columns named in ``columns`` (in that order): the HTTP layer parsed the
input format and converted every column with ``DataType.to_storage``, so values are validated and
non-Nullable columns hold no nulls.  Columns the insert did not name get their defaults in the engine.
Every batch but the last has exactly ``InsertSettings.max_insert_block_size`` rows and is one
ClickHouse *insert block* (the unit of ``block_id`` deduplication), so a retried insert of the same
body produces the same blocks.

Errors are ``replicad.errors.ReplicadError`` subclasses; the HTTP layer maps ``code``/``http_status``
(UnknownTableError → 404, TooManyPartsError → 429, ReadOnlyError → 503, BadInputError → 400 …).
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from replicad.datatypes import DataType
from replicad.model.staged_job import StagedTask, StageId

if TYPE_CHECKING:
    from replicad.config import Config
    from replicad.tasks import Supervisor


@dataclass(frozen=True, order=True)
class TableName:
    database: str
    table: str

    @classmethod
    def parse(cls, text: str, default_database: str = "default") -> TableName:
        """``db.t`` or ``t`` (backquotes allowed around each part)."""
        parts = [p.strip().strip("`") for p in _split_dotted(text.strip())]
        if len(parts) == 1 and parts[0]:
            return cls(default_database, parts[0])
        if len(parts) == 2 and all(parts):
            return cls(parts[0], parts[1])
        raise ValueError(f"invalid table name {text!r}")

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"


def _split_dotted(text: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in text:
        if ch == "`":
            quoted = not quoted
        if ch == "." and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


# ---- insert --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InsertSettings:
    """Per-insert settings (ClickHouse names in the URL; defaults from the config's ``settings``)."""

    insert_quorum: int = 0
    insert_quorum_timeout_ms: int = 600000
    insert_deduplicate: bool = True
    insert_deduplication_token: str | None = None
    max_insert_block_size: int = 1048576
    max_partitions_per_insert_block: int = 100  # 0 = no limit
    query_id: str = ""
    #: a two-phase write's staged insert (``replicad_stage_*`` URL settings): staged, not published
    stage: StageId | None = None


@dataclass(frozen=True)
class InsertSummary:
    written_rows: int = 0
    written_parts: int = 0
    deduplicated_blocks: int = 0
    written_bytes: int = 0  # uncompressed bytes of the inserted columns (storage Arrow size)
    staged_on: str = ""  # a staged insert: the replica holding it (written_* count staged rows/parts)

    def to_dict(self) -> dict[str, int | str]:
        """The response body: ours first, then ClickHouse's ``X-ClickHouse-Summary`` fields."""
        out: dict[str, int | str] = {
            "written_rows": self.written_rows,
            "written_parts": self.written_parts,
            "deduplicated_blocks": self.deduplicated_blocks,
            "written_bytes": self.written_bytes,
            "read_rows": 0,
            "read_bytes": 0,
            "total_rows_to_read": 0,
        }
        if self.staged_on:
            out["staged_on"] = self.staged_on
        return out

    def header_dict(self) -> dict[str, str]:
        """``X-ClickHouse-Summary``: the same fields, values as decimal strings as ClickHouse sends them."""
        return {k: str(v) for k, v in self.to_dict().items()}


# ---- queries and statements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderKey:
    expression: str  # expression text, compiled by replicad.sql.expressions
    descending: bool = False


@dataclass(frozen=True)
class SelectQuery:
    """``SELECT cols|* FROM t [WHERE …] [ORDER BY …] [LIMIT n]``; expressions are text."""

    table: TableName
    columns: tuple[str, ...] | None = None  # None = ``*``
    where: str | None = None
    order_by: tuple[OrderKey, ...] = ()
    limit: int | None = None
    text: str = ""
    #: ORDER BY holds at most this many rows / bytes of matching rows at once (0: no limit); with LIMIT n it
    #: keeps only the best n rows as it reads, so the limits bind only a large LIMIT or none
    max_rows_to_sort: int = 0
    max_bytes_to_sort: int = 0


@dataclass
class QueryResult:
    """Rows of a SELECT: ``columns`` names and types (in output order), ``batches`` in storage Arrow."""

    columns: list[tuple[str, DataType]]
    batches: AsyncIterator[pa.RecordBatch]

    @classmethod
    def from_table(cls, columns: list[tuple[str, DataType]], table: pa.Table) -> QueryResult:
        async def gen() -> AsyncIterator[pa.RecordBatch]:
            for b in table.to_batches():
                yield b

        return cls(columns, gen())


class StatementKind(enum.Enum):
    CREATE_TABLE = "create_table"
    DROP_TABLE = "drop_table"
    ALTER_DELETE = "alter_delete"
    ALTER_UPDATE = "alter_update"
    DROP_PARTITION = "drop_partition"
    DETACH_PARTITION = "detach_partition"
    OPTIMIZE = "optimize"
    TRUNCATE = "truncate"
    SYNC_REPLICA = "sync_replica"
    ATTACH = "attach"  # ALTER TABLE t ATTACH PART 'p' | PARTITION p (from detached/)
    DROP_DETACHED = "drop_detached"  # ALTER TABLE t DROP DETACHED PART 'p' | PARTITION p
    DROP_REPLICA = "drop_replica"  # SYSTEM DROP REPLICA 'r' FROM TABLE t
    RESTART_REPLICA = "restart_replica"  # SYSTEM RESTART REPLICA t
    FETCHES = "system_fetches"  # SYSTEM STOP|START FETCHES [t]
    MERGES = "system_merges"  # SYSTEM STOP|START MERGES [t]
    ALTER_COLUMNS = "alter_columns"  # ALTER TABLE t ADD|DROP|MODIFY COLUMN …


@dataclass(frozen=True)
class Statement:
    """A non-INSERT, non-SELECT statement routed to a table (or the catalog).

    ``text`` is the original SQL; ``parsed`` is ``replicad.sql.statements.parse_statement(text)`` when
    that parser accepted it (the engine should prefer it), else None.
    """

    kind: StatementKind
    table: TableName
    text: str
    parsed: Any = None
    if_exists: bool = False  # DROP TABLE IF EXISTS / CREATE TABLE IF NOT EXISTS
    settings: dict[str, int | float | str] = field(default_factory=dict)  # URL settings (mutations_sync …)


@dataclass(frozen=True)
class ExecuteResult:
    """What a statement did; ``message`` is informational (empty body on success, like ClickHouse)."""

    message: str = ""
    fields: dict[str, Any] = field(default_factory=dict)


# ---- the protocols -------------------------------------------------------------------------------------


@runtime_checkable
class TableService(Protocol):
    """One ReplicatedMergeTree table on this replica."""

    @property
    def name(self) -> TableName: ...

    @property
    def columns(self) -> Sequence[tuple[str, DataType]]:
        """Ordinary columns in table order (name, type)."""
        ...

    @property
    def is_readonly(self) -> bool:
        """True while the table cannot accept writes (no ZooKeeper session, shutting down …)."""
        ...

    async def insert(self, batches: AsyncIterator[pa.RecordBatch], columns: list[str] | None,
                     settings: InsertSettings) -> InsertSummary:
        """Insert every batch (one insert block each).  ``columns`` None = all columns in table order.

        May raise TooManyPartsError (429), ReadOnlyError (503), QuorumError, UnknownInsertStatusError;
        exceptions raised while consuming ``batches`` (BadInputError, BodyTooLargeError) must propagate.
        """
        ...

    async def select(self, query: SelectQuery) -> QueryResult: ...

    async def count(self, where: str | None) -> int:
        """``SELECT count() FROM t [WHERE where]``."""
        ...

    async def execute(self, statement: Statement) -> ExecuteResult:
        """ALTER … DELETE/UPDATE, DROP/DETACH PARTITION, OPTIMIZE, TRUNCATE, SYSTEM SYNC REPLICA."""
        ...

    def status(self) -> dict[str, Any]:
        """``system.replicas`` fields: is_leader, is_readonly, is_session_expired, queue_size,
        inserts_in_queue, merges_in_queue, log_max_index, log_pointer, absolute_delay, total_replicas,
        active_replicas, zookeeper_path, replica_name, replica_path …, plus ``active_parts``."""
        ...

    def parts(self) -> list[dict[str, Any]]:
        """``system.parts`` rows (name, partition_id, rows, bytes_on_disk, active, level, …)."""
        ...

    def queue(self) -> list[dict[str, Any]]:
        """``system.replication_queue`` rows (node_name, type, create_time, new_part_name, num_tries …)."""
        ...

    def mutations(self) -> list[dict[str, Any]]:
        """``system.mutations`` rows (mutation_id, command, create_time, parts_to_do, is_done …)."""
        ...

    async def staged_commit(self, job_id: str, run: str, tasks: list[StagedTask]) -> dict[str, Any]:
        """Two-phase writes: decide (once, in ZooKeeper) that ``run`` commits exactly ``tasks``."""
        ...

    async def staged_abort(self, run: str, job_id: str) -> dict[str, Any]:
        """Decide that ``run`` publishes nothing (unless it was committed already)."""
        ...

    async def staged_status(self, run: str) -> dict[str, Any]:
        """The run's decision and which of its tasks are published."""
        ...


@runtime_checkable
class Catalog(Protocol):
    """The tables of this replica."""

    def get(self, name: TableName) -> TableService:
        """The table, or raise UnknownTableError (404)."""
        ...

    def tables(self) -> list[TableService]: ...

    async def create_table(self, statement: Statement) -> TableService:
        """CREATE TABLE (``statement.text`` is the DDL); IF NOT EXISTS returns the existing table."""
        ...

    async def drop_table(self, statement: Statement) -> None:
        """DROP TABLE [IF EXISTS]: removes this replica from ZooKeeper and the local data."""
        ...

    def keeper_status(self) -> dict[str, Any]:
        """ZooKeeper session: ``state`` (connected/suspended/lost/closed), ``session_id``, ``hosts`` …"""
        ...


@runtime_checkable
class Engine(Protocol):
    """The replication engine's lifecycle, driven by ``replicad.daemon``."""

    @property
    def catalog(self) -> Catalog: ...

    async def start(self) -> None:
        """Connect to ZooKeeper, load parts, create the config's tables, start the interserver server and
        register background tasks with the supervisor.  Returns when the replica can serve (READY=1)."""
        ...

    async def reload(self, config: Config) -> None:
        """Apply what can change at run time (settings, new tables); called on SIGHUP."""
        ...

    # Shutdown steps, called once each in this order by the daemon (each may be a no-op; the daemon stops the
    # background tasks between stop_inserts and stop_tables).  They are also called when start() failed part
    # way, so each must tolerate a partly started engine.
    async def stop_listening(self) -> None:
        """Close the DataPartsExchange listener: no new connection; sends in flight go on."""
        ...

    async def stop_inserts(self) -> None:
        """Refuse new inserts and wait for the ones in flight (their commits finish or fail)."""
        ...

    async def stop_tables(self) -> None:
        """Stop every table, last attached first: its queue work in flight, its DataPartsExchange endpoint,
        its leader candidacy and ``replicas/<r>/is_active`` (peers stop choosing us)."""
        ...

    async def close_interserver(self) -> None:
        """Close the DataPartsExchange server (after in-flight sends finish or time out)."""
        ...

    async def close_keeper(self) -> None:
        """Close the ZooKeeper session."""
        ...


class EngineMetrics(Protocol):
    """What the engine reports to the daemon's metrics (``replicad.server.metrics.Metrics``)."""

    def observe_zookeeper(self, request: str, seconds: float) -> None: ...


class EngineFactory(Protocol):
    def __call__(self, config: Config, supervisor: Supervisor, metrics: EngineMetrics) -> Engine: ...
