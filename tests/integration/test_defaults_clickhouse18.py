"""Column defaults against a real ClickHouse 18.16 server.

* The same DDL (DEFAULT, typed DEFAULT stored as ``CAST(expr, 'Type')``, MATERIALIZED, ALIAS, expressions
  reading other defaulted columns, a partition key over a DEFAULT column) gives the same default texts as
  18.16's ``system.columns``; the same rows inserted into 18.16 and written by replicad's sink
  (``write_block``: prepare_block + PartWriter) give byte-identical parts (LZ4), ALIAS columns absent,
  MATERIALIZED columns last in columns.txt.
* Naming a MATERIALIZED column in an insert is refused with 18.16's message and code (44), an ALIAS column
  is "no such column" (16) — in the sink and in the HTTP layer's column mapping.
* In one replica set with 18.16 (replicad's TableReplica, table from the same DDL): rows inserted through
  replicad with only some columns reach 18.16 with every DEFAULT/MATERIALIZED value 18.16 itself computes
  for the same insert, and 18.16 inserting the same rows is deduplicated (same part bytes, same block_id).
* ``UPDATE n = NULL`` keeps the old value under the NULL in ``n.bin`` (18.16 does); ``mutate_part`` writes
  the same bytes now that the Nullable serializer writes the values the array holds under NULL.
"""

from __future__ import annotations

import asyncio
import filecmp
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from replicad.catalog import spec_from_ddl
from replicad.devtools.clickhouse import ClickHouseError, ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.errors import BadInputError
from replicad.keeper.client import Keeper
from replicad.replica import ReplicaEnv, TableReplica
from replicad.replication.sink import InsertContext, TableSchema, column_defaults, write_block
from replicad.server.insert_input import insert_columns as _insert_columns
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.service import SelectQuery, TableName
from replicad.sql.ddl import parse_create_table
from replicad.sql.table_metadata import ColumnsDescription
from replicad.storage.layout import TableDataLayout
from replicad.storage.merge import PartSchema
from replicad.storage.mutate import MutationCommand, mutate_part
from replicad.storage.reader import PartReader
from replicad.storage.types import parse_type
from replicad.storage.types_composite import values_under_nulls
from replicad.storage.writer import WriterSettings
from tests.support.replicad_daemon import make_chroot, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse]

DDL = (
    "CREATE TABLE {name} (a UInt32, b UInt32 DEFAULT a + 1, m String MATERIALIZED toString(b), "
    "c UInt64 DEFAULT b * 10, d UInt64 ALIAS a * 2, e String, f DEFAULT 5, g UInt16 DEFAULT e_len, "
    "e_len UInt8 MATERIALIZED length(e), x UInt8 DEFAULT a + 300, s String DEFAULT a, "
    "n Nullable(Int32) DEFAULT NULL, i8 Int8 DEFAULT -a, fl Float32 DEFAULT a / 3, "
    "ts DateTime DEFAULT toDateTime(1700000000 + a * 3600), dd Date DEFAULT toDate(ts), "
    "u UInt64 MATERIALIZED intHash64(a) % 1000, sd String DEFAULT concat(e, '-', toString(g))) "
    "ENGINE = MergeTree PARTITION BY toYYYYMM(dd) ORDER BY (e, a) SETTINGS index_granularity = 256"
)
GRANULARITY = 256


@pytest.fixture(scope="module")
def ch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    with ClickHouseServer(tmp_path_factory.mktemp("ch18_defaults")) as server:
        yield server


def sink_schema(ddl: str) -> TableSchema:
    """The sink schema the way the engine builds it: physical columns in declaration order + defaults."""
    table = parse_create_table(ddl)
    columns = tuple((c.name, c.type) for c in table.columns if c.is_physical)
    return TableSchema(columns, table.partition_by, table.order_by, table.primary_key,
                       defaults=column_defaults(table.columns_text()))


