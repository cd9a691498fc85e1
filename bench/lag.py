"""Replication lag: a batch of small sequential inserts into replica A; for each, the time from A's
acknowledgement to the rows being counted on replica B (``SELECT count()`` polled every few ms over a
keep-alive connection).  p50/p99 per batch; the ZooKeeper traffic of the batch is measured at the same
time (bench/zk_requests.py).  The two systems' batches alternate.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench import Context
from bench.cluster import BenchCluster, ReplicaPair, cpu_seconds, make_events, to_tsv_fast
from bench.profiling import PySpy
from bench.report import Figure
from bench.zk_requests import ZkMeter, ZkResult
from bench.zk_requests import figures as zk_figures

TABLE = "bench.lag"
POLL_S = 0.003
STAGES = {
    "send_commit": "A: request sent → part committed in ZooKeeper (`part_committed`)",
    "commit_ack": "A: part committed → HTTP acknowledgement received",
    "commit_fetch": "B: A's commit → B starts fetching (`fetching_part`: log watch, pull, queue)",
    "fetch": "B: fetching → fetched and committed (`fetched_part`)",
    "visible": "B: fetched → rows counted by the polling client",
}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def batch(pair: ReplicaPair, bodies: list[bytes], rows: int,
          wall: list[tuple[float, float, float]] | None = None) -> tuple[list[float], list[float]]:
    """(ack seconds, lag seconds) of each insert; ``wall`` receives (sent, acknowledged, visible on B) in
    wall-clock seconds, to line up with the daemons' logs."""
    expected = pair.b.count(TABLE)
    acks, lags = [], []
    for body in bodies:
        t_send = time.time()
        acks.append(pair.a.insert(f"INSERT INTO {TABLE} FORMAT TSV", body))
        t_ack = time.perf_counter()
        t_ack_wall = time.time()
        expected += rows
        while pair.b.count(TABLE) < expected:
            if time.perf_counter() - t_ack > 120:
                raise TimeoutError(f"{pair.system}: rows not on {pair.b.name} 120 s after the insert")
            time.sleep(POLL_S)
        lags.append(time.perf_counter() - t_ack)
        if wall is not None:
            wall.append((t_send, t_ack_wall, time.time()))
    return acks, lags


def _log_events(path: Path, names: set[str]) -> list[tuple[float, str, dict[str, object]]]:
    """(unix time, event, record) of the daemon log's JSON lines whose event is in ``names``."""
    out = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{") or not any(f'"event":"{n}"' in line for n in names):
                continue
            with contextlib.suppress(ValueError, KeyError):
                rec = json.loads(line)
                t = dt.datetime.fromisoformat(str(rec["ts"]).replace("Z", "+00:00")).timestamp()
                out.append((t, str(rec["event"]), rec))
    return out


#: replicad's insert_stages (replicad/stage_times.py) in path order: (stage, what, ZooKeeper round trips)
INSERT_STAGES = (
    ("http_in", "client sends → handler starts (HTTP, aiohttp, middlewares)", 0),
    ("route", "query text → route (settings, table lookup)", 0),
    ("parse_start", "small body read whole, parsed to storage Arrow (on the loop up to 16 KiB of text, else "
                    "one worker-thread trip)", 0),
    ("parse_rows", "first block handed to the table", 0),
    ("prepare", "block: defaults, column order, types (worker thread, one trip with the next two)", 0),
    ("split", "split by partition", 0),
    ("seal", "sort, serialize, compress: the .bin checksums, hence the block id, known; the block-number "
             "lock started from the worker thread (replication/early_lock.py)", 0),
    ("zk_lock_multi", "ZooKeeper: dedup probe + block number (one multi), while the files are written", 1),
    ("files", "the part's files written (no fsync, as 18.16), while the lock is taken", 0),
    ("write_part", "lock in hand (waited for, if the files came first), tmp_insert_ renamed to the part's "
                   "name in the same worker trip", 0),
    ("block_id", "back on the loop; block id checked", 0),
    ("commit_ops", "log entry and commit ops built", 0),
    ("rename", "the commit's own rename trip, when the worker thread could not rename", 0),
    ("zk_commit_multi", "ZooKeeper: commit multi (log, part, blocks, unlock)", 1),
    ("activate", "part active (its `part_committed` line written once the answer is)", 0),
    ("parse_end", "no more blocks", 0),
    ("parse_close", "parser closed", 0),
    ("respond", "metrics, insert_done log, JSON answer built", 0),
    ("finish", "middleware (metrics, stage log)", 0),
    ("http_out", "handler returns → client has the answer (aiohttp write, client read)", 0),
)


def zk_rtt(cluster: BenchCluster, n: int = 200) -> tuple[float, float]:
    """p50 seconds of a kazoo ``exists`` (a read) and a ``create`` + ``delete`` multi (a write, as the
    commit) of the bench process against the benchmark's ZooKeeper: the unit of the small insert's floor."""
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=cluster.zk.hosts)
    zk.start(15)
    try:
        reads, writes = [], []
        for i in range(n):
            t0 = time.perf_counter()
            zk.exists("/")
            reads.append(time.perf_counter() - t0)
            tx = zk.transaction()
            tx.create(f"/bench_rtt_{i}", b"x")
            tx.delete(f"/bench_rtt_{i}")
            t0 = time.perf_counter()
            tx.commit()
            writes.append(time.perf_counter() - t0)
    finally:
        zk.stop()
        zk.close()
    return statistics.median(reads), statistics.median(writes)


