"""``make run``: a local 3-replica replicad cluster, fed 1 M demo events by Spark, checked to agree.

    python -m scripts.run_cluster [--rows 1000000] [--keep] [--reuse-data]

1. starts a ZooKeeper (replicad/devtools/zookeeper.py) with its data under ./run-data/zookeeper;
2. starts ``python -m replicad run --config …`` for each of config/cluster/r*.yaml (data under ./run-data/);
   if one of their ports is taken, configs with free ports are generated into ./run-data/config/ instead;
3. waits for ``/ping`` and for the demo table, then runs examples/spark_events.py against replica 1;
4. waits until every replica has caught up (``SYSTEM SYNC REPLICA`` and ``count()``), prints each replica's
   ``replicad status`` and the counts;
5. stops everything — at the end, on Ctrl-C or on SIGTERM.  ``--keep`` keeps the cluster serving until
   Ctrl-C.  ./run-data is wiped at start unless ``--reuse-data``.

The ``Daemon`` helper (start/wait/query/stop one ``replicad run`` process) lives in
``replicad/devtools/daemon.py``, shared with the benchmarks and the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

import yaml

from replicad.devtools.daemon import (
    DEMO_TABLE,
    REPO,
    Daemon,
    HttpError,
    daemon_env,
    replica_config,
    wait_in_sync,
)
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer

RUN_DATA = Path("run-data")
CLUSTER_CONFIGS = Path("config/cluster")


def say(text: str) -> None:
    print(f"[run_cluster] {text}", flush=True)


def print_statuses(daemons: Sequence[Daemon]) -> None:
    """Each replica's ``replicad status``."""
    for d in daemons:
        print(f"\n===== replicad status --url {d.url}  ({d.name}) =====", flush=True)
        print(d.status_text().rstrip(), flush=True)


# ---- configs ----------------------------------------------------------------------------------------------


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no conflict
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _zk_port(hosts: str) -> int:
    first = hosts.split("/", 1)[0].split(",")[0]
    return int(first.rsplit(":", 1)[1]) if ":" in first else 2181


def cluster_configs(root: Path) -> tuple[list[Path], int]:
    """The replica config files (relative to ``root``) and the ZooKeeper port they expect.

    The shipped config/cluster/r*.yaml when present and all their ports are free, else copies with free
    ports (or fresh demo configs) written to run-data/config/."""
    shipped = sorted((root / CLUSTER_CONFIGS).glob("r*.yaml"))
    docs = [yaml.safe_load(p.read_text()) for p in shipped]
    if docs:
        zk_port = _zk_port(str(docs[0]["zookeeper"]["hosts"]))
        ports = [zk_port] + [int(d[s]["port"]) for d in docs for s in ("api", "interserver")]
        if all(_bindable(p) for p in ports):
            return [p.relative_to(root) for p in shipped], zk_port
        say(f"ports of {CLUSTER_CONFIGS}/*.yaml are in use ({ports}): generating configs with free ports")
    zk_port = free_port()
    out_dir = root / RUN_DATA / "config"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for i, name in enumerate([str(d["replica"]) for d in docs] or ["r1", "r2", "r3"]):
        base = docs[i] if docs else replica_config(name, str(RUN_DATA / name), "", 0, 0)
        chroot = str(base["zookeeper"]["hosts"]).partition("/")[2] or "replicad"
        base["zookeeper"] = {**base["zookeeper"], "hosts": f"127.0.0.1:{zk_port}/{chroot}"}
        base["api"] = {**base["api"], "port": free_port()}
        base["interserver"] = {**base["interserver"], "port": free_port()}
        path = out_dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(base, sort_keys=False))
        paths.append(path.relative_to(root))
    return paths, zk_port


# ---- the demo ---------------------------------------------------------------------------------------------


