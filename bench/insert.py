"""Insert throughput over HTTP: N rows of the events table as one TSV body into replica A of each system,
and as one ArrowStream body into replicad (18.16 has no Arrow input; that row is compared with its TSV).

Timed: from sending the request to the acknowledgement (the part is written and committed in
ZooKeeper).  Between inserts the second replica is allowed to catch up (untimed), so runs do not
overlap.  Every insert goes to a month of its own: no merges between runs, no deduplicated blocks.

Memory: the server's peak RSS during the insert; and a flatness probe — the RSS growth of a freshly
restarted server inserting N/2 rows (one 1,048,576-row block at most) against N×2 rows (four blocks):
a server that streams the body block by block grows the same for both.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from bench import Context
from bench.cluster import (
    CPU_TICK,
    BenchCluster,
    BenchHttpError,
    PeakRss,
    ReplicaPair,
    cpu_seconds,
    make_events,
    to_arrow_stream,
    to_tsv_fast,
    with_month,
)
from bench.profiling import PySpy
from bench.report import Figure

TABLE = "bench.events"


@dataclass(frozen=True)
class Sample:
    seconds: float
    rows: int
    body_bytes: int
    peak_mb: float
    growth_mb: float
    cpu_s: float  # the inserting server's CPU time (all threads) during the insert

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.body_bytes / 1e6 / self.seconds


def insert_once(pair: ReplicaPair, fmt: str, body: bytes, rows: int, table: str = TABLE,
                retry_s: float = 0.0) -> Sample:
    """Insert ``body`` into ``pair.a``, then wait (untimed) until ``pair.b`` has the rows too.  With
    ``retry_s``, a refused insert (read-only after a restart) is retried for that long."""
    before = pair.b.count(table)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            cpu0 = cpu_seconds(pair.a.pid)
            with PeakRss(pair.a.pid) as rss:
                seconds = pair.a.insert(f"INSERT INTO {table} FORMAT {fmt}", body)
            cpu = max(cpu_seconds(pair.a.pid) - cpu0, CPU_TICK)  # at least one clock tick
            break
        except BenchHttpError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    pair.wait_rows(table, before + rows)
    return Sample(seconds, rows, len(body), rss.peak_mb, rss.peak_mb - rss.before_mb, cpu)


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    rd, ch = cluster.replicad, cluster.clickhouse
    n = ctx.sizes.insert_rows
    for pair in (rd, ch):
        pair.create_table(TABLE)
    month = itertools.count()
    warm = make_events(max(1, n // 10), seed=999)
    for pair in (rd, ch):  # first-insert costs (imports, caches, connections) are not what we measure
        insert_once(pair, "TSV", to_tsv_fast(with_month(warm, next(month))), warm.num_rows)
        if pair.system == "replicad":
            insert_once(pair, "ArrowStream", to_arrow_stream(with_month(warm, next(month))), warm.num_rows)
    res: dict[str, list[Sample]] = {"rd_tsv": [], "ch_tsv": [], "rd_arrow": []}
    tsv_mb = arrow_mb = 0.0
    for i in range(ctx.sizes.runs):
        base = make_events(n, seed=1000 + i)
        tsv = to_tsv_fast(with_month(base, next(month)))
        arrow = to_arrow_stream(with_month(base, next(month)))
        tsv_mb, arrow_mb = len(tsv) / 1e6, len(arrow) / 1e6
        steps = [("rd_tsv", rd, "TSV", tsv), ("ch_tsv", ch, "TSV", tsv),
                 ("rd_arrow", rd, "ArrowStream", arrow)]
        for key, pair, fmt, body in (steps if i % 2 == 0 else steps[::-1]):
            s = insert_once(pair, fmt, body, n)
            res[key].append(s)
            ctx.say(f"insert run {i + 1}: {pair.system:<10} {fmt:<11} {n:,} rows in {s.seconds:.2f}s = "
                    f"{s.rows_per_s:,.0f} rows/s, {s.mb_per_s:.1f} MB/s, server CPU {s.cpu_s:.2f}s; "
                    f"peak RSS {s.peak_mb:.0f} MiB (+{s.growth_mb:.0f})")
        del tsv, arrow, base
    rd_tsv, ch_tsv, rd_arrow = res["rd_tsv"], res["ch_tsv"], res["rd_arrow"]
    figures = [
        Figure("insert_tsv_rows", f"Insert {n / 1e6:g} M rows TSV over HTTP", "rows/s",
               [s.rows_per_s for s in rd_tsv], [s.rows_per_s for s in ch_tsv], target=1.0),
        Figure("insert_tsv_mb", f"Insert TSV ({tsv_mb:.0f} MB body)", "MB/s",
               [s.mb_per_s for s in rd_tsv], [s.mb_per_s for s in ch_tsv], decimals=1),
        Figure("insert_arrow_rows", f"Insert {n / 1e6:g} M rows ArrowStream (ClickHouse: TSV)", "rows/s",
               [s.rows_per_s for s in rd_arrow], [s.rows_per_s for s in ch_tsv],
               note="18.16 has no ArrowStream input; its column shows its TSV insert of the same rows"),
        Figure("insert_arrow_mb", f"Insert ArrowStream ({arrow_mb:.0f} MB body; ClickHouse: TSV)", "MB/s",
               [s.mb_per_s for s in rd_arrow], [s.mb_per_s for s in ch_tsv], decimals=1),
        Figure("insert_tsv_cpu", f"Insert {n / 1e6:g} M rows TSV: rows per server CPU-second", "rows/s",
               [s.rows / s.cpu_s for s in rd_tsv], [s.rows / s.cpu_s for s in ch_tsv],
               note="CPU time (user + system, all threads) of the inserting server process during the "
                    "insert: less sensitive than wall time to other load on the machine"),
        Figure("insert_arrow_cpu", f"Insert {n / 1e6:g} M rows ArrowStream: rows per server CPU-second "
               "(ClickHouse: TSV)", "rows/s", [s.rows / s.cpu_s for s in rd_arrow],
               [s.rows / s.cpu_s for s in ch_tsv]),
        Figure("insert_rss_peak", f"Server peak RSS during the {tsv_mb:.0f} MB TSV insert", "MiB",
               [s.peak_mb for s in rd_tsv], [s.peak_mb for s in ch_tsv], higher_is_better=False),
        Figure("insert_arrow_rss_peak", f"Server peak RSS during the {arrow_mb:.0f} MB ArrowStream insert",
               "MiB", [s.peak_mb for s in rd_arrow], [], higher_is_better=False),
    ]
    figures += flatness_probe(cluster, ctx, next(month))
    if ctx.profile and not ctx.sizes.quick:
        for f in figures:
            if f.key in ("insert_tsv_rows", "insert_arrow_rows") and (f.ratio or 0) < 1.0:
                profile_insert(cluster, ctx, "ArrowStream" if "arrow" in f.key else "TSV", next(month))
    return figures


def flatness_probe(cluster: BenchCluster, ctx: Context, month: int) -> list[Figure]:
    """RSS growth of a freshly restarted inserting server: N/2 rows against 2N rows (TSV)."""
    n = ctx.sizes.insert_rows
    sizes = (max(1, n // 2), 2 * n)
    growth: dict[tuple[str, int], float] = {}
    body_mb: dict[int, float] = {}
    for k, rows in enumerate(sizes):
        body = to_tsv_fast(make_events(rows, seed=2000 + k, month=month + k))
        body_mb[rows] = len(body) / 1e6
        for pair in (cluster.replicad, cluster.clickhouse):
            cluster.restart(pair.a, TABLE)
            s = insert_once(pair, "TSV", body, rows, retry_s=30)
            growth[(pair.system, rows)] = s.growth_mb
            ctx.say(f"insert flatness: fresh {pair.system:<10} {rows:,} rows ({body_mb[rows]:.0f} MB TSV) in "
                    f"{s.seconds:.2f}s: RSS +{s.growth_mb:.0f} MiB (peak {s.peak_mb:.0f})")
        del body
    small, big = sizes
    flat = growth[("replicad", big)] <= 1.5 * growth[("replicad", small)] + 32
    return [
        Figure("insert_rss_growth_small", f"RSS growth, fresh server, {small / 1e6:g} M-row "
               f"({body_mb[small]:.0f} MB) TSV insert", "MiB", [growth[("replicad", small)]],
               [growth[("clickhouse", small)]], higher_is_better=False),
        Figure("insert_rss_growth_big", f"RSS growth, fresh server, {big / 1e6:g} M-row "
               f"({body_mb[big]:.0f} MB) TSV insert", "MiB", [growth[("replicad", big)]],
               [growth[("clickhouse", big)]], higher_is_better=False,
               status="flat" if flat else "grows with size",
               note="one run each, on a restarted server; status: flat when replicad's growth for the 4× "
                    "larger insert stays within 1.5× its growth for the smaller one + 32 MiB"),
    ]


def profile_insert(cluster: BenchCluster, ctx: Context, fmt: str, month: int) -> None:
    """One extra (uncounted) insert into replicad A under py-spy; the top functions go to the report."""
    rd = cluster.replicad
    n = ctx.sizes.insert_rows
    base = make_events(n, seed=3000 + month, month=month)
    body = to_arrow_stream(base) if fmt == "ArrowStream" else to_tsv_fast(base)
    spy = PySpy(rd.a.pid, ctx.work_dir / "profiles" / f"insert-{fmt}.txt")
    before = rd.b.count(TABLE)
    with spy:
        seconds = rd.a.insert(f"INSERT INTO {TABLE} FORMAT {fmt}", body)
    rd.wait_rows(TABLE, before + n)
    ctx.say(f"profiled replicad {fmt} insert: {seconds:.2f}s")
    title = f"py-spy of daemon A ({seconds:.2f} s insert; profiled run not counted)"
    ctx.sections.append((f"Profile: replicad daemon during a {n / 1e6:g} M-row {fmt} insert",
                         spy.markdown(title)))
