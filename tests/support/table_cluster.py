"""In-process replicad replica sets (replication, merge / mutation / drop, cleanup, quorum tests).

Each replica is a :class:`TableReplica` with its own Keeper session and DataPartsExchange server.  Its
merges / mutations / drops side (``TableOperations``) is the one the replica built itself when it has one
(``replica.ops``), else one attached here after start-up with short pauses for fast tests.  The table is
``db.events`` at :data:`ZK_PATH` (:func:`events_spec`); the ``cluster`` fixture of
``tests/integration/conftest.py`` hands out a :class:`Cluster` of it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from replicad.datatypes import parse_type
from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.client import Keeper
from replicad.replica import ReplicaEnv, TableReplica, TableSpec
from replicad.replication.merge_assigner import AssignerSettings
from replicad.replication.table_ops import TableOperations
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.service import Statement, StatementKind, TableName
from replicad.sql.statements import parse_statement
from replicad.storage.writer import WriterSettings

ZK_PATH = "/clickhouse/tables/01/events"
TABLE = TableName("db", "events")
METADATA = (
    "metadata format version: 1\ndate column: \nsampling expression: \nindex granularity: 8192\nmode: 0\n"
    "sign column: \nprimary key: id\ndata format version: 1\npartition key: toYYYYMM(ctime)\n"
)
FAST = AssignerSettings(sleep_s=0.3)
#: ClickHouse's CREATE of the table :func:`spec` describes (a mixed set: ClickHouse servers beside replicas)
EVENTS_DDL = (
    "CREATE TABLE db.events (id Int32, ctime DateTime, name String, v UInt32) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
    "PARTITION BY toYYYYMM(ctime) ORDER BY id"
)
#: ClickHouse's compression: a replica's own parts byte-identical to a ClickHouse server's
LZ4 = WriterSettings(fsync=False, method="lz4", threads=1)


def events_spec(
    replica: str, columns: Sequence[tuple[str, str]], settings: dict[str, Any] | None = None
) -> TableSpec:
    """``db.events`` at ZK_PATH with ``columns`` (name, type): PARTITION BY toYYYYMM(ctime) ORDER BY id."""
    columns_text = f"columns format version: 1\n{len(columns)} columns:\n" + "".join(
        f"`{n}` {t}\n" for n, t in columns
    )
    return TableSpec(
        name=TABLE,
        zk_path=ZK_PATH,
        replica_name=replica,
        columns=tuple((n, parse_type(t)) for n, t in columns),
        metadata_text=METADATA,
        columns_text=columns_text,
        partition_by="toYYYYMM(ctime)",
        order_by="id",
        settings=dict(settings or {}),
    )


async def ch(server: ClickHouseServer, sql: str, data: bytes | None = None) -> str:
    """One query to a ClickHouse server, off the event loop."""
    return await asyncio.to_thread(server.query, sql, data)


def spec(replica: str, settings: dict[str, Any] | None = None) -> TableSpec:
    return events_spec(replica, [("id", "Int32"), ("ctime", "DateTime"), ("name", "String"), ("v", "UInt32")],
                       settings)


def rows(ids: list[int] | range, month: int = 11, name: str = "x") -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int32()),
            "ctime": pa.array(
                [dt.datetime(2026, month, 1 + i % 27, 12, 0, i % 60) for i in ids], pa.timestamp("s")
            ),
            "name": pa.array([f"{name}{i}".encode() for i in ids], pa.binary()),
            "v": pa.array([i * 10 for i in ids], pa.uint32()),
        }
    )


def statement(sql: str, **settings: Any) -> Statement:
    parsed = parse_statement(sql)
    kind = {
        "Alter": StatementKind.ALTER_DELETE,
        "Optimize": StatementKind.OPTIMIZE,
        "Truncate": StatementKind.TRUNCATE,
    }[type(parsed).__name__]
    if kind is StatementKind.ALTER_DELETE:
        cmds = getattr(parsed, "commands", ())
        first = type(cmds[0]).__name__ if cmds else ""
        kinds = {c.kind for c in cmds}
        if first == "ColumnCommand":
            kind = StatementKind.ALTER_COLUMNS
        elif first == "PartitionCommand":
            kind = StatementKind.DETACH_PARTITION if "DETACH" in kinds else StatementKind.DROP_PARTITION
        elif "UPDATE" in kinds:
            kind = StatementKind.ALTER_UPDATE
    return Statement(kind, TABLE, sql, parsed=parsed, settings=dict(settings))


async def wait_for(
    cond: Callable[[], Any], timeout: float = 60.0, what: str = "", poll: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        res = cond()
        if inspect.isawaitable(res):
            res = await res
        if res:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(poll)


def part_checksums(replica: TableReplica) -> dict[str, bytes]:
    return {p.name: (p.path / "checksums.txt").read_bytes() for p in replica.store.active()}


def parts_per_partition(replica: TableReplica) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in replica.store.active():
        out[p.info.partition_id] = out.get(p.info.partition_id, 0) + 1
    return out


async def sorted_rows(replica: TableReplica) -> list[dict[str, Any]]:
    table = await replica.read_all()
    return sorted(table.to_pylist(), key=lambda r: (r["id"], r["name"]))


class Cluster:
    """Replicas sharing one ZooKeeper chroot.

    ``make_spec(name, settings)`` builds each replica's table (default: :func:`spec`); ``assigner`` replaces
    the merge assigner's settings of each replica (None: the replica keeps its own).
    """

    def __init__(
        self,
        zookeeper: ZooKeeperServer,
        zk_root: str,
        tmp_path: Path,
        *,
        make_spec: Callable[[str, dict[str, Any] | None], TableSpec] = spec,
        assigner: AssignerSettings | None = FAST,
    ) -> None:
        self.zookeeper = zookeeper
        self.zk_root = zk_root
        self.tmp_path = tmp_path
        self.make_spec = make_spec
        self.assigner = assigner
        self.replicas: dict[str, TableReplica] = {}
        self.ops: dict[str, TableOperations] = {}
        self.keepers: dict[str, Keeper] = {}
        self.servers: dict[str, InterserverServer] = {}
        self._runners: dict[str, list[asyncio.Task[None]]] = {}

    async def start(
        self,
        name: str,
        settings: dict[str, Any] | None = None,
        assigner: AssignerSettings | None = None,
        **env_kw: Any,
    ) -> TableReplica:
        assigner = assigner or self.assigner
        keeper = Keeper(self.zookeeper.hosts, session_timeout_s=6.0, chroot=self.zk_root)
        await keeper.start()
        server = self.servers.get(name)
        if server is None:
            server = InterserverServer("127.0.0.1", 0)
            await server.start()
            self.servers[name] = server
        env_kw.setdefault("writer", WriterSettings(fsync=False, threads=1))
        env = ReplicaEnv(
            data_path=self.tmp_path / name,
            interserver=InterserverExchange(server),
            interserver_host="127.0.0.1",
            fsync=False,
            **env_kw,
        )
        replica = TableReplica(self.make_spec(name, settings), keeper, env)
        built = getattr(replica, "ops", None)
        ops = (
            built
            if isinstance(built, TableOperations)
            else TableOperations(replica, assigner_settings=assigner)
        )
        if built is not None and assigner is not None:
            ops.assigner.settings = assigner
            ops.assigner.period_s = assigner.sleep_s
        await replica.start()
        if built is None:
            ops.install()
            loop = asyncio.get_running_loop()
            self._runners[name] = [loop.create_task(t.run(), name=t.name) for t in ops.tasks]
        self.replicas[name] = replica
        self.ops[name] = ops
        self.keepers[name] = keeper
        return replica

    async def execute(self, name: str, sql: str, **settings: Any) -> Any:
        replica = self.replicas[name]
        stmt = statement(sql, **settings)
        if getattr(replica, "ops", None) is not None:
            return await replica.execute(stmt)
        return await self.ops[name].execute(stmt)

    async def _stop_runners(self, name: str) -> None:
        for task in self.ops[name].tasks:
            task.request_stop()
        for runner in self._runners.pop(name, []):
            runner.cancel()
            try:
                await runner
            except BaseException:
                pass

    async def stop(self, name: str) -> None:
        replica = self.replicas.pop(name)
        await self._stop_runners(name)
        self.ops.pop(name)
        await replica.stop()
        await self.keepers.pop(name).close()

    async def kill(self, name: str) -> None:
        """Stop like a crash: no clean leave; the ZooKeeper session is closed (ephemeral nodes go at once),
        the tasks are cancelled, the interserver endpoint is withdrawn."""
        replica = self.replicas.pop(name)
        await self._stop_runners(name)
        self.ops.pop(name)
        keeper = self.keepers.pop(name)
        await keeper.close()
        await replica.stop()

    async def close(self) -> None:
        for name in list(self.replicas):
            await self.stop(name)
        for server in self.servers.values():
            await server.stop(grace_s=0.1)


def leaders(cluster: Cluster) -> list[str]:
    return [n for n, ops in cluster.ops.items() if ops.leader.is_leader]


async def converged(replicas: list[TableReplica]) -> bool:
    sets = [part_checksums(r) for r in replicas]
    queues = [len(r.queue_state) for r in replicas]
    return all(s == sets[0] for s in sets) and not any(queues)
