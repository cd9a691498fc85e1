"""``make chaos SEED=… RUNS=…``: the planted-bug proofs, then RUNS random schedules, then RELIABILITY.md.

    python -m tests.chaos --seed 1 --runs 5 [--faults 4] [--out RELIABILITY.md] [--no-plants] [--keep]
                          [--mixed M] [--s3 K] [--schedule kill_all,wipe_local,…]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos import clock, linkfaults, report, s3_runs, scenarios
from tests.chaos.ensemble import Ensemble
from tests.chaos.netns import Network
from tests.chaos.rig import netns_support


def say(text: str) -> None:
    print(f"[chaos] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--faults", type=int, default=4, help="nemeses per run")
    ap.add_argument("--out", type=Path, default=Path("RELIABILITY.md"))
    ap.add_argument("--no-plants", action="store_true", help="skip the planted-bug proofs")
    ap.add_argument("--keep", action="store_true", help="keep the data directories")
    ap.add_argument("--loopback", action="store_true", help="no network namespaces even where possible")
    ap.add_argument("--mixed", type=int, default=0,
                    help="extra runs (after RUNS) with a ClickHouse 18.16 member, on loopback")
    ap.add_argument("--tmpfs-mb", type=int, default=96, help="replica data on tmpfs of this size (0: no)")
    ap.add_argument("--s3", type=int, default=0,
                    help="extra runs (seeds after the mixed ones) with the table on an S3 disk (zero-copy)")
    ap.add_argument("--schedule", default="",
                    help="comma-separated nemeses for every run instead of the seed's draw (to replay a "
                         "failing run's schedule: the seed still drives the timing and the workload)")
    args = ap.parse_args(argv)
    schedule = [n.strip() for n in args.schedule.split(",") if n.strip()] or None
    unknown = [n for n in schedule or () if n not in scenarios.ALL_NEMESES]
    if unknown:
        ap.error(f"unknown nemeses {unknown}; known: {', '.join(sorted(scenarios.ALL_NEMESES))}")
    # SIGTERM (make interrupted, a timeout) leaves through the clean-up: namespaces, bridge, mounts, processes
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

    base = Path(tempfile.mkdtemp(prefix="replicad-chaos-"))
    net: Network | None = None
    reason = None if args.loopback else netns_support()
    if args.loopback:
        reason = "--loopback given"
    if reason is None:
        net = Network(["zk1", "zk2", "zk3", *scenarios.NAMES, *(["s3"] if args.s3 else [])])
        try:
            net.setup()
        except RuntimeError as e:
            net, reason = None, str(e)
    if net is not None:
        mode = (f"network namespaces (10.{net.octet}.0.0/23, one per ZooKeeper node and replica); "
                f"{linkfaults.describe_support()}, tbf for slow links; {clock.describe_support()}")
        ensemble = Ensemble(base / "zookeeper", hosts=[net.ip(f"zk{i}") for i in (1, 2, 3)],
                            prefixes=[net.prefix(f"zk{i}") for i in (1, 2, 3)])
    else:
        mode = f"loopback only, process and disk faults ({reason}); {clock.describe_support()}"
        ensemble = Ensemble(base / "zookeeper")
    say(mode)
    plants: list[scenarios.RunResult] = []
    runs: list[scenarios.RunResult] = []
    try:
        ensemble.start()
        if not args.no_plants:
            for name, scenario in scenarios.PLANTS.items():
                r = scenario(base / f"plant-{name}", ensemble, True)
                say(f"plant {name}: violations {sorted(r.verdict.kinds()) or 'NONE (not caught!)'}")
                plants.append(r)
            if args.s3:
                plants.append(s3_runs.plant(base, ensemble, say))
        if args.s3:  # first: an interrupted session (SIGTERM) still reports them
            runs += s3_runs.runs(base, ensemble, range(args.seed + args.runs + args.mixed,
                                                       args.seed + args.runs + args.mixed + args.s3),
                                 args.faults, net, args.tmpfs_mb, say, schedule)
        for seed in range(args.seed, args.seed + args.runs):
            t0 = time.monotonic()
            r = scenarios.random_run(base / f"seed-{seed}", ensemble, seed, args.faults, net=net,
                                     tmpfs_mb=args.tmpfs_mb, schedule=schedule)
            say(f"seed {seed}: {', '.join(e.nemesis for e in r.events)}; {r.acked_rows} acked rows, "
                f"{r.indeterminate} indeterminate, recovery {r.verdict.recovery_s} s, "
                f"{len(r.verdict.violations)} violations ({time.monotonic() - t0:.0f} s)")
            for k, d in r.verdict.violations:
                say(f"  {k}: {d}")
            runs.append(r)
        ensemble.stop()
        if net is not None:
            net.teardown()
            net = None
        if args.mixed:
            ensemble = Ensemble(base / "zookeeper-mixed")
            ensemble.start()
            first = args.seed + args.runs
            for seed in range(first, first + args.mixed):
                r = scenarios.random_run(base / f"mixed-{seed}", ensemble, seed, args.faults, clickhouse=True,
                                         schedule=schedule)
                faults = ", ".join(e.nemesis for e in r.events)
                say(f"seed {seed} (mixed): {faults}; {r.acked_rows} acked rows, "
                    f"recovery {r.verdict.recovery_s} s, {len(r.verdict.violations)} violations")
                for k, d in r.verdict.violations:
                    say(f"  {k}: {d}")
                runs.append(r)
    finally:
        ensemble.stop()
        if net is not None:
            net.teardown()
        command = f"make chaos SEED={args.seed} RUNS={args.runs} MIXED={args.mixed}"
        command += f" S3={args.s3}" if args.s3 else ""
        command += f" SCHEDULE={','.join(schedule)}" if schedule else ""
        report.write(args.out, report.render(runs, plants, seed=args.seed, faults=args.faults, mode=mode,
                                             command=command))
        say(f"wrote {args.out}")
        if args.keep:
            say(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    missed = [p.name for p in plants if not (p.verdict.kinds() & scenarios.PLANT_EXPECTS[p.name.split()[1]])]
    failing = [r.seed for r in runs if r.verdict.violations]
    if missed:
        say(f"planted bugs NOT caught: {missed}")
    if failing:
        say(f"failing seeds: {failing}")
    return 1 if missed or failing else 0


if __name__ == "__main__":
    sys.exit(main())
