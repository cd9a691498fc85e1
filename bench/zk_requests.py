"""ZooKeeper requests per insert, from ZooKeeper's own per-connection counters (``cons``: ``recved``).

Each server's connections are found by their client ports (the server process's TCP sockets to the
ZooKeeper port, from /proc), so the count is exactly what that process sent: requests, multi
transactions (one packet each, as ZooKeeper counts them) and pings.  A batch of inserts is measured
on the inserting replica (A) and on the whole replica set (A + B: B's log pulling, fetch and commit
included), and divided by the number of inserts.  The batch is the replication-lag batch of
bench/lag.py (sequential inserts of small blocks, background merges included for both systems).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.cluster import BenchCluster, ReplicaPair
from bench.report import Figure


@dataclass
class ZkMeter:
    """Packets ZooKeeper received from each replica of ``pair`` over a ``with`` block."""

    cluster: BenchCluster
    pair: ReplicaPair
    start: dict[str, int] = field(default_factory=dict)
    delta: dict[str, int] = field(default_factory=dict)

    def __enter__(self) -> ZkMeter:
        self.start = self.cluster.zk_packets(self.pair.replicas)
        return self

    def __exit__(self, *exc: object) -> None:
        end = self.cluster.zk_packets(self.pair.replicas)
        self.delta = {k: end[k] - self.start.get(k, 0) for k in end}

    @property
    def a(self) -> int:
        return self.delta[f"{self.pair.system}-{self.pair.a.name}"]

    @property
    def b(self) -> int:
        return self.delta[f"{self.pair.system}-{self.pair.b.name}"]


@dataclass
class ZkResult:
    inserts: int
    a: int
    b: int

    @property
    def per_insert_a(self) -> float:
        return self.a / self.inserts

    @property
    def per_insert_total(self) -> float:
        return (self.a + self.b) / self.inserts


def figures(results: dict[str, list[ZkResult]], rows: int) -> list[Figure]:
    rd, ch = results.get("replicad", []), results.get("clickhouse", [])
    return [
        Figure("zk_per_insert_a", f"ZooKeeper requests per {rows}-row insert, inserting replica", "requests",
               [r.per_insert_a for r in rd], [r.per_insert_a for r in ch], higher_is_better=False, target=1.0,
               decimals=1,
               note="ZooKeeper's `cons` recved counter of the inserting server's session over the lag batch, "
                    "divided by the inserts (pings and background merges of that batch included)"),
        Figure("zk_per_insert_total", f"ZooKeeper requests per {rows}-row insert, both replicas", "requests",
               [r.per_insert_total for r in rd], [r.per_insert_total for r in ch], higher_is_better=False,
               target=1.0, decimals=1,
               note="A + B: includes the second replica pulling the log, fetching and committing each part"),
    ]
