"""A replica that only replicates never imports pyarrow.compute nor the insert formats' parsers
(replicad.memory.defer_import): two real daemons, one inserts, the other fetches, answers SYSTEM SYNC
REPLICA, count() and its parts list; then the first SELECT with a WHERE and an insert on it import them (in a
worker thread) and answer right.  The daemon process runs Arrow's allocator with replicad.memory's options."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.memory import MIMALLOC_OPTIONS
from tests.support.replicad_daemon import make_chroot, ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "db.t"
DDL = ("CREATE TABLE IF NOT EXISTS db.t (d Date, ts DateTime, k UInt64, s String) "
       "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') "
       "PARTITION BY toYYYYMM(d) ORDER BY (k, ts)")


def mapped(d: Daemon, library: str) -> bool:
    assert d.proc is not None
    return library in Path(f"/proc/{d.proc.pid}/maps").read_text()


def compute_mapped(d: Daemon) -> bool:
    return mapped(d, "pyarrow/_compute.cpython")


def rows(first: int, n: int) -> bytes:
    return b"".join(b"2024-0%d-1%d\t2024-01-02 03:04:05\t%d\tv%d\n" % (1 + k % 3, k % 10, k, k)
                    for k in range(first, first + n))


def test_a_replicating_daemon_leaves_compute_unloaded(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "resting")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    try:
        r2 = start_daemon(tmp_path, zookeeper, chroot, "r2", tables=[DDL], wait_table=TABLE)
        try:
            ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", rows(0, 300)))
            assert compute_mapped(r1)  # the insert needed it
            ok(query(r2.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True))
            assert ok(query(r2.url, f"SELECT count() FROM {TABLE}")).text == "300\n"
            assert ok(query(r2.url, f"SELECT count() FROM {TABLE} FORMAT JSONEachRow")).text == \
                '{"count()":"300"}\n'
            parts = ok(request(r2.url, f"/tables/{TABLE}/parts")).json()
            assert sorted(p["partition_id"] for p in parts) == ["202401", "202402", "202403"]
            assert not compute_mapped(r2)
            assert not mapped(r2, "pyarrow/_csv.cpython")  # the insert formats (replicad.server.formats)

            got = ok(query(r2.url, f"SELECT k, s FROM {TABLE} WHERE k % 100 = 7 ORDER BY k")).text
            assert got == "7\tv7\n107\tv107\n207\tv207\n"
            assert compute_mapped(r2) and mapped(r2, "pyarrow/_csv.cpython")
            ok(query(r2.url, f"INSERT INTO {TABLE} FORMAT TSV", rows(300, 10)))
            ok(query(r1.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True))
            assert ok(query(r1.url, f"SELECT count() FROM {TABLE} WHERE k >= 300")).text == "10\n"
            assert r2.stop() == 0
        finally:
            if r2.running:
                r2.kill()
        assert r1.stop() == 0
    finally:
        if r1.running:
            r1.kill()


def test_the_daemon_process_runs_with_the_allocator_options(zookeeper: ZooKeeperServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``replicad run`` sets :data:`replicad.memory.MIMALLOC_OPTIONS` before pyarrow loads, so Arrow's
    allocator in the daemon process runs with them (mimalloc prints its options at start-up when
    MIMALLOC_VERBOSE is set: read back from the daemon's own output, not from a copy of the code)."""
    for name in list(os.environ):
        if name.startswith("MIMALLOC_"):
            monkeypatch.delenv(name)
    chroot = make_chroot(zookeeper, "allocator")
    d = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE,
                     env={"MIMALLOC_VERBOSE": "1"})
    try:
        ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", rows(0, 10)))
        assert ok(query(d.url, f"SELECT count() FROM {TABLE}")).text == "10\n"
        assert d.stop() == 0
    finally:
        if d.running:
            d.kill()
    assert d.log_path is not None
    printed = dict(re.findall(r"^option '(\w+)': (-?\d+)", d.log_path.read_text(errors="replace"), re.M))
    assert printed, "mimalloc printed no options"
    for env_name, value in MIMALLOC_OPTIONS.items():
        assert printed[env_name.removeprefix("MIMALLOC_").lower()] == value, env_name


def anon_mib(d: Daemon) -> float:
    assert d.proc is not None
    status = Path(f"/proc/{d.proc.pid}/status").read_text()
    return int(re.search(r"^RssAnon:\s+(\d+)", status, re.M).group(1)) / 1024  # type: ignore[union-attr]


def settled_anon_mib(d: Daemon, below: float, wait_s: float = 10.0) -> float:
    """The daemon's anonymous resident memory once it is below ``below`` (the release after a big insert runs
    in the background), or what it is after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while (now := anon_mib(d)) >= below and time.monotonic() < deadline:
        time.sleep(0.2)
    return now


def test_the_memory_of_big_inserts_is_given_back(zookeeper: ZooKeeperServer, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """After big inserts (parsed and written in worker threads) the daemon's anonymous memory returns to
    about what it was before them: the daemon runs glibc's malloc with one arena
    (replicad.memory.limit_malloc_arenas), so the trim after an insert reaches the free space the worker
    threads left (with an arena per thread, as glibc's default, about 60 MiB stayed resident)."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    chroot = make_chroot(zookeeper, "arenas")
    d = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    try:
        ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", rows(0, 20_000)))  # parsers loaded, caches made
        before = settled_anon_mib(d, below=0.0, wait_s=1.0)
        body = rows(100_000, 600_000)  # ~33 MB
        for _ in range(3):
            ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", body, insert_deduplicate=0))
        assert ok(query(d.url, f"SELECT count() FROM {TABLE}")).text == "1820000\n"
        after = settled_anon_mib(d, below=before + 20)
        assert after < before + 20, f"anonymous memory {before:.0f} -> {after:.0f} MiB after the inserts"
        assert d.stop() == 0
    finally:
        if d.running:
            d.kill()


def wakeups(pid: int) -> int:
    """Voluntary context switches of all the process's threads: each is a sleep, ended by a wake-up."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # a thread that just ended
        total += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    return total


def test_an_idle_daemon_sleeps(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """A daemon whose replicated table sees no insert wakes about twice a second (ZooKeeper's pings, the event
    loop monitor's idle period), not ten times (a 100 ms timer: each wake-up costs ~0.2 ms of CPU on a
    virtual machine, nine tenths of an idle daemon's CPU)."""
    chroot = make_chroot(zookeeper, "idle")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    try:
        ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", rows(0, 10)))
        assert r1.proc is not None
        time.sleep(6)  # start-up work and the insert's aftermath settle
        before, started = wakeups(r1.proc.pid), time.monotonic()
        time.sleep(8)
        rate = (wakeups(r1.proc.pid) - before) / (time.monotonic() - started)
        assert rate < 5, f"an idle daemon woke {rate:.1f} times a second"
        assert ok(query(r1.url, f"SELECT count() FROM {TABLE}")).text == "10\n"  # asleep, not stuck
        assert r1.stop() == 0
    finally:
        if r1.running:
            r1.kill()
