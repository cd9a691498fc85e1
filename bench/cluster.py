"""The benchmark cluster: one ZooKeeper, two replicad daemons and two ClickHouse 18.16 servers on loopback.

    with BenchCluster(work_dir) as cluster:          # everything on free 127.0.0.1 ports
        rd, ch = cluster.replicad, cluster.clickhouse  # ReplicaPair: .a (inserts go here), .b (replicates)
        rd.create_table("bench.events", EVENTS_COLUMNS)
        rd.a.insert("INSERT INTO bench.events FORMAT TSV", body)
        rd.b.count("bench.events")

Each pair has its own ZooKeeper chroot (``/replicad`` and ``/clickhouse``), so the two replica sets never
see each other.  The servers come from the dev tools (replicad/devtools/zookeeper.py, clickhouse.py,
daemon.py).  ClickHouse writes zstd parts like replicad's default.  :class:`Replica` gives both kinds the
same face: keep-alive HTTP, ``count``, ``parts``, the
server's pid, its RSS and its ZooKeeper session.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import shutil
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from kazoo.client import KazooClient

from bench.part_writer import COLUMNS as EVENTS_COLUMNS
from bench.part_writer import make_rows, to_tsv
from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.daemon import Daemon, replica_config
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer

__all__ = ["EVENTS_COLUMNS", "BenchCluster", "Replica", "ReplicaPair", "events_table", "make_events",
           "to_tsv"]

System = Literal["replicad", "clickhouse"]
ZSTD_CONFIG = (
    "<compression><case><min_part_size>0</min_part_size><min_part_size_ratio>0</min_part_size_ratio>"
    "<method>zstd</method></case></compression>"
)
DATABASE = "bench"
CLICKHOUSE_ZK_ROOT = "/clickhouse_bench"
MONTH0 = np.datetime64("2024-01", "M")


class BenchHttpError(RuntimeError):
    def __init__(self, status: int, text: str, what: str) -> None:
        super().__init__(f"HTTP {status} from {what}: {text.strip()[:500]}")
        self.status = status


# ---- data


def drop_table_sql(system: str, table: str) -> str:
    """The DROP TABLE text for ``system`` (18.16 wants IF EXISTS for a table that may be gone)."""
    return f"DROP TABLE IF EXISTS {table}" if system == "clickhouse" else f"DROP TABLE {table}"


def make_events(n: int, seed: int, month: int = 0, string_len: tuple[int, int] | None = None) -> pa.Table:
    """``n`` rows of the 6-column events table (bench/part_writer.py's generator) dated in month ``month``
    after 2024-01 (see :func:`with_month`).  ``string_len=(lo, hi)`` replaces ``s`` by random text of
    lo..hi-1 printable characters of a 64-letter alphabet (≈ 6 bits per byte: zstd keeps ~3/4 of it)."""
    t = with_month(make_rows(n, seed), month)
    if string_len is not None:
        rng = np.random.default_rng(seed + 1)
        lens = rng.integers(string_len[0], string_len[1], n)
        total = int(lens.sum())
        words = rng.integers(0, np.iinfo(np.uint64).max, total // 8 + 1, dtype=np.uint64, endpoint=True)
        chars = (words.view(np.uint8)[:total] & 63) + 48  # '0' .. 'o'
        chars[chars == 92] = 33  # no backslash (TSV escape): '!' instead
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        s = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n,
                                             [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
        t = t.set_column(3, "s", pa.chunked_array(
            [s.slice(i, 1 << 18).cast(pa.binary()) for i in range(0, n, 1 << 18)], pa.binary()))
    return t


def with_month(t: pa.Table, month: int) -> pa.Table:
    """The rows with ``d``/``ts`` moved into month ``month`` after 2024-01 (same day-of-month spread,
    same time of day): one partition per month, so rows of different months never merge together and
    never count as duplicate blocks."""
    start = (MONTH0 + month).astype("datetime64[D]")
    days = int((((start + np.timedelta64(31, "D")).astype("datetime64[M]")).astype("datetime64[D]") - start)
               .astype(int))
    d = t.column("d").to_numpy().astype("datetime64[D]").astype(np.int64)
    new_d = int(start.astype(np.int64)) + (d - d.min()) % days
    ts = t.column("ts").to_numpy().astype(np.int64)
    t = t.set_column(0, "d", pa.array(new_d.astype(np.int32), pa.date32()))
    return t.set_column(1, "ts", pa.array(new_d * 86400 + ts % 86400, pa.timestamp("s")))


def to_arrow_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=65536)
    return bytes(sink.getvalue().to_pybytes())


def to_tsv_fast(table: pa.Table) -> bytes:
    """The events rows as TSV (vectorised; the generated strings need no escaping)."""
    out = []
    for batch in table.to_batches(max_chunksize=1 << 19):
        cols = [pc.cast(batch.column(n), pa.string()) for n, _ in EVENTS_COLUMNS]
        lines = pc.binary_join_element_wise(*cols, "\t")
        lines = pc.binary_join_element_wise(lines, pa.scalar(""), "\n")
        offsets = np.frombuffer(lines.buffers()[1], np.int32)[lines.offset:lines.offset + len(lines) + 1]
        out.append(lines.buffers()[2].to_pybytes()[int(offsets[0]):int(offsets[-1])])
    return b"".join(out)


def events_table(table: str, zk_path: str, columns: Sequence[tuple[str, str]] = EVENTS_COLUMNS) -> str:
    cols = ", ".join(f"{n} {t}" for n, t in columns)
    return (f"CREATE TABLE IF NOT EXISTS {table} ({cols}) "
            f"ENGINE = ReplicatedMergeTree('{zk_path}', '{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY k")


# ---- processes


def proc_status_kb(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (VmRSS, VmHWM), 0 if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss(pid: int) -> bool:
    """Reset the kernel's peak RSS (VmHWM) of ``pid`` to its current RSS (``clear_refs`` 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


CPU_TICK = 1 / os.sysconf("SC_CLK_TCK")  # resolution of cpu_seconds


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PeakRss:
    """Peak RSS of a process over a ``with`` block: VmHWM after a reset when the kernel allows it,
    else the largest VmRSS sampled every 20 ms.  ``peak_mb``, ``before_mb``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before_mb = 0.0
        self.peak_mb = 0.0
        self._sampled = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm = False

    def __enter__(self) -> PeakRss:
        self.before_mb = proc_status_kb(self.pid, "VmRSS") / 1024
        self._hwm = reset_peak_rss(self.pid)
        self._sampled = 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self._sampled = max(self._sampled, proc_status_kb(self.pid, "VmRSS"))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        peak_kb = max(self._sampled, proc_status_kb(self.pid, "VmRSS"))
        if self._hwm:
            peak_kb = max(peak_kb, proc_status_kb(self.pid, "VmHWM"))
        self.peak_mb = peak_kb / 1024


def socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[8:-1]))
    return out


def tcp_peer_ports(pid: int, remote_port: int) -> set[int]:
    """Local ports of ``pid``'s TCP connections to 127.0.0.1:``remote_port`` (from /proc/net/tcp)."""
    inodes = socket_inodes(pid)
    ports: set[int] = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            local, remote, inode = f[1], f[2], int(f[9])
            if inode in inodes and int(remote.split(":")[1], 16) == remote_port:
                ports.add(int(local.split(":")[1], 16))
    return ports


def zk_recved_by_port(zk: ZooKeeperServer) -> dict[int, int]:
    """Packets ZooKeeper received per client port (its ``cons`` command)."""
    out: dict[int, int] = {}
    for line in zk.command("cons").splitlines():
        line = line.strip()
        if not line.startswith("/") or "recved=" not in line:
            continue
        addr = line[1:line.index("[")]
        port = int(addr.rsplit(":", 1)[1])
        stats = line[line.index("(") + 1:line.rindex(")")].split(",")
        fields = dict(f.split("=", 1) for f in stats if "=" in f)
        out[port] = int(fields["recved"])
    return out


def part_ctimes_ms(kz: KazooClient, table_path: str, replica: str) -> dict[str, int]:
    """Creation times (ZooKeeper's clock, ms) of ``replica``'s ``parts/<name>`` znodes under ``table_path``
    (seen from the server's root): when each part was committed there (inserted, fetched or merged)."""
    parts = f"{table_path}/replicas/{replica}/parts"
    out: dict[str, int] = {}
    for name in kz.get_children(parts):
        stat = kz.exists(f"{parts}/{name}")
        if stat is not None:
            out[name] = int(stat.ctime)
    return out


# ---- HTTP


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read now (poll: no limit on descriptor numbers, unlike select)."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(0))


class Http:
    """A keep-alive HTTP client for one server (one connection, re-opened when the server closed it)."""

    def __init__(self, port: int, what: str) -> None:
        self.port = port
        self.what = what
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 600.0) -> bytes:
        with self._lock:
            for attempt in (0, 1):
                if self._conn is not None and self._conn.sock is not None and _readable(self._conn.sock):
                    self.close_locked()  # readable while idle: the server closed the keep-alive connection
                if self._conn is None:
                    self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
                self._conn.timeout = timeout
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout)
                try:
                    self._conn.request(method, path, body=body)
                    resp = self._conn.getresponse()
                    data = resp.read()
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self.close_locked()
                    if attempt or (body is not None and method == "POST" and len(body) > 1 << 20):
                        raise
                    continue
                if resp.will_close:
                    self.close_locked()
                if resp.status != 200:
                    raise BenchHttpError(resp.status, data.decode("utf-8", "replace"), self.what)
                return data
        raise AssertionError("unreachable")

    def close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()

    def query(self, sql: str, body: bytes | None = None, timeout: float = 600.0) -> str:
        """SELECTs go as GET, anything with a body or a statement as POST (query in the URL)."""
        path = "/?" + urllib.parse.urlencode({"query": sql})
        is_select = sql.lstrip()[:6].upper() == "SELECT"
        method = "GET" if body is None and is_select else "POST"
        return self.request(method, path, body if body is not None else (None if is_select else b""),
                            timeout).decode()


