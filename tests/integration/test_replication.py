"""replicad-only replica sets on a real ZooKeeper: creation layout, commit sequence, log pulling, fetching,
deduplication and faults.  Every replica is an in-process TableReplica with its own Keeper session and its
own DataPartsExchange server on a free loopback port."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replica import ReplicaEnv, TableReplica, TableSpec
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.service import InsertSettings, TableName
from replicad.storage.checksums import Checksums, MinimalisticChecksums
from tests.support import table_cluster
from tests.support.table_cluster import METADATA, ZK_PATH, Cluster, events_spec, part_checksums

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

COLUMNS = "columns format version: 1\n3 columns:\n`id` Int8\n`ctime` DateTime\n`name` String\n"


def spec(replica: str, settings: dict[str, Any] | None = None) -> TableSpec:
    return events_spec(replica, [("id", "Int8"), ("ctime", "DateTime"), ("name", "String")], settings)


def rows(ids: list[int], month: int = 11, name: str = "x") -> pa.Table:
    ts = [dt.datetime(2026, month, 1 + (i % 27), 12, 0, i % 60) for i in ids]
    return pa.table(
        {
            "id": pa.array(ids, pa.int8()),
            "ctime": pa.array(ts, pa.timestamp("s")),
            "name": pa.array([f"{name}{i}".encode() for i in ids], pa.binary()),
        }
    )


def new_cluster(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> Cluster:
    """Replicas of the 3-column table (Int8 ids) with their own merge assigner settings."""
    return Cluster(zookeeper, zk_root, tmp_path, make_spec=spec, assigner=None)


@pytest_asyncio.fixture
async def cluster(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = new_cluster(zookeeper, zk_root, tmp_path)
    try:
        yield c
    finally:
        await c.close()


wait_for = functools.partial(table_cluster.wait_for, timeout=30.0)


async def converged(replicas: list[TableReplica], n_parts: int) -> bool:
    sets = [part_checksums(r) for r in replicas]
    return all(len(s) == n_parts for s in sets) and all(s == sets[0] for s in sets)


# ---------------------------------------------------------------------------------------------------------


async def test_creation_layout_matches_18_16(cluster: Cluster, keeper: Keeper) -> None:
    await cluster.start("r1")
    await cluster.start("r2")
    paths = TablePaths.create(ZK_PATH, "r1")
    children = set(await keeper.get_children(ZK_PATH))
    assert {
        "metadata",
        "columns",
        "log",
        "blocks",
        "block_numbers",
        "nonincrement_block_numbers",
        "leader_election",
        "temp",
        "replicas",
        "quorum",
        "mutations",
    } <= children
    assert (await keeper.get(paths.metadata))[0].decode() == METADATA
    assert (await keeper.get(paths.columns))[0].decode() == COLUMNS
    assert (await keeper.get(paths.replicas))[0] == b"last added replica: r2"
    for name, lost in (("r1", b"0"), ("r2", b"0")):  # r2 was cloned from r1 and cleared its flag
        rp = paths.replica(name)
        kids = set(await keeper.get_children(rp.root))
        assert {
            "host",
            "log_pointer",
            "queue",
            "parts",
            "flags",
            "is_lost",
            "columns",
            "is_active",
            "min_unprocessed_insert_time",
            "max_processed_insert_time",
            "mutation_pointer",
            "metadata",
        } <= kids
        assert (await keeper.get(rp.is_lost))[0] == lost
        host = (await keeper.get(rp.host))[0].decode()
        assert host.startswith("host: 127.0.0.1\nport: ") and host.endswith(
            "\ndatabase: db\ntable: events\nscheme: http\n"
        )
        active, stat = await keeper.get(rp.is_active)
        assert active.decode().startswith(f"pid: {os.getpid()}, random: ")
        assert stat.ephemeral_owner != 0
        assert (await keeper.get(rp.columns))[0].decode() == COLUMNS
        assert (await keeper.get(rp.metadata))[0].decode() == METADATA


async def test_second_process_with_same_replica_name_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    from replicad.replication.init import ReplicaIsAlreadyActiveError

    await cluster.start("r1")
    other = new_cluster(cluster.zookeeper, cluster.zk_root, tmp_path / "other")
    try:
        with pytest.raises(ReplicaIsAlreadyActiveError):
            await other.start("r1")
    finally:
        for k in other.keepers.values():
            await k.close()
        for s in other.servers.values():
            await s.stop(grace_s=0.1)


async def test_metadata_mismatch_is_refused(cluster: Cluster, keeper: Keeper) -> None:
    from replicad.errors import MetadataMismatchError

    await cluster.start("r1")
    await keeper.set(f"{ZK_PATH}/metadata", METADATA.replace("primary key: id", "primary key: name").encode())
    with pytest.raises(MetadataMismatchError, match="primary key"):
        await cluster.start("r2")


async def test_commit_writes_18_16_nodes(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    summary = await r1.insert_table(rows([1, 2, 3]))
    assert summary.written_parts == 1 and summary.written_rows == 3
    paths = TablePaths.create(ZK_PATH, "r1")
    (part,) = r1.store.active_names()
    assert part == "202611_0_0_0"
    log_names = sorted(await keeper.get_children(paths.log))
    assert log_names == ["log-0000000000"]
    text = (await keeper.get(paths.log_entry(log_names[0])))[0].decode()
    entry = LogEntry.parse(text)
    assert entry.type is LogEntryType.GET_PART and entry.new_part_name == part
    assert entry.source_replica == "r1"
    assert text.startswith("format version: 4\ncreate_time: ")
    assert text.endswith(f"source replica: r1\nblock_id: {entry.block_id}\nget\n{part}\n")
    # the block id is the 18.16 one (SipHash of the .bin checksums) and names the part
    assert (await keeper.get(paths.block(entry.block_id)))[0] == part.encode()
    checksums = Checksums.parse((r1.store.active()[0].path / "checksums.txt").read_bytes())
    mc = MinimalisticChecksums.parse((await keeper.get(paths.me.part_checksums(part)))[0])
    assert mc == MinimalisticChecksums.from_checksums(checksums)
    assert (await keeper.get(paths.me.part_columns(part)))[0].decode() == COLUMNS
    assert (await keeper.get(paths.me.part(part)))[0] == b""
    # the lock is released: no block- node left; the holder is 22.11+'s shared persistent node, no
    # ephemeral abandonable_lock-NNNNNNNNNN of 18.16's form
    assert await keeper.get_children(paths.partition_block_numbers("202611")) == []
    assert await keeper.get_children(paths.temp) == ["abandonable_lock-insert"]
    # the next insert in the partition gets the next block number
    await r1.insert_table(rows([4]))
    assert "202611_1_1_0" in r1.store.active_names()


async def test_three_replicas_converge(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    await r1.insert_table(rows([1, 2, 3], month=11))
    await r2.insert_table(rows([4, 5], month=10))
    await r3.insert_table(rows([6, 7, 8, 9], month=11))
    await r1.insert_table(rows([10, 11], month=10, name="y"))
    await wait_for(lambda: converged([r1, r2, r3], 4), what="all replicas to hold the same 4 parts")
    assert sorted(r1.store.active_names()) == ["202610_0_0_0", "202610_1_1_0", "202611_0_0_0", "202611_1_1_0"]
    for r in (r1, r2, r3):
        assert await r.count(None) == 11
        assert await r.count("id > 5") == 6
        await wait_for(lambda r=r: r.queue_state.status().queue_size == 0, what="queues to drain")
    st = r3.status()
    assert st["queue_size"] == 0 and st["active_parts"] == 4 and st["log_pointer"] == 4


async def test_a_fresh_part_is_served_from_the_files_its_insert_held(cluster: Cluster) -> None:
    """The replicas fetching a part just inserted get it from the files the insert's writer held
    (replicad.storage.fresh_files), not read back from disk: the same part (checksums) on every replica;
    once the files are no longer kept the part is read from its directory as before."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    served = cluster.servers["r1"].small_bodies
    await r1.insert_table(rows([1, 2, 3], month=11))
    await wait_for(lambda: converged([r1, r2, r3], 1), what="the part on every replica")
    assert served.from_memory >= 1 and served.builds == 0  # two fetches: one body, shared or not
    assert part_checksums(r2) == part_checksums(r1) == part_checksums(r3)
    r1.store.fresh.forget("202611_0_0_0")
    served._bodies.clear()
    await cluster.stop("r2")
    await cluster.stop("r3")
    r4 = await cluster.start("r4")  # its only source: r1
    await wait_for(lambda: converged([r1, r4], 1), what="the part on the fourth replica")
    assert served.builds == 1 and part_checksums(r4) == part_checksums(r1)
    assert await r4.count(None) == 3


