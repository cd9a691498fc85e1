"""``/status`` and the per-table introspection endpoints, plus the text of ``replicad status``.

``/status`` (JSON)::

    {"replica": "r1", "state": "running", "uptime_s": 12.5, "version": "...",
     "zookeeper": {"state": "connected", ...},
     "tables": {"db.t": {<system.replicas fields>, "active_parts": 3}},
     "tasks": [{"name": ..., "state": "running", "restarts": 0, "last_error": null,
                "last_run": ..., "last_outcome": {...}}]}

``/tables/<db>.<t>/parts|queue|mutations`` are JSON lists of ``system.parts`` / ``system.replication_queue``
/ ``system.mutations`` rows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicad.logging import get_logger
from replicad.storage.checksums import Checksums

if TYPE_CHECKING:
    from replicad.service import Catalog, TableService
    from replicad.tasks import Supervisor

log = get_logger(__name__)

#: the ``system.replicas`` fields shown first, in ClickHouse's column order
REPLICA_FIELDS = (
    "database", "table", "engine", "is_leader", "is_readonly", "is_session_expired", "future_parts",
    "parts_to_check", "zookeeper_path", "replica_name", "replica_path", "columns_version", "queue_size",
    "inserts_in_queue", "merges_in_queue", "queue_oldest_time", "inserts_oldest_time", "merges_oldest_time",
    "oldest_part_to_get", "oldest_part_to_merge_to", "log_max_index", "log_pointer", "last_queue_update",
    "absolute_delay", "total_replicas", "active_replicas",
)
#: ``system.replicas`` fields 18.16 reads from ZooKeeper at query time (``with_zk_fields``)
ZK_FIELDS = ("log_max_index", "total_replicas", "active_replicas")
#: /replicas_status fails above this delay (ClickHouse's max_replica_delay_for_distributed_queries)
MAX_REPLICA_DELAY_S = 300
ZK_FIELDS_TIMEOUT_S = 2.0


def jsonable(value: Any) -> Any:
    """Plain JSON types: dates as ISO text, bytes as text, sets as sorted lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def table_status(table: TableService, zk_fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """One table's ``system.replicas`` row (ClickHouse's columns first) plus the engine's extra fields.

    ``zk_fields`` (fresh values of :data:`ZK_FIELDS`, see :func:`read_zk_fields`) replace the engine's
    cached ones; ``oldest_part_to_merge_to`` is derived from the queue when the engine does not give it."""
    raw = dict(table.status())
    raw.setdefault("database", table.name.database)
    raw.setdefault("table", table.name.table)
    raw.update(zk_fields or {})
    if "oldest_part_to_merge_to" not in raw:
        raw["oldest_part_to_merge_to"] = _oldest_merge(table)
    ordered = {k: raw.pop(k) for k in REPLICA_FIELDS if k in raw}
    ordered.update(raw)
    return jsonable(ordered)  # type: ignore[no-any-return]


def _oldest_merge(table: TableService) -> str:
    """``new_part_name`` of the oldest MERGE_PARTS entry in the queue ("" when none), as 18.16."""
    try:
        merges = [r for r in table.queue() if r.get("type") == "MERGE_PARTS"]
    except Exception:
        return ""
    if not merges:
        return ""
    oldest = min(merges, key=lambda r: (r.get("create_time") or 0, str(r.get("node_name", ""))))
    return str(oldest.get("new_part_name") or "")


async def read_zk_fields(catalog: Catalog | None, timeout_s: float = ZK_FIELDS_TIMEOUT_S
                         ) -> dict[str, dict[str, Any]]:
    """Fresh ``log_max_index``/``total_replicas``/``active_replicas`` per table, read from ZooKeeper as
    18.16's ``system.replicas`` does (tables whose engine has no ``replicas_summary()``, read-only tables
    and tables whose read fails or times out keep the engine's cached values)."""
    if catalog is None:
        return {}
    out: dict[str, dict[str, Any]] = {}

    async def one(t: TableService) -> None:
        fn = getattr(t, "replicas_summary", None)
        if fn is None or t.is_readonly:
            return
        view = getattr(t, "replicas_view", None)
        try:
            summary, replicas = await asyncio.wait_for(
                asyncio.gather(fn(), view() if view is not None else asyncio.sleep(0, [])), timeout_s)
        except Exception as e:  # status must answer even when ZooKeeper is slow
            log.info("status_zk_fields_unavailable", table=str(t.name), error=f"{type(e).__name__}: {e}")
            return
        out[str(t.name)] = {k: summary[k] for k in ZK_FIELDS if k in summary}
        out[str(t.name)]["replicas"] = replicas

    await asyncio.gather(*(one(t) for t in catalog.tables()))
    return out


async def refresh_zk_fields(catalog: Catalog | None, timeout_s: float = ZK_FIELDS_TIMEOUT_S) -> None:
    """Have each table re-read the ZooKeeper fields of its ``status()`` unless they are recent (engines
    with a ``refresh_zk_summary()``): what a ``/metrics`` scrape reads, read when it is asked for."""
    if catalog is None:
        return

    async def one(t: TableService) -> None:
        fn = getattr(t, "refresh_zk_summary", None)
        if fn is None:
            return
        try:
            await asyncio.wait_for(fn(), timeout_s)
        except Exception as e:  # a scrape must answer even when ZooKeeper is slow: the older values stay
            log.info("metrics_zk_fields_unavailable", table=str(t.name), error=f"{type(e).__name__}: {e}")

    await asyncio.gather(*(one(t) for t in catalog.tables()))


def build_status(*, replica: str, state: str, started_at: float, version: str,
                 catalog: Catalog | None, supervisor: Supervisor | None,
                 zk_fields: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "replica": replica,
        "state": state,
        "uptime_s": round(time.monotonic() - started_at, 3),
        "version": version,
        "zookeeper": {"state": "unknown"},
        "tables": {},
        "tasks": [],
    }
    if catalog is not None:
        try:
            out["zookeeper"] = jsonable(catalog.keeper_status())
        except Exception as e:
            out["zookeeper"] = {"state": "unknown", "error": str(e)}
        for t in sorted(catalog.tables(), key=lambda t: t.name):
            try:
                out["tables"][str(t.name)] = table_status(t, (zk_fields or {}).get(str(t.name)))
            except Exception as e:  # one broken table must not hide the others
                log.warning("status_failed", table=str(t.name), error=str(e))
                out["tables"][str(t.name)] = {"error": f"{type(e).__name__}: {e}"}
    if supervisor is not None:
        out["tasks"] = [h.to_dict() for h in supervisor.health().values()]
    return out


def table_rows(table: TableService, what: str) -> list[dict[str, Any]]:
    """The rows as the engine gives them (cheap: call on the event loop), with database/table added."""
    getters: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "parts": table.parts, "queue": table.queue, "mutations": table.mutations}
    rows = []
    for r in getters[what]():
        row = {"database": table.name.database, "table": table.name.table}
        row.update(r)
        if what == "parts":
            row.setdefault("engine", "ReplicatedMergeTree")
        rows.append(row)
    return jsonable(rows)  # type: ignore[no-any-return]