@dataclass(frozen=True)
class PartRow:
    name: str
    partition_id: str
    rows: int
    bytes_on_disk: int


class Replica:
    """One server of either kind, seen the same way."""

    def __init__(self, system: System, name: str, server: Daemon | ClickHouseServer, http_port: int) -> None:
        self.system = system
        self.name = name
        self.server = server
        self.http = Http(http_port, f"{system} {name}")

    @property
    def pid(self) -> int:
        proc = self.server.proc
        assert proc is not None, f"{self.system} {self.name} is not running"
        return proc.pid  # ``setpriv --pdeathsig`` execs the server: same pid

    def insert(self, sql: str, body: bytes, timeout: float = 1200.0) -> float:
        """Seconds from sending the request to the acknowledgement."""
        t0 = time.perf_counter()
        self.http.query(sql, body, timeout)
        return time.perf_counter() - t0

    def count(self, table: str) -> int:
        return int(self.http.query(f"SELECT count() FROM {table}").strip() or 0)

    def parts(self, table: str) -> list[PartRow]:
        """Active parts."""
        if self.system == "clickhouse":
            db, _, t = table.partition(".")
            text = self.http.query(
                "SELECT name, partition_id, rows, bytes_on_disk FROM system.parts "
                f"WHERE database = '{db}' AND table = '{t}' AND active FORMAT JSONEachRow")
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            rows = [r for r in json.loads(self.http.request("GET", f"/tables/{table}/parts"))
                    if r.get("active", r.get("state") in (None, "Committed", "Active", "active"))]
        return [PartRow(str(r["name"]), str(r.get("partition_id", r["name"].split("_")[0])), int(r["rows"]),
                        int(r["bytes_on_disk"])) for r in rows]

    def sync(self, table: str, timeout: float = 600.0) -> None:
        self.http.query(f"SYSTEM SYNC REPLICA {table}", timeout=timeout)

    def zk_client_ports(self, zk_port: int) -> set[int]:
        return tcp_peer_ports(self.pid, zk_port)

    def rss_mb(self) -> float:
        return proc_status_kb(self.pid, "VmRSS") / 1024