def engine_passes_defaults(tmp_path: Path) -> bool:
    """Whether TableReplica hands the table's column defaults to its sink schema (a replica.py change)."""
    ddl = ("CREATE TABLE db.p (a UInt8, m UInt8 MATERIALIZED a) ENGINE = ReplicatedMergeTree('/p', 'r') "
           "ORDER BY a")
    env = ReplicaEnv(data_path=tmp_path / "probe",
                     interserver=InterserverExchange(InterserverServer("127.0.0.1", 0)),
                     interserver_host="127.0.0.1")
    replica = TableReplica(spec_from_ddl(parse_create_table(ddl), {}, "r"), Keeper("127.0.0.1:1"), env)
    return bool(getattr(replica.schema, "defaults", ()))


def parts_by_partition(ch: ClickHouseServer, table: str) -> dict[str, str]:
    rows = ch.query_rows(f"SELECT partition_id, name FROM system.parts WHERE table = '{table}' AND active")
    return {pid: name for pid, name in rows}


def write_like_sink(tmp: Path, schema: TableSchema, rows: pa.Table) -> dict[str, Path]:
    layout = TableDataLayout(tmp, "default", "t")
    settings = WriterSettings(index_granularity=GRANULARITY, method="lz4", fsync=False)
    parts = asyncio.run(write_block(rows, schema, layout, settings, InsertContext()))
    return {p.partition_id: Path(p.path) for p in parts}


def assert_same_files(theirs: Path, ours: Path) -> None:
    names = sorted(os.listdir(theirs))
    assert sorted(os.listdir(ours)) == names
    _same, mismatch, errors = filecmp.cmpfiles(theirs, ours, names, shallow=False)
    assert not mismatch and not errors, f"{theirs.name}: differing files {mismatch + errors}"


def tsv(rows: pa.Table) -> bytes:
    cols = [c.to_pylist() for c in rows.columns]
    out = []
    for values in zip(*cols, strict=True):
        out.append("\t".join("\\N" if v is None else v.decode() if isinstance(v, bytes) else str(v)
                             for v in values))
    return ("\n".join(out) + "\n").encode()


def test_default_texts_match_system_columns(ch: ClickHouseServer) -> None:
    ch.query("DROP TABLE IF EXISTS dflt_texts")
    ch.query(DDL.format(name="dflt_texts"))
    theirs = ch.query_rows("SELECT name, type, default_kind, default_expression FROM system.columns "
                           "WHERE database = 'default' AND table = 'dflt_texts'")
    described = ColumnsDescription.parse(parse_create_table(DDL.format(name="t")).columns_text())
    ours = [[c.name, c.type, c.default_kind, c.default_expression.replace("'", "\\'")]
            for c in described.ordered()]
    assert ours == theirs


@pytest.mark.parametrize("given", [("a", "e"), ("a", "b", "e", "s", "n", "ts"), ("e",)])
def test_inserted_parts_are_byte_identical(
    ch: ClickHouseServer, tmp_path: Path, given: tuple[str, ...]
) -> None:
    table = "dflt_" + "_".join(given)
    ch.query(f"DROP TABLE IF EXISTS {table}")
    ch.query(DDL.format(name=table))
    n = 3000
    data: dict[str, Any] = {
        "a": pa.array([(i * 7919) % 2000 for i in range(n)], pa.uint32()),
        "e": pa.array([("w" * (i % 13) + str(i % 17)).encode() for i in range(n)], pa.binary()),
        "b": pa.array([i * 3 for i in range(n)], pa.uint32()),
        "s": pa.array([f"given{i}".encode() for i in range(n)], pa.binary()),
        "n": pa.array([None if i % 4 == 0 else i - 1500 for i in range(n)], pa.int32()),
        "ts": pa.array([1710000000 + i * 7200 for i in range(n)], pa.timestamp("s")),
    }
    rows = pa.table({c: data[c] for c in given})
    ch.query(f"INSERT INTO {table} ({', '.join(given)}) FORMAT TabSeparated", data=tsv(rows))
    ours = write_like_sink(tmp_path, sink_schema(DDL.format(name=table)), rows)
    theirs = parts_by_partition(ch, table)
    assert sorted(ours) == sorted(theirs)
    for pid, path in ours.items():
        their_dir = ch.table_dir("default", table) / theirs[pid]
        assert "d.bin" not in os.listdir(their_dir)  # ALIAS: never stored
        assert_same_files(their_dir, path)
    got = pa.concat_tables(PartReader(p).read() for p in ours.values())
    assert got.num_rows == n


