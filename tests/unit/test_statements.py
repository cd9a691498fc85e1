"""HTTP API statements: parsing, mutation command texts (vs. a live 18.16) and partition specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import SyntaxError_
from replicad.model.text_io import escape
from replicad.sql.expressions_lexer import unescape
from replicad.sql.statements import (
    Alter,
    CreateTable,
    DropTable,
    Insert,
    MutationCommand,
    Optimize,
    PartitionCommand,
    Select,
    SystemSyncReplica,
    TableRef,
    Truncate,
    format_commands,
    parse_mutation_commands,
    parse_statement,
)

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "ch18_metadata.json").read_text())
MUTATIONS = [(c["name"], m) for c in FIXTURE["cases"] for m in c["mutations"]]


@pytest.mark.parametrize(("table", "mutation"), MUTATIONS, ids=[m["alter"][:40] for _, m in MUTATIONS])
def test_mutation_commands_text_matches_18_16(table: str, mutation: dict[str, str]) -> None:
    stmt = parse_statement(f"ALTER TABLE g.{table} {mutation['alter']}")
    assert isinstance(stmt, Alter)
    znode_commands = mutation["znode"].split("commands: ", 1)[1]
    assert escape(stmt.mutation_commands_text()) == znode_commands
    # and the entry's text parses back into the same commands
    if "--" in znode_commands:  # 18.16 prints negate(negate(a)) as --a, which reads back as a comment
        with pytest.raises(SyntaxError_):
            parse_mutation_commands(unescape(znode_commands))
        return
    back = parse_mutation_commands(unescape(znode_commands))
    assert format_commands(back) == format_commands(parse_mutation_commands(format_commands(back)))
    assert [c.kind for c in back] == [c.kind for c in stmt.mutation_commands]


def test_mutation_commands() -> None:
    stmt = parse_statement(
        "ALTER TABLE db.t UPDATE a = a + 1, `b c` = 'x' WHERE d = 1, DELETE WHERE x IN (1, 2)"
    )
    assert isinstance(stmt, Alter)
    assert stmt.table == TableRef("db", "t")
    upd, dele = stmt.mutation_commands
    assert upd.kind == "UPDATE" and [c for c, _ in upd.assignments] == ["a", "b c"]
    assert upd.columns == ["d", "a"]
    assert (
        stmt.mutation_commands_text()
        == "UPDATE a = a + 1, `b c` = 'x' WHERE d = 1, DELETE WHERE x IN (1, 2) "
    )
    assert parse_mutation_commands("DELETE WHERE 1 ") == [
        MutationCommand(
            "DELETE", dele.predicate.__class__(parse_mutation_commands("DELETE WHERE 1")[0].predicate.node)
        )
    ]
    with pytest.raises(SyntaxError_, match="Multiple assignments"):
        parse_statement("ALTER TABLE t UPDATE a = 1, a = 2 WHERE 1")
    with pytest.raises(SyntaxError_):
        parse_mutation_commands("DROP PARTITION 1")
    with pytest.raises(SyntaxError_):
        parse_mutation_commands("MATERIALIZE INDEX i")


@pytest.mark.parametrize(
    ("sql", "data"),
    [
        ("INSERT INTO db.t FORMAT JSONEachRow", b""),
        ('INSERT INTO db.t FORMAT JSONEachRow {"a": 1}', b'{"a": 1}'),
        ("INSERT INTO db.t FORMAT TSV\n1\t2\n", b"1\t2\n"),
        ("INSERT INTO db.t FORMAT TSV  \r\n  1\t2\n", b"  1\t2\n"),
        ("insert into t (a, `b`) format CSV\n\n1,2", b"\n1,2"),
    ],
)
def test_insert(sql: str, data: bytes) -> None:
    stmt = parse_statement(sql)
    assert isinstance(stmt, Insert)
    assert stmt.data == data
    if "(a, `b`)" in sql:
        assert stmt.columns == ("a", "b") and stmt.format == "CSV" and stmt.table == TableRef(None, "t")
    else:
        assert stmt.columns is None and stmt.table.qualified == "db.t"


def test_insert_values_and_settings() -> None:
    stmt = parse_statement("INSERT INTO t SETTINGS insert_quorum = 2 VALUES (1, 'a'), (2, 'b')")
    assert isinstance(stmt, Insert)
    assert (stmt.format, stmt.data, stmt.settings) == (
        "Values",
        b"(1, 'a'), (2, 'b')",
        {"insert_quorum": "2"},
    )


def test_select() -> None:
    stmt = parse_statement(
        "SELECT a, b AS c, toYYYYMM(d) m, * FROM db.t FINAL WHERE a > 1 AND s LIKE 'x%' "
        "ORDER BY a DESC, b NULLS FIRST LIMIT 5, 10 FORMAT JSONEachRow SETTINGS max_threads = 1"
    )
    assert isinstance(stmt, Select)
    assert [i.name for i in stmt.items] == ["a", "c", "m", "*"]
    assert stmt.star and stmt.final and not stmt.is_count
    assert stmt.where is not None and stmt.where.text == "(a > 1) AND (s LIKE 'x%')"
    assert [(o.expr.text, o.descending, o.nulls_first) for o in stmt.order_by] == [
        ("a", True, None),
        ("b", False, True),
    ]
    assert (stmt.limit, stmt.offset, stmt.format, stmt.settings) == (
        10,
        5,
        "JSONEachRow",
        {"max_threads": "1"},
    )
    plus = parse_statement("SELECT a + 1 FROM t")
    assert isinstance(plus, Select) and [i.name for i in plus.items] == ["plus(a, 1)"]
    count = parse_statement("select COUNT(*) from t where x = 1 limit 1 offset 2")
    assert isinstance(count, Select) and count.is_count and (count.limit, count.offset) == (1, 2)
    assert parse_statement("SELECT count() FROM t").is_count  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a FROM t GROUP BY a",
        "SELECT DISTINCT a FROM t",
        "SELECT count(), a FROM t",
        "SELECT a",
        "SELECT a FROM (SELECT 1)",
        "SELECT a FROM t LIMIT x",
        "UPDATE t SET a = 1",
        "CREATE DATABASE x",
        "ALTER TABLE t ADD COLUMN x UInt8 AFTER",
        "ALTER TABLE t DROP COLUMN",
        "ALTER TABLE t MODIFY COLUMN x UInt8 CODEC(ZSTD)",
        "SYSTEM STOP MOVES t",
        "SYSTEM DROP REPLICA r FROM TABLE t",
        "SYSTEM STOP FETCHES t extra",
        "DROP DATABASE d",
        "SELECT a FROM t WHERE",
        "OPTIMIZE TABLE t FINALLY",
        "INSERT INTO t",
        "ALTER TABLE t DELETE x = 1",
    ],
)
def test_unsupported_or_bad_statements(sql: str) -> None:
    with pytest.raises(SyntaxError_):
        parse_statement(sql)


def test_ddl_like_statements() -> None:
    assert parse_statement("DROP TABLE IF EXISTS db.t ON CLUSTER c") == DropTable(
        TableRef("db", "t"), True, "c"
    )
    assert parse_statement("drop table t") == DropTable(TableRef(None, "t"))
    assert parse_statement("TRUNCATE TABLE db.t") == Truncate(TableRef("db", "t"))
    assert parse_statement("SYSTEM SYNC REPLICA db.t;") == SystemSyncReplica(TableRef("db", "t"))
    opt = parse_statement("OPTIMIZE TABLE db.t PARTITION ID '202611' FINAL DEDUPLICATE")
    assert isinstance(opt, Optimize) and opt.final and opt.deduplicate and opt.partition is not None
    assert opt.partition.resolve([]) == "202611"
    assert parse_statement("OPTIMIZE TABLE t") == Optimize(TableRef(None, "t"))
    create = parse_statement("CREATE TABLE db.x (a UInt8) ENGINE = MergeTree ORDER BY a")
    assert isinstance(create, CreateTable) and create.table == TableRef("db", "x")


def _partition(sql: str) -> PartitionCommand:
    stmt = parse_statement(sql)
    assert isinstance(stmt, Alter)
    cmd = stmt.commands[0]
    assert isinstance(cmd, PartitionCommand)
    return cmd


def test_partition_specs_resolve_like_18_16() -> None:
    """Partition values name the IDs 18.16 gave the recorded parts."""
    u32, i8, date, s, i32 = (parse_type(n) for n in ("UInt32", "Int8", "Date", "String", "Int32"))
    cases = [
        ("DROP PARTITION 202611", [u32], "202611"),
        (
            "DETACH PARTITION (20261122, '2026-11-16', '2026-11-01', -3)",
            [u32, date, date, i8],
            "20261122-20261116-20261101--3",
        ),
        ("DROP PARTITION '2026-11-22'", [date], "20261122"),
        ("DROP PARTITION toDate('2026-11-22')", [date], "20261122"),
        ("DROP PARTITION 'hello'", [s], "21818ffeee1ae033898614f81c7c3c75"),
        ("DROP PARTITION ('x', 7)", [s, i32], "009a7e62d72d9d2b66c40e44545abf3a"),
        ("DROP PARTITION tuple()", [], "all"),
        ("DROP PARTITION ID 'abc'", [u32], "abc"),
    ]
    recorded = {p["partition_id"] for c in FIXTURE["cases"] for p in c["parts"]}
    for sql, types, want in cases:
        cmd = _partition(f"ALTER TABLE t {sql}")
        assert cmd.partition.resolve(types) == want
        assert want in recorded or want in ("all", "abc", "202611")
    assert _partition("ALTER TABLE t DETACH PARTITION (1, 'a')").to_text() == "DETACH PARTITION (1, 'a')"
    assert _partition("ALTER TABLE t DROP PARTITION ID 'x'").to_text() == "DROP PARTITION ID 'x'"
    with pytest.raises(SyntaxError_, match="Wrong number of fields"):
        _partition("ALTER TABLE t DROP PARTITION (1, 2)").partition.resolve([u32])
    with pytest.raises(SyntaxError_, match="Could not parse partition value"):
        _partition("ALTER TABLE t DROP PARTITION 'x'").partition.resolve([u32])


@given(
    st.lists(
        st.sampled_from(
            [
                "DELETE WHERE a = 1",
                "UPDATE b = concat(s, 'x\\'y') WHERE (a > 1) AND (c < 2)",
                "DELETE WHERE s LIKE '%\\\\%'",
                "UPDATE `x y` = -1 WHERE 1",
            ]
        ),
        min_size=1,
        max_size=4,
    )
)
def test_mutation_command_text_round_trip(texts: list[str]) -> None:
    joined = format_commands(parse_mutation_commands(", ".join(texts)))
    assert joined == "".join(t + ("," if i + 1 < len(texts) else "") + " " for i, t in enumerate(texts))
    assert format_commands(parse_mutation_commands(unescape(escape(joined)))) == joined


@pytest.mark.parametrize(("sql", "want"), [
    ("SYSTEM DROP REPLICA 'r2' FROM TABLE db.t", ("DROP REPLICA", "db.t", "r2")),
    ("SYSTEM RESTART REPLICA t", ("RESTART REPLICA", "t", None)),
    ("system stop fetches db.t", ("STOP FETCHES", "db.t", None)),
    ("SYSTEM START MERGES", ("START MERGES", None, None)),
])
def test_system_commands(sql: str, want: tuple[str, str | None, str | None]) -> None:
    from replicad.sql.statements import SystemCommand

    st = parse_statement(sql)
    assert isinstance(st, SystemCommand)
    assert (st.action, st.table.qualified if st.table else None, st.replica) == want


def test_attach_and_drop_detached_commands() -> None:
    from replicad.sql.statements import DetachedCommand

    st = parse_statement("ALTER TABLE db.t ATTACH PART 'all_1_1_0'")
    assert st.commands == (DetachedCommand("ATTACH", part="all_1_1_0"),)  # type: ignore[union-attr]
    st = parse_statement("ALTER TABLE db.t DROP DETACHED PARTITION ID '202401'")
    cmd = st.commands[0]  # type: ignore[union-attr]
    assert isinstance(cmd, DetachedCommand) and cmd.kind == "DROP DETACHED" and cmd.partition is not None
    assert cmd.partition.id == "202401" and cmd.to_text() == "DROP DETACHED PARTITION ID '202401'"
    with pytest.raises(SyntaxError_):
        parse_statement("ALTER TABLE db.t ATTACH PART all_1_1_0")  # the name is a string


def test_column_commands() -> None:
    from replicad.sql.statements import Alter, ColumnCommand

    s = parse_statement("ALTER TABLE db.t ADD COLUMN IF NOT EXISTS `c d` UInt32 DEFAULT x * 2 "
                        "COMMENT 'it''s' AFTER x, DROP COLUMN IF EXISTS y, MODIFY COLUMN z Nullable(String)")
    assert isinstance(s, Alter)
    assert s.commands == (
        ColumnCommand("ADD", "c d", "`c d` UInt32 DEFAULT x * 2 COMMENT 'it\\'s'", "x", True),
        ColumnCommand("DROP", "y", if_exists=True),
        ColumnCommand("MODIFY", "z", "z Nullable(String)"),
    )
    assert [c.to_text() for c in s.commands] == [
        "ADD COLUMN IF NOT EXISTS `c d` UInt32 DEFAULT x * 2 COMMENT 'it\\'s' AFTER x",
        "DROP COLUMN IF EXISTS y", "MODIFY COLUMN z Nullable(String)"]
