"""A 3-node replicad cluster in network namespaces: every node has its own network stack, address and the
default ports (8123, 9009), as on three hosts; needs root and ``ip`` (iproute2).

    python -m scripts.netns_cluster [--nodes 3] [--rows 100000] [--keep]

1. a bridge ``rpdc-br`` (10.77.0.254/24) in the current namespace and, per node, a namespace ``rpdc-nI``
   joined to it by a veth pair, address 10.77.0.I/24;
2. ZooKeeper on 10.77.0.254:2181 (bound to the bridge address only);
3. ``replicad run`` inside each namespace, bound to its own address: API with a user (an exposed API needs
   one), interserver with credentials (an exposed interserver needs them), ``interserver.host`` = the
   node's address, the demo table;
4. inserts ``--rows`` rows on node 1, waits until every node holds them, prints each node's
   ``replicad status`` (the cluster view) and the counts;
5. removes everything (processes, namespaces, bridge) at the end, on Ctrl-C or on SIGTERM; ``--keep``
   keeps the cluster running until Ctrl-C (``ip netns exec rpdc-n2 curl …`` reaches a node from inside).

Exit code 0 when every node agrees, 1 otherwise, 2 when namespaces cannot be made here.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from replicad.devtools import process
from replicad.devtools.daemon import DEMO_DDL, DEMO_TABLE, Daemon, daemon_env, wait_in_sync
from replicad.devtools.zookeeper import ZooKeeperServer
from scripts.run_cluster import Stop, _on_signal, print_statuses, say

PREFIX = "rpdc"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.77.0"
GATEWAY = f"{SUBNET}.254"
USER = "demo"


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def can_make_namespaces() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs ip (iproute2)"
    probe = f"{PREFIX}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextlib.contextmanager
def network(nodes: int) -> Iterator[list[str]]:
    """The bridge and one namespace per node; yields the namespaces' names; removes them all after."""
    names = [f"{PREFIX}-n{i}" for i in range(1, nodes + 1)]
    teardown(nodes)
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        for i, ns in enumerate(names, start=1):
            outer = f"{PREFIX}-v{i}"
            ip("netns", "add", ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("link", "set", outer, "master", BRIDGE)
            ip("link", "set", outer, "up")
            ip("addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0", netns=ns)
            ip("link", "set", "eth0", "up", netns=ns)
            ip("link", "set", "lo", "up", netns=ns)
        yield names
    finally:
        teardown(nodes)


def teardown(nodes: int) -> None:
    for i in range(1, nodes + 1):
        ip("netns", "del", f"{PREFIX}-n{i}", check=False)
        ip("link", "del", f"{PREFIX}-v{i}", check=False)
    ip("link", "del", BRIDGE, check=False)


class BridgeZooKeeper(ZooKeeperServer):
    """ZooKeeper bound to the bridge address (reachable from every namespace, not from outside)."""

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_path.read_text().replace("clientPortAddress=127.0.0.1", "clientPortAddress=")
        self.config_path.write_text(text.replace("clientPortAddress=", f"clientPortAddress={GATEWAY}"))

    @property
    def hosts(self) -> str:
        return f"{GATEWAY}:{self.port}"

    def _serving(self) -> bool:
        from replicad.devtools.zookeeper import four_letter

        try:
            return four_letter(GATEWAY, self.port, "ruok", timeout=0.5) == "imok"
        except OSError:
            return False


@dataclass
class NetnsDaemon(Daemon):
    """A replicad process started inside its node's namespace."""

    netns: str = ""

    def start(self) -> None:
        assert self.log_path is not None
        argv = ["ip", "netns", "exec", self.netns, sys.executable, "-m", "replicad", "run", "--config",
                str(self.config_path)]
        self.proc = process.spawn(argv, self.log_path, cwd=self.cwd, env=daemon_env(self.env))


def node_config(i: int, data: Path, zk_hosts: str, password: str,
                interserver_password: str) -> dict[str, object]:
    address = f"{SUBNET}.{i}"
    return {
        "replica": f"node{i}",
        "data_path": str(data / f"node{i}"),
        "timezone": "UTC",
        "macros": {"shard": "01"},
        "zookeeper": {"hosts": zk_hosts, "session_timeout_s": 10},
        "interserver": {"listen_host": address, "port": 9009, "host": address, "user": "replica",
                        "password": interserver_password},
        "api": {"listen_host": address, "port": 8123,
                "users": [{"name": USER, "password_sha256_hex": hashlib.sha256(password.encode()).hexdigest(),
                           "readonly": 0}]},
        "tables": [DEMO_DDL],
    }


def demo_rows(n: int, start: int = 0) -> bytes:
    return "".join(f"2026-11-{1 + i % 28:02d}\t2026-11-{1 + i % 28:02d} 12:00:00\t{start + i}\tk{i % 7}\n"
                   for i in range(n)).encode()


def run(nodes: int, rows: int, keep: bool, data: Path) -> int:
    password, interserver_password = secrets.token_hex(8), secrets.token_hex(8)
    with network(nodes) as names:
        zk = BridgeZooKeeper(data / "zookeeper", port=2181)
        daemons: list[NetnsDaemon] = []
        try:
            say(f"starting ZooKeeper on {zk.hosts}")
            zk.start()
            for i, ns in enumerate(names, start=1):
                path = data / f"node{i}.yaml"
                path.write_text(yaml.safe_dump(node_config(i, data, zk.hosts, password, interserver_password),
                                               sort_keys=False))
                d = NetnsDaemon(path, cwd=data, log_path=data / "logs" / f"node{i}.log",
                                auth=(USER, password), netns=ns)
                say(f"starting node{i} in namespace {ns}: API {d.url}, interserver {SUBNET}.{i}:9009")
                d.start()
                daemons.append(d)
            for d in daemons:
                d.wait_ready(DEMO_TABLE)
            say(f"inserting {rows:,} rows on node1")
            daemons[0].http("/?query=" + "INSERT%20INTO%20" + DEMO_TABLE + "%20FORMAT%20TSV", demo_rows(rows))
            counts = wait_in_sync(daemons, DEMO_TABLE, rows, timeout=300)
            print_statuses(daemons)
            print(f"\n{'node':<8}{'namespace':<12}{'url':<26}{'count()':>10}")
            for d in daemons:
                print(f"{d.name:<8}{d.netns:<12}{d.url:<26}{counts[d.name]:>10,}")
            agree = len(set(counts.values())) == 1 and rows in counts.values()
            say("every node holds the rows" if agree else f"nodes disagree: {counts}")
            if keep:
                say("cluster running; Ctrl-C stops it")
                while True:
                    time.sleep(3600)
            return 0 if agree else 1
        finally:
            for d in daemons:
                d.stop()
            zk.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A replicad cluster in network namespaces (root, iproute2).")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--keep", action="store_true", help="keep it running until Ctrl-C")
    p.add_argument("--data", type=Path, default=None, help="data directory (default: a temporary one)")
    args = p.parse_args(argv)
    why = can_make_namespaces()
    if why is not None:
        print(f"[netns_cluster] cannot make network namespaces here: {why}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    data = args.data or Path(tempfile.mkdtemp(prefix="replicad-netns-"))
    data.mkdir(parents=True, exist_ok=True)
    try:
        return run(args.nodes, args.rows, args.keep, data.resolve())
    except (KeyboardInterrupt, Stop):
        return 1
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
