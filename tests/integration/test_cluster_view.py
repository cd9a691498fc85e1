"""The cluster view: ``/status`` lists every replica of each table from ZooKeeper (replicad and ClickHouse
18.16 alike), ``replicad status`` prints it, and ``replicad status --check`` fails when the replica is not
healthy."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from replicad.devtools.daemon import Daemon, daemon_env
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
TABLE = "db.view"
DDL = ("CREATE TABLE IF NOT EXISTS db.view (d Date, k UInt64) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/view', '{replica}') PARTITION BY toYYYYMM(d) ORDER BY k")


def status_cli(d: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicad", "status", "--url", d.url, *args], cwd=REPO,
                          env=daemon_env(), capture_output=True, text=True, timeout=60)


def replicas(d: Daemon) -> dict[str, dict[str, Any]]:
    body = ok(request(d.url, "/status")).json()
    return {r["name"]: r for r in body["tables"][TABLE]["replicas"]}


@pytest.mark.clickhouse
def test_status_lists_every_replica_with_its_kind(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
                                                  clickhouse_factory: Any) -> None:
    r1 = start_daemon(tmp_path, zookeeper, zk_root, "r1", tables=[DDL], wait_table=TABLE)
    r2 = start_daemon(tmp_path, zookeeper, zk_root, "r2", tables=[DDL], wait_table=TABLE)
    try:
        ch = clickhouse_factory("ch3")
        ch.query("CREATE DATABASE IF NOT EXISTS db")
        ch.query(DDL.replace("{replica}", "ch3"))
        ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-01-01\t1\n2024-01-02\t2\n"))
        ch.sync_replica(TABLE)
        view = replicas(r1)
        assert set(view) == {"r1", "r2", "ch3"}
        assert {n: v["kind"] for n, v in view.items()} == {"r1": "replicad", "r2": "replicad",
                                                            "ch3": "clickhouse"}
        assert all(v["active"] for v in view.values())
        assert sum(v["is_leader"] for v in view.values()) == 1  # 18.16 elects one leader
        # r2 pulls the insert's log entry on its own time (a loaded machine: seconds); the view shows it then
        deadline = time.monotonic() + 60
        while not all(v["log_pointer"] >= 1 for v in view.values()):
            assert time.monotonic() < deadline, f"log pointers still {view} after 60 s"
            time.sleep(0.2)
            view = replicas(r1)
        assert replicas(r2) == view or set(replicas(r2)) == set(view)
        out = status_cli(r1, "--check")
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        header = next(i for i, ln in enumerate(lines) if ln.split()[:3] == ["replica", "kind", "active"])
        rows = {ln.split()[0]: ln.split() for ln in lines[header + 1:header + 4]}
        assert rows["ch3"][1] == "clickhouse" and rows["r2"][1] == "replicad" and rows["r1"][2] == "yes"
        assert "healthy" in out.stdout
        # a stopped replica shows as not active on the others
        r2.kill()
        deadline = time.monotonic() + 60
        while replicas(r1)["r2"]["active"]:
            assert time.monotonic() < deadline, "r2 still active 60 s after kill -9 (session timeout)"
            time.sleep(1)
    finally:
        r1.kill()
        r2.kill()


def test_status_check_fails_when_the_replica_is_read_only(zookeeper: ZooKeeperServer, zk_root: str,
                                                         tmp_path: Path) -> None:
    r1 = start_daemon(tmp_path, zookeeper, zk_root, "r1", tables=[DDL], wait_table=TABLE)
    try:
        assert status_cli(r1, "--check").returncode == 0
        zookeeper.stop()
        try:
            deadline = time.monotonic() + 90
            while True:
                out = status_cli(r1, "--check")
                if out.returncode == 3:
                    break
                assert time.monotonic() < deadline, out.stdout + out.stderr
                time.sleep(1)
            assert "UNHEALTHY" in out.stderr and "ZooKeeper session is" in out.stderr
            plain = status_cli(r1)  # without --check the answer is the text, exit 0
            assert plain.returncode == 0
        finally:
            zookeeper.start()
        deadline = time.monotonic() + 90
        while status_cli(r1, "--check").returncode != 0:
            assert time.monotonic() < deadline, "not healthy again 90 s after ZooKeeper came back"
            time.sleep(1)
    finally:
        r1.kill()