def test_default_null_of_decimal_fixedstring_uuid_enum_is_byte_identical(
    ch: ClickHouseServer, tmp_path: Path
) -> None:
    ddl = ("CREATE TABLE {name} (a UInt32, dm Nullable(Decimal(9, 2)) DEFAULT NULL, "
           "fs Nullable(FixedString(3)) DEFAULT NULL, uu Nullable(UUID) DEFAULT NULL, "
           "en Nullable(Enum8('a' = 1, 'b' = 2)) DEFAULT NULL) ENGINE = MergeTree ORDER BY a "
           f"SETTINGS index_granularity = {GRANULARITY}")
    ch.query("DROP TABLE IF EXISTS dflt_nulls")
    ch.query(ddl.format(name="dflt_nulls"))
    rows = pa.table({"a": pa.array([(i * 7919) % 2000 for i in range(1000)], pa.uint32())})
    ch.query("INSERT INTO dflt_nulls (a) FORMAT TabSeparated", data=tsv(rows))
    ours = write_like_sink(tmp_path, sink_schema(ddl.format(name="dflt_nulls")), rows)
    theirs = parts_by_partition(ch, "dflt_nulls")
    assert sorted(ours) == sorted(theirs) == ["all"]
    assert_same_files(ch.table_dir("default", "dflt_nulls") / theirs["all"], ours["all"])
    got = PartReader(ours["all"]).read()
    assert all(got.column(c).null_count == 1000 for c in ("dm", "fs", "uu", "en"))


def test_materialized_and_alias_refused_like_18_16(ch: ClickHouseServer, tmp_path: Path) -> None:
    ch.query("DROP TABLE IF EXISTS dflt_refuse")
    ch.query(DDL.format(name="dflt_refuse"))
    schema = sink_schema(DDL.format(name="dflt_refuse"))
    engine_table = SimpleNamespace(name="default.dflt_refuse", columns=schema.columns, schema=schema)
    for column, code in (("m", 44), ("d", 16)):
        with pytest.raises(ClickHouseError) as theirs:
            ch.query(f"INSERT INTO dflt_refuse (a, {column}) FORMAT TabSeparated", data=b"1\t2\n")
        assert theirs.value.code == code
        with pytest.raises(BadInputError) as api:
            _insert_columns(engine_table, ("a", column))
        assert api.value.code == code
        with pytest.raises(BadInputError) as sink:
            write_like_sink(tmp_path, schema, pa.table({"a": pa.array([1], pa.uint32()),
                                                        column: pa.array([2], pa.uint64())}))
        assert sink.value.code == code
        if code == 44:
            assert str(api.value) in str(theirs.value) and str(sink.value) in str(theirs.value)
    # without a column list 18.16 expects the ordinary (and DEFAULT) columns only
    insertable = [n for n, _t in _insert_columns(engine_table, None)]
    theirs_cols = ch.query_rows("SELECT name FROM system.columns WHERE table = 'dflt_refuse' "
                                "AND default_kind NOT IN ('MATERIALIZED', 'ALIAS')")
    assert insertable == [r[0] for r in theirs_cols]
    star = ch.query("SELECT * FROM dflt_refuse FORMAT TSVWithNames").split("\n", 1)[0].split("\t")
    assert star == insertable


