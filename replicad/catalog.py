"""The tables of this replica (``Catalog``) and the replication engine's lifecycle (``Engine``).

Table DDL persists in ``<data_path>/metadata/<escaped db>/<escaped table>.sql`` (the CREATE statement as
given), like ClickHouse's ``metadata/`` directory; at start-up every persisted table is attached again, then
the config's ``tables:`` are created if missing.  CREATE TABLE of a ReplicatedMergeTree creates or joins the
table in ZooKeeper (``replicad.replication.init``); DROP TABLE removes this replica's ZooKeeper subtree (and
the whole table's when it was the last replica, as 18.16 does) and the local data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicad.datatypes import escape_for_file_name, unescape_for_file_name
from replicad.errors import BadInputError, KeeperError, KeeperNoNodeError, ReplicadError, UnknownTableError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.replica import ReplicaEnv, TableReplica, TableSpec
from replicad.replication.alter_columns import refuse_plain_column_comments
from replicad.replication.fetcher import FetchCredentials
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.server.tls import client_context
from replicad.service import Statement, TableName, TableService
from replicad.sql.ddl import TableDef, parse_create_table
from replicad.storage.disk_s3 import build_disks
from replicad.tasks import Supervisor

if TYPE_CHECKING:
    from replicad.config import Config
    from replicad.service import Engine

log = get_logger(__name__)


class TableExistsError(ReplicadError):
    code = 57  # TABLE_ALREADY_EXISTS
    http_status = 400


def merge_tree_defaults(config_settings: Mapping[str, int | float | str]) -> dict[str, str]:
    """The MergeTree-scope entries of the config's ``settings:`` as text (how DDL ``SETTINGS`` hold them)."""
    from replicad.settings import SETTINGS, SettingScope

    return {
        name: str(value)
        for name, value in config_settings.items()
        if name in SETTINGS and SETTINGS[name].scope is SettingScope.MERGE_TREE
    }


def spec_from_ddl(
    table: TableDef,
    config_macros: dict[str, str],
    replica: str,
    default_db: str = "default",
    config_settings: Mapping[str, int | float | str] | None = None,
) -> TableSpec:
    """The TableSpec of a ReplicatedMergeTree CREATE statement, macros expanded as 18.16 expands them.

    ``config_settings`` (the config's ``settings:``) are the defaults of the table's MergeTree settings, as
    ClickHouse's ``<merge_tree>`` section is: the DDL's ``SETTINGS`` override them.  Like ClickHouse, the
    effective ``index_granularity`` is what the table ``metadata`` znode records.
    """
    from replicad.keeper.paths import expand_macros

    if config_settings:
        merged = {**merge_tree_defaults(config_settings), **table.settings}
        if merged != table.settings:
            table = dataclasses.replace(table, settings=merged)

    if not table.replicated or table.zk_path is None or table.replica_name is None:
        raise BadInputError(
            f"Table {table.qualified_name}: only ReplicatedMergeTree tables are supported by replicad",
            code=48,
        )
    database = table.database or default_db
    macros = dict(config_macros)
    macros.setdefault("replica", replica)
    zk_path = expand_macros(table.zk_path, macros, database, table.name)
    replica_name = expand_macros(table.replica_name, macros, database, table.name)
    columns = tuple((c.name, c.type) for c in table.columns if c.is_physical)
    return TableSpec(
        name=TableName(database, table.name),
        zk_path=zk_path,
        replica_name=replica_name,
        columns=columns,
        metadata_text=table.metadata_text(),
        columns_text=table.columns_text(),
        partition_by=table.partition_by,
        order_by=table.order_by,
        primary_key=table.primary_key,
        settings=dict(table.settings),
        ddl=table.ddl,
    )


