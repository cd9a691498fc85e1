"""The introspection rows of a table replica: ``system.replicas`` (plus replicad's own health fields),
the ZooKeeper summary behind its replica counts, and ``system.parts``."""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from replicad.errors import KeeperNoNodeError
from replicad.keeper.client import Keeper, SessionState
from replicad.keeper.paths import TablePaths
from replicad.replication.init import TableStructure
from replicad.replication.part_store import PartState, PartStore
from replicad.replication.table_context import TableContext
from replicad.replication.table_ops import TableOperations
from replicad.tasks import BackgroundTask


class ReplicaView(TableContext, Protocol):
    """A table replica as its ``system.replicas`` row sees it."""

    @property
    def structure(self) -> TableStructure | None: ...

    @property
    def ops(self) -> TableOperations: ...


def replicas_row(
    r: ReplicaView, zk_summary: Mapping[str, int], tasks: Sequence[BackgroundTask]
) -> dict[str, Any]:
    """``system.replicas`` of ``r``; ``zk_summary`` as :func:`zookeeper_summary` last answered."""
    qs = r.queue_state.status()
    active = r.store.active()
    now = time.time()
    min_unprocessed = r.queue_state.min_unprocessed_insert_time
    return {
        "database": r.spec.name.database,
        "table": r.spec.name.table,
        "engine": "ReplicatedMergeTree",
        "is_leader": bool(getattr(r.leader, "is_leader", False)),
        "is_readonly": r.is_readonly,
        "is_session_expired": r.keeper.session_state is SessionState.LOST,
        "future_parts": qs.future_parts,
        "parts_to_check": len(r.part_check),
        "zookeeper_path": r.paths.zk_path,
        "replica_name": r.paths.replica_name,
        "replica_path": r.paths.me.root,
        "columns_version": r.structure.columns_version if r.structure else -1,
        "queue_size": qs.queue_size,
        "inserts_in_queue": qs.inserts_in_queue,
        "merges_in_queue": qs.merges_in_queue,
        "part_mutations_in_queue": qs.part_mutations_in_queue,
        "queue_oldest_time": qs.queue_oldest_time,
        "inserts_oldest_time": qs.inserts_oldest_time,
        "merges_oldest_time": qs.merges_oldest_time,
        "oldest_part_to_get": qs.oldest_part_to_get,
        "log_pointer": r.puller.log_pointer,
        "log_max_index": zk_summary.get("log_max_index", 0),
        "total_replicas": zk_summary.get("total_replicas", 0),
        "active_replicas": zk_summary.get("active_replicas", 0),
        "last_queue_update": qs.last_queue_update,
        "absolute_delay": int(now - min_unprocessed) if min_unprocessed else 0,
        "active_parts": len(active),
        "max_parts_in_partition": max(collections.Counter(p.info.partition_id for p in active).values(),
                                      default=0),
        "fetches_total": r.fetcher.fetches_total,
        "executed_entries": r.executor.executed_total,
        "failed_entries": r.executor.failed_total,
        "merges_and_mutations": r.ops.status(),
        "tasks": {t.name: (t.last_outcome.to_dict() if t.last_outcome else None) for t in tasks},
        "restarting": r.restarting.status(),
        "part_check": r.part_check.status(),
        "cleanup": r.cleanup.status(),
    }


async def zookeeper_summary(keeper: Keeper, paths: TablePaths) -> dict[str, int]:
    """``total_replicas`` / ``active_replicas`` / ``log_max_index`` (need ZooKeeper)."""
    replicas = await keeper.get_children(paths.replicas)
    active = 0
    for r in replicas:
        if await keeper.exists(paths.replica(r).is_active) is not None:
            active += 1
    log_entries = [c for c in await keeper.get_children(paths.log) if c.startswith("log-")]
    log_max = max((int(c[4:]) for c in log_entries), default=0)
    return {"total_replicas": len(replicas), "active_replicas": active, "log_max_index": log_max}


def parts_rows(store: PartStore) -> list[dict[str, Any]]:
    """``system.parts`` rows of every part the store knows (active or not)."""
    rows = []
    for p in store.all_parts():
        rows.append(
            {
                "name": p.name,
                "partition_id": p.info.partition_id,
                "min_block_number": p.info.min_block,
                "max_block_number": p.info.max_block,
                "level": p.info.level,
                "data_version": p.info.data_version,
                "active": p.state is PartState.ACTIVE,
                "state": p.state.value,
                "rows": p.directory.rows,
                "bytes_on_disk": p.directory.bytes_on_disk,
                "modification_time": int(p.modification_time),
                "path": str(p.path),
            }
        )
    return rows


async def replicas_view(keeper: Keeper, paths: TablePaths, now: float | None = None) -> list[dict[str, Any]]:
    """Every replica of the table as ZooKeeper shows it (the cluster view of ``/status`` and
    ``replicad status``): active, log_pointer, queue size, delay, is_leader, lost, and the kind of server —
    replicad advertises no native port (``tcp_port: 0`` in ``host``), ClickHouse always does."""
    now = time.time() if now is None else now
    names = sorted(await keeper.get_children(paths.replicas))
    try:
        candidates = await keeper.get_children(paths.leader_election)
    except KeeperNoNodeError:
        candidates = []
    leaders: set[str] = set()
    first = min(candidates) if candidates else None
    if first is not None:
        got = await keeper.get_many([f"{paths.leader_election}/{first}"])
        data = got[0][0].decode("utf-8", "replace") if got[0] is not None else ""
        if data.startswith("all"):  # 21.12+: no election, every active replica may lead
            leaders = set(names)
        else:
            leaders = {data}
    fields = ("is_active", "log_pointer", "host", "min_unprocessed_insert_time", "is_lost")
    values = await keeper.get_many([getattr(paths.replica(n), f) for n in names for f in fields])
    queues = await keeper.get_children_many([paths.replica(n).queue for n in names])
    out = []
    for i, name in enumerate(names):
        row = dict(zip(fields, values[i * len(fields):(i + 1) * len(fields)], strict=True))

        def text(field: str, row: dict[str, Any] = row) -> str:
            v = row[field]
            return v[0].decode("utf-8", "replace").strip() if v is not None else ""

        active = row["is_active"] is not None
        oldest = text("min_unprocessed_insert_time")
        min_unprocessed = int(oldest) if oldest.isdigit() else 0
        out.append({
            "name": name,
            "active": active,
            "is_leader": active and name in leaders,
            "log_pointer": int(text("log_pointer")) if text("log_pointer").isdigit() else 0,
            "queue_size": len(queues[i] or []),
            "delay": int(now - min_unprocessed) if min_unprocessed else 0,
            "is_lost": text("is_lost") == "1",
            "kind": _server_kind(text("host")),
            "host": _host_field(text("host"), "host"),
        })
    return out


def _host_field(host_text: str, key: str) -> str:
    for line in host_text.splitlines():
        k, _, v = line.partition(": ")
        if k == key:
            return v
    return ""


def _server_kind(host_text: str) -> str:
    if not host_text:
        return "unknown"
    return "replicad" if _host_field(host_text, "tcp_port") == "0" else "clickhouse"
