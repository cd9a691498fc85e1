"""A full disk, for real: one replica's data path is a small tmpfs (root only; skipped elsewhere).

* an insert that does not fit answers 507 (code 243, retriable), writes no row and leaves no temporary
  directory; the daemon goes on answering and a small insert succeeds right after;
* a part fetched from the other replica that does not fit is refused before its bytes are written
  (NOT_ENOUGH_SPACE in the queue entry, no ``tmp-fetch_`` directory), the replica stays writable, and once
  there is room (the tmpfs grown) the fetch goes through and both replicas hold the same rows.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import make_chroot, ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLE = "db.full"
DDL = ("CREATE TABLE IF NOT EXISTS db.full (k UInt64, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/full', '{replica}') ORDER BY k")
SMALL = "16m"
BIG = 2500  # rows: ~25 MB on disk


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    return subprocess.run(mount, capture_output=True).returncode == 0


@pytest.fixture()
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[Daemon, Daemon, Path]]:
    small = tmp_path / "r2" / "data"
    if not _mount_tmpfs(small, SMALL):
        pytest.skip("needs root and tmpfs to make a small disk")
    chroot = make_chroot(zookeeper, "diskfull")
    daemons: list[Daemon] = []
    try:
        daemons.append(start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE))
        daemons.append(start_daemon(tmp_path, zookeeper, chroot, "r2", tables=[DDL], wait_table=TABLE))
        yield daemons[0], daemons[1], small
    finally:
        for d in daemons:
            d.kill()
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def _rows(n: int, start: int = 0) -> bytes:
    """``n`` rows of 20 kB hex text each (about 10 kB each on disk)."""
    return b"".join(b"%d\t%s\n" % (start + i, os.urandom(10_000).hex().encode()) for i in range(n))


def _count(d: Daemon) -> int:
    return int(ok(query(d.url, f"SELECT count() FROM {TABLE}")).text)


def _leftovers(small: Path) -> list[str]:
    table = small / "data" / "db" / "full"
    return sorted(p.name for p in table.iterdir() if p.name.startswith("tmp")) if table.exists() else []


def _leftover_bytes(small: Path) -> int:
    """Bytes in the files of the temporary directories (a directory made ahead holds empty files)."""
    table = small / "data" / "db" / "full"
    total = 0
    for name in _leftovers(small):
        for f in (table / name).rglob("*"):
            with contextlib.suppress(FileNotFoundError):
                total += f.stat().st_size if f.is_file() else 0
    return total


def test_inserts_and_fetches_on_a_full_disk(pair: tuple[Daemon, Daemon, Path]) -> None:
    r1, r2, small = pair
    # 1. an insert into the small disk that cannot fit: 507, nothing written, nothing left
    r = query(r2.url, f"INSERT INTO {TABLE} FORMAT TSV", _rows(BIG))
    assert r.status == 507 and r.exception_code == 243, r.text
    assert r.text.startswith("Code: 243.") and "/tmp" not in r.text, r.text
    assert _count(r2) == 0 and _count(r1) == 0
    assert _leftovers(small) == []
    ok(query(r2.url, f"INSERT INTO {TABLE} FORMAT TSV", _rows(10)))
    ok(query(r1.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True, timeout=60))
    assert _count(r1) == 10

    # 2. a part too big for r2's disk, inserted on r1: r2 refuses the fetch before writing it
    ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", _rows(BIG, start=100)))
    deadline = time.monotonic() + 60
    errors: list[str] = []
    while time.monotonic() < deadline and not errors:
        queue = ok(request(r2.url, f"/tables/{TABLE}/queue")).json()
        entries = queue if isinstance(queue, list) else queue.get("data", queue.get("queue", []))
        errors = [str(e.get("last_exception")) for e in entries
                  if "bytes free" in str(e.get("last_exception"))]
        time.sleep(0.5)
    assert errors, "the fetch that cannot fit was not refused for lack of space"
    assert "243" in errors[0] or "NOT_ENOUGH_SPACE" in errors[0] or "more bytes are needed" in errors[0]
    # the entry keeps being retried: a retry's directory exists while its request travels (made before the
    # answer says how big the part is), holding no byte of the part, and goes with the refusal
    deadline = time.monotonic() + 30
    while (left := _leftovers(small)) and time.monotonic() < deadline:
        assert _leftover_bytes(small) == 0, left
        time.sleep(0.05)
    assert left == []
    ok(query(r2.url, f"INSERT INTO {TABLE} FORMAT TSV", _rows(5, start=5000)))  # still writable

    # 3. room again: the fetch goes through, both replicas agree
    subprocess.run(["mount", "-o", "remount,size=200m", str(small)], check=True)
    ok(query(r2.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True, timeout=120))
    ok(query(r1.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True, timeout=120))
    assert _count(r2) == _count(r1) == 10 + BIG + 5
    assert _leftovers(small) == []