class ReplicaCatalog:
    """Tables by name; implements :class:`replicad.service.Catalog`."""

    def __init__(
        self,
        data_path: Path,
        keeper: Keeper,
        env: ReplicaEnv,
        *,
        replica: str,
        macros: dict[str, str] | None = None,
        supervisor: Supervisor | None = None,
        settings: Mapping[str, int | float | str] | None = None,
    ) -> None:
        self.data_path = Path(data_path)
        self.keeper = keeper
        self.env = env
        self.replica = replica
        self.macros = dict(macros or {})
        self.supervisor = supervisor
        #: the config's ``settings:``: defaults under each table's DDL ``SETTINGS``
        self.settings: dict[str, int | float | str] = dict(settings or {})
        self._tables: dict[TableName, TableReplica] = {}
        self._lock = asyncio.Lock()
        #: distributed DDL (replicad.ddl.service.DistributedDDL) when configured
        self.ddl: Any = None

    @property
    def metadata_path(self) -> Path:
        return self.data_path / "metadata"

    def ddl_path(self, name: TableName) -> Path:
        return (
            self.metadata_path
            / escape_for_file_name(name.database)
            / f"{escape_for_file_name(name.table)}.sql"
        )

    # ------------------------------------------------------------------------------------------- protocol

    def get(self, name: TableName) -> TableService:
        return self.replica_of(name)

    def replica_of(self, name: TableName) -> TableReplica:
        table = self._tables.get(name)
        if table is None:
            raise UnknownTableError(f"Table {name} doesn't exist.")
        return table

    def tables(self) -> list[TableService]:
        return [self._tables[n] for n in sorted(self._tables)]

    async def create_table(self, statement: Statement) -> TableService:
        """CREATE TABLE from a client: as 18.16's CREATE (not ATTACH), a replica name that already exists in
        ZooKeeper is refused (code 253), so a client cannot take over another replica's identity."""
        refuse_plain_column_comments(parse_create_table(statement.text))
        return await self.create_from_ddl(statement.text, if_not_exists=statement.if_exists, new_replica=True)

    async def drop_table(self, statement: Statement) -> None:
        async with self._lock:
            table = self._tables.get(statement.table)
            if table is None:
                if statement.if_exists:
                    return
                raise UnknownTableError(f"Table {statement.table} doesn't exist.")
            await table.stop()
            if table.store.remote is not None:  # before the table's ZooKeeper nodes (table_shared_id) go
                await table.store.remote.release_all()
            await self._drop_zookeeper(table.paths)
            del self._tables[statement.table]
            await asyncio.to_thread(self._remove_local, statement.table, table)
            log.info("table_dropped", table=str(statement.table))

    def keeper_status(self) -> dict[str, Any]:
        return {
            "state": str(self.keeper.session_state),
            "session_id": self.keeper.session_id,
            "hosts": self.keeper.hosts,
            "chroot": self.keeper.chroot,
        }

    # ------------------------------------------------------------------------------------------- creation

    async def create_from_ddl(
        self, ddl: str, *, if_not_exists: bool = False, persist: bool = True, new_replica: bool = False
    ) -> TableReplica:
        table = parse_create_table(ddl)
        spec = spec_from_ddl(table, self.macros, self.replica, config_settings=self.settings)
        check_names(spec.name, spec.zk_path, spec.replica_name)
        async with self._lock:
            existing = self._tables.get(spec.name)
            if existing is not None:
                if if_not_exists or table.if_not_exists:
                    return existing
                raise TableExistsError(f"Table {spec.name} already exists.")
            if new_replica:
                paths = TablePaths.create(spec.zk_path, spec.replica_name)
                if await self.keeper.exists(paths.me.root) is not None:
                    raise BadInputError(f"Replica {paths.me.root} already exists (another server's replica, "
                                        "or one that was dropped locally: SYSTEM DROP REPLICA removes it)",
                                        code=253)
            replica = TableReplica(spec, self.keeper, self.env, self.supervisor)
            path = self.ddl_path(spec.name)
            replica.alter.persist_ddl = _ddl_writer(path)
            if persist:
                await asyncio.to_thread(_write_atomically, path, ddl)
            try:
                await replica.start()
            except BaseException:
                if persist:
                    await asyncio.to_thread(_unlink_quietly, path)
                await replica.stop()
                raise
            self._tables[spec.name] = replica
            log.info("table_attached", table=str(spec.name), zk_path=spec.zk_path, replica=spec.replica_name)
            return replica

    async def load(self) -> list[TableName]:
        """Attach every table whose DDL is persisted under ``metadata/``."""
        loaded: list[TableName] = []
        for db_dir, sql_path in await asyncio.to_thread(self._persisted):
            ddl = await asyncio.to_thread(sql_path.read_text)
            database = unescape_for_file_name(db_dir)
            table = parse_create_table(ddl)
            if table.database is None and database != "default":
                raise ReplicadError(f"{sql_path}: the statement does not name its database {database}")
            replica = await self.create_from_ddl(ddl, persist=False)
            loaded.append(replica.name)
        return loaded

    def _persisted(self) -> list[tuple[str, Path]]:
        out: list[tuple[str, Path]] = []
        if not self.metadata_path.exists():
            return out
        for db in sorted(os.scandir(self.metadata_path), key=lambda e: e.name):
            if not db.is_dir():
                continue
            for f in sorted(Path(db.path).glob("*.sql")):
                out.append((db.name, f))
        return out

    # ------------------------------------------------------------------------------------------- dropping

    async def _drop_zookeeper(self, paths: TablePaths) -> None:
        try:
            await self.keeper.delete(paths.me.root, recursive=True)
            replicas = await self.keeper.get_children(paths.replicas)
        except KeeperNoNodeError:
            return
        except KeeperError as e:
            raise ReplicadError(
                f"Cannot remove replica {paths.me.root} from ZooKeeper: {e}", retriable=True
            ) from e
        if not replicas:
            log.info("removing_table_from_zookeeper", zk_path=paths.zk_path)
            try:
                await self.keeper.delete(paths.zk_path, recursive=True)
            except KeeperError as e:
                log.warning("table_zookeeper_removal_failed", zk_path=paths.zk_path, error=str(e))

    def _remove_local(self, name: TableName, table: TableReplica) -> None:
        shutil.rmtree(table.layout.path, ignore_errors=True)
        _unlink_quietly(self.ddl_path(name))

    # ------------------------------------------------------------------------------------------- shutdown

    async def stop_all(self) -> None:
        """Stop every table, last attached first (the reverse of start-up); one that fails to stop is logged
        and the others still stop."""
        for table in reversed(list(self._tables.values())):
            try:
                await table.stop()
            except Exception as e:
                log.error("table_stop_failed", table=str(table.name), error=f"{type(e).__name__}: {e}",
                          exc_info=True)
            else:
                log.info("table_stopped", table=str(table.name))


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".sql.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text.rstrip() + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _ddl_writer(path: Path) -> Callable[[str], Awaitable[None]]:
    """How a table rewrites its persisted DDL (after an ALTER)."""

    async def write(ddl: str) -> None:
        await asyncio.to_thread(_write_atomically, path, ddl)

    return write


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


