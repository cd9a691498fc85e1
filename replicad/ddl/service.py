"""Distributed DDL for the daemon: the statements a task runs here (:class:`CatalogRunner`) and the
initiator of ``… ON CLUSTER c`` (:class:`DistributedDDL`).

The initiator, as 18.16's: the statement must be one 18.16 runs ON CLUSTER (CREATE / DROP / TRUNCATE /
OPTIMIZE TABLE, ALTER TABLE with column, mutation and DROP/DETACH PARTITION commands; others: code 48
``Unsupported type of ALTER query``), the cluster must be in the config (170 otherwise).  It creates
``query-`` (sequential) with a version-1 entry listing every replica of the cluster, then ``active`` and
``finished``, and polls ``finished/`` for the listed hosts up to ``distributed_ddl_task_timeout`` (180 s;
0 returns at once; code 159 with 18.16's message on timeout).  It answers 18.16's status table
(``host port status error num_hosts_remaining num_hosts_active``), or the first error
(``There was an error on [host:port]: …`` with that host's code).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replicad.ddl.entry import DDLEntry, host_id, parse_status, split_host_id
from replicad.ddl.worker import DDLSettings, DDLWorker, Shard, StatementRunner
from replicad.errors import KeeperError, KeeperNoNodeError, ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create
from replicad.logging import get_logger
from replicad.service import Statement, StatementKind

log = get_logger(__name__)

UNKNOWN_DDL_QUERY = 78
TIMEOUT_EXCEEDED = 159
BAD_GET = 170

_ALTERS = frozenset((StatementKind.ALTER_DELETE, StatementKind.ALTER_UPDATE, StatementKind.DROP_PARTITION,
                     StatementKind.DETACH_PARTITION, StatementKind.ALTER_COLUMNS))
_EVERY_HOST = frozenset((StatementKind.CREATE_TABLE, StatementKind.DROP_TABLE, StatementKind.TRUNCATE,
                         StatementKind.OPTIMIZE))


class CatalogRunner(StatementRunner):
    """Runs a task's statement (``ON CLUSTER`` removed) against this daemon's tables.  ``route`` and
    ``parse`` are the API's (``replicad.server.routing.route`` / ``parse_full``), given by the catalog."""

    def __init__(self, catalog: Any, route: Callable[[str, str], Any], parse: Callable[[str], Any],
                 default_database: str = "default") -> None:
        self.catalog = catalog
        self.route = route
        self.parse = parse
        self.default_database = default_database

    def _route(self, sql: str) -> Any:
        try:
            r = self.route(sql, self.default_database)
        except ReplicadError as e:
            raise ReplicadError(f"Received unknown DDL query ({e})", code=UNKNOWN_DDL_QUERY) from e
        if getattr(r, "kind", None) not in _ALTERS | _EVERY_HOST:
            raise ReplicadError("Received unknown DDL query", code=UNKNOWN_DDL_QUERY)
        return r

    def check_query(self, sql: str) -> None:
        self._route(sql)

    def is_replicated_alter(self, sql: str) -> bool:
        r = self._route(sql)
        if r.kind in _ALTERS:
            self.catalog.get(r.table)  # an unknown table fails before execution (code 60)
            return True  # every replicad table is a ReplicatedMergeTree
        return False

    async def run(self, sql: str) -> None:
        r = self._route(sql)
        parsed = self.parse(sql)
        stmt = Statement(kind=r.kind, table=r.table, text=sql, parsed=parsed, if_exists=r.if_exists)
        if r.kind is StatementKind.CREATE_TABLE:
            await self.catalog.create_table(stmt)
        elif r.kind is StatementKind.DROP_TABLE:
            await self.catalog.drop_table(stmt)
        else:
            await self.catalog.get(r.table).execute(stmt)


@dataclass(frozen=True)
class HostStatus:
    host: str
    port: int
    status: int
    error: str
    num_hosts_remaining: int
    num_hosts_active: int


