"""An in-memory stand-in for the replication engine, implementing the seam in ``replicad.service``.

Good enough to drive the HTTP API and the daemon lifecycle in tests: inserts keep the storage batches
(one "part" per insert block, deduplicated by the block's content like block_id), SELECT returns the rows
(projection, ORDER BY plain columns, LIMIT; WHERE is ignored), statements are recorded.
``create_fake_engine`` is an ``EngineFactory`` (usable as ``REPLICAD_ENGINE_FACTORY=tests.support.fake_engine:
create_fake_engine``); every lifecycle call is appended to ``FakeEngine.calls``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pyarrow as pa
from aiohttp.test_utils import TestClient, TestServer

from replicad.config import Config, build_config
from replicad.datatypes import DataType, parse_type
from replicad.errors import ReplicadError, UnknownTableError
from replicad.server.api import ApiState, create_app
from replicad.server.metrics import Metrics
from replicad.service import (
    ExecuteResult,
    InsertSettings,
    InsertSummary,
    QueryResult,
    SelectQuery,
    Statement,
    TableName,
)
from replicad.tasks import IDLE, FunctionTask, Outcome, Supervisor


class FakeTable:
    def __init__(self, name: TableName, columns: Sequence[tuple[str, str]]) -> None:
        self._name = name
        self._columns = [(n, parse_type(t)) for n, t in columns]
        self.blocks: list[pa.RecordBatch] = []
        self.block_ids: set[str] = set()
        self.readonly = False
        self.fail_insert: ReplicadError | None = None
        self.statements: list[Statement] = []
        self.insert_settings: list[InsertSettings] = []
        self.received_columns: list[list[str]] = []

    @property
    def name(self) -> TableName:
        return self._name

    @property
    def columns(self) -> Sequence[tuple[str, DataType]]:
        return self._columns

    @property
    def is_readonly(self) -> bool:
        return self.readonly

    async def insert(self, batches: AsyncIterator[pa.RecordBatch], columns: list[str] | None,
                     settings: InsertSettings) -> InsertSummary:
        self.insert_settings.append(settings)
        self.received_columns.append(list(columns or []))
        rows = parts = dedup = nbytes = 0
        async for batch in batches:
            if self.fail_insert is not None:
                raise self.fail_insert
            full = self._complete(batch, columns)
            block_id = settings.insert_deduplication_token or _digest(full)
            if settings.insert_deduplicate and block_id in self.block_ids:
                dedup += 1
                continue
            self.block_ids.add(block_id)
            self.blocks.append(full)
            rows += full.num_rows
            nbytes += full.nbytes
            parts += 1
        return InsertSummary(written_rows=rows, written_parts=parts, deduplicated_blocks=dedup,
                             written_bytes=nbytes)

    def _complete(self, batch: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
        given = dict(zip(columns or [n for n, _ in self._columns], batch.columns, strict=True))
        arrays = [given[n] if n in given else t.defaults(batch.num_rows) for n, t in self._columns]
        return pa.RecordBatch.from_arrays(arrays, names=[n for n, _ in self._columns])

    def table(self) -> pa.Table:
        schema = pa.schema([(n, t.arrow_type) for n, t in self._columns])
        return pa.Table.from_batches(self.blocks, schema=schema)

    async def select(self, query: SelectQuery) -> QueryResult:
        table = self.table()
        for key in reversed(query.order_by):
            table = table.sort_by([(key.expression, "descending" if key.descending else "ascending")])
        if query.limit is not None:
            table = table.slice(0, query.limit)
        names = list(query.columns) if query.columns else [n for n, _ in self._columns]
        types = dict(self._columns)
        unknown = [n for n in names if n not in types]
        if unknown:
            raise ReplicadError(f"Missing columns: {unknown[0]}", code=47)
        return QueryResult.from_table([(n, types[n]) for n in names], table.select(names))

    async def count(self, where: str | None) -> int:
        return int(self.table().num_rows)

    async def execute(self, statement: Statement) -> ExecuteResult:
        self.statements.append(statement)
        return ExecuteResult()

    def status(self) -> dict[str, Any]:
        return {"is_leader": True, "is_readonly": self.readonly, "is_session_expired": False, "queue_size": 0,
                "inserts_in_queue": 0, "merges_in_queue": 0, "log_max_index": len(self.blocks),
                "log_pointer": len(self.blocks), "absolute_delay": 0, "total_replicas": 1,
                "active_replicas": 1, "active_parts": len(self.blocks),
                "zookeeper_path": f"/clickhouse/tables/{self._name.table}", "replica_name": "r1"}

    def parts(self) -> list[dict[str, Any]]:
        return [{"name": f"all_{i}_{i}_0", "rows": b.num_rows, "active": True}
                for i, b in enumerate(self.blocks)]

    def queue(self) -> list[dict[str, Any]]:
        return []

    def mutations(self) -> list[dict[str, Any]]:
        return [{"mutation_id": f"{i:010d}", "command": s.text, "is_done": True}
                for i, s in enumerate(self.statements)]


def _digest(batch: pa.RecordBatch) -> str:
    """The block's values (not its buffers: the bytes past an array's values, e.g. a parser's slack, are not
    part of the block and are not defined)."""
    return hashlib.sha256(repr((batch.schema.names, batch.to_pydict())).encode()).hexdigest()


class FakeCatalog:
    def __init__(self) -> None:
        self._tables: dict[TableName, FakeTable] = {}
        self.keeper_state = "connected"

    def add(self, name: str, columns: Sequence[tuple[str, str]]) -> FakeTable:
        t = FakeTable(TableName.parse(name), columns)
        self._tables[t.name] = t
        return t

    def get(self, name: TableName) -> FakeTable:
        try:
            return self._tables[name]
        except KeyError:
            raise UnknownTableError(f"Table {name} doesn't exist.") from None

    def tables(self) -> list[FakeTable]:
        return list(self._tables.values())

    async def create_table(self, statement: Statement) -> FakeTable:
        if statement.table in self._tables:
            if statement.if_exists:
                return self._tables[statement.table]
            raise ReplicadError(f"Table {statement.table} already exists.", code=57)
        return self.add(str(statement.table), [("x", "UInt64")])

    async def drop_table(self, statement: Statement) -> None:
        if statement.table not in self._tables and not statement.if_exists:
            raise UnknownTableError(f"Table {statement.table} doesn't exist.")
        self._tables.pop(statement.table, None)

    def keeper_status(self) -> dict[str, Any]:
        return {"state": self.keeper_state, "session_id": "0x1"}


class FakeEngine:
    def __init__(self, config: Config, supervisor: Supervisor, metrics: Metrics) -> None:
        self.config = config
        self.supervisor = supervisor
        self.metrics = metrics
        self._catalog = FakeCatalog()
        self._catalog.add("db.events", [("d", "Date"), ("ts", "DateTime"), ("user_id", "UInt64"),
                                        ("kind", "String")])
        self.calls: list[str] = []
        self.fail_start: Exception | None = None

    @property
    def catalog(self) -> FakeCatalog:
        return self._catalog

    async def start(self) -> None:
        self.calls.append("start")
        if self.fail_start is not None:
            raise self.fail_start

        async def tick() -> Outcome:
            return IDLE

        self.supervisor.add(FunctionTask("fake_queue", tick, period_s=0.05), group="fetches")

    async def reload(self, config: Config) -> None:
        self.calls.append("reload")
        self.config = config

    async def stop_listening(self) -> None:
        self.calls.append("stop_listening")

    async def stop_inserts(self) -> None:
        self.calls.append("stop_inserts")

    async def stop_tables(self) -> None:
        self.calls.append("stop_tables")

    async def close_interserver(self) -> None:
        self.calls.append("close_interserver")

    async def close_keeper(self) -> None:
        self.calls.append("close_keeper")


def create_fake_engine(config: Config, supervisor: Supervisor, metrics: Metrics) -> FakeEngine:
    return FakeEngine(config, supervisor, metrics)


async def serve_fake_api(data_path: str, api: dict[str, Any]
                         ) -> tuple[TestClient[Any, Any], ApiState, FakeTable, FakeCatalog]:
    """The HTTP API (config section ``api``) over a FakeCatalog holding ``db.events``, on a started
    aiohttp TestServer; the caller closes the client."""
    cfg = build_config({"replica": "r1", "data_path": data_path, "api": api}, {})
    metrics = Metrics()
    state = ApiState(config=cfg, metrics=metrics, state="running")
    catalog = FakeCatalog()
    table = catalog.add("db.events", [("d", "Date"), ("ts", "DateTime"), ("user_id", "UInt64"),
                                      ("kind", "String")])
    supervisor = Supervisor()
    state.catalog, state.supervisor = catalog, supervisor
    metrics.bind(lambda: catalog, supervisor)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(state)))
    await client.start_server()
    return client, state, table, catalog