class Stop(Exception):
    """SIGTERM/SIGHUP: leave through the clean-up path."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop(signal.Signals(signum).name)


@contextlib.contextmanager
def running_cluster(root: Path, reuse_data: bool) -> Iterator[tuple[ZooKeeperServer, list[Daemon]]]:
    if not reuse_data:
        for sub in ("zookeeper", "logs", "config", "r1", "r2", "r3"):
            shutil.rmtree(root / RUN_DATA / sub, ignore_errors=True)
    configs, zk_port = cluster_configs(root)
    daemons = [Daemon(p, cwd=root, log_path=root / RUN_DATA / "logs" / f"{p.stem}.log") for p in configs]
    if not reuse_data:
        for d in daemons:
            shutil.rmtree(d.data_path, ignore_errors=True)
    zk = ZooKeeperServer(root / RUN_DATA / "zookeeper", port=zk_port)
    try:
        say(f"starting ZooKeeper on 127.0.0.1:{zk_port} (data and log under {RUN_DATA}/zookeeper)")
        zk.start()
        for d in daemons:
            say(f"starting replica {d.name}: replicad run --config {d.config_path} "
                f"(API {d.url}, log {d.log_path})")
            d.start()
        yield zk, daemons
    finally:
        say("stopping the replicas and ZooKeeper")
        with ThreadPoolExecutor(max(1, len(daemons))) as pool:
            codes = list(pool.map(lambda d: (d.name, d.stop()), daemons))
        say("replica exit codes: " + ", ".join(f"{n}={c}" for n, c in codes))
        zk.stop()


def run_spark_demo(root: Path, url: str, table: str, rows: int, partitions: int, master: str) -> None:
    argv = [sys.executable, str(root / "examples" / "spark_events.py"), "--url", url, "--table", table,
            "--rows", str(rows), "--partitions", str(partitions), "--master", master]
    env = daemon_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    proc = subprocess.Popen(argv, cwd=root, env=env)
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()
    if code != 0:
        raise RuntimeError(f"the Spark job failed (exit code {code})")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run a local 3-replica replicad cluster and a Spark demo job.")
    p.add_argument("--rows", type=int, default=1_000_000, help="demo events to write (default 1,000,000)")
    p.add_argument("--partitions", type=int, default=4, help="Spark partitions of the demo job")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--table", default=DEMO_TABLE)
    p.add_argument("--keep", action="store_true",
                   help="keep the cluster running after the demo (until Ctrl-C)")
    p.add_argument("--reuse-data", action="store_true", help="keep ./run-data from an earlier run")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the replicas to agree")
    args = p.parse_args(argv)
    root = REPO
    os.chdir(root)  # the shipped configs use paths relative to the repository
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    ok = False
    try:
        with running_cluster(root, args.reuse_data) as (_zk, daemons):
            for d in daemons:
                d.wait_ready(args.table)
            say("all replicas answer /ping: " + ", ".join(f"{d.name} {d.url}" for d in daemons))
            before = daemons[0].count(args.table)
            t0 = time.monotonic()
            say(f"Spark: writing {args.rows:,} events into {args.table} on {daemons[0].name} "
                f"({daemons[0].url})")
            run_spark_demo(root, daemons[0].url, args.table, args.rows, args.partitions, args.master)
            say(f"Spark job done in {time.monotonic() - t0:.1f}s; waiting for the replicas to agree")
            counts = wait_in_sync(daemons, args.table, before + args.rows, args.timeout)
            say(f"replicas agree after {time.monotonic() - t0:.1f}s")
            print_statuses(daemons)
            print(f"\n{'replica':<10}{'url':<28}{'count()':>12}")
            for d in daemons:
                print(f"{d.name:<10}{d.url:<28}{counts[d.name]:>12,}")
            ok = all(c == before + args.rows for c in counts.values())
            say(("OK: " if ok else "MISMATCH: ") + f"{args.rows:,} rows written once to {daemons[0].name}, "
                f"{before + args.rows:,} expected on every replica")
            if args.keep:
                say("cluster kept running (--keep); press Ctrl-C to stop it")
                while all(d.running for d in daemons):
                    time.sleep(1)
                say("a replica exited: " + ", ".join(d.name for d in daemons if not d.running))
    except (KeyboardInterrupt, Stop) as e:
        say(f"interrupted ({type(e).__name__} {e}): cluster stopped")
        return 130
    except (RuntimeError, TimeoutError, HttpError) as e:
        say(f"FAILED: {e}")
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
