"""COMMENT COLUMN as replicad initiates it: the new ``columns`` text, and the refusals that keep a
ClickHouse 18.16 replica from losing a column (18.16 reads a line with a comment but no DEFAULT /
MATERIALIZED / ALIAS expression as no column at all)."""

from __future__ import annotations

import pytest

from replicad.errors import ReplicadError
from replicad.replication.alter_columns import apply_column_commands, refuse_plain_column_comments
from replicad.sql.ddl import TableDef, parse_create_table
from replicad.sql.statements import Alter, parse_statement

TABLE = parse_create_table(
    "CREATE TABLE db.t (id Int32, name String, v UInt32, d UInt32 DEFAULT v + 1, a String ALIAS name, "
    "m UInt64 MATERIALIZED v * 2 COMMENT 'old') ENGINE = ReplicatedMergeTree('/t', 'r') ORDER BY id")


def alter(table: TableDef, commands: str) -> TableDef:
    parsed = parse_statement(f"ALTER TABLE db.t {commands}")
    assert isinstance(parsed, Alter)
    return apply_column_commands(table, parsed.commands)


def test_comment_on_columns_with_an_expression_writes_18_16_lines() -> None:
    new = alter(TABLE, "COMMENT COLUMN d 'it''s \\\\ a\\ttab\\nline', COMMENT COLUMN a 'al', "
                       "COMMENT COLUMN m ''")
    text = new.columns_text()
    assert ("`d` UInt32\tDEFAULT\tCAST(v + 1, \\'UInt32\\')\t"
            "\\'it\\\\\\'s \\\\\\\\ a\\\\ttab\\\\nline\\'\n") in text
    assert "`a` String\tALIAS\tname\t\\'al\\'\n" in text
    assert "`m` UInt64\tMATERIALIZED\tv * 2\n" in text  # '' removes the comment
    # nothing but the comments changed
    assert [(c.name, c.type_text, c.default_kind, c.default_expression) for c in new.columns] == [
        (c.name, c.type_text, c.default_kind, c.default_expression) for c in TABLE.columns]


def test_comment_added_with_the_column_in_one_statement() -> None:
    new = alter(TABLE, "ADD COLUMN x UInt8 DEFAULT 1, COMMENT COLUMN x 'later'")
    assert "`x` UInt8\tDEFAULT\t1\t\\'later\\'\n" in new.columns_text()


@pytest.mark.parametrize("commands", [
    "COMMENT COLUMN name 'x'",                   # a plain column
    "ADD COLUMN x UInt8 COMMENT 'x'",            # a new plain column with a comment
    "MODIFY COLUMN d UInt32 COMMENT 'x'",        # MODIFY dropping the DEFAULT, keeping a comment
])
def test_a_comment_without_an_expression_is_refused(commands: str) -> None:
    with pytest.raises(ReplicadError) as e:
        alter(TABLE, commands)
    assert e.value.code == 48 and "no DEFAULT/MATERIALIZED/ALIAS expression" in str(e.value)


def test_comment_column_errors() -> None:
    with pytest.raises(ReplicadError) as e:
        alter(TABLE, "COMMENT COLUMN nope 'x'")
    assert e.value.code == 44
    assert alter(TABLE, "COMMENT COLUMN IF EXISTS nope 'x'").columns_text() == TABLE.columns_text()
    # removing a comment of a plain column that already has one (set by another replica) is fine
    with_plain = parse_create_table(
        "CREATE TABLE db.t (id Int32, name String COMMENT 'c') "
        "ENGINE = ReplicatedMergeTree('/t', 'r') ORDER BY id")
    assert "`name` String\n" in alter(with_plain, "COMMENT COLUMN name ''").columns_text()
    # and an unrelated ALTER keeps it
    assert "`name` String\t\t\\'c\\'\n" in alter(with_plain, "ADD COLUMN z UInt8").columns_text()


def test_create_with_a_comment_on_a_plain_column_is_refused() -> None:
    with pytest.raises(ReplicadError) as e:
        refuse_plain_column_comments(parse_create_table(
            "CREATE TABLE db.t (id Int32, name String COMMENT 'who') "
            "ENGINE = ReplicatedMergeTree('/t', 'r') ORDER BY id"))
    assert e.value.code == 48 and "column name" in str(e.value)
    refuse_plain_column_comments(TABLE)  # comments on columns with an expression only: fine
    refuse_plain_column_comments(parse_create_table(  # a local table writes no columns znode
        "CREATE TABLE db.t (id Int32, name String COMMENT 'who') ENGINE = MergeTree ORDER BY id"))
