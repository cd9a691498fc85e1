"""``python -m bench`` (``make bench``): replicad against ClickHouse 18.16 on this machine.

    python -m bench                  # everything, 3 runs per figure; writes BENCHMARKS.md
    python -m bench --quick          # small sizes, 1 run: a smoke check (writes nothing unless --output)
    python -m bench --only insert,lag --runs 5 --output /tmp/b.md

Benchmarks (in this order): insert, schemas (insert across table shapes), formats (every input format
both systems read), lag (with ZooKeeper requests
per insert), fetch — on one cluster of ZooKeeper + 2 replicad daemons + 2 ClickHouse servers
(bench/cluster.py) — then part_writer and merge (bench/part_writer.py, bench/merge.py: the storage engine
alone, in child processes), zero_copy, and scale (bench/scale.py: how cost grows with tables, replicas,
parts, backlog and clients; a table and BENCHMARKS-scale.png beside the report).  Scratch data
lives in ./bench-data (removed at the end unless --keep), on a fresh journaled ext4 loop-mounted there for
the run where this process may mount one (bench/scratch_fs.py, --scratch-fs).  Where replicad misses a
target, an extra uncounted run is profiled with py-spy and the top functions go into the report
(--no-profile: skip).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import Context, Sizes, page_cache, scratch_fs
from bench.report import Figure, Report

REPO = Path(__file__).resolve().parent.parent
CLUSTER_BENCHES = ("insert", "schemas", "formats", "lag", "fetch", "spark")
STORAGE_BENCHES = ("part_writer", "merge", "zero_copy")
ALL = CLUSTER_BENCHES + STORAGE_BENCHES + ("scale",)
MERGE_TARGET = 0.5


def run_cluster_benches(names: Sequence[str], ctx: Context) -> list[Figure]:
    from bench import fetch, formats, insert, lag, schemas, spark_write
    from bench.cluster import BenchCluster

    modules: dict[str, Callable[..., list[Figure]]] = {"insert": insert.run, "schemas": schemas.run,
                                                      "formats": formats.run,
                                                      "lag": lag.run, "fetch": fetch.run,
                                                      "spark": spark_write.run}
    figures: list[Figure] = []
    ctx.say("starting ZooKeeper, 2 replicad daemons, 2 ClickHouse 18.16 servers")
    with BenchCluster(ctx.work_dir / "cluster") as cluster:
        ctx.clickhouse_version = cluster.clickhouse_version
        ctx.say(f"cluster up: ZooKeeper {cluster.zk.hosts}; replicad API "
                f"{cluster.replicad.a.http.port}/{cluster.replicad.b.http.port}; ClickHouse HTTP "
                f"{cluster.clickhouse.a.http.port}/{cluster.clickhouse.b.http.port}")
        for name in names:
            t0 = time.monotonic()
            figures += modules[name](cluster, ctx)
            ctx.say(f"{name} done in {time.monotonic() - t0:.0f}s")
    return figures


def run_part_writer(ctx: Context) -> list[Figure]:
    from bench import part_writer

    sizes = ctx.sizes
    argv = ["--rows", str(sizes.part_writer_rows), "--repeat", str(sizes.runs)]
    args = part_writer.parser().parse_args(argv)
    m = part_writer.measure(args)
    ours, theirs = m["replicad"], m["clickhouse"]
    rows = sizes.part_writer_rows
    mb = statistics.median(r["uncompressed"] for r in ours) / 1e6
    ctx.say(f"part writer: replicad {[round(r['seconds'], 2) for r in ours]} s, ClickHouse "
            f"{[round(s, 2) for s, _ in theirs]} s")
    return [
        Figure("part_writer_rows", f"Part writer: {rows / 1e6:g} M rows → one part", "rows/s",
               [rows / r["seconds"] for r in ours], [rows / s for s, _ in theirs],
               note="replicad: PartWriter from a memory-mapped Arrow file (sort + write + fsync) in a child "
                    "process; ClickHouse: the same rows as TSV over HTTP into a plain MergeTree (parsing "
                    "included, no fsync) — bench/part_writer.py"),
        Figure("part_writer_mb", f"Part writer ({mb:.0f} MB uncompressed column data)", "MB/s",
               [r["uncompressed"] / 1e6 / r["seconds"] for r in ours], [mb / s for s, _ in theirs],
               decimals=1),
        Figure("part_writer_cpu", "Part writer CPU time (process / server)", "s",
               [r["cpu_seconds"] for r in ours], [c for _, c in theirs], higher_is_better=False, decimals=2),
        Figure("part_writer_rss", "Part writer peak RSS (writer process)", "MiB",
               [r["peak_rss_kb"] / 1024 for r in ours], [], higher_is_better=False),
    ]


def run_merge(ctx: Context) -> list[Figure]:
    from bench import merge

    sizes = ctx.sizes
    args = merge.parser().parse_args(["--parts", str(sizes.merge_parts), "--rows", str(sizes.merge_rows)])
    runs = []
    for i in range(sizes.runs):
        m = merge.measure(args)
        runs.append(m)
        ctx.say(f"merge run {i + 1}: {m['mb']:.0f} MB input: replicad {m['replicad']['seconds']:.2f}s, "
                f"ClickHouse OPTIMIZE FINAL {m['clickhouse_seconds']:.2f}s, byte-identical {m['identical']}")
    mb = runs[0]["mb"]
    identical = all(m["identical"] for m in runs)
    ours = statistics.median(m["mb"] / m["replicad"]["seconds"] for m in runs)
    theirs = statistics.median(m["mb"] / m["clickhouse_seconds"] for m in runs)
    if ctx.profile and ours < MERGE_TARGET * theirs:
        profile_merge(ctx, args)
    if not identical:
        ctx.notes.append("merge: replicad's merged part differed from 18.16's: "
                         + "; ".join(str(m["differ"]) for m in runs if not m["identical"]))
    return [
        Figure("merge_mb", f"Merge {sizes.merge_parts} parts × {sizes.merge_rows / 1e3:g} k rows "
               f"({mb:.0f} MB input)", "MB/s",
               [m["mb"] / m["replicad"]["seconds"] for m in runs],
               [m["mb"] / m["clickhouse_seconds"] for m in runs], target=MERGE_TARGET, decimals=1,
               note="MB/s of uncompressed input; ClickHouse: OPTIMIZE FINAL of the same parts (lz4), "
                    "replicad: merge_parts of copies in a child process; merged parts byte-identical: "
                    f"{identical} — bench/merge.py"),
        Figure("merge_cpu", "Merge CPU time (process / server)", "s",
               [m["replicad"]["cpu_seconds"] for m in runs], [m["clickhouse_cpu_seconds"] for m in runs],
               higher_is_better=False, decimals=2),
        Figure("merge_rss", "Merge peak RSS (merging process / server)", "MiB",
               [m["replicad"]["peak_rss_kb"] / 1024 for m in runs],
               [m["clickhouse_peak_rss_kb"] / 1024 for m in runs], higher_is_better=False),
    ]


class LoadSampler:
    """The machine's 1-minute load average every 5 s while the suite runs (other work skews wall times)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(float(Path("/proc/loadavg").read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                return
            if self._stop.wait(5.0):
                return

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        if not self.samples:
            return ""
        return (f"machine load (1-min load average, sampled every 5 s) during the suite: min "
                f"{min(self.samples):.1f}, median {statistics.median(self.samples):.1f}, max "
                f"{max(self.samples):.1f} on {os.cpu_count()} cores — wall-clock figures suffer from other "
                "work on the machine; the CPU-second figures much less")