def stage_table(cluster: BenchCluster, wall: list[tuple[float, float, float]], acks: list[float],
                ch_ack_s: float, rtt: tuple[float, float]) -> str:
    """Per-stage µs of replicad's small inserts (daemon A's ``insert_stages`` lines of the last lag batch)
    against the floor: the ZooKeeper round trips the insert needs."""
    a_log = cluster.daemons[0].log_path
    if a_log is None or not wall:
        return ""
    lines = [r for _t, _e, r in _log_events(a_log, {"insert_stages"})]
    stages: dict[str, list[float]] = {k: [] for k, _w, _n in INSERT_STAGES}
    zk_requests: list[int] = []
    for (sent, acked, _visible), ack_s in zip(wall, acks, strict=True):
        mine = [r for r in lines if sent <= float(str(r.get("wall0"))) <= acked]
        if len(mine) != 1:
            continue
        rec = mine[0]
        raw_us: Any = rec.get("us") or {}
        us = {str(k): float(v) for k, v in raw_us.items()}
        handler_us = sum(us.values())
        us["http_in"] = 1e6 * (float(str(rec["wall0"])) - sent)
        us["http_out"] = max(0.0, 1e6 * ack_s - us["http_in"] - handler_us)
        for k in stages:
            stages[k].append(us.get(k, 0.0))
        raw_zk: Any = rec.get("zk") or {}
        zk_requests.append(sum(int(v) for v in raw_zk.values()))
    matched = len(zk_requests)
    if not matched:
        return ""
    read_s, write_s = rtt
    rows = []
    total = 0.0
    for key, what, trips in INSERT_STAGES:
        p50 = statistics.median(stages[key])
        total += p50
        floor = f"{1e6 * trips * write_s:.0f}" if trips else "0"
        rows.append(f"| {what} (`{key}`) | {p50:,.0f} | {percentile(stages[key], 90):,.0f} | "
                    f"{trips or ''} | {floor} |")
    trips_total = sum(t for _k, _w, t in INSERT_STAGES)
    head = (f"Over {matched} of {len(wall)} inserts of the last replicad lag batch: daemon A's "
            "`insert_stages` log lines (`REPLICAD_INSERT_STAGES=1`, replicad/stage_times.py), each stage "
            "from the previous mark; `http_in` / `http_out` from the client's clock (same machine).  "
            "ZooKeeper round trip on this machine (bench process, kazoo, p50): "
            f"read {1e6 * read_s:.0f} µs, write multi {1e6 * write_s:.0f} µs.")
    ack_us = 1e6 * statistics.median(acks)
    tail = (f"ZooKeeper requests per insert (replicad, counted by its client): "
            f"{statistics.median(zk_requests):.0f}, all in the {trips_total} round trips above.  ClickHouse "
            "18.16 (StorageReplicatedMergeTree::allocateBlockNumber, AbandonableLockInZooKeeper, "
            "ReplicatedMergeTreeBlockOutputStream::commitPart) needs 3 sequential round trips: the multi of "
            "the dedup probe and the `temp/abandonable_lock-` holder, the `block-` create naming the holder, "
            f"the commit multi (floor {3e6 * write_s:.0f} µs); its ack p50 in the same run: "
            f"{1e6 * ch_ack_s:,.0f} µs.")
    return "\n".join([
        head, "",
        "| stage | p50 µs | p90 µs | ZooKeeper round trips | floor µs |",
        "|:---|---:|---:|---:|---:|",
        *rows,
        f"| **sum of the stage medians** / replicad ack p50 | {total:,.0f} / {ack_us:,.0f} | | "
        f"{trips_total} | {1e6 * trips_total * write_s:.0f} |",
        "", tail,
    ])


