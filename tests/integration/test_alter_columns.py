"""Replicated ALTER … ADD / DROP COLUMN between in-process replicad replicas (18.16's protocol: the table's
``columns`` znode, ``replicas/<r>/columns``, parts converted by each replica's alter task)."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from replicad.errors import ReplicadError
from replicad.keeper.paths import TablePaths
from replicad.sql.table_metadata import ColumnsDescription, NamesAndTypesList
from tests.support.table_cluster import ZK_PATH, Cluster, rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


async def znode(replica: object, path: str) -> str:
    return (await replica.keeper.get(path))[0].decode()  # type: ignore[attr-defined]


async def test_add_and_drop_column_reach_every_replica(cluster: Cluster) -> None:
    rs = [await cluster.start(n) for n in ("r1", "r2", "r3")]
    await rs[0].insert_table(rows(range(0, 20), month=10))
    for r in rs:
        await r.sync_replica(60)
    paths = TablePaths.create(ZK_PATH, "r1")

    await cluster.execute("r2", "ALTER TABLE db.events ADD COLUMN c UInt32 DEFAULT 7 AFTER id")
    shared = await znode(rs[0], paths.columns)
    assert [c.name for c in ColumnsDescription.parse(shared).ordered()] == ["id", "c", "ctime", "name", "v"]
    assert "`c` UInt32\tDEFAULT\tCAST(7, \\'UInt32\\')\n" in shared, shared  # as 18.16 writes it
    for name in ("r1", "r2", "r3"):  # the initiator returned after every active replica applied it
        assert await znode(rs[0], paths.replica(name).columns) == shared
    for r in rs:
        assert [n for n, _t in r.columns] == ["id", "c", "ctime", "name", "v"]
    # a new insert has the column; old rows read its default
    t = rows(range(100, 110), month=11)
    t = t.add_column(1, "c", pa.array([1000 + i for i in range(10)], pa.uint32()))
    await rs[2].insert_table(t)
    for r in rs:
        await r.sync_replica(60)
    for r in rs:
        got = sorted((x["id"], x["c"]) for x in (await r.read_all(["id", "c"])).to_pylist())
        expected = [(i, 7) for i in range(20)] + [(100 + i, 1000 + i) for i in range(10)]
        assert got == expected, r.spec.replica_name

    await cluster.execute("r3", "ALTER TABLE db.events DROP COLUMN name")
    shared = await znode(rs[0], paths.columns)
    assert "`name`" not in shared
    for r in rs:
        assert [n for n, _t in r.columns] == ["id", "c", "ctime", "v"]
        for p in r.store.active():  # files, columns.txt, checksums.txt and the part's znodes agree
            files = {f.name for f in p.path.iterdir()}
            assert "name.bin" not in files and "name.mrk" not in files, (p.name, files)
            assert "name" not in p.directory.columns_text
            assert not any(f.startswith("name.") for f in p.directory.checksums.files)
            me = TablePaths.create(ZK_PATH, r.spec.replica_name).me
            assert await znode(r, me.part_columns(p.name)) == p.directory.columns_text
            assert NamesAndTypesList.parse(p.directory.columns_text).names[0] == "id"
        assert len((await r.read_all()).to_pylist()) == 30
    # errors as 18.16 words them
    for sql, code in (("ALTER TABLE db.events DROP COLUMN id", 44),
                      ("ALTER TABLE db.events DROP COLUMN nope", 44),
                      ("ALTER TABLE db.events ADD COLUMN c UInt8", 44),
                      ("ALTER TABLE db.events MODIFY COLUMN id Int64", 44),
                      ("ALTER TABLE db.events MODIFY COLUMN nope Int64", 44)):
        with pytest.raises(ReplicadError) as e:
            await cluster.execute("r1", sql)
        assert e.value.code == code, (sql, e.value)
    await cluster.execute("r1", "ALTER TABLE db.events ADD COLUMN IF NOT EXISTS c UInt8")


async def test_alter_times_out_with_341_when_an_active_replica_does_not_follow(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r2.alter.task.request_stop()  # r2 stays active but never applies
    await asyncio.sleep(0.5)
    with pytest.raises(ReplicadError) as e:
        await cluster.execute("r1", "ALTER TABLE db.events ADD COLUMN c UInt8",
                              replication_alter_columns_timeout=3)
    assert e.value.code == 341
    assert str(e.value).startswith("Alter is not finished because timeout when waiting for some replicas: "
                                   "r2 (replication_alter_columns_timeout = 3). Alter will be done "
                                   "asynchronously."), str(e.value)
    await wait_for(lambda: [n for n, _t in r1.columns][-1] == "c", what="r1 applied")


async def test_a_replica_down_during_the_alter_takes_the_columns_when_it_comes_back(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(0, 20), month=10))
    await r2.sync_replica(60)
    await cluster.stop("r2")  # not active: the initiator does not wait for it (as 18.16)
    await cluster.execute("r1", "ALTER TABLE db.events ADD COLUMN c UInt8 DEFAULT 3, DROP COLUMN name")
    paths = TablePaths.create(ZK_PATH, "r2")
    shared = await znode(r1, paths.columns)
    assert await znode(r1, paths.me.columns) != shared
    r2 = await cluster.start("r2")  # its own definition still has the old columns: it takes ZooKeeper's

    async def followed() -> bool:
        return await znode(r2, paths.me.columns) == shared

    await wait_for(followed, what="r2 to publish the altered columns")
    assert [n for n, _t in r2.columns] == ["id", "ctime", "v", "c"]
    for p in r2.store.active():
        assert "`name`" not in p.directory.columns_text and not (p.path / "name.bin").exists()
    got = sorted((x["id"], x["c"]) for x in (await r2.read_all(["id", "c"])).to_pylist())
    assert got == [(i, 3) for i in range(20)]


async def test_an_insert_meeting_a_newer_columns_version_is_written_again(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r1.alter.task.request_stop()  # r1 does not follow by itself: its next insert meets the new columns
    await asyncio.sleep(0.5)
    with pytest.raises(ReplicadError) as e:
        await cluster.execute("r2", "ALTER TABLE db.events ADD COLUMN c UInt16 DEFAULT v + 1",
                              replication_alter_columns_timeout=1)
    assert e.value.code == 341
    assert "c" not in dict(r1.columns)
    summary = await r1.insert_table(rows(range(0, 10), month=10))  # written with the old columns first
    assert summary.written_rows == 10
    assert "c" in dict(r1.columns)
    [part] = r1.store.active()
    assert "`c` UInt16" in part.directory.columns_text  # the block was written again, with the column
    await r2.sync_replica(60)
    for r in (r1, r2):
        got = sorted((x["id"], x["c"]) for x in (await r.read_all(["id", "c"])).to_pylist())
        assert got == [(i, i * 10 + 1) for i in range(10)]


async def test_add_materialized_and_alias_columns(cluster: Cluster) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(0, 5), month=10))
    await r2.sync_replica(60)
    await cluster.execute("r1", "ALTER TABLE db.events ADD COLUMN m UInt64 MATERIALIZED id * 2, "
                                "ADD COLUMN a UInt32 ALIAS v + 1")
    shared = await znode(r1, TablePaths.create(ZK_PATH, "r1").columns)
    described = {c.name: (c.type, c.default_kind) for c in ColumnsDescription.parse(shared).ordered()}
    assert list(described)[-2:] == ["m", "a"], shared  # ordinary, MATERIALIZED, ALIAS: 18.16's order
    assert described["m"] == ("UInt64", "MATERIALIZED") and described["a"] == ("UInt32", "ALIAS")
    await r2.insert_table(rows(range(10, 15), month=10))  # m computed at insert
    await r1.sync_replica(60)
    for r in (r1, r2):
        assert [n for n, _t in r.columns] == ["id", "ctime", "name", "v", "m"]
        got = sorted((x["id"], x["m"]) for x in (await r.read_all(["id", "m"])).to_pylist())
        assert got == [(i, i * 2) for i in [*range(0, 5), *range(10, 15)]]


async def test_converted_parts_attach_in_current_clickhouse(cluster: Cluster, tmp_path: object) -> None:
    """Parts converted by DROP and MODIFY COLUMN (and lacking a column added later) are attached by chdb
    (ClickHouse 26.x) into a table with the new columns: CHECK TABLE passes and the rows are replicad's."""
    import shutil
    from pathlib import Path

    chdb_session = pytest.importorskip("chdb.session")
    r1 = await cluster.start("r1")
    await r1.insert_table(rows(range(0, 300), month=10))
    await r1.insert_table(rows(range(300, 400), month=11))
    await cluster.execute("r1", "ALTER TABLE db.events DROP COLUMN name, MODIFY COLUMN v String")
    await cluster.execute("r1", "ALTER TABLE db.events ADD COLUMN c UInt8 DEFAULT 3")
    got = (await r1.read_all(["id", "v", "c"])).to_pylist()
    mine = sorted((x["id"], x["v"].decode(), x["c"]) for x in got)
    s = chdb_session.Session(str(Path(str(tmp_path)) / "chdb"))
    try:
        s.query("CREATE DATABASE IF NOT EXISTS db ENGINE = Atomic")
        s.query("CREATE TABLE db.x (id Int32, ctime DateTime, v String, c UInt8 DEFAULT 3) "
                "ENGINE = MergeTree PARTITION BY toYYYYMM(ctime) ORDER BY id SETTINGS "
                "index_granularity = 8192, index_granularity_bytes = 0, min_bytes_for_wide_part = 0, "
                "min_rows_for_wide_part = 0")
        data = Path(str(s.query("SELECT arrayJoin(data_paths) FROM system.tables WHERE name = 'x'",
                                "TabSeparated")).strip())
        for p in r1.store.active():
            shutil.copytree(p.path, data / "detached" / p.name)
            s.query(f"ALTER TABLE db.x ATTACH PART '{p.name}'")
        assert str(s.query("CHECK TABLE db.x SETTINGS check_query_single_value_result = 1",
                           "TabSeparated")).strip() == "1"
        text = str(s.query("SELECT id, v, c FROM db.x ORDER BY id", "TabSeparated"))
        theirs = [(int(a), b, int(c)) for a, b, c in (line.split("\t") for line in text.splitlines())]
        assert theirs == mine == [(i, str(i * 10), 3) for i in range(400)]
    finally:
        s.close()