async def test_deduplication(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    first = await r1.insert_table(rows([1, 2, 3]))
    again = await r2.insert_table(rows([1, 2, 3]))
    assert (first.written_parts, first.deduplicated_blocks) == (1, 0)
    assert (again.written_parts, again.deduplicated_blocks) == (0, 1)
    tok = InsertSettings(insert_deduplication_token="batch-7")
    a = await r1.insert_table(rows([20, 21]), tok)
    b = await r2.insert_table(rows([30, 31]), tok)  # same token, other data: still a duplicate
    assert (a.written_parts, b.written_parts, b.deduplicated_blocks) == (1, 0, 1)
    await wait_for(lambda: converged([r1, r2], 2), what="2 parts everywhere")
    assert await r2.count(None) == 5
    # a dropped duplicate leaves no gap-filling part behind, only a consumed block number or none at all
    assert len(await keeper.get_children(f"{ZK_PATH}/blocks")) == 2


# ---------------------------------------------------------------------------------------------- faults


async def test_stopped_replica_catches_up_after_restart(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    await r1.insert_table(rows([1]))
    await wait_for(lambda: converged([r1, r2, r3], 1), what="first part everywhere")

    async def inserts(replica: TableReplica, base: int) -> None:
        for i in range(4):
            await replica.insert_table(rows([base + i], month=10 + i % 2))

    async def same_data(replicas: list[TableReplica], n_rows: int) -> bool:
        # new log entries wake the merge selection: the 13 inserted parts may be merged meanwhile
        sets = [part_checksums(r) for r in replicas]
        counts = [await r.count(None) for r in replicas]
        return all(s == sets[0] for s in sets) and counts == [n_rows] * len(replicas)

    # r3 goes down while inserts are running on the two others
    await asyncio.gather(inserts(r1, 10), inserts(r2, 20), cluster.stop("r3"))
    await inserts(r1, 30)
    await wait_for(lambda: same_data([r1, r2], 13), what="r1 and r2 to converge")
    r3 = await cluster.start("r3")  # same data directory, same replica name
    await wait_for(lambda: same_data([r1, r2, r3], 13), what="r3 to catch up")
    assert await r3.count(None) == 13
    await wait_for(lambda: r3.queue_state.status().queue_size == 0, what="r3's queue to drain")


class FakeSource:
    """A DataPartsExchange peer that serves a damaged copy of a real part: ``corrupt`` flips one byte of
    the first .bin file's data, ``truncate`` cuts the body in the middle and drops the connection."""

    def __init__(self, part_dir: Path, mode: str) -> None:
        from replicad.storage.part_transfer import iter_part_body_sync

        body = b"".join(
            iter_part_body_sync(part_dir, Checksums.parse((part_dir / "checksums.txt").read_bytes()))
        )
        if mode == "corrupt":
            at = body.index(b".bin") + 4 + 8 + 20  # inside the first .bin file's bytes
            body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1 :]
        else:
            body = body[: len(body) // 2]
        self.body = body
        self.mode = mode
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.requests += 1
        head = b"HTTP/1.1 200 OK\r\nConnection: Close\r\n"
        if self.mode == "corrupt":
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(self.body) + self.body)
        else:  # promise the whole body, send half of it, hang up
            writer.write(head + b"Content-Length: %d\r\n\r\n" % (2 * len(self.body) + 1) + self.body)
        await writer.drain()
        writer.close()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def register_fake_replica(
    keeper: Keeper, name: str, port: int, source: TableReplica, part: str
) -> None:
    """ZooKeeper nodes of a healthy-looking active replica ``name`` that claims to hold ``part``."""
    paths = TablePaths.create(ZK_PATH, name)
    me = paths.me
    src = source.paths.me
    host = f"host: 127.0.0.1\nport: {port}\ntcp_port: 9000\ndatabase: db\ntable: events\nscheme: http\n"
    for path, data in (
        (me.root, b""),
        (me.host, host.encode()),
        (me.log_pointer, b"1000"),
        (me.queue, b""),
        (me.parts, b""),
        (me.is_lost, b"0"),
        (me.columns, COLUMNS.encode()),
        (me.part(part), b""),
        (me.part_columns(part), (await keeper.get(src.part_columns(part)))[0]),
        (me.part_checksums(part), (await keeper.get(src.part_checksums(part)))[0]),
    ):
        await keeper.create(path, data)
    await keeper.create(me.is_active, b"pid: 1, random: 2", ephemeral=True)


@pytest.mark.parametrize("mode", ["corrupt", "truncate"])
async def test_bad_transfer_is_refused_and_fetched_from_another_replica(
    cluster: Cluster, keeper: Keeper, mode: str
) -> None:
    r1 = await cluster.start("r1")
    await r1.insert_table(rows([1, 2, 3]))
    (part,) = r1.store.active()
    fake = FakeSource(part.path, mode)
    port = await fake.start()
    try:
        # "zz" sorts after r1, so r2 clones r1; the fake's large log_pointer makes it the preferred source
        await register_fake_replica(keeper, "zz_fake", port, r1, part.name)
        r2 = await cluster.start("r2")
        await wait_for(
            lambda: converged([r1, r2], 1), what="r2 to get the part from r1 after the fake failed"
        )
        assert fake.requests >= 1
        assert r2.executor.failed_total >= 1
        assert not list(r2.layout.path.glob("tmp*")), "no half-fetched directory may be left behind"
        assert await r2.count(None) == 3
        assert (r2.store.active()[0].path / "id.bin").read_bytes() == (part.path / "id.bin").read_bytes()
    finally:
        await fake.stop()


async def test_quorum_insert(cluster: Cluster, keeper: Keeper) -> None:
    from replicad.errors import QuorumError
    from replicad.model.quorum import QuorumLastPart

    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    summary = await r1.insert_table(rows([1, 2]), InsertSettings(insert_quorum=3))
    assert summary.written_parts == 1
    # returned only once every replica had the part: the status node is gone, last_part names it
    assert await keeper.exists(f"{ZK_PATH}/quorum/status") is None
    last = QuorumLastPart.parse((await keeper.get(f"{ZK_PATH}/quorum/last_part"))[0])
    assert last.parts == {"202611": "202611_0_0_0"}
    assert all("202611_0_0_0" in r.store.active_names() for r in (r2, r3))
    log_text = (await keeper.get(f"{ZK_PATH}/log/log-0000000000"))[0].decode()
    assert log_text.endswith("get\n202611_0_0_0\nquorum: 3\n")
    with pytest.raises(QuorumError, match="less than requested quorum"):
        await r1.insert_table(rows([3]), InsertSettings(insert_quorum=4))


async def test_session_expiry_reactivates_and_catches_up(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows([1]))
    await wait_for(lambda: converged([r1, r2], 1), what="first part on both")
    old_session = cluster.keepers["r2"].session_id
    creds = cluster.keepers["r2"].session_id_and_password
    assert creds is not None
    sid, password = creds
    await asyncio.to_thread(cluster.zookeeper.expire_session, sid, password)
    await r1.insert_table(rows([2], month=10))
    await r1.insert_table(rows([3], month=9))
    # r2 gets a new session, declares itself active again and fetches what it missed
    await wait_for(lambda: cluster.keepers["r2"].session_id not in (None, old_session), what="a new session")
    await wait_for(lambda: converged([r1, r2], 3), timeout=40, what="r2 to catch up after the expiry")
    _data, stat = await keeper.get(f"{ZK_PATH}/replicas/r2/is_active")
    assert stat.ephemeral_owner == cluster.keepers["r2"].session_id
    assert not r2.is_readonly
    assert await r2.count(None) == 3


@pytest.mark.parametrize("applied", [True, False])
async def test_lost_commit_answer_is_settled_by_the_part_check(cluster: Cluster, applied: bool) -> None:
    from replicad.errors import KeeperConnectionLossError, UnknownInsertStatusError

    r1 = await cluster.start("r1")
    keeper = cluster.keepers["r1"]
    real_multi = keeper.multi

    async def flaky_multi(ops: Any) -> Any:
        ops = list(ops)
        if any(getattr(op, "path", "").endswith("/log/log-") for op in ops):
            keeper.multi = real_multi  # type: ignore[method-assign]
            if applied:
                await real_multi(ops)
            raise KeeperConnectionLossError("multi: connection loss (injected)")
        return await real_multi(ops)

    keeper.multi = flaky_multi  # type: ignore[method-assign]
    with pytest.raises(UnknownInsertStatusError):
        await r1.insert_table(rows([1, 2]))
    # the part stays visible until the part check has looked at ZooKeeper
    await wait_for(lambda: not r1._parts_to_check, what="the part check")
    if applied:
        assert r1.store.active_names() == ["202611_0_0_0"]
        retry = await r1.insert_table(rows([1, 2]))  # the client's retry is deduplicated
        assert retry.deduplicated_blocks == 1
    else:
        assert r1.store.active_names() == []
        assert [p.name for p in r1.layout.detached_path.iterdir()] == ["unexpected_202611_0_0_0"]
        retry = await r1.insert_table(rows([1, 2]))
        assert retry.written_parts == 1
        assert r1.store.active_names() == ["202611_1_1_0"]  # block 0 was abandoned, its lock released
    assert await keeper.get_children(f"{ZK_PATH}/block_numbers/202611") == []
    assert await keeper.get_children(f"{ZK_PATH}/temp") == ["abandonable_lock-insert"]  # the shared holder
    assert await r1.count(None) == 2


async def test_catalog_persists_and_drops_tables(
    zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    from replicad.catalog import ReplicaCatalog
    from replicad.errors import UnknownTableError
    from replicad.service import Statement, StatementKind

    ddl = (
        "CREATE TABLE db.t (k UInt64, s String) "
        "ENGINE = ReplicatedMergeTree('/tables/{shard}/t', '{replica}') ORDER BY k"
    )

    async def open_catalog(name: str) -> tuple[ReplicaCatalog, Keeper, InterserverServer]:
        keeper = Keeper(zookeeper.hosts, session_timeout_s=6.0, chroot=zk_root)
        await keeper.start()
        server = InterserverServer("127.0.0.1", 0)
        await server.start()
        env = ReplicaEnv(
            data_path=tmp_path / name, interserver=InterserverExchange(server), interserver_host="127.0.0.1",
            fsync=False,
        )
        return (
            ReplicaCatalog(tmp_path / name, keeper, env, replica=name, macros={"shard": "7"}),
            keeper,
            server,
        )

    async def close(cat: ReplicaCatalog, keeper: Keeper, server: InterserverServer) -> None:
        await cat.stop_all()
        await keeper.close()
        await server.stop(grace_s=0.1)

    a, ka, sa = await open_catalog("a")
    b, kb, sb = await open_catalog("b")
    try:
        ta = await a.create_from_ddl(ddl)
        tb = await b.create_from_ddl(ddl)
        assert ta.paths.me.root == "/tables/7/t/replicas/a"
        await ta.insert_table(pa.table({"k": pa.array([1, 2], pa.uint64()), "s": pa.array([b"x", b"y"])}))
        await wait_for(lambda: len(tb.store.active()) == 1, what="b to fetch")
        # a restarted catalog attaches its tables from metadata/ again, with their data
        await close(b, kb, sb)
        b, kb, sb = await open_catalog("b")
        assert [str(n) for n in await b.load()] == ["db.t"]
        assert await b.get(TableName("db", "t")).count(None) == 2
        # DROP TABLE removes this replica (and, for the last one, the table) from ZooKeeper and disk
        await a.drop_table(Statement(StatementKind.DROP_TABLE, TableName("db", "t"), "DROP TABLE db.t"))
        assert await ka.exists("/tables/7/t/replicas/a") is None
        assert await ka.exists("/tables/7/t") is not None
        assert not (tmp_path / "a" / "metadata" / "db" / "t.sql").exists()
        assert not (tmp_path / "a" / "data" / "db" / "t").exists()
        with pytest.raises(UnknownTableError):
            a.get(TableName("db", "t"))
        await b.drop_table(Statement(StatementKind.DROP_TABLE, TableName("db", "t"), "DROP TABLE db.t"))
        assert await ka.exists("/tables/7/t") is None
    finally:
        await close(a, ka, sa)
        await close(b, kb, sb)


async def test_select(cluster: Cluster) -> None:
    from replicad.service import OrderKey, SelectQuery

    r1 = await cluster.start("r1")
    await r1.insert_table(rows([5, 1, 9, 3], month=11))
    await r1.insert_table(rows([7, 2], month=10))

    async def run(**kw: Any) -> list[dict[str, Any]]:
        res = await r1.select(SelectQuery(TableName("db", "events"), **kw))
        return pa.Table.from_batches([b async for b in res.batches]).to_pylist()

    got = await run(columns=("id",), where="id > 2", order_by=(OrderKey("id", descending=True),), limit=3)
    assert got == [{"id": 9}, {"id": 7}, {"id": 5}]
    unordered = await run(columns=("id", "name"), where="id != 1")
    assert sorted(r["id"] for r in unordered) == [2, 3, 5, 7, 9]
    assert len(await run(limit=4)) == 4
    assert await run(columns=("name",), where="id = 3") == [{"name": b"x3"}]
    assert await r1.count("toYYYYMM(ctime) = 202610") == 2


async def test_startup_reconciles_local_parts_with_zookeeper(cluster: Cluster) -> None:
    import shutil

    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3], month=10))
    await wait_for(lambda: converged([r1, r2], 2), what="both parts on r2")
    await cluster.stop("r2")
    data = cluster.tmp_path / "r2" / "data" / "db" / "events"
    shutil.rmtree(data / "202611_0_0_0")  # lost from disk: must be fetched again
    shutil.copytree(data / "202610_0_0_0", data / "202610_5_5_0")  # unknown to ZooKeeper: set aside
    r2 = await cluster.start("r2")
    await wait_for(lambda: converged([r1, r2], 2), what="r2 to fetch the lost part")
    assert sorted(p.name for p in (data / "detached").iterdir()) == ["ignored_202610_5_5_0"]
