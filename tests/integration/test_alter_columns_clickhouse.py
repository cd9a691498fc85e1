"""Replicated ALTER ADD / DROP COLUMN in a set mixing ClickHouse 18.16 and replicad.

ClickHouse issues ``ADD COLUMN … DEFAULT`` and returns at once: it waited for replicad's
``replicas/<r>/columns`` (18.16 waits for every active replica, 60 s, code 341).  replicad issues
``DROP COLUMN``: ClickHouse's alter thread follows, and replicad returns once ClickHouse published its
columns.  Rows (old ones reading the DEFAULT) agree on both; every part on both sides lists the same
columns in columns.txt and in its znode; parts written before the ADD travel between them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.errors import ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.replica import TableReplica
from tests.support.table_cluster import EVENTS_DDL as DDL
from tests.support.table_cluster import LZ4, ZK_PATH, Cluster, ch, rows

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(400)]


def tsv(ids: range, month: int) -> bytes:
    return "".join(f"{i}\t2026-{month:02d}-{1 + i % 27:02d} 10:00:00\tch{i}\t{i * 10}\n"
                   for i in ids).encode()


async def rd_pairs(r: TableReplica, column: str) -> list[tuple[int, int]]:
    t = await r.read_all(["id", column])
    return sorted(zip(t.column("id").to_pylist(), t.column(column).to_pylist(), strict=True))


async def ch_pairs(s: ClickHouseServer, column: str) -> list[tuple[int, int]]:
    text = await ch(s, f"SELECT id, {column} FROM db.events ORDER BY id")
    return sorted((int(a), int(b)) for a, b in (line.split("\t") for line in text.splitlines()))


async def parts_consistent(keeper: Keeper, replica: str, table_dir: Path, names: list[str],
                           expected_absent: str | None = None) -> None:
    me = TablePaths.create(ZK_PATH, replica).me
    for name in names:
        on_disk = (table_dir / name / "columns.txt").read_text()
        registered = (await keeper.get(me.part_columns(name)))[0].decode()
        assert on_disk == registered, (replica, name, on_disk, registered)
        if expected_absent is not None:
            assert f"`{expected_absent}`" not in on_disk, (replica, name, on_disk)
            assert not (table_dir / name / f"{expected_absent}.bin").exists()


async def test_clickhouse_alters_and_replicad_follows_and_the_other_way_round(
    clickhouse_factory: Callable[..., ClickHouseServer], cluster: Cluster, keeper: Keeper,
) -> None:
    rd = await cluster.start("rd", writer=LZ4)  # ClickHouse's compression: byte-identical converted parts
    ch1 = await asyncio.to_thread(clickhouse_factory, "ch1")
    await ch(ch1, "CREATE DATABASE db")
    await ch(ch1, DDL)
    await rd.insert_table(rows(range(0, 30), month=10))
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(100, 130), 11))
    await ch(ch1, "SYSTEM SYNC REPLICA db.events")
    await rd.sync_replica(60)
    paths = TablePaths.create(ZK_PATH, "rd")

    # ---- ClickHouse 18.16 issues the ALTER; it returns only once replicad's replicas/rd/columns matches
    await ch(ch1, "ALTER TABLE db.events ADD COLUMN c UInt32 DEFAULT 7 AFTER id")
    shared = (await keeper.get(paths.columns))[0].decode()
    assert (await keeper.get(paths.me.columns))[0].decode() == shared
    assert [n for n, _t in rd.columns] == ["id", "c", "ctime", "name", "v"]
    assert rd.spec.columns_text == shared  # replicad formats the columns as 18.16 wrote them
    t = rows(range(200, 210), month=11)
    await rd.insert_table(t.add_column(1, "c", pa.array(range(2000, 2010), pa.uint32())))
    await ch(ch1, "INSERT INTO db.events (id, c, ctime, name, v) FORMAT TSV",
             b"".join(f"{i}\t{i * 3}\t2026-10-02 10:00:00\tx\t1\n".encode() for i in range(300, 305)))
    await ch(ch1, "SYSTEM SYNC REPLICA db.events")
    await rd.sync_replica(60)
    expected = sorted([(i, 7) for i in [*range(0, 30), *range(100, 130)]]
                      + [(i, 2000 + i - 200) for i in range(200, 210)]
                      + [(i, i * 3) for i in range(300, 305)])
    assert await rd_pairs(rd, "c") == expected
    assert await ch_pairs(ch1, "c") == expected

    # ---- replicad issues the ALTER; ClickHouse's alter thread follows before it returns
    await cluster.execute("rd", "ALTER TABLE db.events DROP COLUMN name")
    ch_columns = (await keeper.get(TablePaths.create(ZK_PATH, "ch1").me.columns))[0].decode()
    assert ch_columns == (await keeper.get(paths.columns))[0].decode()
    assert "`name`" not in ch_columns
    described = await ch(ch1, "DESCRIBE TABLE db.events")
    assert [line.split("\t")[0] for line in described.splitlines()] == ["id", "c", "ctime", "v"]
    await rd.insert_table(pa.table({"id": pa.array(range(400, 405), pa.int32()),
                                    "c": pa.array([1] * 5, pa.uint32()),
                                    "ctime": rows(range(400, 405), month=12).column("ctime"),
                                    "v": pa.array([5] * 5, pa.uint32())}))
    await ch(ch1, "SYSTEM SYNC REPLICA db.events")
    await rd.sync_replica(60)
    expected += [(i, 1) for i in range(400, 405)]
    expected.sort()
    assert await rd_pairs(rd, "c") == expected
    assert await ch_pairs(ch1, "c") == expected
    assert await rd_pairs(rd, "v") == await ch_pairs(ch1, "v")

    # both sides: every active part's columns.txt is its registered columns, without the dropped column
    ch_parts = (await ch(ch1, "SELECT name FROM system.parts WHERE active AND table = 'events'")).split()
    await parts_consistent(keeper, "ch1", ch1.table_dir("db", "events"), ch_parts, "name")
    await parts_consistent(keeper, "rd", rd.layout.path, rd.store.active_names(), "name")
    assert sorted(ch_parts) == sorted(rd.store.active_names())

    # ---- MODIFY COLUMN (a type change converts every part): issued by ClickHouse, then by replicad.
    # Both sides write the converted streams: the parts stay byte-identical (checksums.txt equal).
    await ch(ch1, "ALTER TABLE db.events MODIFY COLUMN v UInt64")
    assert dict(rd.columns)["v"].name == "UInt64"
    await same_parts(ch1, rd, keeper, "`v` UInt64")
    await cluster.execute("rd", "ALTER TABLE db.events MODIFY COLUMN c String")
    assert (await ch(ch1, "SELECT toTypeName(c) FROM db.events LIMIT 1")).strip() == "String"
    await same_parts(ch1, rd, keeper, "`c` String")
    text = await ch(ch1, "SELECT id, c, v FROM db.events ORDER BY id FORMAT TSV")
    t = await rd.read_all(["id", "c", "v"])
    mine = sorted(zip(t.column("id").to_pylist(), t.column("c").to_pylist(), t.column("v").to_pylist(),
                      strict=True))
    assert "".join(f"{i}\t{c.decode()}\t{v}\n" for i, c, v in mine) == text
    # converted values; rows of parts without the column read the new default (MODIFY without DEFAULT
    # removed it, as in 18.16: '')
    converted = {i: c for i, c, _v in mine}
    assert [converted[i] for i in (200, 209, 300, 400)] == [b"2000", b"2009", b"900", b"1"]
    assert converted[0] == b""

    # ---- COMMENT COLUMN issued by ClickHouse: replicad follows (the same columns text on both sides)
    await ch(ch1, "ALTER TABLE db.events COMMENT COLUMN c 'a comment'")
    shared = (await keeper.get(paths.columns))[0].decode()
    assert "`c` String\t\t\\'a comment\\'\n" in shared, shared
    assert rd.spec.columns_text == shared
    assert (await keeper.get(paths.me.columns))[0].decode() == shared
    # (c has no DEFAULT: 18.16 itself drops such a commented column, test_alter_comment_clickhouse.py;
    # replicad refuses to set a comment on a column without an expression, for that reason)
    with pytest.raises(ReplicadError) as e:
        await cluster.execute("rd", "ALTER TABLE db.events COMMENT COLUMN v 'x'")
    assert e.value.code == 48


async def same_parts(s: ClickHouseServer, rd: TableReplica, keeper: Keeper, column_line: str) -> None:
    names = (await ch(s, "SELECT name FROM system.parts WHERE active AND table = 'events'")).split()
    assert sorted(names) == sorted(rd.store.active_names())
    having = 0
    for name in names:
        theirs = (s.table_dir("db", "events") / name / "checksums.txt").read_bytes()
        ours = (rd.layout.path / name / "checksums.txt").read_bytes()
        assert theirs == ours, name
        text = (rd.layout.path / name / "columns.txt").read_text()
        if column_line.split(" ")[0] in text:  # parts written before the column was added lack it
            assert column_line in text, (name, text)
            having += 1
    assert having, "no part has the converted column"
    await parts_consistent(keeper, "rd", rd.layout.path, names)
    await parts_consistent(keeper, "ch1", s.table_dir("db", "events"), names)
