"""Prometheus metrics: one registry per daemon, the metric names, and a scrape-time collector.

Two sets of names: ``replicad_*`` (per table, with labels) and ClickHouse's own
``ClickHouseProfileEvents_*`` / ``ClickHouseMetrics_*`` / ``ClickHouseAsyncMetrics_*``
(:mod:`replicad.server.clickhouse_metrics`), plus the process, platform and GC collectors of
prometheus_client.  HTTP requests are labelled by handler and by query kind (insert, select, or the
statement kind); ZooKeeper requests are timed per request kind.

Counters are updated where things happen (the API counts requests and inserts).  Replica state
(``system.replicas`` fields, part counts, task health, ZooKeeper session) is read at scrape time from the
catalog and the supervisor, so it is never stale and costs nothing between scrapes.  The engine may
register its own metrics in ``Metrics.registry`` (prefix ``replicad_``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from replicad.logging import get_logger
from replicad.server import clickhouse_metrics

if TYPE_CHECKING:
    from replicad.service import Catalog
    from replicad.tasks import Supervisor

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
log = get_logger(__name__)

# system.replicas fields exported as gauges: field -> (metric name, help)
REPLICA_GAUGES: dict[str, tuple[str, str]] = {
    "is_leader": ("replicad_replica_is_leader", "1 if this replica is a leader for the table"),
    "is_readonly": ("replicad_replica_is_readonly", "1 if the table is read-only (no ZooKeeper session)"),
    "is_session_expired": ("replicad_replica_is_session_expired", "1 if the ZooKeeper session expired"),
    "queue_size": ("replicad_replica_queue_size", "entries in replicas/<r>/queue"),
    "inserts_in_queue": ("replicad_replica_inserts_in_queue", "GET_PART entries in the queue"),
    "merges_in_queue": ("replicad_replica_merges_in_queue", "MERGE_PARTS entries in the queue"),
    "log_max_index": ("replicad_replica_log_max_index", "largest index in the shared log"),
    "log_pointer": ("replicad_replica_log_pointer", "next shared-log index this replica will pull"),
    "absolute_delay": ("replicad_replica_absolute_delay_seconds", "replication lag in seconds"),
    "total_replicas": ("replicad_replica_total_replicas", "replicas registered in ZooKeeper"),
    "active_replicas": ("replicad_replica_active_replicas", "replicas with an is_active node"),
    "active_parts": ("replicad_active_parts", "active data parts on this replica"),
}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.started_at = time.monotonic()
        for c in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(c)
        self.http_requests = Counter("replicad_http_requests", "HTTP API requests",
                                     ["handler", "query", "code"], registry=r)
        self.http_duration = Histogram("replicad_http_request_duration_seconds", "HTTP API request time",
                                       ["handler", "query"], registry=r,
                                       buckets=(0.005, 0.02, 0.1, 0.5, 1, 2.5, 10, 30, 120))
        self.zookeeper_duration = Histogram(
            "replicad_zookeeper_request_duration_seconds", "ZooKeeper request time (sent → answered)",
            ["request"], registry=r, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2, 10))
        self._zookeeper_by_kind: dict[str, Histogram] = {}
        self.loop_lag = Histogram("replicad_event_loop_lag_seconds",
                                  "how late the event loop woke a 50 ms sleep", registry=r,
                                  buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 1, 5))
        self.loop_stalls = Counter("replicad_event_loop_stalls", "event loop lags over 100 ms", registry=r)
        #: ClickHouse's ProfileEvents of the API (queries, inserted rows …)
        self.events = clickhouse_metrics.ApiEvents()
        self.inserted_rows = Counter("replicad_inserted_rows", "rows inserted through the API",
                                     ["table"], registry=r)
        self.inserted_bytes = Counter("replicad_inserted_bytes", "uncompressed bytes inserted",
                                      ["table"], registry=r)
        self.inserted_parts = Counter("replicad_inserted_parts", "parts created by inserts",
                                      ["table"], registry=r)
        self.deduplicated_blocks = Counter("replicad_insert_deduplicated_blocks",
                                           "insert blocks skipped as duplicates", ["table"], registry=r)
        self.insert_errors = Counter("replicad_insert_errors", "failed inserts by ClickHouse error code",
                                     ["table", "code"], registry=r)
        self.body_bytes = Counter("replicad_http_body_bytes", "request body bytes read", registry=r)
        self._state = _StateCollector()
        r.register(self._state)

    def bind(self, catalog: Callable[[], Catalog | None], supervisor: Supervisor | None) -> None:
        """Tell the scrape-time collector where replica state lives."""
        self._state.catalog = catalog
        self._state.supervisor = supervisor

    def observe_loop_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)
        if seconds > 0.1:
            self.loop_stalls.inc()

    def observe_zookeeper(self, request: str, seconds: float) -> None:
        # the child histogram of each kind is kept: ``labels()`` (a lock and a key built per call) cost
        # 7 % of a fetching replica's CPU, once per ZooKeeper answer
        child = self._zookeeper_by_kind.get(request)
        if child is None:
            child = self._zookeeper_by_kind[request] = self.zookeeper_duration.labels(request)
        child.observe(seconds)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry)) + clickhouse_metrics.render(
            self._state.table_statuses(), self.events, self.started_at).encode()


class _StateCollector(Collector):
    def __init__(self) -> None:
        self.catalog: Callable[[], Catalog | None] = lambda: None
        self.supervisor: Supervisor | None = None

    def describe(self) -> list[Metric]:
        return []  # dynamic: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        yield from self._replica_metrics()
        yield from self._task_metrics()

    def table_statuses(self) -> list[dict[str, Any]]:
        catalog = self.catalog()
        if catalog is None:
            return []
        out = []
        try:
            tables = catalog.tables()
        except Exception:
            return []
        for t in tables:
            try:
                out.append(dict(t.status()))
            except Exception:  # reported by the replicad_* collector
                continue
        return out

    def _replica_metrics(self) -> Iterator[Metric]:
        catalog = self.catalog()
        if catalog is None:
            return
        families = {f: GaugeMetricFamily(name, help_, labels=["table"])
                    for f, (name, help_) in REPLICA_GAUGES.items()}
        try:
            tables = catalog.tables()
        except Exception as e:  # a scrape must not fail because one source is broken
            log.warning("metrics_source_failed", source="catalog", error=str(e))
            tables = []
        for t in tables:
            try:
                status = t.status()
            except Exception as e:
                log.warning("metrics_source_failed", source=str(t.name), error=str(e))
                continue
            for f, fam in families.items():
                v = _number(status.get(f))
                if v is not None:
                    fam.add_metric([str(t.name)], v)
        yield from families.values()
        try:
            keeper = catalog.keeper_status()
        except Exception:
            keeper = {}
        g = GaugeMetricFamily("replicad_keeper_session_connected", "1 while the ZooKeeper session is usable")
        g.add_metric([], 1.0 if keeper.get("state") == "connected" else 0.0)
        yield g

    def _task_metrics(self) -> Iterator[Metric]:
        if self.supervisor is None:
            return
        restarts = CounterMetricFamily("replicad_task_restarts", "background task crashes (restarts)",
                                       labels=["task"])
        runs = CounterMetricFamily("replicad_task_runs", "background task run_once calls", labels=["task"])
        state = GaugeMetricFamily("replicad_task_state", "1 for the task's current state",
                                  labels=["task", "state"])
        for name, h in self.supervisor.health().items():
            restarts.add_metric([name], h.restarts)
            runs.add_metric([name], h.runs)
            state.add_metric([name, h.state.value], 1.0)
        yield restarts
        yield runs
        yield state


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    return None
