"""Hostile statements against a real daemon: each gets a 4xx ``Code: N. DB::Exception`` (never a 500, never a
machine path), writes nothing, and no single request stalls the event loop."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "db.h"
DDL = ("CREATE TABLE IF NOT EXISTS db.h (d Date, k UInt64, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/h', '{replica}') PARTITION BY toYYYYMM(d) ORDER BY k")


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("hostile")
    from tests.support.replicad_daemon import make_chroot

    d = start_daemon(base, zookeeper, make_chroot(zookeeper, "hostile"), "r1", tables=[DDL], wait_table=TABLE)
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-01-01\t1\ta\n2024-01-02\t2\tb\n"))
    try:
        yield d
    finally:
        d.kill()


def assert_client_error(r: object, code: int | None = None) -> None:
    status, text = r.status, r.text  # type: ignore[attr-defined]
    assert 400 <= status < 500, (status, text)
    assert text.startswith("Code: ") and "DB::Exception" in text, text
    assert "/tmp" not in text and "/work" not in text and "/var" not in text, text
    if code is not None:
        assert r.exception_code == code, text  # type: ignore[attr-defined]


def test_a_huge_in_list_does_not_stall_the_event_loop(daemon: Daemon) -> None:
    values = ",".join(str(i) for i in range(50_000))
    sql = f"SELECT count() FROM {TABLE} WHERE k IN ({values})"  # 290 KB, seconds of parsing
    assert len(sql) > 262144
    refused = request(daemon.url, "/", sql.encode())
    assert_client_error(refused, 62)  # over max_query_size (262144)
    result: dict[str, object] = {}

    def big() -> None:
        result["r"] = request(daemon.url, "/?max_query_size=4000000", sql.encode(), timeout=240)

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.5)  # parsing (seconds of pure Python) has begun
    worst = 0.0
    pings = 0
    while t.is_alive() and worst < 30:
        started = time.monotonic()
        assert ok(request(daemon.url, "/ping", timeout=60)).text == "Ok.\n"
        worst = max(worst, time.monotonic() - started)
        pings += 1
        time.sleep(0.05)
    t.join(timeout=240)
    assert ok(result["r"]).text == "2\n"  # type: ignore[arg-type]
    assert pings >= 5, "the statement was answered before the pings could overlap its parsing"
    assert worst < 3.0, f"/ping waited {worst:.1f}s while a long statement was parsed"


@pytest.mark.parametrize("sql", [
    "SELECT k FROM db.h WHERE " + "(" * 3000 + "k = 1" + ")" * 3000,
    "SELECT k FROM db.h WHERE " + "NOT " * 3000 + "k = 1",
    "SELECT k FROM db.h WHERE k = 99999999999999999999999999999999999999",
    "SELECT k FROM db.h WHERE k = -99999999999999999999999999999999999999",
    "SELECT k FROM db.h LIMIT 99999999999999999999999999",
    "ALTER TABLE db.h DELETE WHERE k = 1e999999",
    "SELECT k FROM db.h WHERE s = '" + "\\" * 7,
])
def test_malformed_or_oversized_statements_are_client_errors(daemon: Daemon, sql: str) -> None:
    r = query(daemon.url, sql, post=True)
    if r.status == 200:  # a value ClickHouse accepts too (e.g. a Float64 literal)
        return
    assert_client_error(r)
    assert ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text == "2\n"


def test_names_that_would_break_files_or_zookeeper_are_refused(daemon: Daemon) -> None:
    long_name = "t" * 300
    cases = [
        f"CREATE TABLE db.{long_name} (k UInt64) ENGINE = ReplicatedMergeTree('/x/{{table}}', 'r') "
        "ORDER BY k",
        f"CREATE TABLE {long_name}.t (k UInt64) ENGINE = ReplicatedMergeTree('/x/y', 'r') ORDER BY k",
        "CREATE TABLE db.a (k UInt64) ENGINE = ReplicatedMergeTree('x/relative', 'r') ORDER BY k",
        "CREATE TABLE db.b (k UInt64) ENGINE = ReplicatedMergeTree('/x//y', 'r') ORDER BY k",
        "CREATE TABLE db.c (k UInt64) ENGINE = ReplicatedMergeTree('/x/../y', 'r') ORDER BY k",
        "CREATE TABLE db.d (k UInt64) ENGINE = ReplicatedMergeTree('/x/y', 'a/b') ORDER BY k",
        "CREATE TABLE db.e (k UInt64) ENGINE = ReplicatedMergeTree('/x/y', '..') ORDER BY k",
    ]
    for sql in cases:
        r = query(daemon.url, sql, post=True)
        assert_client_error(r, 36)
    assert all(len(name) < 250 for name in os.listdir(daemon.data_path / "metadata" / "db"))
    tables = ok(request(daemon.url, "/status")).json()["tables"]
    assert set(tables) <= {TABLE, "db.victim"}


def test_create_table_cannot_take_over_an_existing_replica(daemon: Daemon) -> None:
    """Another server's replica (here one registered in ZooKeeper and not active) keeps its identity: CREATE
    TABLE naming it is refused with 253, as ClickHouse 18.16 refuses it, and its nodes are untouched."""
    ok(query(daemon.url, "CREATE TABLE db.victim (k UInt64) ENGINE = "
                         "ReplicatedMergeTree('/clickhouse/tables/01/victim', 'r1') ORDER BY k", post=True))
    ok(query(daemon.url, "INSERT INTO db.victim FORMAT TSV", b"1\n"))
    r = query(daemon.url, "CREATE TABLE db.thief (k UInt64) ENGINE = "
                          "ReplicatedMergeTree('/clickhouse/tables/01/victim', 'r1') ORDER BY k", post=True)
    assert_client_error(r, 253)
    assert ok(query(daemon.url, "SELECT count() FROM db.victim")).text == "1\n"
    assert request(daemon.url, "/tables/db.thief/parts").status == 404


def test_a_control_character_in_query_id_is_refused_before_the_insert(daemon: Daemon) -> None:
    """Found by the fuzzer: the query id is echoed in a response header; a control character there broke the
    answer after the insert had committed (the client saw a dropped connection for a written insert)."""
    before = ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text
    r = query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2024-03-01\t9\tz\n", query_id="a\x1fb")
    assert_client_error(r, 36)
    assert ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text == before



def test_an_insert_block_over_max_partitions_per_insert_block_writes_nothing(daemon: Daemon) -> None:
    before = ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text
    body = "".join(f"{2000 + m // 12}-{m % 12 + 1:02d}-01\t{100 + m}\tp\n" for m in range(150)).encode()
    r = query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", body)  # 150 months in one block
    assert_client_error(r, 252)
    assert ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text == before
    parts = daemon.data_path / "data" / "db" / "h"
    assert not [p for p in parts.iterdir() if p.name.startswith("tmp")]
    ok(query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", body, max_partitions_per_insert_block=0))
    assert int(ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text) == int(before) + 150


def test_order_by_holds_a_bounded_number_of_rows(daemon: Daemon) -> None:
    """ORDER BY without LIMIT stops at max_bytes_to_sort / max_rows_to_sort (400, code 396); with LIMIT n it
    keeps only the best n rows as it reads, so the same small cap serves it, with the rows of a full sort."""
    ddl = ("CREATE TABLE IF NOT EXISTS db.sorted (k UInt64, g UInt32, s String) ENGINE = "
           "ReplicatedMergeTree('/clickhouse/tables/01/sorted', '{replica}') ORDER BY k")
    ok(query(daemon.url, ddl, post=True))
    n = 300_000
    body = "".join(f"{i}\t{(i * 7919) % 1000}\tv{i % 13}\n" for i in range(n)).encode()
    ok(query(daemon.url, "INSERT INTO db.sorted FORMAT TSV", body, max_insert_block_size=50_000))
    for setting in ({"max_bytes_to_sort": 100_000}, {"max_rows_to_sort": 1000}):
        r = query(daemon.url, "SELECT k, g FROM db.sorted ORDER BY g DESC, k", **setting)
        assert_client_error(r, 396)
        assert "max_rows_to_sort" in r.text
        sql = "SELECT k, g FROM db.sorted ORDER BY g DESC, k LIMIT 5 OFFSET 3"
        top = ok(query(daemon.url, sql, **setting))
        expected = sorted(((i, (i * 7919) % 1000) for i in range(n)), key=lambda kg: (-kg[1], kg[0]))[3:8]
        assert top.text == "".join(f"{k}\t{g}\n" for k, g in expected)
    everything = ok(query(daemon.url, "SELECT count() FROM db.sorted"))
    assert everything.text == f"{n}\n"
    full = ok(query(daemon.url, "SELECT k FROM db.sorted ORDER BY k DESC LIMIT 2"))  # default cap: 1 GiB
    assert full.text == f"{n - 1}\n{n - 2}\n"


def test_max_query_size_from_the_config(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """The config's ``settings: {max_query_size: …}`` is the limit when the URL gives none (the URL wins)."""
    from tests.support.replicad_daemon import make_chroot

    d = start_daemon(tmp_path, zookeeper, make_chroot(zookeeper, "qsize"), "r1", tables=[DDL],
                     wait_table=TABLE, settings={"max_query_size": 1000})
    try:
        sql = f"SELECT count() FROM {TABLE} WHERE k IN ({','.join(['1'] * 600)})"  # 1,230 bytes
        assert_client_error(request(d.url, "/", sql.encode()), 62)
        assert ok(request(d.url, "/?max_query_size=2000", sql.encode())).text == "0\n"
        assert ok(request(d.url, "/", f"SELECT count() FROM {TABLE}".encode())).text == "0\n"
    finally:
        d.kill()