async def test_current_clickhouse_alter_metadata_entries(cluster: Cluster) -> None:
    """An ALTER as current ClickHouse makes it (the table's columns set and an ALTER_METADATA entry in the
    same multi): replicad applies it and sets replicas/<me>/metadata_version; one whose columns replicad
    cannot serve (CODEC) stays in the queue with a clear error and changes nothing."""
    from replicad.keeper.ops import Create, Set
    from replicad.model.log_entry import LogEntry, LogEntryType

    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(0, 5), month=10))
    paths = TablePaths.create(ZK_PATH, "r1")
    old, stat = await r1.keeper.get(paths.columns)
    metadata = (await r1.keeper.get(paths.metadata))[0].decode()
    new = old.decode().replace("4 columns:", "5 columns:") + "`c` UInt8\tDEFAULT\t9\n"

    async def alter(columns: str, version: int, expected_version: int) -> None:
        entry = LogEntry(LogEntryType.ALTER_METADATA, source_replica="modern", create_time=1795600000,
                         alter_version=version, columns_str=columns, metadata_str=metadata)
        await r1.keeper.multi([Set(paths.columns, columns.encode(), expected_version),
                               Create(paths.log_prefix, entry.to_bytes(), sequence=True)])

    await alter(new, 0, stat.version)
    for r in (r1, r2):
        me = TablePaths.create(ZK_PATH, r.spec.replica_name).me
        await r.sync_replica(60)
        assert await znode(r, f"{me.root}/metadata_version") == "0"
        assert await znode(r, me.columns) == new
        got = sorted((x["id"], x["c"]) for x in (await r.read_all(["id", "c"])).to_pylist())
        assert got == [(i, 9) for i in range(5)]

    bad = new.replace("5 columns:", "6 columns:") + "`z` UInt8\t\tCODEC(ZSTD(1))\n"
    await alter(bad, 1, stat.version + 1)

    async def refused() -> bool:
        rows_ = r1.queue_rows()
        return any("CODEC" in str(q.get("last_exception")) for q in rows_)

    await wait_for(refused, what="the ALTER_METADATA entry refused with a clear error")
    assert "z" not in dict(r1.columns)
    assert await znode(r1, f"{paths.me.root}/metadata_version") == "0"


