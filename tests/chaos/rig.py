"""The rig: replicad daemons (``python -m replicad run``) on a 3-node ZooKeeper ensemble, all on loopback.

    rig = Rig(base_dir, ensemble, ["r1", "r2", "r3"], env={"r2": {"REPLICAD_FAULT_PLANT": "drop_log_entry"}})
    rig.start(["r1", "r2"])       # the rest can join later (rig.start(["r3"]))
    rig.kill("r1"); rig.pause("r2"); rig.resume("r2"); rig.heal()
    rig.close()

With ``net`` (a set-up :class:`tests.chaos.netns.Network` whose members include the replica names) each
replica runs in its own network namespace: the HTTP API on ``net.ip(name)``, the interserver port on
``net.inter_ip(name)``.  Without it everything is on loopback.  ``tmpfs_mb``: each replica's data directory is
a tmpfs of that size (for the disk-full nemesis; 0 = an ordinary directory).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from replicad.devtools import process
from replicad.devtools.daemon import Daemon, daemon_env, replica_config
from replicad.devtools.ports import free_port
from tests.chaos.clickhouse_member import ClickHouseMember
from tests.chaos.ensemble import Ensemble
from tests.chaos.netns import Network

DB_TABLE = "db.t"
TABLE_ZK_PATH = "/clickhouse/tables/01/t"
DDL = (
    "CREATE TABLE IF NOT EXISTS db.t (p UInt8, id UInt64, client UInt32, v UInt64) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') PARTITION BY p ORDER BY id"
)
SESSION_TIMEOUT_S = 5
PLANT_ENV = "REPLICAD_FAULT_PLANT"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # user default, no password


def netns_support() -> str | None:
    """None when network namespaces can be built here, else the reason they cannot."""
    name = f"chaos-probe-{uuid.uuid4().hex[:6]}"
    try:
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ip netns add failed: {e}"
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return None


@dataclass
class NsDaemon(Daemon):
    """A daemon started behind a command prefix (``ip netns exec <ns>``)."""

    prefix: list[str] = field(default_factory=list)

    def start(self) -> None:
        assert self.log_path is not None
        argv = [*self.prefix, sys.executable, "-m", "replicad", "run", "--config", str(self.config_path)]
        self.proc = process.spawn(argv, self.log_path, cwd=self.cwd, env=daemon_env(self.env))


def mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """None when mounted, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                       capture_output=True, text=True, timeout=20)
    return None if r.returncode == 0 else f"mount -t tmpfs failed: {r.stderr.strip()}"


class Rig:
    def __init__(self, base: Path, ensemble: Ensemble, names: Sequence[str],
                 env: Mapping[str, Mapping[str, str]] | None = None, net: Network | None = None,
                 tmpfs_mb: int = 0, clickhouse: Sequence[str] = (), ddl: str = DDL,
                 config: Mapping[str, Any] | None = None) -> None:
        """``clickhouse``: names of ClickHouse 18.16 members besides the replicad ``names`` (loopback);
        ``ddl``: the table of the replicad members (db.t); ``config``: extra top-level config sections."""
        self.base = base
        self.ensemble = ensemble
        self.names = [*names, *clickhouse]
        self.replicad_names = list(names)
        self.clickhouse_names = list(clickhouse)
        self.net = net
        self.mounts: list[Path] = []
        self.tmpfs_reason: str | None = "no tmpfs asked for"
        self.chroot = f"/chaos/{base.name}-{uuid.uuid4().hex[:8]}"
        self._ensure_chroot()
        self.daemons: dict[str, Any] = {}
        self.paused: set[str] = set()
        self.s3: Any = None  # the S3 member of an S3 run (tests.chaos.s3_member.S3Member)
        for name in self.clickhouse_names:
            assert net is None, "ClickHouse 18.16 members listen on loopback only"
            self.daemons[name] = ClickHouseMember(base, name, ensemble.hosts, self.chroot, DDL,
                                                  SESSION_TIMEOUT_S)
        for name in self.replicad_names:
            if tmpfs_mb:
                self.tmpfs_reason = mount_tmpfs(base / name / "data", tmpfs_mb)
                if self.tmpfs_reason is None:
                    self.mounts.append(base / name / "data")
            cfg = replica_config(name, str(base / name / "data"), ensemble.hosts + self.chroot, free_port(),
                                 free_port(), tables=[ddl])
            cfg.update(config or {})
            cfg["zookeeper"]["session_timeout_s"] = SESSION_TIMEOUT_S
            if net is not None:  # addresses off loopback need users; the test network is private to the rig
                cfg["api"]["listen_host"] = net.ip(name)
                cfg["api"]["users"] = [{"name": "default", "password_sha256_hex": EMPTY_SHA256}]
                cfg["interserver"]["listen_host"] = cfg["interserver"]["host"] = net.inter_ip(name)
                cfg["interserver"]["user"] = cfg["interserver"]["password"] = "chaos"
            path = base / name / "replicad.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            extra = {"REPLICAD_FAULT_INJECTION": "1", **dict((env or {}).get(name, {}))}
            self.daemons[name] = NsDaemon(path, cwd=path.parent, log_path=path.parent / "replicad.log",
                                          env=extra, prefix=net.prefix(name) if net is not None else [])

    def _ensure_chroot(self) -> None:
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.ensemble.hosts)
        zk.start(30)
        try:
            zk.ensure_path(self.chroot)
        finally:
            zk.stop()
            zk.close()

    # ---- views

    @property
    def zk_table_path(self) -> str:
        """The table's path in ZooKeeper, chroot included (for a client without chroot)."""
        return self.chroot + TABLE_ZK_PATH

    def url(self, name: str) -> str:
        return self.daemons[name].url

    def table_dir(self, name: str) -> Path:
        return self.daemons[name].data_path / "data" / "db" / "t"

    def running(self, name: str) -> bool:
        return self.daemons[name].running

    # ---- process control

    def start(self, names: Sequence[str] | None = None, timeout: float = 90.0) -> None:
        todo = [n for n in (names or self.names) if not self.daemons[n].running]
        for name in todo:  # spawned from this (main) thread: the kernel kills them if the suite dies
            self.daemons[name].start()
        with ThreadPoolExecutor(max(1, len(todo))) as pool:
            list(pool.map(lambda n: self.daemons[n].wait_ready(DB_TABLE, timeout=timeout), todo))

    def kill(self, name: str) -> None:
        self.resume(name)
        self.daemons[name].kill()

    def pause(self, name: str) -> None:
        d = self.daemons[name]
        if d.proc is not None and d.proc.poll() is None:
            os.killpg(d.proc.pid, signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        d = self.daemons[name]
        if name in self.paused and d.proc is not None and d.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.proc.pid, signal.SIGCONT)
        self.paused.discard(name)

    def heal(self) -> None:
        """No network fault; every ZooKeeper node and replica running and resumed."""
        if self.net is not None:
            self.net.heal()
        for i, node in enumerate(self.ensemble.nodes):
            if not node.running:
                self.ensemble.start_node(i)
        for name in self.names:
            self.resume(name)
        self.ensemble.wait_quorum(90)
        self.start()

    def close(self) -> None:
        for name in self.names:
            self.resume(name)
        with ThreadPoolExecutor(len(self.names)) as pool:
            list(pool.map(lambda d: d.stop(timeout=15), self.daemons.values()))
        for m in self.mounts:
            subprocess.run(["umount", "-l", str(m)], capture_output=True, timeout=20)
        self.mounts = []

    def log_tail(self, name: str, lines: int = 30) -> str:
        return self.daemons[name].log_tail(lines)
