"""COMMENT COLUMN in a set mixing ClickHouse 18.16 and a replicad daemon, issued on either kind.

replicad sets the comment (the ``columns`` znode in 18.16's text: ``\\t\\t'…'`` after the type, or after
``\\tDEFAULT\\t<expr>``): the 18.16 replica's alter thread follows, DESCRIBE TABLE and system.columns show
the comment, the column and its rows stay (same rows on both sides, same parts, also after a restart of
ClickHouse).  Then 18.16 comments a column: replicad follows, its DESCRIBE shows it.  A comment on a column
without an expression is refused by replicad: 18.16 loses such a column (shown at the end)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.sql.table_metadata import ColumnsDescription
from tests.support.replicad_daemon import ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(300)]

TABLE_PATH = "/clickhouse/tables/01/events"
DDL = (
    "CREATE TABLE db.events (id Int32, ctime DateTime, name String, v UInt32) "
    f"ENGINE = ReplicatedMergeTree('{TABLE_PATH}', '{{replica}}') "
    "PARTITION BY toYYYYMM(ctime) ORDER BY id"
)
SELECT = "SELECT id, ctime, name, v, d FROM db.events ORDER BY id FORMAT TSV"
PARTS = "SELECT name FROM system.parts WHERE active AND database = 'db' AND table = 'events' ORDER BY name"


def tsv(ids: range) -> bytes:
    return "".join(f"{i}\t2026-11-{1 + i % 27:02d} 10:00:00\tn{i}\t{i * 10}\n" for i in ids).encode()


def describe(text: str) -> list[list[str]]:
    return [line.split("\t")[:5] for line in text.splitlines()]


def rd(d: Daemon, sql: str, body: bytes | None = None, post: bool = False) -> str:
    return ok(query(d.url, sql, body, post=post, timeout=120)).text


def synced(ch1: ClickHouseServer, d: Daemon) -> str:
    ch1.query("SYSTEM SYNC REPLICA db.events")
    rd(d, "SYSTEM SYNC REPLICA db.events", post=True)
    return ch1.query(SELECT)


def parts_columns(ch1: ClickHouseServer) -> str:
    return ch1.query("SELECT name, groupArray(column) FROM (SELECT name, column FROM system.parts_columns "
                     "WHERE active AND database = 'db' AND table = 'events' ORDER BY name, column) "
                     "GROUP BY name ORDER BY name")


def test_comment_column_issued_on_either_kind_is_followed(
    clickhouse_factory: Callable[..., ClickHouseServer], zookeeper: ZooKeeperServer, zk_root: str,
    tmp_path: Path,
) -> None:
    ch1 = clickhouse_factory("ch1")
    ch1.query("CREATE DATABASE db")
    ch1.query(DDL)
    create = DDL.replace("TABLE", "TABLE IF NOT EXISTS", 1)
    d = start_daemon(tmp_path, zookeeper, zk_root, "rd", tables=[create], wait_table="db.events")
    zk = KazooClient(hosts=zookeeper.hosts + zk_root)
    zk.start(15)
    columns = f"{TABLE_PATH}/columns"
    try:
        rd(d, "INSERT INTO db.events (id, ctime, name, v) FORMAT TSV", tsv(range(0, 30)), post=True)
        ch1.query("INSERT INTO db.events (id, ctime, name, v) FORMAT TSV", tsv(range(100, 130)))
        ch1.query("ALTER TABLE db.events ADD COLUMN d UInt32 DEFAULT v + 1, ADD COLUMN a String ALIAS name")
        before = synced(ch1, d)
        assert len(before.splitlines()) == 60 and rd(d, SELECT) == before
        parts = parts_columns(ch1)
        assert "'d'" not in parts  # the rows of these parts read d's DEFAULT

        # ---- replicad comments the DEFAULT column (quote, backslash, tab, LF in it) and the ALIAS one
        rd(d, "ALTER TABLE db.events COMMENT COLUMN d 'it''s \\\\ a\\ttab\\nand a line'", post=True)
        rd(d, "ALTER TABLE db.events COMMENT COLUMN a 'the name again'", post=True)
        shared = zk.get(columns)[0].decode()
        assert shared.endswith(
            "`d` UInt32\tDEFAULT\tCAST(v + 1, \\'UInt32\\')\t"
            "\\'it\\\\\\'s \\\\\\\\ a\\\\ttab\\\\nand a line\\'\n"
            "`a` String\tALIAS\tname\t\\'the name again\\'\n"), shared
        # replicad answered once ClickHouse had followed and published the same columns
        assert zk.get(f"{TABLE_PATH}/replicas/ch1/columns")[0].decode() == shared
        expected = [
            ["id", "Int32", "", "", ""],
            ["ctime", "DateTime", "", "", ""],
            ["name", "String", "", "", ""],
            ["v", "UInt32", "", "", ""],
            ["d", "UInt32", "DEFAULT", "CAST(v + 1, \\'UInt32\\')", "it\\'s \\\\ a\\ttab\\nand a line"],
            ["a", "String", "ALIAS", "name", "the name again"],
        ]
        assert describe(ch1.query("DESCRIBE TABLE db.events")) == expected
        assert describe(rd(d, "DESCRIBE TABLE db.events")) == expected
        assert ch1.query("SELECT name, comment FROM system.columns WHERE database = 'db' AND "
                         "table = 'events' AND comment != '' ORDER BY name FORMAT TSV") == (
            "a\tthe name again\nd\tit\\'s \\\\ a\\ttab\\nand a line\n")  # TSV escapes the quote too
        # ClickHouse kept every column and row; its parts are untouched; also after its restart
        assert ch1.query(SELECT) == before and parts_columns(ch1) == parts
        ch1.stop()
        ch1.start()
        assert describe(ch1.query("DESCRIBE TABLE db.events")) == expected
        assert ch1.query(SELECT) == before and parts_columns(ch1) == parts

        # ---- a comment on a column without an expression is refused: 18.16 would lose that column
        r = query(d.url, "ALTER TABLE db.events COMMENT COLUMN name 'the name'", post=True)
        assert r.status != 200 and r.exception_code == 48, r.text
        assert "no DEFAULT/MATERIALIZED/ALIAS expression" in r.text
        r = query(d.url, "ALTER TABLE db.events ADD COLUMN x UInt8 COMMENT 'x'", post=True)
        assert r.exception_code == 48, r.text
        assert zk.get(columns)[0].decode() == shared
        # removing a comment is fine
        rd(d, "ALTER TABLE db.events COMMENT COLUMN a ''", post=True)
        expected[5][4] = ""
        assert describe(ch1.query("DESCRIBE TABLE db.events")) == expected
        assert describe(rd(d, "DESCRIBE TABLE db.events")) == expected
        ch1.query("INSERT INTO db.events (id, ctime, name, v) FORMAT TSV", tsv(range(200, 210)))
        rows = b"".join(f"{i}\t2026-11-02 10:00:00\tr{i}\t{i}\t{i * 7}\n".encode() for i in range(300, 310))
        rd(d, "INSERT INTO db.events (id, ctime, name, v, d) FORMAT TSV", rows, post=True)
        after = synced(ch1, d)
        assert len(after.splitlines()) == 80 and rd(d, SELECT) == after

        # ---- ClickHouse comments: replicad follows, its columns text is byte-identical to 18.16's
        ch1.query("ALTER TABLE db.events COMMENT COLUMN d 'from \\'ClickHouse\\' \\\\ 18.16'")
        expected[4][4] = "from \\'ClickHouse\\' \\\\ 18.16"
        assert describe(ch1.query("DESCRIBE TABLE db.events")) == expected
        assert describe(rd(d, "DESCRIBE TABLE db.events")) == expected
        shared = zk.get(columns)[0].decode()
        assert zk.get(f"{TABLE_PATH}/replicas/rd/columns")[0].decode() == shared
        assert ColumnsDescription.parse(shared).to_text() == shared
        assert rd(d, SELECT) == after == ch1.query(SELECT)
        # a restarted replicad keeps the comment (its persisted DDL was rewritten)
        d.stop()
        d = start_daemon(tmp_path, zookeeper, zk_root, "rd", tables=[create], wait_table="db.events")
        assert describe(rd(d, "DESCRIBE TABLE db.events")) == expected
        assert rd(d, SELECT) == after

        # ---- why the refusal: 18.16's own COMMENT on a column without an expression loses the column on
        # 18.16 (DESCRIBE, parts); replicad, following the same znode text, keeps the column and its rows
        ch1.query("ALTER TABLE db.events COMMENT COLUMN name 'gone on 18.16'")
        assert "name" not in [row[0] for row in describe(ch1.query("DESCRIBE TABLE db.events"))]
        assert "'name'" not in parts_columns(ch1)
        assert "`name` String\t\t\\'gone on 18.16\\'\n" in zk.get(columns)[0].decode()
        wait_for = [*expected[:2], ["name", "String", "", "", "gone on 18.16"], *expected[3:]]
        deadline = time.monotonic() + 30
        while describe(rd(d, "DESCRIBE TABLE db.events")) != wait_for:
            assert time.monotonic() < deadline, rd(d, "DESCRIBE TABLE db.events")
            time.sleep(0.2)
        assert rd(d, "SELECT id, name FROM db.events ORDER BY id FORMAT TSV") == "".join(
            f"{line.split(chr(9))[0]}\t{line.split(chr(9))[2]}\n" for line in after.splitlines())
    finally:
        zk.stop()
        d.kill()