def add_part_sizes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill the ``system.parts`` size columns the engine does not give (``marks``, ``data_compressed_bytes``,
    ``data_uncompressed_bytes``, ``marks_bytes``, ``primary_key_bytes_in_memory``) from each part's
    ``checksums.txt``.  Blocking file reads: run it in a worker thread.  A part removed meanwhile keeps
    its row without them."""
    for row in rows:
        path = row.get("path")
        if not path or all(k in row for k in _SIZE_FIELDS):
            continue
        try:
            sums = Checksums.parse((Path(path) / "checksums.txt").read_bytes())
        except Exception as e:  # outdated part removed meanwhile, unreadable or corrupt checksums.txt
            log.debug("part_sizes_unavailable", part=row.get("name"), error=str(e))
            continue
        for k, v in part_sizes(sums).items():
            row.setdefault(k, v)
    return rows


_SIZE_FIELDS = ("marks", "data_compressed_bytes", "data_uncompressed_bytes", "marks_bytes",
                "primary_key_bytes_in_memory")


def part_sizes(sums: Checksums) -> dict[str, int]:
    files = sums.files
    bins = [c for n, c in files.items() if n.endswith(".bin")]
    marks = {n: c for n, c in files.items() if n.endswith((".mrk", ".mrk2", ".cmrk", ".cmrk2"))}
    n_marks = 0
    if marks:  # every column has one mark per granule: any marks file gives the count
        name, c = min(marks.items())
        size = c.uncompressed_size if name.endswith((".cmrk", ".cmrk2")) else c.file_size
        n_marks = size // (24 if name.endswith("mrk2") else 16)
    primary = files.get("primary.idx")
    return {
        "marks": n_marks,
        "data_compressed_bytes": sum(c.file_size for c in bins),
        "data_uncompressed_bytes": sum(c.uncompressed_size if c.is_compressed else c.file_size for c in bins),
        "marks_bytes": sum(c.file_size for c in marks.values()),
        "primary_key_bytes_in_memory": primary.file_size if primary is not None else 0,
    }


def replicas_problems(catalog: Catalog | None, max_delay_s: float = MAX_REPLICA_DELAY_S) -> list[str]:
    """Why ``/replicas_status`` should answer 503 (empty list = Ok)."""
    if catalog is None:
        return ["replica is starting"]
    problems = []
    for t in sorted(catalog.tables(), key=lambda t: t.name):
        try:
            s = t.status()
        except Exception as e:
            problems.append(f"{t.name}:\tstatus unavailable: {e}")
            continue
        delay = s.get("absolute_delay") or 0
        if t.is_readonly or s.get("is_readonly"):
            problems.append(f"{t.name}:\tis read-only.")
        elif delay >= max_delay_s:
            problems.append(f"{t.name}:\tAbsolute delay: {delay}. Relative delay: "
                            f"{s.get('relative_delay', delay)}.")
    return problems


# ---- `replicad status` ----------------------------------------------------------------------------------


def fetch_status(url: str, timeout_s: float = 5.0,
                 headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """GET ``<url>/status`` (blocking; for the CLI)."""
    req = urllib.request.Request(url.rstrip("/") + "/status", headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        data = json.loads(resp.read().decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("unexpected /status answer")
    return data


def _age(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "never"
    return f"{max(0.0, time.time() - ts):.1f}s ago"


def render_text(status: dict[str, Any]) -> str:
    """Human-readable ``/status``."""
    lines = [
        f"replica   {status.get('replica')}  ({status.get('state')}, up {status.get('uptime_s')}s, "
        f"version {status.get('version')})",
    ]
    zk = status.get("zookeeper") or {}
    extra = ", ".join(f"{k}={v}" for k, v in zk.items() if k != "state")
    lines.append(f"zookeeper {zk.get('state')}" + (f"  ({extra})" if extra else ""))
    tables = status.get("tables") or {}
    lines.append("")
    lines.append(f"tables ({len(tables)})")
    for name, t in tables.items():
        if "error" in t and len(t) == 1:
            lines.append(f"  {name}: ERROR {t['error']}")
            continue
        flags = [f for f in ("is_leader", "is_readonly", "is_session_expired") if t.get(f)]
        lines.append(f"  {name}  [{' '.join(flags) or 'follower'}]")
        lines.append(
            f"    parts {t.get('active_parts', '?')}  queue {t.get('queue_size', '?')} "
            f"(inserts {t.get('inserts_in_queue', '?')}, merges {t.get('merges_in_queue', '?')})  "
            f"log {t.get('log_pointer', '?')}/{t.get('log_max_index', '?')}  "
            f"delay {t.get('absolute_delay', '?')}s  replicas {t.get('active_replicas', '?')}/"
            f"{t.get('total_replicas', '?')} active")
        lines += _cluster_lines(t.get("replicas") or [])
    tasks = status.get("tasks") or []
    lines.append("")
    lines.append(f"tasks ({len(tasks)})")
    for h in tasks:
        outcome = (h.get("last_outcome") or {}).get("name", "-")
        line = (f"  {h.get('name'):<32} {h.get('state'):<9} runs {h.get('runs', 0):<7} "
                f"restarts {h.get('restarts', 0):<3} last {outcome} ({_age(h.get('last_run'))})")
        if h.get("last_error"):
            line += f"\n    last error: {h['last_error']} ({_age(h.get('last_error_time'))})"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _cluster_lines(replicas: list[dict[str, Any]]) -> list[str]:
    """The replicas of one table as a small table (``patronictl list`` style)."""
    if not replicas:
        return []
    head = ("replica", "kind", "active", "leader", "log_pointer", "queue", "delay", "")
    rows = [(str(r.get("name")), str(r.get("kind", "?")), "yes" if r.get("active") else "NO",
             "*" if r.get("is_leader") else "", str(r.get("log_pointer", "?")), str(r.get("queue_size", "?")),
             f"{r.get('delay', 0)}s", "LOST" if r.get("is_lost") else "") for r in replicas]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    return ["    " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [head, *rows]]


def health_problems(status: dict[str, Any], max_delay_s: float = MAX_REPLICA_DELAY_S) -> list[str]:
    """Why ``replicad status --check`` fails (empty: healthy): not running, ZooKeeper not connected, a table
    read-only, its session expired, lost, broken or lagging, a background task crashed and backing off."""
    problems = []
    if status.get("state") != "running":
        problems.append(f"daemon is {status.get('state')}")
    zk = (status.get("zookeeper") or {}).get("state")
    if zk != "connected":
        problems.append(f"ZooKeeper session is {zk}")
    for name, t in (status.get("tables") or {}).items():
        if "error" in t:
            problems.append(f"{name}: {t['error']}")
            continue
        for flag in ("is_readonly", "is_session_expired"):
            if t.get(flag):
                problems.append(f"{name}: {flag}")
        if (t.get("absolute_delay") or 0) >= max_delay_s:
            problems.append(f"{name}: absolute delay {t.get('absolute_delay')}s")
        me = [r for r in t.get("replicas") or [] if r.get("name") == t.get("replica_name")]
        if me and me[0].get("is_lost"):
            problems.append(f"{name}: this replica is marked lost")
    for h in status.get("tasks") or []:
        if h.get("state") == "backoff":
            problems.append(f"task {h.get('name')} crashed: {h.get('last_error')}")
    return problems


def status_command(url: str, timeout_s: float = 5.0, *, check: bool = False,
                   headers: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(exit code, text) for ``replicad status``; with ``check`` the exit code is 3 when unhealthy."""
    try:
        data = fetch_status(url, timeout_s, headers)
    except urllib.error.HTTPError as e:
        return 1, f"replicad status: {url}: HTTP {e.code} {e.reason}\n"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return 2, f"replicad status: cannot reach {url}: {reason}\n"
    text = render_text(data)
    if not check:
        return 0, text
    problems = health_problems(data)
    if problems:
        return 3, text + "\nUNHEALTHY\n" + "".join(f"  - {p}\n" for p in problems)
    return 0, text + "\nhealthy\n"