def profile_merge(ctx: Context, args: argparse.Namespace) -> None:
    """bench/merge.py once more, under py-spy (its merge child process included)."""
    from bench import merge
    from bench.profiling import PySpy

    argv = [sys.executable, merge.__file__, "--parts", str(args.parts), "--rows", str(args.rows)]
    spy = PySpy.record_command(argv, ctx.work_dir / "profiles" / "merge.txt", only_process="--child")
    ctx.say("profiled bench/merge.py")
    title = "py-spy of bench/merge.py's merge child process (uncounted run)"
    section = f"Profile: replicad merge of {args.parts} parts × {args.rows} rows"
    ctx.sections.append((section, spy.markdown(title)))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench",
                                description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--quick", action="store_true", help="small sizes, 1 run (smoke check)")
    p.add_argument("--runs", type=int, default=None, help="runs per figure and side (default 3; quick 1)")
    p.add_argument("--only", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    p.add_argument("--output", type=Path, default=None,
                   help="markdown report (default BENCHMARKS.md for a full run of everything)")
    p.add_argument("--work-dir", type=Path, default=REPO / "bench-data", help="scratch directory")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--scratch-fs", choices=("auto", "image", "dir"), default="auto",
                   help="image: the scratch directory is a fresh journaled ext4 loop-mounted for the run "
                        "(needs root); dir: the directory as it is; auto (default): image where possible "
                        "(bench/scratch_fs.py)")
    p.add_argument("--no-profile", action="store_true", help="do not profile replicad's shortfalls")
    p.add_argument("--scale-curves", default="tables,replicas,clone,drain,clients",
                   help="with --only scale: the curves to run (comma-separated)")
    p.add_argument("--scale-parts", default=None,
                   help="with --only scale: the clone and drain sizes, e.g. 1000,3000 (default 1000,10000)")
    p.add_argument("--scale-tables", default=None,
                   help="with --only scale: the table counts of the idle curves (default 1,10,100,500)")
    return p.parse_args(argv)


#: options that name this machine's paths or keep its scratch: left out of the command a report records
_LOCAL_OPTIONS = {"--work-dir": 1, "--keep": 0}  # --scratch-fs is recorded: it shapes the figures


