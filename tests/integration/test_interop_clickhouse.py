"""replicad in one replica set with real ClickHouse 18.16 servers (same ZooKeeper, same table).

Two ClickHouse replicas create the table; replicad joins as the third replica (cloning the state of an
existing one, as 18.16 does for a new replica).  Parts inserted on ClickHouse are fetched by replicad and
parts inserted on replicad are fetched (and merged) by ClickHouse; both sides must end up with the same rows.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.replica import ReplicaEnv, TableReplica, TableSpec
from replicad.replication.fetcher import FetchCredentials
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.service import InsertSettings, TableName
from replicad.storage.writer import WriterSettings
from tests.support import table_cluster
from tests.support.table_cluster import LZ4, ZK_PATH, ch, events_spec

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(240)]

DDL = (
    "CREATE TABLE db.events (id Int32, ctime DateTime, name String) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
    "PARTITION BY toYYYYMM(ctime) ORDER BY id"
)


def spec(replica: str) -> TableSpec:
    """The table of DDL (its metadata and columns texts as 18.16 writes them)."""
    return events_spec(replica, [("id", "Int32"), ("ctime", "DateTime"), ("name", "String")])


def tsv(ids: range, month: int) -> bytes:
    return "".join(f"{i}\t2026-{month:02d}-{1 + i % 27:02d} 10:00:00\tch{i}\n" for i in ids).encode()


def arrow_rows(ids: range, month: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int32()),
            "ctime": pa.array([dt.datetime(2026, month, 1 + i % 27, 10) for i in ids], pa.timestamp("s")),
            "name": pa.array([f"rd{i}".encode() for i in ids], pa.binary()),
        }
    )


PLAIN = WriterSettings(fsync=False, threads=1)
wait_for = functools.partial(table_cluster.wait_for, timeout=60.0, poll=0.1)


async def replicad_env(
    zookeeper: ZooKeeperServer, zk_root: str, data: Path, writer: WriterSettings = LZ4,
    credentials: FetchCredentials | None = None,
) -> tuple[ReplicaEnv, Keeper, InterserverServer]:
    """An in-process replica's environment: its ZooKeeper session and interserver server (started), with
    ``credentials`` asked of peers and given to them."""
    keeper = Keeper(zookeeper.hosts, session_timeout_s=10.0, chroot=zk_root)
    await keeper.start()
    credentials = credentials or FetchCredentials()
    server = InterserverServer("127.0.0.1", 0, user=credentials.user, password=credentials.password)
    await server.start()
    env = ReplicaEnv(
        data_path=data,
        interserver=InterserverExchange(server),
        interserver_host="127.0.0.1",
        fsync=False,
        credentials=credentials,
        writer=writer,
    )
    return env, keeper, server


async def start_replicad(
    zookeeper: ZooKeeperServer, zk_root: str, data: Path, name: str = "r3"
) -> tuple[TableReplica, Keeper, InterserverServer]:
    env, keeper, server = await replicad_env(zookeeper, zk_root, data)
    replica = TableReplica(spec(name), keeper, env)
    await replica.start()
    return replica, keeper, server


async def test_mixed_replica_set(
    clickhouse_factory: Callable[..., ClickHouseServer],
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
) -> None:
    with ThreadPoolExecutor(2) as pool:
        ch1, ch2 = pool.map(lambda r: clickhouse_factory(r), ["r1", "r2"])
    for s in (ch1, ch2):
        await ch(s, "CREATE DATABASE db")
        await ch(s, DDL)
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(0, 100), 11))
    await ch(ch2, "INSERT INTO db.events FORMAT TSV", tsv(range(100, 150), 10))
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(150, 160), 11))

    replica, keeper, server = await start_replicad(zookeeper, zk_root, tmp_path / "rd")
    try:
        # ClickHouse's inserts reach replicad (whatever ClickHouse merged meanwhile)
        async def rd_count() -> int:
            return await replica.count(None)

        await wait_for(_eq(rd_count, 160), what="160 rows on replicad")

        # replicad's inserts reach both ClickHouse servers
        s1 = await replica.insert_table(arrow_rows(range(1000, 1200), 11))
        s2 = await replica.insert_table(arrow_rows(range(1200, 1210), 9))
        assert s1.written_parts == 1 and s2.written_parts == 1
        for s in (ch1, ch2):
            await ch(s, "SYSTEM SYNC REPLICA db.events")
        expected_sum = sum(range(0, 160)) + sum(range(1000, 1210))
        for s in (ch1, ch2):
            assert (await ch(s, "SELECT count(), sum(id) FROM db.events")).split() == [
                "370",
                str(expected_sum),
            ]
            names = await ch(s, "SELECT count() FROM db.events WHERE name LIKE 'rd%'")
            assert names.strip() == "210"
        await replica.sync_replica()
        await wait_for(_eq(rd_count, 370), what="370 rows on replicad")
        assert await replica.count("id >= 1000") == 210
        res = await replica.select(_select("SELECT * FROM db.events WHERE id = 1205"))
        got = [b async for b in res.batches]
        assert pa.Table.from_batches(got).to_pylist() == [
            {"id": 1205, "ctime": dt.datetime(2026, 9, 18, 10), "name": b"rd1205"}
        ]

        # every znode replicad wrote can be read back by ClickHouse: its replication queue is empty and
        # its system.replicas row shows no errors; our log entries parse as 18.16 entries
        for s in (ch1, ch2):
            errs = await ch(s, "SELECT count() FROM system.replication_queue WHERE last_exception != ''")
            assert errs.strip() == "0"
            assert (await ch(s, "SELECT total_replicas, active_replicas FROM system.replicas")).split() == [
                "3",
                "3",
            ]
        paths = TablePaths.create(ZK_PATH, "r3")
        for name in await keeper.get_children(paths.log):
            data, _ = await keeper.get(paths.log_entry(name))
            assert LogEntry.parse(data).readable_by_18_16

        # quorum inserts in both directions need replicad's participation (quorum = all 3 replicas)
        await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(2000, 2010), 8))
        await asyncio.to_thread(
            ch1.query, "INSERT INTO db.events FORMAT TSV", tsv(range(3000, 3010), 8), {"insert_quorum": 3}
        )
        s3 = await replica.insert_table(arrow_rows(range(4000, 4010), 8), InsertSettings(insert_quorum=3))
        assert s3.written_parts == 1
        assert await keeper.exists(f"{ZK_PATH}/quorum/status") is None
        for s in (ch1, ch2):
            assert (await ch(s, "SELECT count() FROM db.events WHERE id >= 2000")).strip() == "30"
        await wait_for(_eq(rd_count, 400), what="400 rows on replicad")

        # a merge assigned by ClickHouse's leader is executed by replicad itself, byte-identical
        await ch(ch1, "OPTIMIZE TABLE db.events PARTITION 202611 FINAL")
        await ch(ch1, "SYSTEM SYNC REPLICA db.events")
        (merged,) = (
            await ch(ch1, "SELECT name FROM system.parts WHERE active AND partition_id = '202611'")
        ).split()

        def have_merged() -> bool:
            return [p.name for p in replica.store.active() if p.info.partition_id == "202611"] == [merged]

        await wait_for(have_merged, what=f"replicad to merge into {merged}")
        assert replica.ops.producer.merged_total >= 1 and replica.ops.producer.mismatches_total == 0
        mine = replica.store.get(merged)
        assert mine is not None
        theirs = ch1.table_dir("db", "events") / merged / "checksums.txt"
        assert theirs.read_bytes() == (mine.path / "checksums.txt").read_bytes()
        assert await replica.count(None) == 400

        # ClickHouse's copy of a part written by replicad is byte-identical to ours
        for p in replica.store.active():
            if p.info.partition_id == "202609":
                theirs = ch1.table_dir("db", "events") / p.name / "checksums.txt"
                if theirs.exists():
                    assert theirs.read_bytes() == (p.path / "checksums.txt").read_bytes()
    finally:
        await replica.stop()
        await keeper.close()
        await server.stop(grace_s=0.1)


def _eq(fn: Callable[[], Any], value: int) -> Callable[[], Any]:
    async def check() -> bool:
        return bool(await fn() == value)

    return check


def _select(text: str) -> Any:
    from replicad.service import SelectQuery

    return SelectQuery(TableName("db", "events"), None, "id = 1205", (), None, text)


async def test_clickhouse_joins_a_table_created_by_replicad(
    clickhouse_factory: Callable[..., ClickHouseServer],
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
) -> None:
    from replicad.catalog import ReplicaCatalog

    env, keeper, server = await replicad_env(zookeeper, zk_root, tmp_path / "rd", PLAIN)
    catalog = ReplicaCatalog(tmp_path / "rd", keeper, env, replica="rd", macros={"shard": "01"})
    try:
        replica = await catalog.create_from_ddl(DDL.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS"))
        assert (tmp_path / "rd" / "metadata" / "db" / "events.sql").read_text().startswith("CREATE TABLE")
        await replica.insert_table(arrow_rows(range(0, 50), 11))
        await replica.insert_table(arrow_rows(range(50, 60), 12))
        ch1 = await asyncio.to_thread(clickhouse_factory, "r1")
        await ch(ch1, "CREATE DATABASE db")
        await ch(ch1, DDL)  # joins: is_lost=1, clones replicad's state, fetches its parts
        await ch(ch1, "SYSTEM SYNC REPLICA db.events")
        assert (await ch(ch1, "SELECT count(), sum(id) FROM db.events")).split() == [
            "60",
            str(sum(range(60))),
        ]
        await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(100, 130), 11))

        async def rd_count() -> int:
            return await replica.count(None)

        await wait_for(_eq(rd_count, 90), what="ClickHouse's insert on replicad")
        # replicad leads (it was the first candidate): 18.16 forwards OPTIMIZE to the leader's native port,
        # which replicad publishes as 0, so the forward fails at once rather than reaching another server
        assert (await ch(ch1, "SELECT is_leader FROM system.replicas")).strip() == "0"
        from replicad.devtools.clickhouse import ClickHouseError

        with pytest.raises(ClickHouseError, match=r"Connection refused \(127\.0\.0\.1:0\)"):
            await ch(ch1, "OPTIMIZE TABLE db.events FINAL")
        # a ClickHouse table with another definition at the same path is refused by replicad
        from replicad.errors import MetadataMismatchError

        other = DDL.replace("ORDER BY id", "ORDER BY (id, name)").replace("db.events", "db.events2")
        with pytest.raises(MetadataMismatchError, match=r"sorting key|primary key"):
            await catalog.create_from_ddl(other.replace("{replica}", "{replica}_2"))
        assert not (tmp_path / "rd" / "metadata" / "db" / "events2.sql").exists()
    finally:
        await catalog.stop_all()
        await keeper.close()
        await server.stop(grace_s=0.1)


async def test_interserver_credentials_both_ways(
    clickhouse_factory: Callable[..., ClickHouseServer],
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
) -> None:
    ch1 = await asyncio.to_thread(
        lambda: clickhouse_factory("r1", interserver_credentials=("repl", "s3cr3t"))
    )
    await ch(ch1, "CREATE DATABASE db")
    await ch(ch1, DDL)
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(0, 20), 11))
    env, keeper, server = await replicad_env(zookeeper, zk_root, tmp_path / "rd", PLAIN,
                                             FetchCredentials("repl", "s3cr3t"))
    replica = TableReplica(spec("r3"), keeper, env)
    try:
        await replica.start()

        async def rd_count() -> int:
            return await replica.count(None)

        await wait_for(_eq(rd_count, 20), what="ClickHouse's part fetched with credentials")
        await replica.insert_table(arrow_rows(range(100, 105), 11))
        await ch(ch1, "SYSTEM SYNC REPLICA db.events")
        assert (await ch(ch1, "SELECT count() FROM db.events")).strip() == "25"
        assert server.sent_parts >= 1
    finally:
        await replica.stop()
        await keeper.close()
        await server.stop(grace_s=0.1)
