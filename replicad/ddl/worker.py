"""The DDL worker: runs the ``… ON CLUSTER`` tasks of ZooKeeper's queue that list this daemon, as 18.16 does.

One task at a time, in name order (the queue's children are watched; a periodic look too).  For a task:

* unreadable (another format version, an extra line…): ``finished/<own id>`` gets 18.16's 287 / 27 status;
* no id of ``hosts`` names this daemon: nothing is written (the task is not ours).  An id names it when
  its port is the daemon's and its host is the daemon's configured spelling or resolves to an address of
  this machine (:mod:`replicad.ddl.host_match`, as 18.16's ``isLocalAddress``); the first such id, in its
  canonical form, is the task's id for this daemon (``<id>`` below);
* ``finished/<id>`` exists already (done before a restart): skipped;
* else ``active/<id>`` (ephemeral) while it runs, then one multi {delete ``active/<id>``, create
  ``finished/<id>`` = ``<code>\\n<message>``}.  The statement is parsed, its cluster looked up in this
  daemon's config and ``ON CLUSTER`` removed; CREATE / DROP / TRUNCATE / OPTIMIZE run on every host, an ALTER
  of a replicated table once per shard (``shards/<replicas>/lock`` and ``executed``, 20 tries with random
  0–1 s sleeps; a replica that finds ``executed`` reports 0, one that never does reports 18.16's 48).
  Statements 18.16 would not run ON CLUSTER are refused with 78; nothing runs before every check passed.

Cleanup as 18.16's: after queue changes, at most once per ``cleanup_delay_period``, tasks older than
``task_max_lifetime`` or beyond the newest ``max_tasks_in_queue`` are removed (never one with ``active/``
children or whose ``lock`` another server holds).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replicad.ddl.entry import (
    DDLEntry,
    EntryFormatError,
    exception_message,
    host_id,
    readable,
    split_host_id,
    status_text,
)
from replicad.ddl.host_match import LocalHosts
from replicad.errors import (
    KeeperError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
)
from replicad.keeper.client import Keeper, SessionState
from replicad.keeper.ops import Create, Delete
from replicad.logging import get_logger
from replicad.sql.expressions_lexer import T, tokenize
from replicad.tasks import IDLE, BackgroundTask, Outcome

log = get_logger(__name__)

UNKNOWN_DDL_QUERY = 78
INCONSISTENT_CLUSTER_DEFINITION = 371
NOT_IMPLEMENTED = 48
SHARD_TRIES = 20

_CREATE_DATABASE = re.compile(
    r"\s*CREATE\s+DATABASE\s+(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+ON\s+CLUSTER\s+\S+\s*;?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Shard:
    replicas: tuple[str, ...]  # "host:port" as the config writes them
    internal_replication: bool = True

    @property
    def node_name(self) -> str:
        """The ``shards/<…>`` name: the replicas' readable ``host:port``, sorted, comma-joined."""
        return ",".join(sorted(readable(*split_host_id(r)) for r in self.replicas))


@dataclass(frozen=True)
class DDLSettings:
    host: str
    port: int
    path: str = "/clickhouse/task_queue/ddl"
    task_max_lifetime: int = 604800
    cleanup_delay_period: int = 60
    max_tasks_in_queue: int = 1000
    task_timeout: int = 180

    @property
    def host_id(self) -> str:
        return host_id(self.host, self.port)


class StatementRunner:
    """What the worker needs from the engine: is this an ALTER of a replicated table; run a statement."""

    def check_query(self, sql: str) -> None:
        """Refuse (code 78) a statement that is not one distributed DDL runs."""

    def is_replicated_alter(self, sql: str) -> bool:
        raise NotImplementedError

    async def run(self, sql: str) -> None:
        raise NotImplementedError


def remove_on_cluster(query: str) -> tuple[str, str | None]:
    """``query`` without its ``ON CLUSTER <name>`` clause, and the name (None when there is none)."""
    toks = tokenize(query)
    for i in range(len(toks) - 2):
        if toks[i].is_word("ON") and toks[i + 1].is_word("CLUSTER"):
            name_tok = toks[i + 2]
            if name_tok.kind not in (T.WORD, T.QUOTED_ID, T.STRING):
                return query, None
            from replicad.sql.expressions_ast import Parser

            p = Parser(name_tok.text)
            name = p.string_literal() if name_tok.kind is T.STRING else p.identifier()
            return (query[:toks[i].start].rstrip() + " " + query[name_tok.end:].lstrip()).strip(), name
    return query, None


