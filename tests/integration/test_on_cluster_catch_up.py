"""A host that is down during an ``ALTER … ON CLUSTER`` of the replicated table catches up when it comes
back: a ClickHouse 18.16 server and two replicad daemons, one daemon stopped.  The ALTER runs once for the
shard (the executor waits only for the active replicas), the initiator reports the missing host after
``distributed_ddl_task_timeout`` (159); rows inserted meanwhile carry the new column.  The daemon, started
again, follows the table's new columns, answers the task it missed with 0 without running it a second time
(``shards/<…>/executed`` is there), and every replica ends with the same rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from replicad.devtools.clickhouse import ClickHouseError, ClickHouseServer
from replicad.devtools.daemon import Daemon
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.integration.test_on_cluster import QUEUE, ch_cluster_xml, rd_rows, status_rows, wait
from tests.support.replicad_daemon import ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(400)]

CREATE = ("CREATE TABLE db.t ON CLUSTER c3 (d Date, k UInt64, v String) ENGINE = "
          "ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') PARTITION BY toYYYYMM(d) "
          "ORDER BY k")


def test_a_daemon_down_during_an_alter_on_cluster_catches_up(
    clickhouse_factory: Callable[..., ClickHouseServer], zookeeper: ZooKeeperServer, zk_root: str,
    tmp_path: Path,
) -> None:
    ch1 = clickhouse_factory("ch1", start=False)
    rd_ports = [free_port(), free_port()]
    hosts = [f"127.0.0.1:{ch1.tcp_port}"] + [f"127.0.0.1:{p}" for p in rd_ports]
    ch1.extra_config = ch_cluster_xml(hosts).replace("<c4>", "<c3>").replace("</c4>", "</c3>")
    ch1.start()

    def extra(port: int) -> dict[str, Any]:
        return {"clusters": {"c3": [{"replicas": hosts, "internal_replication": True}]},
                "distributed_ddl": {"host": "127.0.0.1", "port": port, "path": QUEUE}}

    rds: list[Daemon] = [start_daemon(tmp_path, zookeeper, zk_root, f"rd{i + 1}", extra=extra(p))
                         for i, p in enumerate(rd_ports)]
    zk = KazooClient(hosts=zookeeper.hosts + zk_root)
    zk.start(15)
    try:
        assert set(status_rows(ch1.query("CREATE DATABASE db ON CLUSTER c3")).values()) == {0}
        assert status_rows(ch1.query(CREATE)) == {h: 0 for h in hosts}
        ch1.query("INSERT INTO db.t VALUES ('2024-01-01', 1, 'a'), ('2024-01-02', 2, 'b')")
        ok(query(rds[0].url, "INSERT INTO db.t FORMAT TSV", b"2024-02-01\t3\tc\n", post=True))
        for d in rds:
            ok(query(d.url, "SYSTEM SYNC REPLICA db.t", post=True))
        ch1.query("SYSTEM SYNC REPLICA db.t")

        # ---- rd2 is down during the ALTER: the others apply it, the initiator times out on rd2
        rds[1].stop()
        rd2_id = f"127%2E0%2E0%2E1:{rd_ports[1]}"
        with pytest.raises(ClickHouseError) as e:
            ch1.query("ALTER TABLE db.t ON CLUSTER c3 ADD COLUMN c UInt32 DEFAULT k * 10",
                      settings={"distributed_ddl_task_timeout": 15, "wait_end_of_query": 1})
        assert e.value.code == 159 and "There are 1 unfinished hosts" in str(e.value), e.value
        [task] = [n for n in sorted(zk.get_children(QUEUE)) if b"ADD COLUMN" in zk.get(f"{QUEUE}/{n}")[0]]
        node = f"{QUEUE}/{task}"
        assert set(zk.get_children(f"{node}/finished")) == {h.replace(".", "%2E") for h in hosts} - {rd2_id}
        [shard] = zk.get_children(f"{node}/shards")
        executor = zk.get(f"{node}/shards/{shard}/executed")[0].decode()
        assert executor != rd2_id
        ch1.query("INSERT INTO db.t (d, k, v, c) VALUES ('2024-03-01', 4, 'd', 7)")
        ok(query(rds[0].url, "INSERT INTO db.t (d, k, v, c) FORMAT TSV", b"2024-03-02\t5\te\t8\n", post=True))
        expected = [["1", "a", "10"], ["2", "b", "20"], ["3", "c", "30"], ["4", "d", "7"], ["5", "e", "8"]]
        ch1.query("SYSTEM SYNC REPLICA db.t")
        rows = ch1.query("SELECT k, v, c FROM db.t ORDER BY k").splitlines()
        assert [r.split("\t") for r in rows] == expected
        ok(query(rds[0].url, "SYSTEM SYNC REPLICA db.t", post=True))
        assert sorted(rd_rows(rds[0], "SELECT k, v, c FROM db.t")) == expected

        # ---- rd2 comes back: follows the columns, answers the missed task (0), runs nothing twice
        rds[1] = start_daemon(tmp_path, zookeeper, zk_root, "rd2", extra=extra(rd_ports[1]))
        wait(lambda: zk.exists(f"{node}/finished/{rd2_id}"), "rd2 to answer the ALTER it missed")
        assert zk.get(f"{node}/finished/{rd2_id}")[0] == b"0\n"
        assert zk.get(f"{node}/shards/{shard}/executed")[0].decode() == executor
        table = "/clickhouse/tables/01/t"
        wait(lambda: zk.get(f"{table}/replicas/rd2/columns")[0] == zk.get(f"{table}/columns")[0],
             "rd2 to publish the new columns")
        ok(query(rds[1].url, "SYSTEM SYNC REPLICA db.t", post=True))
        assert sorted(rd_rows(rds[1], "SELECT k, v, c FROM db.t")) == expected
        described = [r[:4] for r in rd_rows(rds[1], "DESCRIBE TABLE db.t")]
        assert described[-1] == ["c", "UInt32", "DEFAULT", "CAST(k * 10, \\'UInt32\\')"], described
        # and it takes part in the next DDL normally
        out = ch1.query("ALTER TABLE db.t ON CLUSTER c3 DROP COLUMN c")
        assert status_rows(out) == {h: 0 for h in hosts}, out
        for d in rds:
            assert sorted(rd_rows(d, "SELECT k, v FROM db.t")) == [r[:2] for r in expected]
            assert "c" not in [r[0] for r in rd_rows(d, "DESCRIBE TABLE db.t")]
    finally:
        zk.stop()
        for d in rds:
            d.kill()
