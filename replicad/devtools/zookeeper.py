"""A real ZooKeeper server for tests (standalone ``ZooKeeperServerMain``), on a free loopback port.

    zk = ZooKeeperServer(tmp_dir)
    zk.start()            # returns when ``ruok`` answers ``imok``
    zk.hosts              # "127.0.0.1:<port>"
    zk.restart()          # same port, same data (sessions survive if clients reconnect in time)
    zk.kill()             # SIGKILL; zk.start() brings it back
    zk.expire_session(session_id, password)
    zk.mntr()["zk_packets_received"]

The jars are found at run time: ``$REPLICAD_ZOOKEEPER_CLASSPATH`` if set, else ``$ZOOKEEPER_HOME/lib``
(upstream tarball), else the Debian package layout (``/usr/share/java`` or ``/usr/share/zookeeper``).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from replicad.devtools import process
from replicad.devtools.ports import free_port

# Jars a standalone server needs (Debian names); the first four are required.
_REQUIRED_JARS = ("zookeeper", "zookeeper-jute", "slf4j-api", "slf4j-simple")
_OPTIONAL_JARS = ("metrics-core", "commons-cli", "snappy-java")
# With these the server uses Netty for client connections.  ZooKeeper 3.8.0's default NIO factory
# leaks a connection that arrives between binding the port and loading the database (an NPE while
# closing it), so a client reconnecting during a restart hangs for a whole session timeout.
_NETTY_JARS = (
    "netty-handler",
    "netty-common",
    "netty-transport",
    "netty-buffer",
    "netty-codec",
    "netty-resolver",
    "netty-transport-native-epoll",
    "netty-transport-native-unix-common",
)
NETTY_FACTORY = "org.apache.zookeeper.server.NettyServerCnxnFactory"
_JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper/lib", "/usr/share/zookeeper")


def find_classpath() -> str | None:
    """The class path of a ZooKeeper 3.5+ server, or None if ZooKeeper is not installed."""
    env = os.environ.get("REPLICAD_ZOOKEEPER_CLASSPATH")
    if env:
        return env
    home = os.environ.get("ZOOKEEPER_HOME")
    if home and (Path(home) / "lib").is_dir():
        jars = sorted(str(p) for p in (Path(home) / "lib").glob("*.jar"))
        jars += sorted(str(p) for p in Path(home).glob("zookeeper-*.jar"))
        return os.pathsep.join(jars) if jars else None
    found: list[str] = []
    for name in _REQUIRED_JARS + _OPTIONAL_JARS + _NETTY_JARS:
        jar = _find_jar(name)
        if jar is not None:
            found.append(jar)
        elif name in _REQUIRED_JARS:
            return None
    return os.pathsep.join(found)


def _find_jar(name: str) -> str | None:
    for d in _JAR_DIRS:
        p = Path(d) / f"{name}.jar"
        if p.is_file():
            return str(p)
    return None


def _has_netty(classpath: str) -> bool:
    names = {Path(p).name for p in classpath.split(os.pathsep)}
    if any(n.startswith("netty-all") for n in names):
        return True
    return all(any(n.startswith(j) for n in names) for j in _NETTY_JARS[:6])


def find_java() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home) / "bin" / "java", os.X_OK):
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java")


def available() -> bool:
    return find_java() is not None and find_classpath() is not None


def four_letter(host: str, port: int, cmd: str, timeout: float = 2.0) -> str:
    """Send a four-letter command and read the whole answer."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            b = s.recv(65536)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperServer(process.ServerProcess):
    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        tick_time_ms: int = 500,
        max_session_timeout_ms: int = 600_000,
        heap_mb: int = 256,
    ) -> None:
        if base_dir is None:
            base_dir = tempfile.mkdtemp(prefix="replicad-zk-")
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "zoo.cfg"
        self.log_path = self.base_dir / "zookeeper.log"
        self.port = port if port is not None else free_port()
        self.tick_time_ms = tick_time_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.heap_mb = heap_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None  # how long the last start() took

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    f"minSessionTimeout={2 * self.tick_time_ms}",
                    f"maxSessionTimeout={self.max_session_timeout_ms}",
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=*",
                    "forceSync=no",  # tests do not need fsync; it makes every write slow
                    "preAllocSize=4096",
                    "snapCount=100000",
                    "",
                ]
            )
        )

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        java, classpath = find_java(), find_classpath()
        if java is None or classpath is None:
            raise RuntimeError("ZooKeeper or Java is not installed")
        self._write_config()
        factory = [f"-Dzookeeper.serverCnxnFactory={NETTY_FACTORY}"] if _has_netty(classpath) else []
        argv = [
            java,
            f"-Xmx{self.heap_mb}m",
            "-Xms32m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Xshare:auto",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-Dzookeeper.admin.enableServer=false",
            *factory,
            "-cp",
            classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(self.config_path),
        ]
        t0 = time.monotonic()
        self.proc = process.spawn(argv, self.log_path, cwd=self.base_dir)
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"ZooKeeper exited with {self.proc.returncode}:\n{process.tail(self.log_path)}"
                )
            if self._serving():
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ZooKeeper not ready in {timeout}s:\n{process.tail(self.log_path)}")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - t0

    def _serving(self) -> bool:
        try:
            return (
                four_letter("127.0.0.1", self.port, "ruok", timeout=0.5) == "imok"
                and "Mode: " in four_letter("127.0.0.1", self.port, "srvr", timeout=0.5)
            )
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop (SIGTERM), SIGKILL after ``timeout``.  Data stays for a later start()."""
        self._terminate(timeout)

    def restart(self, timeout: float = 60.0, down_for: float = 0.0) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        if down_for:
            time.sleep(down_for)
        self.start(timeout)

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    # ------------------------------------------------------------------ inspection helpers

    def command(self, cmd: str) -> str:
        return four_letter("127.0.0.1", self.port, cmd)

    def mntr(self) -> dict[str, int | float | str]:
        """``mntr`` statistics (e.g. zk_packets_received, zk_znode_count, zk_ephemerals_count)."""
        out: dict[str, int | float | str] = {}
        for line in self.command("mntr").splitlines():
            key, _, value = line.partition("\t")
            if not key:
                continue
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    out[key] = value
        return out

    def session_ids(self) -> set[int]:
        """Ids of the sessions currently connected (from ``cons``)."""
        ids: set[int] = set()
        for line in self.command("cons").splitlines():
            for field in line[line.find("(") + 1 : line.rfind(")")].split(","):
                k, _, v = field.partition("=")
                if k == "sid":
                    ids.add(int(v, 16))
        return ids

    def expire_session(self, session_id: int, password: bytes, timeout: float = 10.0) -> None:
        """Make ZooKeeper expire a live session (the classic trick): a second client takes the session
        over — the owner's connection is dropped — and closes it; on reconnecting the owner hears
        "session expired".  Retried if the owner won the race and took its session back."""
        from kazoo.client import KazooClient  # the test support may use kazoo directly

        for _attempt in range(5):
            zk = KazooClient(hosts=self.hosts, client_id=(session_id, password), timeout=timeout)
            try:
                zk.start(timeout)
            except Exception:  # already expired: the server refuses the session
                zk.stop()
                zk.close()
                return
            try:
                zk.stop()
            finally:
                zk.close()
            time.sleep(0.3)
            if session_id not in self.session_ids():
                return
        raise RuntimeError(f"could not expire session 0x{session_id:x}")

    def new_chroot(self, name: str) -> str:
        """A fresh, created path ``/tests/<name>-<random>`` (``name`` made path-safe) to use as a chroot."""
        from kazoo.client import KazooClient

        root = f"/tests/{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:80]}-{uuid.uuid4().hex[:8]}"
        zk = KazooClient(hosts=self.hosts)
        zk.start(15)
        try:
            zk.ensure_path(root)
        finally:
            zk.stop()
            zk.close()
        return root

    def dump_tree(self, root: str = "/", *, with_data: bool = True, max_data: int = 200) -> str:
        """The tree under ``root`` as indented text (for failure messages and tests)."""
        from kazoo.client import KazooClient
        from kazoo.exceptions import NoNodeError

        zk = KazooClient(hosts=self.hosts)
        zk.start(10)
        lines: list[str] = []
        try:

            def walk(path: str, depth: int) -> None:
                try:
                    data, _ = zk.get(path)
                    children = sorted(zk.get_children(path))
                except NoNodeError:
                    return
                name = path if depth == 0 else path.rsplit("/", 1)[-1]
                text = ""
                if with_data and data:
                    try:
                        shown: str | bytes = data[:max_data].decode()
                    except UnicodeDecodeError:
                        shown = data[:max_data]
                    text = f" = {shown!r}" + ("…" if len(data) > max_data else "")
                lines.append("  " * depth + name + text)
                for c in children:
                    walk(path.rstrip("/") + "/" + c, depth + 1)

            walk(root, 0)
        finally:
            zk.stop()
            zk.close()
        return "\n".join(lines)