def interpreter_note() -> str:
    """Which CPython runs replicad (the daemons are started with this interpreter).  A build whose executable
    calls into a shared libpython (pyenv's default) runs the insert path's Python noticeably slower than one
    with the interpreter linked in (Debian's, the python Docker images')."""
    try:
        with open("/proc/self/maps") as maps:
            shared = any("libpython" in line for line in maps)
    except OSError:
        return f"replicad's interpreter: CPython {sys.version.split()[0]}"
    linked = "through a shared libpython" if shared else "with the interpreter linked into the executable"
    return f"replicad's interpreter: CPython {sys.version.split()[0]}, {linked}"


def recorded_command(args: Sequence[str]) -> str:
    """The command line a report shows: ``python -m bench`` and the options that shape the figures, without
    the machine-local ones (a scratch directory's path)."""
    out: list[str] = []
    skip = 0
    for a in args:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in _LOCAL_OPTIONS:
            skip = _LOCAL_OPTIONS[name] if "=" not in a else 0
            continue
        out.append(a)
    return " ".join(["python -m bench", *out])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(ALL)})", file=sys.stderr)
        return 2
    sizes = Sizes.quick_sizes() if args.quick else Sizes.full()
    if args.runs is not None:
        sizes = Sizes(**{**sizes.__dict__, "runs": max(1, args.runs)})
    output = args.output
    if output is None and not args.quick and set(names) == set(ALL):
        output = REPO / "BENCHMARKS.md"
    from replicad.devtools import clickhouse, zookeeper

    if not (clickhouse.available() and zookeeper.available()):
        print("ClickHouse 18.16 and ZooKeeper must be installed (make deps)", file=sys.stderr)
        return 1
    started = dt.datetime.now(dt.UTC)
    command = recorded_command(argv if argv is not None else sys.argv[1:])
    if command == "python -m bench":
        command = "make bench  (= .venv/bin/python -m bench)"
    work_dir = args.work_dir.absolute()
    shutil.rmtree(work_dir, ignore_errors=True)
    ctx = Context(sizes, work_dir, profile=not args.no_profile and not args.quick,
                  log=lambda s: print(s, flush=True))
    report = Report(command, started, runs=sizes.runs)
    scratch = contextlib.ExitStack()
    fs_text = scratch.enter_context(
        scratch_fs.journaled_scratch(work_dir, args.scratch_fs, ctx.say, args.keep))
    os.environ["TMPDIR"] = str(work_dir / "tmp")  # the storage benches' child processes write there
    (work_dir / "tmp").mkdir(exist_ok=True)
    tempfile.tempdir = None
    evicted_files, evicted_bytes = page_cache.evict(page_cache.program_files())
    cache_text = (f"both systems' program files ({evicted_files} shared libraries and binaries, "
                  f"{evicted_bytes / 2**20:,.0f} MiB) dropped from the page cache before the servers "
                  f"started, so that their RSS counts the pages they map as after a reboot, not the large "
                  f"folios a fresh install leaves cached (bench/page_cache.py)")
    ctx.say(cache_text)
    load = LoadSampler().__enter__()
    try:
        cluster_names = [n for n in CLUSTER_BENCHES if n in names]
        if cluster_names:
            report.add(run_cluster_benches(cluster_names, ctx))
        if "part_writer" in names:
            ctx.say("part writer (bench/part_writer.py)")
            report.add(run_part_writer(ctx))
        if "merge" in names:
            ctx.say("merge (bench/merge.py)")
            report.add(run_merge(ctx))
        if "zero_copy" in names:
            from bench import zero_copy

            ctx.say("S3 zero-copy fetch vs full fetch (bench/zero_copy.py)")
            report.add(zero_copy.run(ctx))
        if "scale" in names:
            from bench import scale

            ctx.say("scale curves (bench/scale.py)")
            plot = output.with_name("BENCHMARKS-scale.png") if output is not None else None
            curves = [c.strip() for c in args.scale_curves.split(",") if c.strip()]
            sz = scale.ScaleSizes.quick() if sizes.quick else scale.ScaleSizes()
            if args.scale_parts:
                parts = tuple(int(n) for n in args.scale_parts.split(","))
                sz = dataclasses.replace(sz, clone_parts=parts, drain_entries=parts)
            if args.scale_tables:
                sz = dataclasses.replace(sz, tables=tuple(int(n) for n in args.scale_tables.split(",")))
            report.add(scale.run(ctx, quick=sizes.quick, plot_path=plot, sizes=sz, only=curves))
    finally:
        load.__exit__()
        scratch.close()  # unmounted: the image's files go with it, unread
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    report.notes.append(f"scratch directory's file system (both systems' data, ZooKeeper's, the storage "
                        f"benches' temporary files): {fs_text}")
    report.notes.append(cache_text)
    report.notes.append(interpreter_note())
    report.seconds = time.monotonic() - ctx.t0
    report.notes += ctx.notes
    if ctx.clickhouse_version:
        report.clickhouse_version = ctx.clickhouse_version
    if load.summary():
        report.notes.append(load.summary())
    report.sections += ctx.sections
    print()
    print(report.text_table())
    for n in report.notes:
        print(f"note: {n}")
    if output is not None:
        report.write(output)
        print(f"\nwrote {output} ({report.seconds / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
