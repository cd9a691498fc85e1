"""Which tasks of the distributed DDL queue real replicad daemons take as theirs: as ClickHouse 18.16, by
resolution, not by spelling.  Two daemons on this machine differ only by port; a task listing a daemon as
``127.0.0.1:<port>``, ``localhost:<port>`` or ``<hostname>:<port>`` is executed by that daemon (its
``finished/<id as listed>`` is 0) and not by the other; an id with another port is nobody's; hostile or
unresolvable host names are executed by nobody and do not hold up the next task; a task listing the same
daemon twice is answered under the first id only."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from replicad.ddl.entry import DDLEntry
from replicad.devtools.daemon import Daemon
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUE = "/clickhouse/task_queue/ddl"


def esc(host: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else f"%{ord(c):02X}" for c in host)


def submit(zk: KazooClient, table: str, hosts: list[str]) -> str:
    create = (f"CREATE TABLE db.{table} ON CLUSTER c (k UInt64) ENGINE = "
              f"ReplicatedMergeTree('/clickhouse/tables/{table}', '{{replica}}') ORDER BY k")
    path = zk.create(f"{QUEUE}/query-", DDLEntry(create, tuple(hosts), "test:0").to_bytes(), sequence=True)
    zk.ensure_path(f"{path}/active")
    zk.ensure_path(f"{path}/finished")
    return path


def finished(zk: KazooClient, task: str) -> dict[str, bytes]:
    return {n: zk.get(f"{task}/finished/{n}")[0] for n in zk.get_children(f"{task}/finished")}


def wait_finished(zk: KazooClient, task: str, ids: set[str], timeout: float = 30.0) -> dict[str, bytes]:
    deadline = time.monotonic() + timeout
    while set(finished(zk, task)) != ids:
        assert time.monotonic() < deadline, (task, finished(zk, task), ids)
        time.sleep(0.1)
    return finished(zk, task)


def has_table(d: Daemon, table: str) -> bool:
    r = query(d.url, f"SELECT count() FROM db.{table}")
    return r.status == 200


def test_tasks_are_matched_to_daemons_by_resolution(
    zk: KazooClient, zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
) -> None:
    p1, p2 = free_port(), free_port()
    cluster = {"c": [{"replicas": [f"127.0.0.1:{p1}", f"127.0.0.1:{p2}"], "internal_replication": True}]}
    ds: list[Daemon] = []
    try:
        for name, port in (("rd1", p1), ("rd2", p2)):
            ds.append(start_daemon(tmp_path, zookeeper, zk_root, name, extra={
                "clusters": cluster,
                "distributed_ddl": {"host": "127.0.0.1", "port": port, "path": QUEUE}}))
        rd1, rd2 = ds

        # the configured spelling, and localhost, for rd1 only
        t = submit(zk, "a", [f"127%2E0%2E0%2E1:{p1}"])
        assert wait_finished(zk, t, {f"127%2E0%2E0%2E1:{p1}"}) == {f"127%2E0%2E0%2E1:{p1}": b"0\n"}
        t = submit(zk, "b", [f"localhost:{p1}"])
        assert wait_finished(zk, t, {f"localhost:{p1}"}) == {f"localhost:{p1}": b"0\n"}
        assert has_table(rd1, "a") and has_table(rd1, "b")
        assert not has_table(rd2, "a") and not has_table(rd2, "b")
        # this machine's host name and another loopback address, for rd2; a third port is nobody's
        me = esc(socket.gethostname())
        t = submit(zk, "c", [f"{me}:{p2}", f"localhost:{p2 + 1 if p2 + 1 != p1 else p2 + 2}"])
        assert wait_finished(zk, t, {f"{me}:{p2}"}) == {f"{me}:{p2}": b"0\n"}
        t = submit(zk, "d", [f"127%2E0%2E0%2E2:{p2}"])
        assert wait_finished(zk, t, {f"127%2E0%2E0%2E2:{p2}"}) == {f"127%2E0%2E0%2E2:{p2}": b"0\n"}
        assert has_table(rd2, "c") and has_table(rd2, "d") and not has_table(rd1, "c")

        # hostile and unresolvable names: nobody executes, and the next task is not held up
        hostile = submit(zk, "e", [f"nosuch%2Dhost%2Einvalid:{p1}", f"{'a' * 300}:{p1}", f"a%00b:{p1}",
                                   f"%2E%2E%2F%2E%2E:{p2}", f"203%2E0%2E113%2E9:{p2}", f"x%0Ay:{p2}", "junk"])
        t0 = time.monotonic()
        t = submit(zk, "f", [f"127%2E0%2E0%2E1:{p1}", f"127%2E0%2E0%2E1:{p2}"])
        wait_finished(zk, t, {f"127%2E0%2E0%2E1:{p1}", f"127%2E0%2E0%2E1:{p2}"})
        assert time.monotonic() - t0 < 10.0
        assert finished(zk, hostile) == {} and zk.get_children(f"{hostile}/active") == []
        assert not has_table(rd1, "e") and not has_table(rd2, "e")

        # the same daemon listed twice: answered under the first id only (as 18.16)
        t = submit(zk, "g", [f"localhost:{p1}", f"127%2E0%2E0%2E1:{p1}", f"127%2E0%2E0%2E1:{p2}"])
        assert wait_finished(zk, t, {f"localhost:{p1}", f"127%2E0%2E0%2E1:{p2}"}) == {
            f"localhost:{p1}": b"0\n", f"127%2E0%2E0%2E1:{p2}": b"0\n"}
        time.sleep(1.0)
        assert set(finished(zk, t)) == {f"localhost:{p1}", f"127%2E0%2E0%2E1:{p2}"}
        for d in ds:
            assert ok(query(d.url, "SELECT count() FROM db.g")).text == "0\n"
    finally:
        for d in ds:
            d.kill()
