"""Distributed DDL ``… ON CLUSTER`` across two ClickHouse 18.16 servers and two replicad daemons sharing
ZooKeeper's task queue (one shard, internal replication, four replicas).

DDL initiated on ClickHouse reaches the replicad daemons and the other way round; an ALTER of the replicated
table runs once for the shard (``shards/<…>/executed``) and every replica follows it; a replicad daemon
stopped during a DDL runs it when it comes back; hostile task entries are refused and marked failed under
the daemon's own id (or ignored when they do not list it), never executed partially."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from replicad.devtools.clickhouse import ClickHouseError, ClickHouseServer
from replicad.devtools.daemon import Daemon
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(600)]

QUEUE = "/clickhouse/task_queue/ddl"
CREATE = ("CREATE TABLE db.t ON CLUSTER c4 (d Date, k UInt64, v String) ENGINE = "
          "ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') "
          "PARTITION BY toYYYYMM(d) ORDER BY k")


def ch_cluster_xml(hosts: list[str]) -> str:
    replicas = "".join(f"<replica><host>{h.split(':')[0]}</host><port>{h.split(':')[1]}</port></replica>"
                       for h in hosts)
    return (f"<remote_servers><c4><shard><internal_replication>true</internal_replication>{replicas}</shard>"
            f"</c4></remote_servers><distributed_ddl><path>{QUEUE}</path></distributed_ddl>")


def wait(cond: Callable[[], Any], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def rd_rows(d: Daemon, sql: str) -> list[list[str]]:
    return [line.split("\t") for line in ok(query(d.url, sql)).text.splitlines()]


def status_rows(text: str) -> dict[str, int]:
    return {f"{r[0]}:{r[1]}": int(r[2]) for r in (line.split("\t") for line in text.splitlines())}


def test_on_cluster_between_clickhouse_and_replicad(
    clickhouse_factory: Callable[..., ClickHouseServer], zookeeper: ZooKeeperServer, zk_root: str,
    tmp_path: Path,
) -> None:
    chs = [clickhouse_factory(f"ch{i}", start=False) for i in (1, 2)]
    rd_ports = [free_port(), free_port()]
    hosts = [f"127.0.0.1:{c.tcp_port}" for c in chs] + [f"127.0.0.1:{p}" for p in rd_ports]
    for c in chs:
        c.extra_config = ch_cluster_xml(hosts)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda c: c.start(), chs))
    ch1, ch2 = chs

    def extra(port: int) -> dict[str, Any]:
        return {"clusters": {"c4": [{"replicas": hosts, "internal_replication": True}]},
                "distributed_ddl": {"host": "127.0.0.1", "port": port, "path": QUEUE,
                                    "cleanup_delay_period": 0}}

    rds = [start_daemon(tmp_path, zookeeper, zk_root, f"rd{i + 1}", extra=extra(p))
           for i, p in enumerate(rd_ports)]
    rd1, rd2 = rds
    zk = KazooClient(hosts=zookeeper.hosts + zk_root)
    zk.start(15)
    try:
        # ---- ClickHouse initiates: CREATE DATABASE, CREATE TABLE reach the replicad daemons
        out = ch1.query("CREATE DATABASE db ON CLUSTER c4")
        assert set(status_rows(out).values()) == {0} and len(status_rows(out)) == 4, out
        out = ch1.query(CREATE)
        assert status_rows(out) == {h: 0 for h in hosts}, out
        for d in rds:
            assert rd_rows(d, "SELECT count() FROM db.t") == [["0"]]
        ch2.query("INSERT INTO db.t VALUES ('2024-01-01', 1, 'a'), ('2024-01-02', 2, 'b')")
        ok(query(rd1.url, "INSERT INTO db.t FORMAT TSV", b"2024-02-01\t3\tc\n"))
        for d in rds:
            ok(query(d.url, "SYSTEM SYNC REPLICA db.t", post=True))
        ch1.query("SYSTEM SYNC REPLICA db.t")

        # ---- replicad initiates an ALTER: executed once for the shard, followed by every replica
        r = ok(query(rd2.url, "ALTER TABLE db.t ON CLUSTER c4 ADD COLUMN c UInt8 DEFAULT 5", post=True))
        assert status_rows(r.text) == {h: 0 for h in hosts}, r.text
        [task] = [n for n in sorted(zk.get_children(QUEUE)) if b"ADD COLUMN" in zk.get(f"{QUEUE}/{n}")[0]]
        entry = zk.get(f"{QUEUE}/{task}")[0].decode()
        assert entry.startswith("version: 1\nquery: ALTER TABLE db.t ON CLUSTER c4 ADD COLUMN c UInt8 "
                                "DEFAULT 5\nhosts: ['127%2E0%2E0%2E1:"), entry
        [shard] = zk.get_children(f"{QUEUE}/{task}/shards")
        assert shard == ",".join(sorted(hosts))
        assert zk.get(f"{QUEUE}/{task}/shards/{shard}/executed")[0].decode() in {
            h.replace(".", "%2E") for h in hosts}
        for c in chs:
            assert c.query("SELECT k, c FROM db.t ORDER BY k") == "1\t5\n2\t5\n3\t5\n"
        for d in rds:
            assert sorted(rd_rows(d, "SELECT k, c FROM db.t")) == [["1", "5"], ["2", "5"], ["3", "5"]]

        # ---- a replicad daemon stopped during a DDL runs it when it comes back
        rd2.stop()
        with pytest.raises(ClickHouseError) as e:
            ch1.query("CREATE TABLE db.t2 ON CLUSTER c4 (k UInt64) ENGINE = "
                      "ReplicatedMergeTree('/clickhouse/tables/{shard}/t2', '{replica}') ORDER BY k",
                      settings={"distributed_ddl_task_timeout": 5, "wait_end_of_query": 1})
        assert e.value.code == 159 and "There are 1 unfinished hosts" in str(e.value)
        rd2 = start_daemon(tmp_path, zookeeper, zk_root, "rd2", extra=extra(rd_ports[1]))
        rds[1] = rd2
        [t2] = [n for n in sorted(zk.get_children(QUEUE)) if b"db.t2" in zk.get(f"{QUEUE}/{n}")[0]]
        rd2_id = f"127%2E0%2E0%2E1:{rd_ports[1]}"
        wait(lambda: zk.exists(f"{QUEUE}/{t2}/finished/{rd2_id}"), "rd2 to run the task it missed")
        assert zk.get(f"{QUEUE}/{t2}/finished/{rd2_id}")[0] == b"0\n"
        assert rd_rows(rd2, "SELECT count() FROM db.t2") == [["0"]]

        # ---- hostile entries: refused and marked failed under the daemon's id, or left alone
        rd1_id = f"127%2E0%2E0%2E1:{rd_ports[0]}"

        def task(text: bytes) -> str:
            return zk.create(f"{QUEUE}/query-", text, sequence=True)

        not_listed = task(b"version: 1\nquery: DROP TABLE db.t ON CLUSTER c4\nhosts: ['nohost:1']\n"
                          b"initiator: x:1\n")
        select = task(f"version: 1\nquery: SELECT 1\nhosts: ['{rd1_id}']\ninitiator: x:1\n".encode())
        v2 = task(f"version: 2\nquery: DROP TABLE db.t ON CLUSTER c4\nhosts: ['{rd1_id}']\n".encode())
        key = task(f"version: 1\nquery: ALTER TABLE db.t ON CLUSTER c4 DROP COLUMN k, DROP COLUMN v\n"
                   f"hosts: ['{rd1_id}']\ninitiator: x:1\n".encode())
        wait(lambda: zk.exists(f"{key}/finished/{rd1_id}"), "rd1 to answer the hostile tasks")
        status = {n: zk.get(f"{n}/finished/{rd1_id}")[0].decode() for n in (select, v2, key)}
        assert status[select].startswith("78\nAn error occured before execution: Code: 78, "), status
        assert status[v2].startswith("287\nCode: 287, e.displayText() = DB::Exception: Unknown DDLLogEntry "
                                     "format version: 2"), status
        assert status[key].startswith("44\nCode: 44, e.displayText() = DB::Exception: trying to ALTER key "
                                      "column k"), status
        assert not zk.exists(f"{not_listed}/finished/{rd1_id}")
        assert not zk.get_children(f"{not_listed}/finished")
        for d in rds:  # nothing ran: the table and its columns are intact
            assert sorted(rd_rows(d, "SELECT k, v FROM db.t")) == [["1", "a"], ["2", "b"], ["3", "c"]]

        # ---- replicad initiates DROP TABLE: gone everywhere
        r = ok(query(rd1.url, "DROP TABLE db.t ON CLUSTER c4", post=True))
        assert status_rows(r.text) == {h: 0 for h in hosts}, r.text
        for c in chs:
            assert c.query("EXISTS TABLE db.t").strip() == "0"
        for d in rds:
            assert query(d.url, "SELECT count() FROM db.t").status == 404
    finally:
        zk.stop()
        zk.close()
        for d in rds:
            d.kill()
