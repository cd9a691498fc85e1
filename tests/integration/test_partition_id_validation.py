"""A hostile partition ID never reaches ZooKeeper, and a bad ``block_numbers`` child left by anyone (an old
bug, a hand edit) cannot break mutations and TRUNCATE for good."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, one_daemon, query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLE = "db.pid"
ZK_PATH = "/clickhouse/tables/01/pid"
DDL = ("CREATE TABLE IF NOT EXISTS db.pid (d Date, k UInt64) ENGINE = "
       f"ReplicatedMergeTree('{ZK_PATH}', '{{replica}}') PARTITION BY toYYYYMM(d) ORDER BY k")


@pytest.fixture
def daemon(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> Iterator[Daemon]:
    yield from one_daemon(tmp_path, zookeeper, zk_root, DDL, TABLE)


@pytest.fixture
def zk(zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.hosts + zk_root)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def block_numbers(zk: KazooClient) -> list[str]:
    return sorted(zk.get_children(f"{ZK_PATH}/block_numbers"))


@pytest.mark.parametrize("bad", ["x\ty", "x\\ty", "a/b", "..", "a_b", "", "x" * 200, "😀", "a b"])
def test_bad_partition_ids_are_refused_before_zookeeper(daemon: Daemon, zk: KazooClient, bad: str) -> None:
    ok(query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-01-01\t1\n"))
    before = block_numbers(zk)
    quoted = bad.replace("\\", "\\\\").replace("'", "\\'")
    for stmt in (f"ALTER TABLE {TABLE} DROP PARTITION ID '{quoted}'",
                 f"ALTER TABLE {TABLE} DETACH PARTITION ID '{quoted}'",
                 f"OPTIMIZE TABLE {TABLE} PARTITION ID '{quoted}' FINAL",
                 f"ALTER TABLE {TABLE} ATTACH PARTITION ID '{quoted}'"):
        r = query(daemon.url, stmt, post=True)
        assert 400 <= r.status < 500, (stmt, r.status, r.text)
        assert r.text.startswith("Code: "), r.text
    assert block_numbers(zk) == before
    # and everything still works
    ok(query(daemon.url, f"ALTER TABLE {TABLE} DELETE WHERE k = 1", post=True, mutations_sync=1))
    ok(query(daemon.url, f"TRUNCATE TABLE {TABLE}", post=True))


def test_a_bad_block_numbers_child_does_not_break_mutations_or_truncate(daemon: Daemon,
                                                                         zk: KazooClient) -> None:
    ok(query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-01-01\t1\n2024-02-01\t2\n"))
    zk.create(f"{ZK_PATH}/block_numbers/x\\ty")  # what a validation bug once left behind
    zk.create(f"{ZK_PATH}/block_numbers/a b_c")
    ok(query(daemon.url, f"ALTER TABLE {TABLE} DELETE WHERE k = 1", post=True, mutations_sync=1))
    assert ok(query(daemon.url, f"SELECT k FROM {TABLE}")).text == "2\n"
    ok(query(daemon.url, f"TRUNCATE TABLE {TABLE}", post=True))
    assert ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text == "0\n"
    ok(query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-03-01\t3\n"))
    assert ok(query(daemon.url, f"SELECT k FROM {TABLE}")).text == "3\n"
