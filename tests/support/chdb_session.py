"""A chdb (ClickHouse 26.x in-process) session per test module, with database ``db``, and a query helper."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def chs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    chdb_session = pytest.importorskip("chdb.session")
    s = chdb_session.Session(str(tmp_path_factory.mktemp("chdb")))
    s.query("CREATE DATABASE IF NOT EXISTS db ENGINE = Atomic")
    try:
        yield s
    finally:
        s.close()


def q(chs: Any, sql: str) -> str:
    return str(chs.query(sql, "TabSeparated"))
