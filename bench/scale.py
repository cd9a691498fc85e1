"""Scale curves: how each system's cost grows with the work (``python -m bench --only scale``).

Five curves, each measured for replicad and for ClickHouse 18.16 on one ZooKeeper server (each system in
its own chroot, one system at a time, so the two never compete for the cores):

- **tables**: idle CPU (both replicas' processes) and ZooKeeper requests/s with 1, 10, 100 and 500
  replicated tables on a 2-replica set, after the tables have settled;
- **replicas**: replication lag p50 with 2, 3 and 5 replicas: for each small insert, from its part's
  ``parts/<name>`` znode on the inserting replica to the same znode on the last replica (ZooKeeper's
  own clock on both ends, so no polling delay counts); with it the CPU time of the replicas' servers and
  the ZooKeeper requests they sent, per insert (the bench's ``count()`` polls included), figures the other
  engineers' load disturbs less than the lag;
- **clone**: seconds for a new replica to hold every row of a table of 1,000 and 10,000 parts (one part per
  partition, so nothing merges), from its CREATE TABLE;
- **drain**: log entries per second a replica works through after it was stopped while 1,000 and 10,000
  parts were inserted elsewhere (from the moment it answers again until it holds every row; start-up
  time is left out, it differs between the systems and is not the queue's);
- with each of clone and drain, the CPU time of both servers (the source serves the parts) per part or
  entry: a figure the other engineers' load on a shared machine disturbs less than the elapsed time;
- **clients**: insert throughput into one replica of a 2-replica set with 1, 4 and 16 concurrent
  clients (10,000-row TSV blocks, each a different one of 900 made in advance, handed out in turn: a real
  stream does not repeat its blocks, and repeated ones make a merged part compress n:1, so that both
  systems' size-based merge selection sees a part far smaller than its rows; ``insert_deduplicate=0`` for
  the rare block handed out again), and the
  CPU time of both servers per insert while the clients post (merges and the second replica's fetches
  included): on a shared machine the rate swings with the others' load, the CPU per insert much less.
  Each point has a table of its own, dropped after it.

``python -m bench --only scale --scale-curves clone,drain --scale-parts 1000,3000`` runs some curves at
other sizes (the default clone and drain sizes, 1,000 and 10,000, take about 15 minutes of the run).

Each curve gets a growth order (the log-log slope of cost against the work: flat, sub-linear, linear or
worse; for the clients curve the speed-up instead), a table and a plot (bench/scale_plot.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import shutil
import statistics
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kazoo.client import KazooClient

from bench import Context
from bench.cluster import (
    CLICKHOUSE_ZK_ROOT,
    EVENTS_COLUMNS,
    ZSTD_CONFIG,
    BenchHttpError,
    Replica,
    System,
    cpu_seconds,
    drop_table_sql,
    make_events,
    part_ctimes_ms,
    tcp_peer_ports,
    to_tsv_fast,
    with_month,
    zk_recved_by_port,
)
from bench.report import Figure
from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.daemon import Daemon, replica_config
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer

SYSTEMS: tuple[System, ...] = ("replicad", "clickhouse")
ZK_PREFIX = "/clickhouse/tables/01"
EVENTS_DDL = (", ".join(f"{n} {t}" for n, t in EVENTS_COLUMNS), "toYYYYMM(d)", "k")
PARTS_DDL = ("p UInt32, x UInt64", "p", "x")  # one partition per row value of p: parts that never merge


@dataclass(frozen=True)
class ScaleSizes:
    tables: tuple[int, ...] = (1, 10, 100, 500)
    replicas: tuple[int, ...] = (2, 3, 5)
    clone_parts: tuple[int, ...] = (1_000, 10_000)
    drain_entries: tuple[int, ...] = (1_000, 10_000)
    clients: tuple[int, ...] = (1, 4, 16)
    idle_window_s: float = 45.0  # longer than both systems' cleanup cadence (30-40 s)
    settle_s: float = 10.0
    lag_inserts: int = 40
    client_seconds: float = 10.0
    client_rows: int = 10_000
    #: distinct blocks made in advance for the clients curve (0.73 MB of TSV each, ~9 s to make): the fastest
    #: point takes ~860
    client_bodies: int = 900

    @classmethod
    def quick(cls) -> ScaleSizes:
        return cls(tables=(1, 5, 20), replicas=(2, 3), clone_parts=(100, 400), drain_entries=(100, 400),
                   clients=(1, 4), idle_window_s=10.0, settle_s=2.0, lag_inserts=8, client_seconds=3.0,
                   client_rows=2_000, client_bodies=40)


@dataclass
class Point:
    x: int
    value: float


@dataclass
class Curve:
    key: str
    title: str
    x_label: str
    unit: str
    higher_is_better: bool
    points: dict[str, list[Point]] = field(default_factory=dict)  # system → points

    def values(self, system: str) -> list[float]:
        return [p.value for p in self.points.get(system, [])]

    def xs(self) -> list[int]:
        return sorted({p.x for pts in self.points.values() for p in pts})


def growth(xs: Sequence[float], ys: Sequence[float], higher_is_better: bool = False) -> tuple[float, str]:
    """The log-log slope of ``ys`` against ``xs`` and its name: flat (< 0.2), sub-linear (< 0.8),
    linear (< 1.25) or worse than linear.  Values below 5 % of the largest are lifted to that floor (a
    reading of 0.0 % CPU is "too small to measure", not a thousandfold growth to the next point)."""
    floor = 0.05 * max((abs(y) for y in ys), default=1.0) or 1e-9
    pts = [(math.log(x), math.log(max(y, floor))) for x, y in zip(xs, ys, strict=True) if x > 0]
    if len(pts) < 2:
        return 0.0, "n/a"
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / var if var else 0.0
    name = ("flat" if slope < 0.2 else "sub-linear" if slope < 0.8 else "linear" if slope < 1.25
            else "worse than linear")
    if higher_is_better and slope <= -0.2:  # a rate that falls as the work grows
        name = "falling"
    return slope, name


# ---- a replica set of one system, of any size


class ScaleSet:
    """``n`` servers of one system on the shared ZooKeeper (replicad under ``/replicad``, ClickHouse under
    its bench root); tables are created on any subset of them."""

    def __init__(self, system: System, zk: ZooKeeperServer, work_dir: Path, n: int) -> None:
        self.system = system
        self.zk = zk
        self.work_dir = work_dir / system
        self.n = n
        self.servers: list[Daemon | ClickHouseServer] = []
        self.replicas: list[Replica] = []
        self.chroot = "/replicad" if system == "replicad" else CLICKHOUSE_ZK_ROOT

    def start(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True)
        for i in range(self.n):
            name = f"r{i}"
            if self.system == "replicad":
                api_port, inter_port = free_port(), free_port()
                cfg = replica_config(name, str(self.work_dir / name), f"{self.zk.hosts}{self.chroot}",
                                     api_port, inter_port, tables=())
                cfg["zookeeper"]["session_timeout_s"] = 30
                path = self.work_dir / f"{name}.yaml"
                path.write_text(yaml.safe_dump(cfg, sort_keys=False))
                d = Daemon(path, cwd=self.work_dir, log_path=self.work_dir / "logs" / f"{name}.log")
                d.start()
                self.servers.append(d)
                self.replicas.append(Replica("replicad", name, d, api_port))
            else:
                ch = ClickHouseServer(self.work_dir / name, replica=name, zookeeper=self.zk.hosts,
                                      zookeeper_root=self.chroot, extra_config=ZSTD_CONFIG)
                ch.start()
                self.servers.append(ch)
                self.replicas.append(Replica("clickhouse", name, ch, ch.http_port))
        for s in self.servers:
            if isinstance(s, Daemon):
                s.wait_ready()

    def stop(self) -> None:
        for i in range(len(self.servers)):
            with contextlib.suppress(Exception):
                self.stop_server(i)

    def stop_server(self, i: int) -> None:
        self.replicas[i].http.close()
        s = self.servers[i]
        if isinstance(s, Daemon):
            s.stop(timeout=30)
        else:
            s.stop()

    def start_server(self, i: int) -> None:
        s = self.servers[i]
        s.start()
        if isinstance(s, Daemon):
            s.wait_ready()

    def create(self, table: str, ddl: tuple[str, str, str], on: Sequence[int]) -> None:
        cols, partition_by, order_by = ddl
        zk_path = f"{ZK_PREFIX}/{table.replace('.', '_')}"
        sql = (f"CREATE TABLE IF NOT EXISTS {table} ({cols}) ENGINE = ReplicatedMergeTree('{zk_path}', "
               f"'{{replica}}') PARTITION BY {partition_by} ORDER BY {order_by}")
        for i in on:
            r = self.replicas[i]
            if self.system == "clickhouse":
                r.http.query(f"CREATE DATABASE IF NOT EXISTS {table.partition('.')[0]}")
            r.http.query(sql, timeout=120)

    def drop(self, table: str, on: Sequence[int]) -> None:
        for i in on:
            with contextlib.suppress(BenchHttpError, OSError):
                self.replicas[i].http.query(drop_table_sql(self.system, table), timeout=120)

    def table_zk_path(self, table: str) -> str:
        return f"{self.chroot}{ZK_PREFIX}/{table.replace('.', '_')}"

    def cpu(self, k: int | None = None) -> float:
        """CPU-seconds of the servers (the first ``k``)."""
        return sum(cpu_seconds(r.pid) for r in self.replicas[:k])

    def zk_requests(self, k: int | None = None) -> int:
        """Requests ZooKeeper received from the servers (the first ``k``)."""
        by_port = zk_recved_by_port(self.zk)
        return sum(by_port.get(p, 0) for r in self.replicas[:k] for p in tcp_peer_ports(r.pid, self.zk.port))


@contextlib.contextmanager
def scale_set(system: System, zk: ZooKeeperServer, work_dir: Path, n: int) -> Iterator[ScaleSet]:
    s = ScaleSet(system, zk, work_dir, n)
    try:
        s.start()
        yield s
    finally:
        s.stop()


def wait_count(r: Replica, table: str, expected: int, timeout: float, poll_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(BenchHttpError, OSError, ValueError):
            if r.count(table) >= expected:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{r.system} {r.name}: fewer than {expected} rows in {table} after {timeout}s")
        time.sleep(poll_s)


def partition_rows(first: int, n: int) -> bytes:
    """``n`` rows ``p = first..first+n-1`` (one partition, so one part, each)."""
    return "".join(f"{p}\t{p * 7}\n" for p in range(first, first + n)).encode()


def post(r: Replica, sql: str, body: bytes, timeout: float = 1200.0, **settings: object) -> None:
    """``sql`` with ``body`` and URL settings (both systems read settings from the URL)."""
    query = urllib.parse.urlencode({"query": sql, **{k: str(v) for k, v in settings.items()}})
    r.http.request("POST", "/?" + query, body, timeout)


def insert_parts(r: Replica, table: str, n: int, chunk: int = 1_000) -> None:
    """``n`` one-row parts, ``chunk`` partitions per INSERT."""
    limit = {"max_partitions_per_insert_block": 0} if r.system == "replicad" else {}  # 18.16: no limit
    for first in range(0, n, chunk):
        post(r, f"INSERT INTO {table} FORMAT TSV", partition_rows(first, min(chunk, n - first)), **limit)


# ---- the curves


def tables_curve(system: System, zk: ZooKeeperServer, ctx: Context, sz: ScaleSizes,
                 cpu: Curve, zkr: Curve) -> None:
    with scale_set(system, zk, ctx.work_dir / "scale-tables", 2) as s:
        made = 0
        for target in sz.tables:
            for t in range(made, target):
                s.create(f"scale.idle{t}", EVENTS_DDL, on=(0, 1))
            made = target
            time.sleep(sz.settle_s)
            c0, z0, t0 = s.cpu(), s.zk_requests(), time.monotonic()
            time.sleep(sz.idle_window_s)
            c1, z1, t1 = s.cpu(), s.zk_requests(), time.monotonic()
            cpu.points.setdefault(system, []).append(Point(target, 100 * (c1 - c0) / (t1 - t0)))
            zkr.points.setdefault(system, []).append(Point(target, (z1 - z0) / (t1 - t0)))
            ctx.say(f"scale tables: {system} {target} tables: idle CPU {cpu.points[system][-1].value:.1f} %, "
                    f"ZooKeeper {zkr.points[system][-1].value:.1f} requests/s")


def replicas_curve(system: System, zk: ZooKeeperServer, kz: KazooClient, ctx: Context, sz: ScaleSizes,
                   lag: Curve, cpu: Curve, zkr: Curve) -> None:
    with scale_set(system, zk, ctx.work_dir / "scale-replicas", max(sz.replicas)) as s:
        for k in sz.replicas:
            table = f"scale.lag{k}"
            s.create(table, EVENTS_DDL, on=range(k))
            expected = 0
            c0, z0 = s.cpu(k), s.zk_requests(k)
            for i in range(sz.lag_inserts):
                body = to_tsv_fast(with_month(make_events(100, seed=70_000 + 1000 * k + i), i))
                post(s.replicas[0], f"INSERT INTO {table} FORMAT TSV", body)
                expected += 100
                for r in s.replicas[1:k]:
                    wait_count(r, table, expected, timeout=120, poll_s=0.01)
            cpu_ms = 1000 * (s.cpu(k) - c0) / sz.lag_inserts
            requests = (s.zk_requests(k) - z0) / sz.lag_inserts
            cpu.points.setdefault(system, []).append(Point(k, cpu_ms))
            zkr.points.setdefault(system, []).append(Point(k, requests))
            path = s.table_zk_path(table)
            origin = part_ctimes_ms(kz, path, "r0")
            others = [part_ctimes_ms(kz, path, f"r{j}") for j in range(1, k)]
            lags = [max(o[p] for o in others) - t for p, t in origin.items() if all(p in o for o in others)]
            value = statistics.median(lags) if lags else float("nan")
            lag.points.setdefault(system, []).append(Point(k, value))
            ctx.say(f"scale replicas: {system} {k} replicas: lag p50 {value:.0f} ms over {len(lags)} parts, "
                    f"{cpu_ms:.1f} CPU-ms, {requests:.1f} ZooKeeper requests of the {k} servers per insert")


def clone_curve(system: System, zk: ZooKeeperServer, ctx: Context, sz: ScaleSizes, clone: Curve,
                cpu: Curve) -> None:
    with scale_set(system, zk, ctx.work_dir / "scale-clone", 2) as s:
        for n in sz.clone_parts:
            table = f"scale.clone{n}"
            s.create(table, PARTS_DDL, on=(0,))
            insert_parts(s.replicas[0], table, n)
            t0, c0 = time.monotonic(), s.cpu()
            s.create(table, PARTS_DDL, on=(1,))
            wait_count(s.replicas[1], table, n, timeout=1800)
            seconds, cpu_s = time.monotonic() - t0, s.cpu() - c0
            clone.points.setdefault(system, []).append(Point(n, seconds))
            cpu.points.setdefault(system, []).append(Point(n, 1000 * cpu_s / n))
            ctx.say(f"scale clone: {system} {n} parts: new replica complete in {seconds:.1f} s, "
                    f"{cpu_s:.1f} CPU-s of both servers")


def drain_curve(system: System, zk: ZooKeeperServer, ctx: Context, sz: ScaleSizes, drain: Curve,
                cpu: Curve) -> None:
    with scale_set(system, zk, ctx.work_dir / "scale-drain", 2) as s:
        for n in sz.drain_entries:
            table = f"scale.drain{n}"
            s.create(table, PARTS_DDL, on=(0, 1))
            s.stop_server(1)
            insert_parts(s.replicas[0], table, n)
            s.start_server(1)
            r = s.replicas[1]
            src0, dst0 = cpu_seconds(s.replicas[0].pid), cpu_seconds(r.pid)
            t0, c0, done0 = time.monotonic(), s.cpu(), r.count(table)  # from readiness: start-ups differ
            wait_count(r, table, n, timeout=1800)
            seconds, cpu_s = time.monotonic() - t0, s.cpu() - c0
            src_s, dst_s = cpu_seconds(s.replicas[0].pid) - src0, cpu_seconds(r.pid) - dst0
            rate = (n - done0) / seconds
            drain.points.setdefault(system, []).append(Point(n, rate))
            cpu.points.setdefault(system, []).append(Point(n, 1000 * cpu_s / max(1, n - done0)))
            ctx.say(f"scale drain: {system} {n} log entries: {n - done0} drained in {seconds:.1f} s after "
                    f"the replica answered ({rate:.0f} entries/s), {cpu_s:.1f} CPU-s of both servers "
                    f"(source {src_s:.2f}, draining replica {dst_s:.2f})")


class BodyDeck:
    """Distinct insert bodies handed out in turn to any number of client threads (``itertools.count`` is
    atomic under the GIL); past the last one the deck starts again and says so."""

    def __init__(self, bodies: Sequence[bytes]) -> None:
        self.bodies = bodies
        self._next = itertools.count()
        self.taken = 0

    def take(self) -> bytes:
        i = next(self._next)
        self.taken = max(self.taken, i + 1)
        return self.bodies[i % len(self.bodies)]

    @property
    def wrapped(self) -> bool:
        return self.taken > len(self.bodies)


@functools.cache
def client_bodies(n: int, rows: int) -> tuple[bytes, ...]:
    """``n`` different blocks of ``rows`` events (one generated table cut in slices): the same for both
    systems."""
    table = make_events(n * rows, seed=90_000)
    return tuple(to_tsv_fast(table.slice(i * rows, rows)) for i in range(n))


def clients_curve(system: System, zk: ZooKeeperServer, ctx: Context, sz: ScaleSizes, clients: Curve,
                  cpu: Curve) -> None:
    bodies = client_bodies(sz.client_bodies, sz.client_rows)
    with scale_set(system, zk, ctx.work_dir / "scale-clients", 2) as s:
        port = s.replicas[0].http.port
        for c in sz.clients:
            # a fresh table per point: no earlier point's parts to merge again, so a point does not depend on
            # the ones before it; the table is dropped after it, ending its merges and fetches
            table = f"scale.clients{c}"
            s.create(table, EVENTS_DDL, on=(0, 1))
            rows = [0] * c
            errors: list[str] = []
            deck = BodyDeck(bodies)  # each point (and system) starts from the first block
            stop_at = time.monotonic() + sz.client_seconds

            def client(j: int, stop_at: float = stop_at, rows: list[int] = rows,
                       errors: list[str] = errors, table: str = table, deck: BodyDeck = deck) -> None:
                me = Replica(system, f"client{j}", s.servers[0], port)
                try:
                    while time.monotonic() < stop_at:
                        post(me, f"INSERT INTO {table} FORMAT TSV", deck.take(), insert_deduplicate=0)
                        rows[j] += sz.client_rows
                except (BenchHttpError, OSError) as e:
                    errors.append(str(e)[:200])
                finally:
                    me.http.close()

            t0, c0 = time.monotonic(), s.cpu()
            threads = [threading.Thread(target=client, args=(j,)) for j in range(c)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rate = sum(rows) / (time.monotonic() - t0)
            inserts = max(1, sum(rows) // sz.client_rows)
            cpu_ms = 1000 * (s.cpu() - c0) / inserts  # the merges and the second replica's fetches included
            if deck.wrapped:
                ctx.notes.append(f"scale clients: {system} with {c} clients took {deck.taken} blocks of "
                                 f"{len(bodies)} distinct ones: some were inserted twice")
            if errors:
                ctx.notes.append(f"scale clients: {system} with {c} clients: {len(errors)} failed inserts, "
                                 f"first: {errors[0]}")
            clients.points.setdefault(system, []).append(Point(c, rate))
            cpu.points.setdefault(system, []).append(Point(c, cpu_ms))
            ctx.say(f"scale clients: {system} {c} clients: {rate / 1e3:.0f} k rows/s, {cpu_ms:.1f} CPU-ms of "
                    "both servers per insert")
            s.drop(table, on=(0, 1))


CURVES = ("tables", "replicas", "clone", "drain", "clients")


def run(ctx: Context, quick: bool, plot_path: Path | None, sizes: ScaleSizes | None = None,
        only: Sequence[str] = CURVES, systems: Sequence[System] = SYSTEMS) -> list[Figure]:
    """The curves named in ``only`` (of :data:`CURVES`) for ``systems``, both by default."""
    from bench import scale_plot

    sz = sizes or (ScaleSizes.quick() if quick else ScaleSizes())
    curves = {
        "idle_cpu": Curve("idle_cpu", "Idle CPU (2 replicas' processes)", "replicated tables", "% of a core",
                          higher_is_better=False),
        "idle_zk": Curve("idle_zk", "Idle ZooKeeper requests/s (2 replicas)", "replicated tables",
                         "requests/s", higher_is_better=False),
        "lag": Curve("lag", "Replication lag p50 (until on the last replica)", "replicas", "ms",
                     higher_is_better=False),
        "lag_cpu": Curve("lag_cpu", "Replication: CPU of the servers per small insert", "replicas", "ms",
                         higher_is_better=False),
        "lag_zk": Curve("lag_zk", "Replication: ZooKeeper requests per small insert", "replicas", "requests",
                        higher_is_better=False),
        "clone": Curve("clone", "New replica: time to hold every part", "parts", "s", higher_is_better=False),
        "clone_cpu": Curve("clone_cpu", "New replica: CPU of both servers per part", "parts", "ms",
                           higher_is_better=False),
        "drain": Curve("drain", "Queue drain rate after a backlog", "log entries", "entries/s",
                       higher_is_better=True),
        "drain_cpu": Curve("drain_cpu", "Queue drain: CPU of both servers per entry", "log entries", "ms",
                           higher_is_better=False),
        "clients": Curve("clients", "Insert throughput (10k-row blocks)", "concurrent clients", "rows/s",
                         higher_is_better=True),
        "clients_cpu": Curve("clients_cpu", "Inserts: CPU of both servers per 10k-row insert",
                             "concurrent clients", "ms", higher_is_better=False),
    }
    zk = ZooKeeperServer(ctx.work_dir / "scale-zookeeper", heap_mb=1024)
    zk.start()
    kz = KazooClient(hosts=zk.hosts)
    kz.start(30)
    try:
        for system in systems:
            ctx.say(f"scale curves: {system}")
            if "tables" in only:
                tables_curve(system, zk, ctx, sz, curves["idle_cpu"], curves["idle_zk"])
            if "replicas" in only:
                replicas_curve(system, zk, kz, ctx, sz, curves["lag"], curves["lag_cpu"], curves["lag_zk"])
            if "clone" in only:
                clone_curve(system, zk, ctx, sz, curves["clone"], curves["clone_cpu"])
            if "drain" in only:
                drain_curve(system, zk, ctx, sz, curves["drain"], curves["drain_cpu"])
            if "clients" in only:
                clients_curve(system, zk, ctx, sz, curves["clients"], curves["clients_cpu"])
    finally:
        with contextlib.suppress(Exception):
            kz.stop()
            kz.close()
        zk.stop()
    measured = [c for c in curves.values() if c.points]  # a run of some curves (--scale-curves) plots those
    ctx.sections.append(("Scale curves", scale_plot.markdown(measured, plot_path)))
    if plot_path is not None and measured:
        scale_plot.plot(measured, plot_path)
    return figures(measured)


def figures(curves: Sequence[Curve]) -> list[Figure]:
    """The largest point of each curve as a figure of the main table, judged by growth order."""
    out = []
    for c in curves:
        ours, theirs = c.values("replicad"), c.values("clickhouse")
        if not ours or not theirs:
            continue
        xs = c.xs()
        s_ours, g_ours = growth(xs[:len(ours)], ours, c.higher_is_better)
        s_theirs, g_theirs = growth(xs[:len(theirs)], theirs, c.higher_is_better)
        if c.key == "clients":
            status = f"speed-up {ours[-1] / ours[0]:.1f}× vs {theirs[-1] / theirs[0]:.1f}×"
        else:
            faster = (s_ours - s_theirs) > 0.15 if not c.higher_is_better else (s_theirs - s_ours) > 0.15
            status = f"{g_ours} (slope {s_ours:.2f}) vs {g_theirs} ({s_theirs:.2f})" + \
                     (" — grows faster" if faster else "")
        out.append(Figure(f"scale_{c.key}", f"Scale: {c.title} at {xs[len(ours) - 1]:,} {c.x_label}", c.unit,
                          [ours[-1]], [theirs[-1]], higher_is_better=c.higher_is_better, status=status,
                          decimals=1))
    return out
