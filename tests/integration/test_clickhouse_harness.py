"""The test harness itself: two real ClickHouse 18.16 replicas on the test ZooKeeper replicate."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from replicad.devtools.clickhouse import ClickHouseError, ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(180)]

DDL = (
    "CREATE TABLE default.t (d Date, k UInt64, s String) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') "
    "PARTITION BY toYYYYMM(d) ORDER BY k"
)
ROWS = b"2024-01-02\t1\ta\n2024-02-03\t2\tb\n2024-02-04\t3\tc\n"


def _listening_sockets() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket (IPv4 and IPv6), from /proc/net."""
    out: set[tuple[str, int]] = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr, port = fields[1].split(":")
            out.add((addr, int(port, 16)))
    return out


def test_two_replicas_replicate_through_zookeeper(
    clickhouse_factory: Callable[..., ClickHouseServer], zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    r1 = clickhouse_factory("r1")
    r2 = clickhouse_factory("r2")
    assert r1.start_seconds is not None and r1.start_seconds < 10

    assert r1.query("SELECT version()").startswith("18.16")
    assert r2.query("SELECT timezone()").strip() in ("UTC", "Etc/UTC")
    assert r2.query("SELECT substitution FROM system.macros WHERE macro = 'replica'") == "r2\n"

    r1.query(DDL)
    r2.query(DDL)
    r1.query("INSERT INTO default.t FORMAT TSV", data=ROWS)
    r2.sync_replica("default.t")
    assert r2.query("SELECT d, k, s FROM default.t ORDER BY k FORMAT TSV").encode() == ROWS
    assert r2.query_rows("SELECT total_replicas, active_replicas FROM system.replicas") == [["2", "2"]]

    # the parts are on r2's disk, fetched from r1
    parts = sorted(p.name for p in r2.table_dir("default", "t").iterdir() if p.name[:1].isdigit())
    assert parts == ["202401_0_0_0", "202402_0_0_0"]

    # ZooKeeper holds the 18.16 layout under this test's root
    tree = zookeeper.dump_tree(zk_root)
    for needle in (
        "clickhouse",
        "replicas = 'last added replica: r2'",
        "log-0000000000 = 'format version: 4\\n",
        "is_active",
        "202402_0_0_0",
    ):
        assert needle in tree, tree

    # nothing listens beyond loopback (127.0.0.1 = 0100007F in /proc/net/tcp)
    ports = {r.http_port for r in (r1, r2)} | {r.tcp_port for r in (r1, r2)}
    ports |= {r.interserver_port for r in (r1, r2)}
    listening = _listening_sockets()
    for port in ports:
        addrs = {a for a, p in listening if p == port}
        assert addrs == {"0100007F"}, (port, addrs)

    with pytest.raises(ClickHouseError) as err:
        r1.query("SELECT * FROM default.no_such_table")
    assert err.value.code == 60 and err.value.status >= 400


def test_interserver_credentials_and_restart(
    clickhouse_factory: Callable[..., ClickHouseServer],
) -> None:
    creds = ("replicator", "s3cret")
    r1 = clickhouse_factory("r1", interserver_credentials=creds)
    r2 = clickhouse_factory("r2", interserver_credentials=creds)
    for r in (r1, r2):
        r.query(DDL)
    r1.query("INSERT INTO default.t FORMAT TSV", data=ROWS)
    r2.sync_replica("default.t")
    assert r2.query("SELECT count() FROM default.t") == "3\n"

    # kill -9 and start again: the data and the replica come back
    r2.kill()
    r1.query("INSERT INTO default.t FORMAT TSV", data=b"2024-03-01\t4\td\n")
    t0 = time.monotonic()
    r2.start()
    r2.sync_replica("default.t")
    assert r2.query("SELECT count() FROM default.t") == "4\n"
    assert time.monotonic() - t0 < 60
