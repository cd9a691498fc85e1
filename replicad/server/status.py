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

import datetime as dt
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replicad.logging import get_logger

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
#: /replicas_status fails above this delay (ClickHouse's max_replica_delay_for_distributed_queries)
MAX_REPLICA_DELAY_S = 300


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


def table_status(table: TableService) -> dict[str, Any]:
    raw = dict(table.status())
    raw.setdefault("database", table.name.database)
    raw.setdefault("table", table.name.table)
    ordered = {k: raw.pop(k) for k in REPLICA_FIELDS if k in raw}
    ordered.update(raw)
    return jsonable(ordered)  # type: ignore[no-any-return]


def build_status(*, replica: str, state: str, started_at: float, version: str,
                 catalog: Catalog | None, supervisor: Supervisor | None) -> dict[str, Any]:
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
                out["tables"][str(t.name)] = table_status(t)
            except Exception as e:  # one broken table must not hide the others
                log.warning("status_failed", table=str(t.name), error=str(e))
                out["tables"][str(t.name)] = {"error": f"{type(e).__name__}: {e}"}
    if supervisor is not None:
        out["tasks"] = [h.to_dict() for h in supervisor.health().values()]
    return out


def table_rows(table: TableService, what: str) -> list[dict[str, Any]]:
    getters: dict[str, Callable[[], list[dict[str, Any]]]] = {
        "parts": table.parts, "queue": table.queue, "mutations": table.mutations}
    return jsonable(getters[what]())  # type: ignore[no-any-return]


def replicas_problems(catalog: Catalog | None) -> list[str]:
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
        elif delay >= MAX_REPLICA_DELAY_S:
            problems.append(f"{t.name}:\tAbsolute delay: {delay}. Relative delay: "
                            f"{s.get('relative_delay', delay)}.")
    return problems


# ---- `replicad status` ----------------------------------------------------------------------------------


def fetch_status(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """GET ``<url>/status`` (blocking; for the CLI)."""
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout_s) as resp:
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


def status_command(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(exit code, text) for ``replicad status``."""
    try:
        data = fetch_status(url, timeout_s)
    except urllib.error.HTTPError as e:
        return 1, f"replicad status: {url}: HTTP {e.code} {e.reason}\n"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return 2, f"replicad status: cannot reach {url}: {reason}\n"
    return 0, render_text(data)
