"""ATTACH PART of a part written by current ClickHouse (chdb, 26.x, default settings: Compact, String size
streams, compressed marks, a column codec) into replicad, in one replica set with a ClickHouse 18.16 server.

replicad converts the part on attach to the 18.16 Wide layout, commits it with a GET_PART entry, and the
18.16 replica fetches it and answers with the rows chdb answers for its own table.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from replicad.service import Statement, StatementKind, TableName
from replicad.sql.statements import parse_statement
from replicad.storage.part import PartDirectory
from replicad.storage.reader import incompatibilities_with_18_16
from tests.integration.test_interop_clickhouse import DDL, ch, start_replicad
from tests.support.clickhouse import ClickHouseServer
from tests.support.zookeeper import ZooKeeperServer

chdb_session = pytest.importorskip("chdb.session")

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(240)]

#: compared as numbers: the servers' time zones may differ
ROWS = "SELECT id, toUnixTimestamp(ctime), name FROM {table} ORDER BY id FORMAT TSV"


def chdb_part(base: Path) -> tuple[Path, str]:
    """A part chdb writes with its defaults (plus a codec) for db.events' columns; (part dir, rows TSV)."""
    s = chdb_session.Session(str(base))
    try:
        s.query("CREATE DATABASE IF NOT EXISTS src ENGINE = Atomic")
        s.query("CREATE TABLE src.events (id Int32 CODEC(Delta, ZSTD), ctime DateTime, name String) "
                "ENGINE = MergeTree PARTITION BY toYYYYMM(ctime) ORDER BY id "
                "SETTINGS index_granularity = 256")
        s.query("INSERT INTO src.events SELECT number, toDateTime('2026-11-10 12:00:00') + number * 37, "
                "concat('chdb', toString(number), repeat('x', number % 7)) FROM numbers(3000)")
        path = str(s.query("SELECT path FROM system.parts WHERE database = 'src' AND table = 'events' "
                           "AND active", "TabSeparated")).strip()
        expected = str(s.query(ROWS.format(table="src.events").rsplit(" FORMAT", 1)[0], "TabSeparated"))
        copy = base / "copy" / Path(path).name
        shutil.copytree(path, copy)
    finally:
        s.close()
    return copy, expected


async def test_attach_chdb_compact_part_read_by_clickhouse_18(
    clickhouse_factory: Callable[..., ClickHouseServer],
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
) -> None:
    part, expected = await asyncio.to_thread(chdb_part, tmp_path / "chdb")
    assert "Compact part (data.bin)" in incompatibilities_with_18_16(PartDirectory.at(part))
    ch1 = await asyncio.to_thread(clickhouse_factory, "r1")
    await ch(ch1, "CREATE DATABASE db")
    await ch(ch1, DDL)
    replica, keeper, server = await start_replicad(zookeeper, zk_root, tmp_path / "rd", "r3")
    try:
        await asyncio.to_thread(shutil.copytree, part, replica.layout.detached_path / part.name)
        text = f"ALTER TABLE db.events ATTACH PART '{part.name}'"
        result = await replica.execute(Statement(StatementKind.ATTACH, TableName("db", "events"), text,
                                                 parse_statement(text)))
        (name,) = result.fields["parts"]
        mine = replica.store.get(name)
        assert mine is not None and incompatibilities_with_18_16(PartDirectory.at(mine.path)) == []
        assert not (replica.layout.detached_path / part.name).exists()
        assert await replica.count(None) == 3000

        await ch(ch1, "SYSTEM SYNC REPLICA db.events")
        assert await ch(ch1, ROWS.format(table="db.events")) == expected
        errs = await ch(ch1, "SELECT count() FROM system.replication_queue WHERE last_exception != ''")
        assert errs.strip() == "0"
        assert (ch1.table_dir("db", "events") / name / "id.mrk").exists()
    finally:
        await replica.stop()
        await keeper.close()
        await server.stop(grace_s=0.1)