class DistributedDDL:
    """This daemon's part in distributed DDL: the worker task and the initiator."""

    def __init__(self, keeper: Keeper, settings: DDLSettings, clusters: Mapping[str, Sequence[Shard]],
                 runner: StatementRunner) -> None:
        self.keeper = keeper
        self.settings = settings
        self.clusters = dict(clusters)
        self.worker = DDLWorker(keeper, settings, clusters, runner)

    def check(self, kind: StatementKind, parsed: Any) -> None:
        """Refuse before enqueueing what 18.16 refuses ON CLUSTER."""
        from replicad.sql.statements import Alter, DetachedCommand

        if kind not in _ALTERS | _EVERY_HOST:
            raise ReplicadError("Unsupported type of ALTER query", code=48)
        commands = parsed.commands if isinstance(parsed, Alter) else ()
        # as 18.16: ATTACH … and COMMENT COLUMN are not distributed
        if any(isinstance(c, DetachedCommand) or getattr(c, "kind", "") == "COMMENT" for c in commands):
            raise ReplicadError("Unsupported type of ALTER query", code=48)

    async def initiate(self, query: str, cluster: str, timeout_s: float) -> list[HostStatus]:
        shards = self.clusters.get(cluster)
        if shards is None:
            raise ReplicadError(f"Requested cluster '{cluster}' not found", code=BAD_GET)
        hosts = [host_id(*split_host_id(r)) for s in shards for r in s.replicas]
        entry = DDLEntry(" ".join(query.split("\n")), tuple(hosts), self.settings.host_id)
        base = self.settings.path.rstrip("/")
        await self.keeper.ensure_path(base)
        node = await self.keeper.create(f"{base}/query-", entry.to_bytes(), sequence=True)
        try:
            await self.keeper.multi([Create(f"{node}/active"), Create(f"{node}/finished")])
        except KeeperError as e:
            log.info("ddl_task_dirs_not_created", task=node, error=str(e))  # workers create them
        self.worker.wakeup()
        log.info("ddl_task_enqueued", task=node, hosts=hosts)
        if timeout_s == 0:
            return []
        return await self._wait(node, hosts, timeout_s)

    async def _wait(self, node: str, hosts: list[str], timeout_s: float) -> list[HostStatus]:
        deadline = None if timeout_s < 0 else time.monotonic() + timeout_s
        rows: list[HostStatus] = []
        pending = list(dict.fromkeys(hosts))
        tries = 0
        while pending:
            if await self.keeper.exists(node) is None:
                raise ReplicadError(
                    f"Cannot provide query execution status. The query's node {node} has been deleted by the "
                    "cleaner since it was finished (or its lifetime is expired)", code=341)
            try:
                finished = set(await self.keeper.get_children(f"{node}/finished"))
                active = len(await self.keeper.get_children(f"{node}/active"))
            except KeeperNoNodeError:
                finished, active = set(), 0
            for h in [h for h in pending if h in finished]:
                try:
                    data, _ = await self.keeper.get(f"{node}/finished/{h}")
                except KeeperNoNodeError:
                    continue
                code, message = parse_status(data)
                pending.remove(h)
                host, port = split_host_id(h)
                rows.append(HostStatus(host, port, code, message, len(pending), active))
            if not pending:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise ReplicadError(
                    f"Watching task {node} is executing longer than distributed_ddl_task_timeout "
                    f"(={int(timeout_s)}) seconds. There are {len(pending)} unfinished hosts ({active} of "
                    "them are currently active), they are going to execute the query in background.",
                    code=TIMEOUT_EXCEEDED)
            tries += 1
            await asyncio.sleep(min(1.0, 0.05 * (tries + 1)))
        for r in rows:
            if r.status != 0:
                raise ReplicadError(f"There was an error on [{r.host}:{r.port}]: {r.error}", code=r.status)
        return rows


def status_table(rows: list[HostStatus]) -> str:
    """The rows as TabSeparated (ClickHouse's default HTTP format)."""
    from replicad.model.text_io import escape

    return "".join(f"{escape(r.host)}\t{r.port}\t{r.status}\t{escape(r.error)}\t{r.num_hosts_remaining}\t"
                   f"{r.num_hosts_active}\n" for r in rows)