def test_update_to_null_keeps_old_values_under_null(ch: ClickHouseServer, tmp_path: Path) -> None:
    ch.query("DROP TABLE IF EXISTS dflt_null")
    ch.query("CREATE TABLE dflt_null (k UInt64, n Nullable(Int32), s Nullable(String), "
             "fs Nullable(FixedString(3)), dm Nullable(Decimal(9, 2)), uu Nullable(UUID), "
             "en Nullable(Enum8('a' = 1, 'b' = 2))) ENGINE = MergeTree ORDER BY k")
    null = "\\N"
    ch.query("INSERT INTO dflt_null FORMAT TabSeparated", data="".join(
        f"{i}\t{null if i % 5 == 0 else i * 11}\t{null if i % 6 == 0 else 'v' * (i % 9)}\t"
        f"{null if i % 7 == 0 else 'ab'}\t{null if i % 4 == 0 else f'{i}.{i % 100:02d}'}\t"
        f"{null if i % 8 == 0 else f'00000000-0000-0000-0000-{i:012x}'}\t"
        f"{null if i % 9 == 0 else 'ab'[i % 2]}\n" for i in range(5000)).encode())
    table_dir = ch.table_dir("default", "dflt_null")
    names = (("k", "UInt64"), ("n", "Nullable(Int32)"), ("s", "Nullable(String)"),
             ("fs", "Nullable(FixedString(3))"), ("dm", "Nullable(Decimal(9, 2))"), ("uu", "Nullable(UUID)"),
             ("en", "Nullable(Enum8('a' = 1, 'b' = 2))"))
    types = tuple((c, parse_type(t)) for c, t in names)
    schema = PartSchema(types, None, "k")
    nulled = ("n", "s", "fs", "dm", "uu", "en")
    alter = f"UPDATE {', '.join(f'{c} = NULL' for c in nulled)} WHERE k % 3 = 0"
    (current,) = parts_by_partition(ch, "dflt_null").values()
    shutil.copytree(table_dir / current, tmp_path / current)
    ch.query(f"ALTER TABLE dflt_null {alter}")
    deadline = time.monotonic() + 30
    while (result := parts_by_partition(ch, "dflt_null")["all"]) == current:
        assert time.monotonic() < deadline, "18.16 did not run the mutation"
        time.sleep(0.05)
    ours = mutate_part(tmp_path / current, tmp_path / "tmp_mut", schema,
                       [MutationCommand.update([(c, "NULL") for c in nulled], "k % 3 = 0")],
                       WriterSettings(method="lz4", fsync=False))
    # 18.16 left the old values under the new NULLs (and 0 under the inserted ones)
    theirs = PartReader(table_dir / result).read()
    k = theirs.column("k").to_pylist()
    under = values_under_nulls(theirs.column("n").combine_chunks()).to_pylist()
    assert under == [0 if i % 5 == 0 else i * 11 for i in k]
    assert theirs.column("n").null_count == sum(1 for i in k if i % 5 == 0 or i % 3 == 0)
    assert_same_files(table_dir / result, ours.path)
    assert PartReader(ours.path).read().equals(PartReader(table_dir / result).read())


