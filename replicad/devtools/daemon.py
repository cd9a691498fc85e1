"""One ``python -m replicad run`` process for development: start it, wait for it, query it over HTTP, stop it.

``make run`` (``scripts/run_cluster.py``), the benchmarks and the daemon-level tests start their replicas with
:class:`Daemon`; :func:`replica_config` writes a loopback-only config like the shipped config/cluster/*.yaml.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from replicad.devtools import process

REPO = Path(__file__).resolve().parents[2]
DEMO_TABLE = "db.events"
DEMO_DDL = (
    "CREATE TABLE IF NOT EXISTS db.events (d Date, ts DateTime, user_id UInt64, kind String) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
    "PARTITION BY toYYYYMM(d) ORDER BY (kind, user_id, ts)"
)


class HttpError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text.strip()}")
        self.status = status
        self.text = text


def daemon_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon: no stray REPLICAD_* overrides from the caller, the repo importable, and
    its bytecode cached (PYTHONDONTWRITEBYTECODE dropped): a daemon that compiles every module from source at
    each start, as none installed from a wheel does, keeps ~1 MiB more resident and starts slower."""
    skip = ("REPLICAD_", "NOTIFY_SOCKET", "WATCHDOG_", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


@dataclass
class Daemon(process.ServerProcess):
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

    def start(self) -> None:
        assert self.log_path is not None
        argv = [sys.executable, "-m", "replicad", "run", "--config", str(self.config_path)]
        self.proc = process.spawn(argv, self.log_path, cwd=self.cwd, env=daemon_env(self.env))

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the daemon's ordered shutdown), SIGKILL after ``timeout``."""
        return self._terminate(timeout)

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