def replicad_breakdown(cluster: BenchCluster, wall: list[tuple[float, float, float]]) -> str:
    """Where replicad's small-insert latency and replication lag go, from the daemons' own log lines
    (A: ``part_committed``; B: ``fetching_part`` / ``fetched_part``), matched to each insert."""
    a_log, b_log = cluster.daemons[0].log_path, cluster.daemons[1].log_path
    if a_log is None or b_log is None or not wall:
        return ""
    commits = [(t, str(r.get("part"))) for t, _, r in _log_events(a_log, {"part_committed"})]
    fetch_start: dict[str, float] = {}
    fetch_end: dict[str, float] = {}
    for t, ev, r in _log_events(b_log, {"fetching_part", "fetched_part"}):
        (fetch_start if ev == "fetching_part" else fetch_end).setdefault(str(r.get("part")), t)
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    for sent, acked, visible in wall:
        mine = [(t, p) for t, p in commits if sent <= t <= acked]
        if len(mine) != 1 or mine[0][1] not in fetch_start or mine[0][1] not in fetch_end:
            continue
        t_commit, part = mine[0]
        t_f0, t_f1 = fetch_start[part], fetch_end[part]
        for key, value in zip(STAGES, (t_commit - sent, acked - t_commit, t_f0 - t_commit, t_f1 - t_f0,
                                       visible - t_f1), strict=True):
            stages[key].append(1000 * value)
    matched = len(stages["send_commit"])
    if not matched:
        return ""
    rows = [f"| {STAGES[k]} | {statistics.median(v):.1f} | {percentile(v, 90):.1f} |"
            for k, v in stages.items()]
    return "\n".join([
        f"Over {matched} of {len(wall)} inserts of the last replicad lag batch, from the daemons' JSON logs "
        "(same machine clock as the client):", "",
        "| stage | p50 ms | p90 ms |", "|:---|---:|---:|", *rows])


