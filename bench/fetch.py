"""Fetch throughput: one big part (≥ 500 MB on disk: rows with ~1 kB incompressible strings) inserted
into replica A and fetched by replica B over DataPartsExchange.

Timed: from A's acknowledgement of the insert (the part is committed in ZooKeeper, so B may fetch it)
to the part being active on B (B's parts polled every 50 ms).  MB/s = the part's bytes on disk on B
over that time.  Memory: B's peak RSS and its growth during the fetch, against the growth for a 10×
smaller part fetched first by a freshly restarted B (flat = no growth with the part's size).  Every
run uses a month (partition) of its own; the table is dropped at the end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench import Context
from bench.cluster import (
    CPU_TICK,
    BenchCluster,
    PeakRss,
    ReplicaPair,
    cpu_seconds,
    make_events,
    to_tsv_fast,
    with_month,
)
from bench.profiling import PySpy
from bench.report import Figure

TABLE = "bench.big"
BYTES_PER_ROW_ON_DISK = 800  # ~1 kB of 6-bit text per row, zstd level 1: for the disk-space check


@dataclass(frozen=True)
class Sample:
    insert_s: float
    fetch_s: float  # A's commit of the part to B's commit of it (ZooKeeper ctimes)
    ack_s: float  # A's HTTP acknowledgement to the part active on B (polled)
    part_bytes: int
    body_bytes: int
    a_growth_mb: float
    b_peak_mb: float
    b_growth_mb: float
    cpu_s: float  # CPU time of both servers (sender + receiver) from the acknowledgement to the fetched part

    @property
    def fetch_mb_s(self) -> float:
        return self.part_bytes / 1e6 / self.fetch_s

    @property
    def insert_mb_s(self) -> float:
        return self.body_bytes / 1e6 / self.insert_s


def partition_id(month: int) -> str:
    return f"{2024 + month // 12}{month % 12 + 1:02d}"


def fetch_once(cluster: BenchCluster, pair: ReplicaPair, body: bytes, rows: int, month: int,
               timeout: float = 900.0) -> Sample:
    """Insert ``body`` (rows of one month) into A and wait for B to have the part(s).  The fetch time is
    taken from ZooKeeper: the creation of B's ``parts/<name>`` znode (B committed the fetched part) minus
    that of A's (A committed the insert, so B could start) — one clock, no polling delay, and no doubt
    about whether B started before A's HTTP acknowledgement."""
    pid = partition_id(month)
    with PeakRss(pair.a.pid) as rss_a, PeakRss(pair.b.pid) as rss_b:
        insert_s = pair.a.insert(f"INSERT INTO {TABLE} FORMAT TSV", body)
        t_ack = time.perf_counter()
        cpu0 = cpu_seconds(pair.a.pid) + cpu_seconds(pair.b.pid)
        while True:
            parts = [p for p in pair.b.parts(TABLE) if p.partition_id == pid]
            if sum(p.rows for p in parts) >= rows:
                break
            if time.perf_counter() - t_ack > timeout:
                raise TimeoutError(f"{pair.system}: partition {pid} not on {pair.b.name} after {timeout}s")
            time.sleep(0.05)
        ack_s = time.perf_counter() - t_ack
        cpu = max(cpu_seconds(pair.a.pid) + cpu_seconds(pair.b.pid) - cpu0, CPU_TICK)
    names = {p.name for p in parts}
    on_a = [t for n, t in cluster.part_ctimes_ms(pair, TABLE, pair.a).items() if n in names]
    on_b = [t for n, t in cluster.part_ctimes_ms(pair, TABLE, pair.b).items() if n in names]
    fetch_s = (max(on_b) - min(on_a)) / 1000 if on_a and len(on_b) == len(names) else ack_s
    return Sample(insert_s, max(fetch_s, 0.001), ack_s, sum(p.bytes_on_disk for p in parts), len(body),
                  rss_a.peak_mb - rss_a.before_mb, rss_b.peak_mb, rss_b.peak_mb - rss_b.before_mb, cpu)


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    rd, ch = cluster.replicad, cluster.clickhouse
    sizes = ctx.sizes
    rows = sizes.fetch_rows
    small_rows = max(1, rows // 10)
    needed_gb = (sizes.runs + 0.2) * 2 * 2 * rows * BYTES_PER_ROW_ON_DISK / 1e9 + 2
    free_gb = cluster.disk_free_gb()
    if free_gb < needed_gb:
        ctx.notes.append(f"fetch benchmark skipped: {free_gb:.1f} GB free, {needed_gb:.1f} GB needed")
        ctx.say(ctx.notes[-1])
        return []
    for pair in (rd, ch):
        pair.create_table(TABLE)
    base = make_events(rows, seed=7000, string_len=sizes.fetch_string_len)
    month = 0
    small: dict[str, Sample] = {}
    small_body = to_tsv_fast(with_month(base.slice(0, small_rows), month))
    for pair in (rd, ch):
        cluster.restart(pair.b, TABLE)
        pair.b.sync(TABLE)
        small[pair.system] = s = fetch_once(cluster, pair, small_body, small_rows, month)
        ctx.say(f"fetch (fresh B): {pair.system:<10} {s.part_bytes / 1e6:.0f} MB part in {s.fetch_s:.2f}s = "
                f"{s.fetch_mb_s:.0f} MB/s; B RSS +{s.b_growth_mb:.0f} MiB")
    del small_body
    res: dict[str, list[Sample]] = {"replicad": [], "clickhouse": []}
    body_mb = part_mb = 0.0
    for i in range(sizes.runs):
        month += 1
        body = to_tsv_fast(with_month(base, month))
        body_mb = len(body) / 1e6
        for pair in ((rd, ch) if i % 2 == 0 else (ch, rd)):
            s = fetch_once(cluster, pair, body, rows, month)
            res[pair.system].append(s)
            part_mb = s.part_bytes / 1e6
            ctx.say(f"fetch run {i + 1}: {pair.system:<10} {part_mb:.0f} MB part in {s.fetch_s:.2f}s "
                    f"(ack to visible {s.ack_s:.2f}s) = "
                    f"{s.fetch_mb_s:.0f} MB/s, CPU {s.cpu_s:.2f}s; B peak RSS {s.b_peak_mb:.0f} MiB "
                    f"(+{s.b_growth_mb:.0f}); "
                    f"insert of the {body_mb:.0f} MB body {s.insert_s:.2f}s, A RSS +{s.a_growth_mb:.0f} MiB")
        del body
    rd_s, ch_s = res["replicad"], res["clickhouse"]
    worst_growth = max((s.b_growth_mb for s in rd_s), default=0.0)
    small_growth = small["replicad"].b_growth_mb
    flat = "flat" if worst_growth <= 1.5 * small_growth + 32 else "grows with size"
    figures = [
        Figure("fetch_mb", f"Fetch of one {part_mb:.0f} MB part by the second replica", "MB/s",
               [s.fetch_mb_s for s in rd_s], [s.fetch_mb_s for s in ch_s], target=1.0, decimals=1,
               note="time from A committing the part to B committing its copy, both read from ZooKeeper "
                    "(ctime of replicas/<r>/parts/<part>); MB = bytes on disk"),
        Figure("fetch_cpu", f"Fetch of the {part_mb:.0f} MB part: MB per CPU-second (sender + receiver)",
               "MB/s",
               [s.part_bytes / 1e6 / s.cpu_s for s in rd_s], [s.part_bytes / 1e6 / s.cpu_s for s in ch_s],
               decimals=1),
        Figure("fetch_rss_peak", f"Fetching replica's peak RSS during the {part_mb:.0f} MB fetch", "MiB",
               [s.b_peak_mb for s in rd_s], [s.b_peak_mb for s in ch_s], higher_is_better=False),
        Figure("fetch_rss_growth_small",
               f"Fetching replica's RSS growth, {small['replicad'].part_bytes / 1e6:.0f} MB part "
               "(fresh process)",
               "MiB", [small["replicad"].b_growth_mb],
               [small["clickhouse"].b_growth_mb], higher_is_better=False),
        Figure("fetch_rss_growth", f"Fetching replica's RSS growth, {part_mb:.0f} MB part", "MiB",
               [s.b_growth_mb for s in rd_s], [s.b_growth_mb for s in ch_s], higher_is_better=False,
               status=flat, note="status: flat when replicad's largest growth stays within 1.5× its growth "
                                 "for the 10× smaller part + 32 MiB"),
        Figure("big_insert_mb", f"Insert of the {body_mb:.0f} MB TSV body ({rows / 1e3:.0f} k rows × ~1 kB)",
               "MB/s", [s.insert_mb_s for s in rd_s], [s.insert_mb_s for s in ch_s], decimals=1),
        Figure("big_insert_rss_growth", f"Inserting server's RSS growth, {body_mb:.0f} MB TSV insert", "MiB",
               [s.a_growth_mb for s in rd_s], [s.a_growth_mb for s in ch_s], higher_is_better=False,
               note="one block (< 1,048,576 rows): ClickHouse holds it whole too"),
    ]
    if ctx.profile and not sizes.quick and min(figures[0].ratio or 0, figures[1].ratio or 0) < 1.0:
        month += 1
        body = to_tsv_fast(with_month(base, month))
        spy = PySpy(rd.b.pid, ctx.work_dir / "profiles" / "fetch-b.txt")
        with spy:
            s = fetch_once(cluster, rd, body, rows, month)
        ctx.say(f"profiled replicad fetch: {s.part_bytes / 1e6:.0f} MB in {s.fetch_s:.2f}s")
        title = f"py-spy of daemon B (insert on A + fetch, {s.fetch_s:.2f} s fetch; profiled run not counted)"
        ctx.sections.append((f"Profile: replicad daemon B fetching a {s.part_bytes / 1e6:.0f} MB part",
                             spy.markdown(title)))
    for pair in (rd, ch):
        pair.drop_table(TABLE)
    return figures