async def test_mixed_replica_set_inserts_with_defaults(
    clickhouse_factory: Callable[..., ClickHouseServer], zookeeper: ZooKeeperServer, zk_root: str,
    tmp_path: Path,
) -> None:
    ddl = DDL.format(name="db.dflt").replace(
        "ENGINE = MergeTree", "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/dflt', '{replica}')")
    ch1 = clickhouse_factory("r1")
    await asyncio.to_thread(ch1.query, "CREATE DATABASE db")
    await asyncio.to_thread(ch1.query, ddl)
    await asyncio.to_thread(ch1.query, DDL.format(name="db.plain"))
    keeper = Keeper(zookeeper.hosts, session_timeout_s=10.0, chroot=zk_root)
    await keeper.start()
    server = InterserverServer("127.0.0.1", 0)
    await server.start()
    env = ReplicaEnv(data_path=tmp_path / "rd", interserver=InterserverExchange(server),
                     interserver_host="127.0.0.1", fsync=False,
                     writer=WriterSettings(fsync=False, method="lz4", threads=1))
    replica = TableReplica(spec_from_ddl(parse_create_table(ddl), {"shard": "01"}, "r2"), keeper, env)
    try:
        if not engine_passes_defaults(tmp_path):
            pytest.skip("replica.py does not pass the column defaults to its sink schema yet")
        await replica.start()
        n = 2000
        rows = pa.table({"a": pa.array([(i * 7919) % 2000 for i in range(n)], pa.uint32()),
                         "e": pa.array([("v" * (i % 11) + str(i % 7)).encode() for i in range(n)])})
        summary = await replica.insert_table(rows)
        assert summary.written_rows == n
        await asyncio.to_thread(ch1.query, "SYSTEM SYNC REPLICA db.dflt")
        await asyncio.to_thread(ch1.query, "INSERT INTO db.plain (a, e) FORMAT TabSeparated", tsv(rows))
        every = "a, b, c, e, f, g, x, s, n, i8, fl, ts, dd, sd, m, e_len, u, d"
        theirs, ours = [await asyncio.to_thread(ch1.query, f"SELECT {every} FROM db.{t} ORDER BY e, a")
                        for t in ("plain", "dflt")]
        assert ours == theirs
        # 18.16 writing the same rows makes the same parts: every block is deduplicated
        await asyncio.to_thread(ch1.query, "INSERT INTO db.dflt (a, e) FORMAT TabSeparated", tsv(rows))
        assert (await asyncio.to_thread(ch1.query, "SELECT count() FROM db.dflt")).strip() == str(n)
        errors = await asyncio.to_thread(
            ch1.query, "SELECT count() FROM system.replication_queue WHERE last_exception != ''")
        assert errors.strip() == "0"
        # SELECT * leaves out MATERIALIZED (and ALIAS) columns, as 18.16 does
        star = (await asyncio.to_thread(ch1.query, "SELECT * FROM db.dflt LIMIT 0 FORMAT TSVWithNames"))
        result = await replica.select(SelectQuery(TableName("db", "dflt"), None, limit=1))
        assert [name for name, _t in result.columns] == star.strip().split("\t")
        assert len([b async for b in result.batches]) == 1
    finally:
        await replica.stop()
        await keeper.close()
        await server.stop(grace_s=0.1)


def test_http_inserts_with_defaults_like_18_16(
    ch: ClickHouseServer, zookeeper: ZooKeeperServer, tmp_path: Path
) -> None:
    if not engine_passes_defaults(tmp_path):
        pytest.skip("replica.py does not pass the column defaults to its sink schema yet")
    ddl = DDL.format(name="db.hd").replace(
        "ENGINE = MergeTree", "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/hd', '{replica}')")
    ch.query("CREATE DATABASE IF NOT EXISTS db")
    ch.query("DROP TABLE IF EXISTS db.hd")
    ch.query(DDL.format(name="db.hd"))
    d = start_daemon(tmp_path, zookeeper, make_chroot(zookeeper, "defaults_http"), "r1", tables=[ddl],
                     wait_table="db.hd")
    try:
        named = "".join(f"{i * 37 % 500}\tval{i % 9}\n" for i in range(300)).encode()
        full = b"7\t8\t9\tfull\t1\t2\t3\ts\t\\N\t-4\t0.5\t2024-03-01 10:00:00\t2024-03-02\tsd\n"
        for sql, body in (("INSERT INTO db.hd (a, e) FORMAT TabSeparated", named),
                          ("INSERT INTO db.hd FORMAT TabSeparated", full)):
            ch.query(sql, data=body)
            reply = query(d.url, sql, body)
            assert reply.status == 200, reply.text
        for column, code in (("m", 44), ("d", 16)):
            reply = query(d.url, f"INSERT INTO db.hd (a, {column}) FORMAT TabSeparated", b"1\t2\n")
            assert reply.status == 400 and reply.exception_code == code, reply.text
        for select in ("SELECT * FROM db.hd ORDER BY e, a FORMAT TSVWithNames",
                       "SELECT a, m, e_len, u FROM db.hd ORDER BY e, a FORMAT TSVWithNames"):
            assert query(d.url, select).text == ch.query(select)
    finally:
        d.stop()