async def test_an_alter_between_the_parts_of_one_block_commits_each_partition_once(cluster: Cluster) -> None:
    """A block of two partitions: the first part commits, then an ALTER (made elsewhere) lands before the
    second commits.  The block is written again with the new columns for the second partition only: no
    row twice (the first partition's new part would not deduplicate: other columns, other block id)."""
    import datetime as dt

    r1 = await cluster.start("r1")
    paths = TablePaths.create(ZK_PATH, "r1")
    old, stat = await r1.keeper.get(paths.columns)
    new = old.decode().replace("4 columns:", "5 columns:") + "`c` UInt8\tDEFAULT\tCAST(1, \\'UInt8\\')\n"
    real = r1.committer.commit
    calls = 0

    async def alter_after_first(*args: object, **kw: object) -> object:
        nonlocal calls
        calls += 1
        result = await real(*args, **kw)  # type: ignore[arg-type]
        if calls == 1:  # another replica's ALTER, before our second part's commit
            await r1.keeper.set(paths.columns, new.encode(), stat.version)
        return result

    r1.committer.commit = alter_after_first  # type: ignore[method-assign]
    r1.alter.task.request_stop()  # only the insert's own catch-up applies the ALTER
    t = rows(range(0, 10), month=10)
    months = pa.array([dt.datetime(2026, 10 + i % 2, 3, 12, 0, 0) for i in range(10)], pa.timestamp("s"))
    t = t.set_column(t.schema.get_field_index("ctime"), "ctime", months)
    summary = await r1.insert_table(t)
    assert summary.written_rows == 10 and summary.written_parts == 2
    got = sorted((x["id"], x["c"]) for x in (await r1.read_all(["id", "c"])).to_pylist())
    assert got == [(i, 1) for i in range(10)]  # each row once; the first part reads c's default
    texts = sorted(p.directory.columns_text for p in r1.store.active())
    assert ["`c` UInt8" in x for x in texts] == [False, True], texts