class ReplicationEngine:
    """The engine the daemon drives (``replicad.service.Engine``)."""

    def __init__(self, config: Config, supervisor: Supervisor, metrics: object | None = None) -> None:
        self.config = config
        self.supervisor = supervisor
        self.metrics = metrics
        zk = config.zookeeper
        self.keeper = Keeper(zk.hosts, session_timeout_s=zk.session_timeout_s)
        self.keeper.latency_observer = getattr(metrics, "observe_zookeeper", None)
        ic = config.interserver
        table_sends = int(config.effective_settings().get("replicated_max_parallel_sends", 0))
        self.interserver = InterserverServer(
            ic.listen_host,
            ic.port,
            user=ic.user,
            password=ic.password,
            max_parallel_sends=_min_limit(ic.max_parallel_sends, table_sends),
            tls_files=(ic.tls_cert_file, ic.tls_key_file) if ic.tls_cert_file and ic.tls_key_file else None,
            max_connections=ic.max_connections,
            send_timeout_s=ic.send_timeout_s,
        )
        # a CA file is one small read at start-up; without one, aiohttp checks peers with the system's CAs
        peer_ssl = client_context(ic.tls_ca_file) if ic.tls_ca_file is not None else True
        env = ReplicaEnv(
            data_path=config.data_path,
            interserver=InterserverExchange(self.interserver),
            interserver_host=ic.host,
            tz=config.timezone,
            credentials=FetchCredentials(ic.user, ic.password, peer_ssl),
            activation_timeout_s=zk.session_timeout_s + 5.0,
            max_fetch_part_bytes=ic.max_fetch_part_bytes,
            disks=build_disks(config.storage, config.data_path),
            storage_policies=config.storage.policy_disks(),
        )
        self._catalog = ReplicaCatalog(
            config.data_path,
            self.keeper,
            env,
            replica=config.replica,
            macros=dict(config.macros),
            supervisor=supervisor,
            settings=config.settings,
        )

        if config.distributed_ddl is not None:
            from replicad.ddl.service import CatalogRunner, DistributedDDL
            from replicad.ddl.worker import DDLSettings, shards_of
            from replicad.server.routing import parse_full, route

            d = config.distributed_ddl
            self._catalog.ddl = DistributedDDL(self.keeper, DDLSettings(
                d.host, d.port, d.path, d.task_max_lifetime, d.cleanup_delay_period, d.max_tasks_in_queue,
                d.task_timeout), shards_of(config.clusters), CatalogRunner(self._catalog, route, parse_full))

    @property
    def catalog(self) -> ReplicaCatalog:
        return self._catalog

    async def start(self) -> None:
        # ZooKeeper down at start-up: tables start read-only and serve reads until it answers
        await self.keeper.start(require_connection=False)
        await self.interserver.start()
        await self._catalog.load()
        await self._create_config_tables(self.config)
        if self._catalog.ddl is not None:  # tasks run once the tables are loaded
            self.supervisor.add(self._catalog.ddl.worker, group="ddl")

    async def _create_config_tables(self, config: Config) -> None:
        for ddl in config.tables:
            await self._catalog.create_from_ddl(ddl, if_not_exists=True)

    async def reload(self, config: Config) -> None:
        self.config = config
        # tables created from now on take the new settings; tables already attached keep theirs
        self._catalog.settings = dict(config.settings)
        await self._create_config_tables(config)

    async def stop_listening(self) -> None:
        await self.interserver.stop_listening()

    async def stop_inserts(self) -> None:
        for table in self._catalog.tables():
            if isinstance(table, TableReplica):
                await table.stop_inserts()

    async def stop_tables(self) -> None:
        await self._catalog.stop_all()

    async def close_interserver(self) -> None:
        await self.interserver.stop()

    async def close_keeper(self) -> None:
        await self.keeper.close()


