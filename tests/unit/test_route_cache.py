"""replicad.server.routing.resolve: SELECT routes are parsed once and kept; INSERTs and long texts are not."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import SyntaxError_
from replicad.server import routing
from replicad.server.routing import InsertRoute, SelectRoute, StatementRoute, resolve
from tests.support.call_log import record_first_arguments


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    routing._resolve_cached.cache_clear()
    return record_first_arguments(monkeypatch, routing, "parse_full")


def test_a_select_is_parsed_once(parses: list[str]) -> None:
    sql = "SELECT count() FROM db.events WHERE id > 5"
    first = resolve(sql)
    again = resolve(sql)
    assert isinstance(first, SelectRoute) and first.is_count
    assert again is first and parses == [sql]
    assert first.query.table.database == "db" and first.query.where == "id > 5"
    other_db = resolve(sql.replace("db.events", "events"), "analytics")
    assert isinstance(other_db, SelectRoute) and other_db.query.table.database == "analytics"
    assert resolve(sql.replace("db.events", "events"), "web") is not other_db  # the database is in the key


def test_inserts_and_long_texts_are_not_kept(parses: list[str]) -> None:
    insert = "INSERT INTO db.events FORMAT TSV\n1\t2\n"
    a, b = resolve(insert), resolve(insert)
    assert isinstance(a, InsertRoute) and a is not b
    long_sql = "SELECT count() FROM db.events WHERE " + " OR ".join(f"id = {i}" for i in range(600))
    assert len(long_sql) > routing.MAX_CACHED_TEXT
    resolve(long_sql)
    resolve(long_sql)
    assert parses == [long_sql, long_sql]
    assert isinstance(resolve("DROP TABLE db.events"), StatementRoute)


def test_syntax_errors_are_raised_every_time(parses: list[str]) -> None:
    for _ in range(2):
        with pytest.raises(Exception, match="Syntax error"):
            resolve("SELECT count( FROM db.events")


@given(st.lists(st.sampled_from(["INSERT", " ", "t", "-", "--", "/", "/*", "*/", "*", "'", '"', "`", "\\",
                                 "\n", "x", "''"]), max_size=12).map("".join))
@settings(max_examples=400, deadline=None)
def test_strip_comments_fast_path_changes_nothing(sql: str) -> None:
    """A text with no comment marker and no quote is returned as it is; any other goes through the scan
    (an unterminated quote still refused there)."""
    from replicad.server import routing

    def scanned(text: str) -> object:
        try:
            return routing._strip_scan(text)  # the scan alone, without the fast path
        except SyntaxError_ as e:
            return ("error", str(e))

    try:
        got: object = routing.strip_comments(sql)
    except SyntaxError_ as e:
        got = ("error", str(e))
    assert got == scanned(sql)