class DDLWorker(BackgroundTask):
    def __init__(self, keeper: Keeper, settings: DDLSettings, clusters: Mapping[str, Sequence[Shard]],
                 runner: StatementRunner, period_s: float = 5.0, hosts: LocalHosts | None = None) -> None:
        super().__init__("ddl_worker", period_s)
        self.keeper = keeper
        self.settings = settings
        self.clusters = dict(clusters)
        self.runner = runner
        self.me = settings.host_id
        self.hosts = hosts if hosts is not None else LocalHosts(settings.host, settings.port)
        self._last: str | None = None
        self._last_cleanup = 0.0
        self._queue_changed = True
        self.processed = 0

    def _watch(self, _event: object) -> None:
        self._queue_changed = True
        self.wakeup()

    async def run_once(self) -> Outcome:
        if self.keeper.session_state is not SessionState.CONNECTED:
            return Outcome("no_zookeeper", delay_s=1.0)
        path = self.settings.path.rstrip("/")
        await self.keeper.ensure_path(path)
        names = sorted(n for n in await self.keeper.get_children(path, watch=self._watch)
                       if n.startswith("query-"))
        todo = [n for n in names if self._last is None or n > self._last]
        done = 0
        for name in todo:
            if self.stopping:
                break
            try:
                await self._process(f"{path}/{name}", name)
            except KeeperNoNodeError:
                pass  # deleted by a cleaner meanwhile
            self._last = name
            done += 1
        due = time.monotonic() - self._last_cleanup >= self.settings.cleanup_delay_period
        if self._queue_changed and due:
            self._queue_changed = False
            self._last_cleanup = time.monotonic()
            await self._cleanup(path, names)
        self.processed += done
        return Outcome("processed", fields={"tasks": done}) if done else IDLE

    # ---- one task ------------------------------------------------------------------------------------

    async def _process(self, task_path: str, name: str) -> None:
        data, _stat = await self.keeper.get(task_path)
        await self._ensure_dirs(task_path)
        try:
            entry = DDLEntry.parse(data)
        except EntryFormatError as e:  # 18.16 answers under its own id, listed or not
            log.warning("ddl_task_unreadable", task=name, error=str(e))
            if await self.keeper.exists(f"{task_path}/finished/{self.me}") is None:
                await self._create_quietly(f"{task_path}/finished/{self.me}",
                                           status_text(e.code, exception_message(e.code, str(e))))
            return
        me = await self.hosts.first_match(entry.hosts)
        if me is None:
            log.debug("ddl_task_not_for_me", task=name)
            return
        if await self.keeper.exists(f"{task_path}/finished/{me}") is not None:
            return  # done before (a restart rescans the whole queue)
        active = f"{task_path}/active/{me}"
        try:
            await self.keeper.create(active, b"", ephemeral=True)
        except KeeperNodeExistsError:
            pass  # left by an old session of ours: accepted, as 18.16 does
        log.info("ddl_task_processing", task=name, query=entry.query[:300])
        code, message = await self._execute(name, entry, me)
        try:
            await self.keeper.multi([Delete(active), Create(f"{task_path}/finished/{me}",
                                                            status_text(code, message))])
        except KeeperMultiError as e:
            if not isinstance(e.cause, KeeperNoNodeError | KeeperNodeExistsError):
                raise
            await self._create_quietly(f"{task_path}/finished/{me}", status_text(code, message))
        log.info("ddl_task_finished", task=name, code=code, message=message[:300])

    async def _execute(self, name: str, entry: DDLEntry, me: str) -> tuple[int, str]:
        """Checks, then the statement: ``(code, message)`` for ``finished/``."""
        me_host, me_port = split_host_id(me)
        me_readable = readable(me_host, me_port)

        def before(code: int, text: str) -> tuple[int, str]:
            return code, exception_message(code, text, before_execution=True)

        local, cluster_name = remove_on_cluster(entry.query)
        if not _CREATE_DATABASE.match(entry.query):
            try:  # as 18.16: an unknown kind of statement first, then the cluster
                self.runner.check_query(local)
            except ReplicadError as e:
                return before(e.code, str(e))
        if cluster_name is None or cluster_name not in self.clusters:
            return before(INCONSISTENT_CLUSTER_DEFINITION,
                          f"DDL task {name} contains current host {me_readable} in cluster "
                          f"{cluster_name or ''}, but there are no such cluster here.")
        shards = self.clusters[cluster_name]
        mine = await self._own_shards(shards, {(me_host, me_port), (self.settings.host, self.settings.port)})
        if not mine:
            return before(INCONSISTENT_CLUSTER_DEFINITION,
                          f"Not found host {me_readable} in definition of cluster {cluster_name}")
        if len(mine) > 1:
            return before(INCONSISTENT_CLUSTER_DEFINITION,
                          f"There are two exactly the same ClickHouse instances {me_readable} in cluster "
                          f"{cluster_name}")
        shard_num, shard = mine[0]
        if _CREATE_DATABASE.match(entry.query):
            return 0, ""  # databases are implicit in replicad
        try:
            replicated_alter = self.runner.is_replicated_alter(local)
        except ReplicadError as e:
            return before(e.code, str(e))
        if replicated_alter:
            if not shard.internal_replication:
                return before(INCONSISTENT_CLUSTER_DEFINITION,
                              f"Table is replicated, but shard #{shard_num} isn't replicated according to "
                              "its cluster definition. Possibly <internal_replication>true"
                              "</internal_replication> is forgotten in the cluster config.")
            return await self._once_per_shard(f"/{name}", shard, local, me)
        return await self._run(local)

    async def _own_shards(self, shards: Sequence[Shard], exact: set[tuple[str, int]]
                          ) -> list[tuple[int, Shard]]:
        """This daemon's shards in a cluster, as 18.16 finds them: replicas spelled as the task's id or
        the config; else (no such replica) replicas whose host resolves to this machine, with its port."""
        mine = [(i, s) for i, s in enumerate(shards, 1) if any(split_host_id(r) in exact for r in s.replicas)]
        if mine:
            return mine
        candidates = [split_host_id(r) for s in shards for r in s.replicas]
        local = await self.hosts.local_hosts([h for h, p in candidates if p == self.settings.port])
        return [(i, s) for i, s in enumerate(shards, 1)
                if any(split_host_id(r)[0] in local and split_host_id(r)[1] == self.settings.port
                       for r in s.replicas)]

    async def _run(self, local: str) -> tuple[int, str]:
        try:
            await self.runner.run(local)
        except ReplicadError as e:
            return e.code, exception_message(e.code, str(e))
        except Exception as e:  # a bug must not leave the task unanswered
            log.error("ddl_statement_crashed", error=f"{type(e).__name__}: {e}", exc_info=True)
            return 1001, exception_message(1001, f"{type(e).__name__}: {e}")
        return 0, ""

    async def _once_per_shard(self, task_suffix: str, shard: Shard, local: str, me: str) -> tuple[int, str]:
        base = f"{self.settings.path.rstrip('/')}{task_suffix}/shards/{shard.node_name}"
        await self.keeper.ensure_path(base)
        for _ in range(SHARD_TRIES):
            if await self.keeper.exists(f"{base}/executed") is not None:
                return 0, ""
            try:
                await self.keeper.create(f"{base}/lock", me.encode(), ephemeral=True)
            except KeeperNodeExistsError:
                await asyncio.sleep(random.uniform(0.0, 1.0))
                continue
            try:
                if await self.keeper.exists(f"{base}/executed") is not None:
                    return 0, ""
                result = await self._run(local)
                await self._create_quietly(f"{base}/executed", me.encode())
                return result
            finally:
                try:
                    await self.keeper.delete(f"{base}/lock")
                except KeeperError:
                    pass
        return NOT_IMPLEMENTED, "Cannot enqueue replicated DDL query for a replicated shard"

    async def _ensure_dirs(self, task_path: str) -> None:
        if await self.keeper.exists(f"{task_path}/finished") is not None:
            return
        for d in ("active", "finished"):
            await self._create_quietly(f"{task_path}/{d}", b"")

    async def _create_quietly(self, path: str, data: bytes) -> None:
        try:
            await self.keeper.create(path, data)
        except KeeperNodeExistsError:
            pass

    async def on_stop(self) -> None:
        self.hosts.close()

    # ---- cleanup -------------------------------------------------------------------------------------

    async def _cleanup(self, path: str, names: list[str]) -> None:
        # Ages on ZooKeeper's clock: a task's ctime against the mtime of a write made now (the queue node's
        # empty data, which no reader uses). The local clock may be far off: a daemon a week ahead would
        # delete every task at once, one behind would keep them for good.
        try:
            now_ms = (await self.keeper.set(path, b"")).mtime_ms
        except KeeperError as e:
            log.warning("ddl_task_cleanup_failed", task="", error=str(e))
            return
        excess = max(0, len(names) - self.settings.max_tasks_in_queue)
        for i, name in enumerate(names):
            task = f"{path}/{name}"
            try:
                stat = await self.keeper.exists(task)
                if stat is None:
                    continue
                expired = stat.ctime_ms + self.settings.task_max_lifetime * 1000 < now_ms
                if not expired and i >= excess:
                    continue
                if await self.keeper.exists(f"{task}/active") is not None and \
                        await self.keeper.get_children(f"{task}/active"):
                    log.info("ddl_task_cleanup_skipped_active", task=name)
                    continue
                try:
                    await self.keeper.create(f"{task}/lock", self.me.encode(), ephemeral=True)
                except KeeperNodeExistsError:
                    continue
                for child in await self.keeper.get_children(task):
                    if child != "lock":
                        await self.keeper.delete(f"{task}/{child}", recursive=True)
                await self.keeper.multi([Delete(f"{task}/lock"), Delete(task)])
                log.info("ddl_task_deleted", task=name, expired=expired)
            except KeeperError as e:
                log.warning("ddl_task_cleanup_failed", task=name, error=str(e))


def shards_of(config_clusters: Mapping[str, Sequence[Any]]) -> dict[str, list[Shard]]:
    """Runtime cluster definitions from the config's ``clusters:``."""
    return {name: [Shard(tuple(s.replicas), bool(s.internal_replication)) for s in shards]
            for name, shards in config_clusters.items()}