_ZK_COMPONENT = re.compile(r"[^\x00-\x1f\x7f/]{1,255}")
MAX_NAME_BYTES = 200  # a database or table name as a file name (escaped), with room for ".sql" and "tmp_"


def check_names(name: TableName, zk_path: str, replica: str) -> None:
    """Refuse names that would break a file name or a ZooKeeper path, before anything is written."""
    for what, value in (("database", name.database), ("table", name.table)):
        if not value or "\x00" in value or len(escape_for_file_name(value).encode()) > MAX_NAME_BYTES:
            raise BadInputError(f"Invalid {what} name {value[:100]!r}: empty, NUL, or longer than "
                                f"{MAX_NAME_BYTES} bytes as a file name", code=36)
    parts = zk_path.split("/")
    if not zk_path.startswith("/") or len(zk_path) > 1000 or any(
            not _ZK_COMPONENT.fullmatch(p) or p in (".", "..") for p in parts[1:]):
        raise BadInputError(f"Invalid ZooKeeper path {zk_path[:200]!r}: it must be absolute, without empty, "
                            "'.' or '..' components or control characters", code=36)
    if not _ZK_COMPONENT.fullmatch(replica) or replica in (".", ".."):
        raise BadInputError(f"Invalid replica name {replica[:100]!r}", code=36)


def _min_limit(*limits: int) -> int:
    """The lowest of limits where 0 means none (0 when all are 0)."""
    return min((n for n in limits if n > 0), default=0)


def create_engine(config: Config, supervisor: Supervisor, metrics: object) -> Engine:
    """The daemon's engine factory (``replicad.daemon.DEFAULT_ENGINE``)."""
    return ReplicationEngine(config, supervisor, metrics)
