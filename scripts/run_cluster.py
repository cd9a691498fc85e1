"""``make run``: a local 3-replica replicad cluster, fed 1 M demo events by Spark, checked to agree.

    python -m scripts.run_cluster [--rows 1000000] [--keep] [--reuse-data]

1. starts a ZooKeeper (tests/support/zookeeper.py) with its data under ./run-data/zookeeper;
2. starts ``python -m replicad run --config …`` for each of config/cluster/r*.yaml (data under ./run-data/);
   if one of their ports is taken, configs with free ports are generated into ./run-data/config/ instead;
3. waits for ``/ping`` and for the demo table, then runs examples/spark_events.py against replica 1;
4. waits until every replica has caught up (``SYSTEM SYNC REPLICA`` and ``count()``), prints each replica's
   ``replicad status`` and the counts;
5. stops everything — at the end, on Ctrl-C or on SIGTERM.  ``--keep`` keeps the cluster serving until
   Ctrl-C.  ./run-data is wiped at start unless ``--reuse-data``.

The ``Daemon`` helper (start/wait/query/stop one ``replicad run`` process) is also used by the Spark
integration test.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from tests.support import process
from tests.support.ports import free_port
from tests.support.zookeeper import ZooKeeperServer

REPO = Path(__file__).resolve().parents[1]
RUN_DATA = Path("run-data")
CLUSTER_CONFIGS = Path("config/cluster")
DEMO_TABLE = "db.events"
DEMO_DDL = (
    "CREATE TABLE IF NOT EXISTS db.events (d Date, ts DateTime, user_id UInt64, kind String) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
    "PARTITION BY toYYYYMM(d) ORDER BY (kind, user_id, ts)"
)


def say(text: str) -> None:
    print(f"[run_cluster] {text}", flush=True)


# ---- one daemon -------------------------------------------------------------------------------------------


class HttpError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text.strip()}")
        self.status = status
        self.text = text


def daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon: no stray REPLICAD_* overrides from the caller, the repo importable."""
    skip = ("REPLICAD_", "NOTIFY_SOCKET", "WATCHDOG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@dataclass
class Daemon:
    """One ``python -m replicad run --config <config_path>`` process (paths relative to ``cwd``)."""

    config_path: Path
    cwd: Path = REPO
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    auth: tuple[str, str] | None = None  # (user, password) for the API, when it has users

    def __post_init__(self) -> None:
        cfg = yaml.safe_load((self.cwd / self.config_path).read_text())
        self.name: str = str(cfg["replica"])
        api = cfg.get("api") or {}
        host = str(api.get("listen_host", "127.0.0.1"))
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        self.url = f"http://{host}:{int(api.get('port', 8123))}"
        self.data_path = self.cwd / str(cfg.get("data_path", "."))
        if self.log_path is None:
            self.log_path = self.data_path.parent / "logs" / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert self.log_path is not None
        argv = [sys.executable, "-m", "replicad", "run", "--config", str(self.config_path)]
        self.proc = process.spawn(argv, self.log_path, cwd=self.cwd, env=daemon_env(self.env))

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the daemon's ordered shutdown), SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        code = process.terminate(self.proc, signal.SIGTERM, timeout=timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        if self.proc is not None:
            process.kill(self.proc)
            self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        assert self.log_path is not None
        return process.tail(self.log_path, lines)

    # -- HTTP

    def http(self, path: str, body: bytes | None = None, timeout: float = 30.0) -> str:
        req = urllib.request.Request(self.url + path, data=body, method="GET" if body is None else "POST")
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return bytes(resp.read()).decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            raise HttpError(e.code, e.read().decode("utf-8", "replace")) from None

    def query(self, sql: str, *, post: bool = False, timeout: float = 30.0) -> str:
        path = "/?" + urllib.parse.urlencode({"query": sql})
        return self.http(path, b"" if post else None, timeout)

    def count(self, table: str = DEMO_TABLE, timeout: float = 60.0) -> int:
        return int(self.query(f"SELECT count() FROM {table}", timeout=timeout).strip())

    def wait_ready(self, table: str | None = None, timeout: float = 90.0) -> None:
        """Until ``/ping`` answers (and ``table`` can be counted); RuntimeError with the log tail if not."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                pinged = self.http("/ping", timeout=2).strip() == "Ok."
                if pinged and (table is None or self.count(table) >= 0):
                    return
            except (HttpError, OSError, ValueError) as e:
                last = e
            time.sleep(0.2)
        raise RuntimeError(f"replica {self.name} not ready after {timeout}s ({last}):\n{self.log_tail()}")

    def status_text(self) -> str:
        argv = [sys.executable, "-m", "replicad", "status", "--url", self.url]
        extra = {}
        if self.auth is not None:
            argv += ["--user", self.auth[0]]
            extra["REPLICAD_PASSWORD"] = self.auth[1]
        r = subprocess.run(argv, cwd=self.cwd, env={**daemon_env(), **extra}, capture_output=True, text=True,
                           timeout=60)
        return r.stdout + r.stderr


def wait_in_sync(daemons: Sequence[Daemon], table: str, expected: int | None = None,
                 timeout: float = 600.0) -> dict[str, int]:
    """``SYSTEM SYNC REPLICA`` on every replica, then poll ``count()`` until all agree (and equal
    ``expected`` if given).  Returns the counts; TimeoutError with them if that never happens."""
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}

    def sync(d: Daemon) -> None:
        with contextlib.suppress(HttpError, OSError):
            d.query(f"SYSTEM SYNC REPLICA {table}", post=True, timeout=max(1.0, deadline - time.monotonic()))

    with ThreadPoolExecutor(len(daemons)) as pool:
        list(pool.map(sync, daemons))
    while True:
        try:
            counts = {d.name: d.count(table) for d in daemons}
        except (HttpError, OSError, ValueError):
            counts = {}
        values = set(counts.values())
        if len(counts) == len(daemons) and len(values) == 1 and (expected is None or expected in values):
            return counts
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas did not agree within {timeout}s: counts {counts}, "
                               f"expected {expected}")
        time.sleep(0.5)


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


def replica_config(name: str, data_path: str, zk_hosts: str, api_port: int, interserver_port: int,
                   tables: Sequence[str] = (DEMO_DDL,),
                   settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """A loopback-only replica config (as the shipped config/cluster/*.yaml)."""
    return {
        "replica": name,
        "data_path": data_path,
        "timezone": "UTC",
        "macros": {"shard": "01"},
        "zookeeper": {"hosts": zk_hosts, "session_timeout_s": 10},
        "interserver": {"listen_host": "127.0.0.1", "port": interserver_port, "host": "127.0.0.1"},
        "api": {"listen_host": "127.0.0.1", "port": api_port},
        "settings": dict(settings or {}),
        "tables": list(tables),
    }


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
            for d in daemons:
                print(f"\n===== replicad status --url {d.url}  ({d.name}) =====", flush=True)
                print(d.status_text().rstrip(), flush=True)
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