class ReplicaPair:
    """Two replicas of one system sharing the benchmark tables; inserts go to ``a``."""

    def __init__(self, system: System, a: Replica, b: Replica, zk_prefix: str, zk_chroot: str) -> None:
        self.system = system
        self.a = a
        self.b = b
        self.zk_prefix = zk_prefix  # the tables' ZooKeeper paths: <zk_prefix>/<db>_<table>
        self.zk_chroot = zk_chroot  # where this replica set's tree lives in the ZooKeeper server

    def zk_table_path(self, table: str) -> str:
        """The table's ZooKeeper path as seen from the server's root (chroot included)."""
        return f"{self.zk_chroot}{self.zk_prefix}/{table.replace('.', '_')}"

    @property
    def replicas(self) -> tuple[Replica, Replica]:
        return self.a, self.b

    def create_table(self, table: str, columns: Sequence[tuple[str, str]] = EVENTS_COLUMNS) -> None:
        ddl = events_table(table, f"{self.zk_prefix}/{table.replace('.', '_')}", columns)
        for r in self.replicas:
            if self.system == "clickhouse":
                r.http.query(f"CREATE DATABASE IF NOT EXISTS {table.partition('.')[0]}")
            r.http.query(ddl)

    def drop_table(self, table: str) -> None:
        for r in self.replicas:
            with contextlib.suppress(BenchHttpError, OSError):
                r.http.query(drop_table_sql(self.system, table), timeout=120)

    def wait_rows(self, table: str, expected: int, timeout: float = 600.0, poll_s: float = 0.05) -> float:
        """Until ``b`` counts ``expected`` rows; returns the seconds waited."""
        t0 = time.perf_counter()
        while True:
            n = self.b.count(table)
            if n >= expected:
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{self.system} {self.b.name}: {n} of {expected} rows in {table} "
                                   f"after {timeout}s")
            time.sleep(poll_s)


