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

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.errors import BadInputError
from replicad.service import Statement, StatementKind, TableName
from replicad.sql.statements import parse_statement
from replicad.storage.part import PartDirectory
from replicad.storage.reader import incompatibilities_with_18_16
from tests.integration.test_interop_clickhouse import DDL, ch, start_replicad

chdb_session = pytest.importorskip("chdb.session")

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(240)]

#: compared as numbers: the servers' time zones may differ
ROWS = "SELECT id, toUnixTimestamp(ctime), name FROM {table} ORDER BY id FORMAT TSV"


def chdb_parts(base: Path) -> tuple[list[Path], str]:
    """Two parts chdb writes for db.events' columns: with its defaults plus a codec and the block number
    columns (Compact), and Wide with sparse columns and a lightweight DELETE; (part dirs, both tables'
    rows as TSV)."""
    s = chdb_session.Session(str(base))
    parts: list[Path] = []
    try:
        s.query("CREATE DATABASE IF NOT EXISTS src ENGINE = Atomic")
        wide = "min_bytes_for_wide_part = 0, ratio_of_defaults_for_sparse_serialization = 0.5"
        first = "index_granularity = 256, enable_block_number_column = 1, enable_block_offset_column = 1"
        for i, settings in enumerate([first, f"index_granularity = 100, {wide}"]):
            s.query(f"CREATE TABLE src.e{i} (id Int32 CODEC(Delta, ZSTD), ctime DateTime, name String) "
                    f"ENGINE = MergeTree PARTITION BY toYYYYMM(ctime) ORDER BY id SETTINGS {settings}")
            name = "if(number % 3 = 0, concat('chdb', toString(number), repeat('x', number % 7)), '')"
            s.query(f"INSERT INTO src.e{i} SELECT number + {i} * 10000, "
                    f"toDateTime('2026-11-10 12:00:00') + number * 37, {name} FROM numbers(3000)")
            if i == 0:  # a second insert and a merge: the merged part stores _block_number/_block_offset
                s.query("INSERT INTO src.e0 SELECT 20000, toDateTime('2026-11-20 00:00:00'), 'late'")
                s.query("OPTIMIZE TABLE src.e0 FINAL")
            if i == 1:  # a lightweight DELETE: the part gets _row_exists
                s.query("DELETE FROM src.e1 WHERE id % 5 = 0")
            path = str(s.query(f"SELECT path FROM system.parts WHERE database = 'src' AND table = 'e{i}' "
                               "AND active", "TabSeparated")).strip()
            copy = base / f"copy{i}" / Path(path).name
            shutil.copytree(path, copy)
            parts.append(copy)
        both = "(SELECT * FROM src.e0 UNION ALL SELECT * FROM src.e1)"
        expected = str(s.query(ROWS.format(table=both).rsplit(" FORMAT", 1)[0], "TabSeparated"))
    finally:
        s.close()
    return parts, expected


async def test_attach_chdb_parts_read_by_clickhouse_18(
    clickhouse_factory: Callable[..., ClickHouseServer],
    zookeeper: ZooKeeperServer,
    zk_root: str,
    tmp_path: Path,
) -> None:
    parts, expected = await asyncio.to_thread(chdb_parts, tmp_path / "chdb")
    assert "Compact part (data.bin)" in incompatibilities_with_18_16(PartDirectory.at(parts[0]))
    assert "_block_number" in PartDirectory.at(parts[0]).columns_text
    assert any("sparse" in r for r in incompatibilities_with_18_16(PartDirectory.at(parts[1])))
    ch1 = await asyncio.to_thread(clickhouse_factory, "r1")
    await ch(ch1, "CREATE DATABASE db")
    await ch(ch1, DDL)
    replica, keeper, server = await start_replicad(zookeeper, zk_root, tmp_path / "rd", "r3")
    try:
        detached = replica.layout.detached_path
        await asyncio.to_thread(shutil.copytree, parts[0], detached / parts[0].name)
        # the same name in another table: renamed in detached/ as a user would
        other = "202611_2_2_0" if parts[1].name != "202611_2_2_0" else "202611_3_3_0"
        await asyncio.to_thread(shutil.copytree, parts[1], detached / other)

        async def alter(text: str) -> list[str]:
            result = await replica.execute(Statement(StatementKind.ATTACH, TableName("db", "events"), text,
                                                     parse_statement(text)))
            return list(result.fields["parts"])

        (name,) = await alter(f"ALTER TABLE db.events ATTACH PART '{parts[0].name}'")
        # a lightweight UPDATE's patch part for the partition: refused, nothing attached
        patch = detached / "patch-0123456789abcdef0123456789abcdef-202611_9_9_0_10"
        await asyncio.to_thread(shutil.copytree, parts[1], patch)
        with pytest.raises(BadInputError, match="patch part of a lightweight UPDATE"):
            await alter("ALTER TABLE db.events ATTACH PARTITION 202611")
        await asyncio.to_thread(shutil.rmtree, patch)
        names = [name, *await alter("ALTER TABLE db.events ATTACH PARTITION 202611")]
        assert len(names) == 2
        for n in names:
            mine = replica.store.get(n)
            assert mine is not None and incompatibilities_with_18_16(PartDirectory.at(mine.path)) == []
        assert not any(detached.iterdir())
        assert await replica.count(None) == 3001 + 2400

        await ch(ch1, "SYSTEM SYNC REPLICA db.events")
        assert await ch(ch1, ROWS.format(table="db.events")) == expected
        errs = await ch(ch1, "SELECT count() FROM system.replication_queue WHERE last_exception != ''")
        assert errs.strip() == "0"
        assert all((ch1.table_dir("db", "events") / n / "id.mrk").exists() for n in names)
    finally:
        await replica.stop()
        await keeper.close()
        await server.stop(grace_s=0.1)