def run(cluster: BenchCluster, ctx: Context) -> list[Figure]:
    rd, ch = cluster.replicad, cluster.clickhouse
    sizes = ctx.sizes
    for pair in (rd, ch):
        pair.create_table(TABLE)
        warm = [to_tsv_fast(make_events(sizes.lag_rows, seed=4000 + j)) for j in range(3)]
        batch(pair, warm, sizes.lag_rows)
    p50: dict[str, list[float]] = {"replicad": [], "clickhouse": []}
    p99: dict[str, list[float]] = {"replicad": [], "clickhouse": []}
    ack50: dict[str, list[float]] = {"replicad": [], "clickhouse": []}
    ack99: dict[str, list[float]] = {"replicad": [], "clickhouse": []}
    cpu: dict[str, list[float]] = {"replicad": [], "clickhouse": []}
    last_acks: list[float] = []
    zk: dict[str, list[ZkResult]] = {"replicad": [], "clickhouse": []}
    wall: list[tuple[float, float, float]] = []
    for i in range(sizes.runs):
        bodies = [to_tsv_fast(make_events(sizes.lag_rows, seed=10_000 * (i + 1) + j))
                  for j in range(sizes.lag_inserts)]
        for pair in ((rd, ch) if i % 2 == 0 else (ch, rd)):
            if pair.system == "replicad":
                wall = []
            cpu0 = cpu_seconds(pair.a.pid)
            with ZkMeter(cluster, pair) as meter:
                acks, lags = batch(pair, bodies, sizes.lag_rows, wall if pair.system == "replicad" else None)
            s = pair.system
            cpu[s].append(1000 * (cpu_seconds(pair.a.pid) - cpu0) / len(bodies))
            p50[s].append(1000 * statistics.median(lags))
            p99[s].append(1000 * percentile(lags, 99))
            ack50[s].append(1000 * statistics.median(acks))
            ack99[s].append(1000 * percentile(acks, 99))
            if s == "replicad":
                last_acks = acks
            zk[s].append(ZkResult(len(bodies), meter.a, meter.b))
            ctx.say(f"lag run {i + 1}: {s:<10} {len(bodies)} inserts: ack p50 {ack50[s][-1]:.1f} ms, "
                    f"p99 {ack99[s][-1]:.1f} ms, A's CPU {cpu[s][-1]:.1f} ms per insert, "
                    f"lag p50 {p50[s][-1]:.1f} ms, p99 {p99[s][-1]:.1f} ms; ZooKeeper packets A {meter.a}, "
                    f"B {meter.b}")
    what = f"{sizes.lag_inserts} inserts of {sizes.lag_rows} rows"
    figures = [
        Figure("lag_p50", f"Replication lag p50 ({what})", "ms", p50["replicad"], p50["clickhouse"],
               higher_is_better=False, target=1.0, decimals=1,
               note="from the insert's acknowledgement on A to count() on B showing the rows; B polled every "
                    f"{POLL_S * 1000:g} ms"),
        Figure("lag_p99", f"Replication lag p99 ({what})", "ms", p99["replicad"], p99["clickhouse"],
               higher_is_better=False, decimals=1),
        Figure("insert_ack_p50", f"Small insert latency p50 ({sizes.lag_rows} rows, until acknowledged)",
               "ms", ack50["replicad"], ack50["clickhouse"], higher_is_better=False, target=1.0, decimals=1),
        Figure("insert_ack_p99", f"Small insert latency p99 ({sizes.lag_rows} rows, until acknowledged)",
               "ms", ack99["replicad"], ack99["clickhouse"], higher_is_better=False, target=1.0, decimals=1),
        Figure("insert_cpu", f"Inserting server's CPU per small insert ({sizes.lag_rows} rows, lag batch)",
               "ms", cpu["replicad"], cpu["clickhouse"], higher_is_better=False, decimals=1,
               note="CPU time (user + system, all threads) of the inserting server over the lag batch, "
                    "divided by the inserts: the insert path plus what it sets off there (merges, "
                    "serving the fetch, its own log pull); less sensitive than the latencies to other "
                    "load on the machine"),
        *zk_figures(zk, sizes.lag_rows),
    ]
    rtt = zk_rtt(cluster)
    ctx.say(f"ZooKeeper round trip (kazoo, p50): read {1e6 * rtt[0]:.0f} µs, write multi "
            f"{1e6 * rtt[1]:.0f} µs")
    stages = stage_table(cluster, wall, last_acks, statistics.median(ack50["clickhouse"]) / 1000, rtt)
    if stages:
        ctx.say("replicad small insert, stage by stage:\n" + stages)
        ctx.sections.append(("replicad small insert: time per stage against the ZooKeeper floor", stages))
    breakdown = replicad_breakdown(cluster, wall)
    if breakdown:
        ctx.sections.append(("replicad small-insert latency and replication lag, stage by stage", breakdown))
    if ctx.profile and not sizes.quick and (figures[0].ratio or 0) > 1.0:
        profile_lag(cluster, ctx)
    return figures


def profile_lag(cluster: BenchCluster, ctx: Context) -> None:
    """py-spy on both daemons during an extra (uncounted) batch of small inserts."""
    rd = cluster.replicad
    bodies = [to_tsv_fast(make_events(ctx.sizes.lag_rows, seed=900_000 + j)) for j in range(100)]
    spy_a = PySpy(rd.a.pid, ctx.work_dir / "profiles" / "lag-a.txt")
    spy_b = PySpy(rd.b.pid, ctx.work_dir / "profiles" / "lag-b.txt")
    with spy_a, spy_b:
        _, lags = batch(rd, bodies, ctx.sizes.lag_rows)
    ctx.say(f"profiled replicad lag batch: p50 {1000 * statistics.median(lags):.1f} ms")
    ctx.sections.append(("Profile: replicad daemons during 100 small inserts (lag batch)",
                         spy_a.markdown("py-spy of daemon A (inserting)") + "\n\n"
                         + spy_b.markdown("py-spy of daemon B (replicating)")))