# ---- the cluster


class BenchCluster:
    def __init__(self, work_dir: Path, *, with_clickhouse: bool = True, with_replicad: bool = True,
                 daemon_settings: dict[str, object] | None = None) -> None:
        self.work_dir = work_dir.absolute()
        self.with_clickhouse = with_clickhouse
        self.with_replicad = with_replicad
        self.daemon_settings = dict(daemon_settings or {})
        self.zk = ZooKeeperServer(self.work_dir / "zookeeper", heap_mb=512)
        self.daemons: list[Daemon] = []
        self.clickhouses: list[ClickHouseServer] = []
        self._replicad: ReplicaPair | None = None
        self._clickhouse: ReplicaPair | None = None
        self._kazoo: KazooClient | None = None
        self.clickhouse_version = ""

    @property
    def replicad(self) -> ReplicaPair:
        assert self._replicad is not None
        return self._replicad

    @property
    def clickhouse(self) -> ReplicaPair:
        assert self._clickhouse is not None
        return self._clickhouse

    def pairs(self) -> list[ReplicaPair]:
        return [p for p in (self._replicad, self._clickhouse) if p is not None]

    def start(self) -> None:
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.work_dir.mkdir(parents=True)
        self.zk.start()
        if self.with_replicad:
            self._start_replicad()
        if self.with_clickhouse:
            self._start_clickhouse()

    def _start_replicad(self) -> None:
        replicas = []
        for name in ("a", "b"):
            api_port, inter_port = free_port(), free_port()
            cfg = replica_config(name, str(self.work_dir / f"replicad-{name}"), f"{self.zk.hosts}/replicad",
                                 api_port, inter_port, tables=(), settings=self.daemon_settings)
            cfg["zookeeper"]["session_timeout_s"] = 30  # as ClickHouse's default session timeout
            path = self.work_dir / f"replicad-{name}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            d = Daemon(path, cwd=self.work_dir, log_path=self.work_dir / "logs" / f"replicad-{name}.log",
                       env={"REPLICAD_INSERT_STAGES": "1"})  # the insert_stages log lines (bench/lag.py)
            d.start()
            self.daemons.append(d)
            replicas.append(Replica("replicad", name, d, api_port))
        for d in self.daemons:
            d.wait_ready()
        self._replicad = ReplicaPair("replicad", replicas[0], replicas[1], "/clickhouse/tables/01",
                                     "/replicad")

    def _start_clickhouse(self) -> None:
        replicas = []
        for name in ("a", "b"):
            ch = ClickHouseServer(self.work_dir / f"clickhouse-{name}", replica=name, zookeeper=self.zk.hosts,
                                  zookeeper_root=CLICKHOUSE_ZK_ROOT, extra_config=ZSTD_CONFIG)
            ch.start()
            self.clickhouses.append(ch)
            replicas.append(Replica("clickhouse", name, ch, ch.http_port))
        self._clickhouse = ReplicaPair("clickhouse", replicas[0], replicas[1], "/clickhouse/tables/01",
                                       CLICKHOUSE_ZK_ROOT)
        self.clickhouse_version = replicas[0].http.query("SELECT version()").strip()

    def stop(self) -> None:
        if self._kazoo is not None:
            with contextlib.suppress(Exception):
                self._kazoo.stop()
                self._kazoo.close()
            self._kazoo = None
        for pair in self.pairs():
            for r in pair.replicas:
                r.http.close()
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop(timeout=30)
        for ch in self.clickhouses:
            with contextlib.suppress(Exception):
                ch.stop()
        with contextlib.suppress(Exception):
            self.zk.stop()

    def __enter__(self) -> BenchCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- ZooKeeper accounting

    def zk_connections(self) -> dict[int, int]:
        return zk_recved_by_port(self.zk)

    def zk_packets(self, replicas: Sequence[Replica]) -> dict[str, int]:
        """ZooKeeper's received-packet counter summed over each replica's connections."""
        conns = self.zk_connections()
        return {f"{r.system}-{r.name}": sum(conns.get(p, 0) for p in r.zk_client_ports(self.zk.port))
                for r in replicas}

    def restart(self, replica: Replica, table: str | None = None, timeout: float = 90.0) -> None:
        """Stop and start one server (a fresh process: its RSS starts from the idle state); returns when it
        answers and, for a replicad daemon, ``/replicas_status`` is Ok (its tables are writable)."""
        replica.http.close()
        if isinstance(replica.server, Daemon):
            replica.server.stop()
            replica.server.start()
            replica.server.wait_ready(table, timeout=timeout)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    replica.http.request("GET", "/replicas_status", timeout=5)
                    break
                except (BenchHttpError, OSError):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        else:
            replica.server.restart(timeout)

    def part_ctimes_ms(self, pair: ReplicaPair, table: str, replica: Replica) -> dict[str, int]:
        """Creation times (ZooKeeper's clock, ms) of ``replica``'s ``parts/<name>`` znodes: when each part
        was committed there (inserted, fetched or merged)."""
        if self._kazoo is None:
            self._kazoo = KazooClient(hosts=self.zk.hosts)
            self._kazoo.start(15)
        return part_ctimes_ms(self._kazoo, pair.zk_table_path(table), replica.name)

    def disk_free_gb(self) -> float:
        return shutil.disk_usage(self.work_dir).free / 1e9


@contextlib.contextmanager
def running(work_dir: Path, **kw: object) -> Iterator[BenchCluster]:
    c = BenchCluster(work_dir, **kw)  # type: ignore[arg-type]
    with c:
        yield c
