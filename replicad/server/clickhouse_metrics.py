"""The metrics ClickHouse exports, under ClickHouse's own names, so dashboards and alerts written for
ClickHouse's Prometheus endpoint work on a replicad node unchanged.

ClickHouse writes ``ClickHouseProfileEvents_<Event>`` (counters since start), ``ClickHouseMetrics_<Metric>``
(current values) and ``ClickHouseAsyncMetrics_<Metric>`` (periodically computed values), per server, without
labels.  Here they are computed at scrape time: the counters of the API (queries, inserted rows) and the
tables' ``/status`` fields (fetches, merges, checks, queue sizes, delays) summed or maxed over the tables.
Only events with a real counterpart are exported: a name that exists here means the same thing it means in
ClickHouse.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

PROFILE = "ClickHouseProfileEvents_"
CURRENT = "ClickHouseMetrics_"
ASYNC = "ClickHouseAsyncMetrics_"

#: ProfileEvents summed over the tables' status: event -> path of the field in a table's /status
TABLE_EVENTS: dict[str, tuple[str, ...]] = {
    "ReplicatedPartFetches": ("fetches_total",),
    "ReplicatedPartFailedFetches": ("failed_entries",),
    "ReplicatedPartMerges": ("merges_and_mutations", "merged_parts"),
    "ReplicatedPartMutations": ("merges_and_mutations", "mutated_parts"),
    "ReplicatedPartFetchesOfMerged": ("merges_and_mutations", "fetched_instead"),
    "ReplicatedPartChecks": ("part_check", "checked_total"),
    "ReplicatedPartChecksFailed": ("part_check", "broken_total"),
    "ReplicatedDataLoss": ("part_check", "lost_forever_total"),
}

#: ProfileEvents counted by the API (see :class:`ApiEvents`)
API_EVENTS = ("Query", "InsertQuery", "SelectQuery", "FailedQuery", "FailedInsertQuery", "FailedSelectQuery",
              "InsertedRows", "InsertedBytes", "DuplicatedInsertedBlocks")

#: AsynchronousMetrics over the tables: name -> (status field, "max" or "sum")
ASYNC_METRICS: dict[str, tuple[str, str]] = {
    "ReplicasMaxAbsoluteDelay": ("absolute_delay", "max"),
    "ReplicasMaxQueueSize": ("queue_size", "max"),
    "ReplicasSumQueueSize": ("queue_size", "sum"),
    "ReplicasMaxInsertsInQueue": ("inserts_in_queue", "max"),
    "ReplicasSumInsertsInQueue": ("inserts_in_queue", "sum"),
    "ReplicasMaxMergesInQueue": ("merges_in_queue", "max"),
    "ReplicasSumMergesInQueue": ("merges_in_queue", "sum"),
    "MaxPartCountForPartition": ("max_parts_in_partition", "max"),
}


class ApiEvents:
    """The API's ProfileEvents and the number of queries running (thread-safe counters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.running = 0

    def add(self, event: str, n: int = 1) -> None:
        with self._lock:
            self.counts[event] += n

    def query_started(self, kind: str) -> None:
        with self._lock:
            self.running += 1
            self.counts["Query"] += 1
            if kind in ("insert", "select"):
                self.counts[f"{kind.capitalize()}Query"] += 1

    def query_finished(self, kind: str, failed: bool) -> None:
        with self._lock:
            self.running -= 1
            if failed:
                self.counts["FailedQuery"] += 1
                if kind in ("insert", "select"):
                    self.counts[f"Failed{kind.capitalize()}Query"] += 1

    def snapshot(self) -> tuple[dict[str, int], int]:
        with self._lock:
            return dict(self.counts), self.running


def _field(status: Mapping[str, Any], path: tuple[str, ...]) -> float:
    value: Any = status
    for key in path:
        if not isinstance(value, Mapping):
            return 0.0
        value = value.get(key)
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else 0.0


def render(statuses: Iterable[Mapping[str, Any]], events: ApiEvents, started_at: float) -> str:
    """The ClickHouse-named metrics in Prometheus text format (appended to the registry's output)."""
    tables = list(statuses)
    counts, running = events.snapshot()
    lines: list[str] = []

    def out(prefix: str, name: str, kind: str, value: float) -> None:
        lines.append(f"# TYPE {prefix}{name} {kind}")
        lines.append(f"{prefix}{name} {value:g}")

    for name in API_EVENTS:
        out(PROFILE, name, "counter", counts.get(name, 0))
    for name, path in TABLE_EVENTS.items():
        out(PROFILE, name, "counter", sum(_field(t, path) for t in tables))
    out(CURRENT, "Query", "gauge", running)
    out(CURRENT, "ReadonlyReplica", "gauge", sum(_field(t, ("is_readonly",)) for t in tables))
    out(CURRENT, "LeaderReplica", "gauge", sum(_field(t, ("is_leader",)) for t in tables))
    for name, (field, how) in ASYNC_METRICS.items():
        values = [_field(t, (field,)) for t in tables]
        out(ASYNC, name, "gauge", (max(values, default=0.0) if how == "max" else sum(values)))
    out(ASYNC, "Uptime", "gauge", round(time.monotonic() - started_at, 3))
    return "\n".join(lines) + "\n"
