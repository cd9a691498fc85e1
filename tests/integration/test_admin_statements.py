"""Admin statements with real daemons and a real ZooKeeper: ATTACH PART/PARTITION from ``detached/`` (checked,
committed, fetched by the other replica), DROP DETACHED, SYSTEM DROP REPLICA, SYSTEM RESTART REPLICA,
SYSTEM STOP/START FETCHES|MERGES — and the hostile variants (bad names, broken or foreign parts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "db.adm"
DDL = ("CREATE TABLE IF NOT EXISTS db.adm (d Date, k UInt64, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/adm', '{replica}') PARTITION BY toYYYYMM(d) ORDER BY k")


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> Iterator[list[Daemon]]:
    ds = [start_daemon(tmp_path, zookeeper, zk_root, n, tables=[DDL], wait_table=TABLE) for n in ("r1", "r2")]
    try:
        yield ds
    finally:
        for d in ds:
            d.kill()


def rows(d: Daemon) -> list[int]:
    return sorted(int(x) for x in ok(query(d.url, f"SELECT k FROM {TABLE}")).text.split())


def insert(d: Daemon, first: int, n: int, month: int = 1) -> None:
    body = "".join(f"2024-{month:02d}-01\t{k}\tv{k}\n" for k in range(first, first + n)).encode()
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", body))


def run(d: Daemon, sql: str) -> Any:
    return query(d.url, sql, post=True)


def wait(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def detached(d: Daemon) -> list[str]:
    path = d.data_path / "data" / "db" / "adm" / "detached"
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def sync(d: Daemon) -> None:
    ok(run(d, f"SYSTEM SYNC REPLICA {TABLE}"))


def test_attach_partition_and_part_from_detached(pair: list[Daemon]) -> None:
    r1, r2 = pair
    insert(r1, 0, 100, month=1)
    insert(r1, 100, 100, month=1)
    insert(r1, 200, 50, month=2)
    sync(r2)
    ok(run(r1, f"ALTER TABLE {TABLE} DETACH PARTITION 202401"))
    sync(r2)
    wait(lambda: rows(r1) == rows(r2) == list(range(200, 250)), "detach on both")
    assert len(detached(r1)) == 2 and len(detached(r2)) == 2
    # one part by name, then the rest of the partition
    first = detached(r1)[0]
    ok(run(r1, f"ALTER TABLE {TABLE} ATTACH PART '{first}'"))
    assert first not in detached(r1)
    ok(run(r1, f"ALTER TABLE {TABLE} ATTACH PARTITION 202401"))
    assert detached(r1) == []
    sync(r2)
    wait(lambda: rows(r1) == rows(r2) == list(range(250)), "attached rows on both replicas")
    # r2 fetched the attached parts; its own detached copies stay where they are (as in ClickHouse)
    assert len(detached(r2)) == 2
    parts = ok(request(r1.url, f"/tables/{TABLE}/parts")).json()
    assert all(p["level"] == 0 for p in parts if p["active"] and p["partition_id"] == "202401")


def test_attach_refuses_hostile_names_broken_and_foreign_parts(pair: list[Daemon]) -> None:
    r1, r2 = pair
    insert(r1, 0, 100)
    ok(run(r1, f"ALTER TABLE {TABLE} DETACH PARTITION 202401"))
    sync(r2)
    wait(lambda: len(detached(r1)) == 1, "detached")
    name = detached(r1)[0]
    for bad, code in (("../../metadata", 233), ("/etc", 233), ("all_1_1_0", 232), ("202401_9_9_0", 232)):
        r = run(r1, f"ALTER TABLE {TABLE} ATTACH PART '{bad}'")
        assert (r.status, r.exception_code) == (400, code), (bad, r.text)
        assert "/work" not in r.text and str(r1.data_path) not in r.text
    # a flipped byte in a column file: refused, the part stays detached under its name, nothing attached
    part = r1.data_path / "data" / "db" / "adm" / "detached" / name
    col = part / "k.bin"
    data = bytearray(col.read_bytes())
    data[-1] ^= 0xFF
    col.write_bytes(bytes(data))
    r = run(r1, f"ALTER TABLE {TABLE} ATTACH PART '{name}'")
    assert r.status == 400 and "broken" in r.text, r.text
    assert detached(r1) == [name] and rows(r1) == []
    data[-1] ^= 0xFF
    col.write_bytes(bytes(data))
    # other columns than the table's: refused too
    cols = part / "columns.txt"
    original = cols.read_text()
    cols.write_text(original.replace("`s` String", "`s` UInt8"))
    r = run(r1, f"ALTER TABLE {TABLE} ATTACH PART '{name}'")
    assert r.status == 400, r.text
    assert detached(r1) == [name] and rows(r1) == []
    cols.write_text(original)
    ok(run(r1, f"ALTER TABLE {TABLE} ATTACH PART '{name}'"))
    sync(r2)
    wait(lambda: rows(r1) == rows(r2) == list(range(100)), "attached after repair")
    # DROP DETACHED: only names inside detached/
    assert run(r2, f"ALTER TABLE {TABLE} DROP DETACHED PART '../adm'").status == 400
    assert (r2.data_path / "data" / "db" / "adm").is_dir()
    ok(run(r2, f"ALTER TABLE {TABLE} DROP DETACHED PARTITION 202401"))
    assert detached(r2) == []


def test_stop_and_start_fetches_and_merges(pair: list[Daemon]) -> None:
    r1, r2 = pair
    ok(run(r2, f"SYSTEM STOP FETCHES {TABLE}"))
    insert(r1, 0, 10)
    insert(r1, 10, 10)
    time.sleep(2.0)
    assert rows(r2) == []  # nothing fetched while stopped, and nothing failed: the entries wait
    queue = ok(request(r2.url, f"/tables/{TABLE}/queue")).json()
    assert len(queue) == 2 and all("fetches are stopped" in q["postpone_reason"] for q in queue), queue
    assert all(q["num_tries"] == 0 and not q["last_exception"] for q in queue), queue
    ok(run(r2, "SYSTEM START FETCHES"))  # no table: every table
    wait(lambda: rows(r2) == list(range(20)), "fetched after START FETCHES", 20)
    ok(run(r2, f"SYSTEM STOP MERGES {TABLE}"))
    # (replication_alter_partitions_sync=0: OPTIMIZE would otherwise wait for r2, whose merges are stopped)
    ok(query(r1.url, f"OPTIMIZE TABLE {TABLE} FINAL", post=True, replication_alter_partitions_sync=0))
    wait(lambda: any(q["type"] == "MERGE_PARTS" and "merges are stopped" in q["postpone_reason"]
                     for q in ok(request(r2.url, f"/tables/{TABLE}/queue")).json()), "merge waits on r2")
    ok(run(r2, f"SYSTEM START MERGES {TABLE}"))
    sync(r2)
    active = [p["name"] for p in ok(request(r2.url, f"/tables/{TABLE}/parts")).json() if p["active"]]
    assert len(active) == 1 and rows(r2) == list(range(20))


def test_drop_replica_and_restart_replica(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
                                           pair: list[Daemon]) -> None:
    r1, r2 = pair
    r3 = start_daemon(tmp_path, zookeeper, zk_root, "r3", tables=[DDL], wait_table=TABLE)
    insert(r1, 0, 10)
    r3.stop()  # gone for good: its is_active is removed, its replicas/r3 stays and pins the log
    for target, what in (("r1", "local replica"), ("r2", "active"), ("nope", "does not exist")):
        r = run(r1, f"SYSTEM DROP REPLICA '{target}' FROM TABLE {TABLE}")
        assert r.status == 400 and r.exception_code == 305 and what in r.text, (target, r.text)
    ok(run(r1, f"SYSTEM DROP REPLICA 'r3' FROM TABLE {TABLE}"))
    view = ok(request(r1.url, "/status")).json()["tables"][TABLE]["replicas"]
    assert sorted(v["name"] for v in view) == ["r1", "r2"]
    ok(run(r2, f"SYSTEM RESTART REPLICA {TABLE}"))
    status = ok(request(r2.url, "/status")).json()["tables"][TABLE]
    assert status["is_readonly"] is False and status["restarting"]["startups_total"] >= 2
    insert(r2, 10, 10)
    sync(r1)
    wait(lambda: rows(r1) == rows(r2) == list(range(20)), "replicating after the restart")
