"""A 3-node ZooKeeper ensemble (``QuorumPeerMain``) on loopback, for the fault suite.

    zk = Ensemble(base_dir, size=3)
    zk.start()                  # returns when a quorum serves (one leader, the rest followers)
    zk.hosts                    # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
    zk.kill(i) / zk.start_node(i) / zk.leader()

Each node keeps its data directory between restarts.  The jars and Java are found as by
``tests.support.zookeeper`` (Debian layout, ``$ZOOKEEPER_HOME`` or ``$REPLICAD_ZOOKEEPER_CLASSPATH``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.support import process
from tests.support.ports import free_port
from tests.support.zookeeper import NETTY_FACTORY, find_classpath, find_java, four_letter


class Node:
    def __init__(self, base: Path, myid: int, host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        self.myid = myid
        self.host = host
        self.prefix = list(prefix)  # e.g. ["ip", "netns", "exec", <ns>]
        self.dir = base / f"zk{myid}"
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "zoo.cfg"
        self.log_path = self.dir / "zookeeper.log"
        self.client_port = free_port()
        self.quorum_port = free_port()
        self.election_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def mode(self) -> str | None:
        """``leader`` / ``follower`` / ``standalone``, or None when not serving."""
        try:
            text = four_letter(self.host, self.client_port, "srvr", timeout=0.5)
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None


class Ensemble:
    def __init__(self, base_dir: Path, size: int = 3, tick_time_ms: int = 500,
                 hosts: Sequence[str] = (), prefixes: Sequence[Sequence[str]] = ()) -> None:
        """``hosts``/``prefixes``: each node's address and command prefix (network namespaces); loopback
        and none by default."""
        self.base = base_dir
        self.tick_time_ms = tick_time_ms
        self.nodes = [Node(base_dir, i + 1, hosts[i] if hosts else "127.0.0.1",
                           prefixes[i] if prefixes else ()) for i in range(size)]

    @property
    def hosts(self) -> str:
        return ",".join(f"{n.host}:{n.client_port}" for n in self.nodes)

    def _config(self, node: Node) -> str:
        lines = [
            f"tickTime={self.tick_time_ms}",
            "initLimit=20",
            "syncLimit=10",
            f"dataDir={node.data_dir}",
            f"clientPort={node.client_port}",
            f"clientPortAddress={node.host}",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            "maxSessionTimeout=60000",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "forceSync=no",
            "preAllocSize=4096",
            "snapCount=100000",
            "standaloneEnabled=false",
            "reconfigEnabled=false",
        ]
        lines += [f"server.{n.myid}={n.host}:{n.quorum_port}:{n.election_port}" for n in self.nodes]
        return "\n".join(lines) + "\n"

    def start_node(self, i: int) -> None:
        node = self.nodes[i]
        if node.running:
            return
        java, classpath = find_java(), find_classpath()
        if java is None or classpath is None:
            raise RuntimeError("ZooKeeper or Java is not installed")
        node.data_dir.mkdir(parents=True, exist_ok=True)
        (node.data_dir / "myid").write_text(f"{node.myid}\n")
        node.config_path.write_text(self._config(node))
        argv = [
            *node.prefix,
            java, "-Xmx128m", "-Xms16m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-Dzookeeper.admin.enableServer=false",
            f"-Dzookeeper.serverCnxnFactory={NETTY_FACTORY}",
            "-cp", classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(node.config_path),
        ]
        node.proc = process.spawn(argv, node.log_path, cwd=node.dir)

    def start(self, timeout: float = 90.0) -> None:
        for i in range(len(self.nodes)):
            self.start_node(i)
        self.wait_quorum(timeout)

    def wait_quorum(self, timeout: float = 60.0) -> float:
        """Until every running node serves and one of them leads; returns the seconds it took."""
        t0 = time.monotonic()
        while True:
            modes = [n.mode() for n in self.nodes if n.running]
            if modes and all(m in ("leader", "follower") for m in modes) and "leader" in modes:
                return time.monotonic() - t0
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise RuntimeError(f"zk{n.myid} exited:\n{process.tail(n.log_path)}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"no ZooKeeper quorum within {timeout}s: modes {modes}")
            time.sleep(0.2)

    def leader(self) -> int | None:
        for i, n in enumerate(self.nodes):
            if n.running and n.mode() == "leader":
                return i
        return None

    def kill(self, i: int) -> None:
        node = self.nodes[i]
        if node.proc is not None:
            process.kill(node.proc)
            node.proc = None

    def stop(self) -> None:
        for i in range(len(self.nodes)):
            self.kill(i)
