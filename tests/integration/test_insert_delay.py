"""parts_to_delay_insert / parts_to_throw_insert / max_delay_to_insert with a real daemon and ZooKeeper: a
block waits ClickHouse's delay once its partition holds parts_to_delay_insert active parts, is refused
(252, HTTP 429) from parts_to_throw_insert on, and is let through again once merges catch up."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.replication.insert_delay import PartsLimit
from tests.support.replicad_daemon import log_events, ok, one_daemon, query, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "db.delayed"
DDL = ("CREATE TABLE IF NOT EXISTS db.delayed (d Date, k UInt64) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/delayed', '{replica}') PARTITION BY toYYYYMM(d) "
       "ORDER BY k SETTINGS parts_to_delay_insert = 2, parts_to_throw_insert = 4, max_delay_to_insert = 1")


@pytest.fixture
def daemon(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> Iterator[Daemon]:
    yield from one_daemon(tmp_path, zookeeper, zk_root, DDL, TABLE)


def insert(d: Daemon, k: int, month: int = 1) -> tuple[float, object]:
    started = time.monotonic()
    r = query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", f"2024-{month:02d}-01\t{k}\n".encode())
    return time.monotonic() - started, r


def active_parts(d: Daemon) -> list[str]:
    return [p["name"] for p in ok(request(d.url, f"/tables/{TABLE}/parts")).json() if p["active"]]


def delays(d: Daemon) -> list[tuple[float, int]]:
    return [(e["ms"], e["parts"]) for e in log_events(d) if e.get("event") == "delaying_insert"]


def test_inserts_wait_then_are_refused_then_pass_once_merged(daemon: Daemon) -> None:
    ok(query(daemon.url, f"SYSTEM STOP MERGES {TABLE}", post=True))
    ok(insert(daemon, 100, month=2)[1])  # another partition's part
    for k in range(2):  # 0, then 1 part in the busiest partition: below parts_to_delay_insert
        ok(insert(daemon, k)[1])
    assert delays(daemon) == []
    ok(insert(daemon, 2)[1])  # 2 parts: k = 1 of max_k = 2, 1000 ** (1/2) ms
    took, r = insert(daemon, 3)  # 3 parts: k = 2 of 2, the whole max_delay_to_insert
    ok(r)
    assert took >= 1.0
    assert delays(daemon) == [(31.623, 2), (1000.0, 3)]
    _took, refused = insert(daemon, 4)  # 4 parts: parts_to_throw_insert
    assert refused.status == 429 and refused.exception_code == 252, refused.text  # type: ignore[attr-defined]
    assert "Too many parts (4)" in refused.text  # type: ignore[attr-defined]
    _took, refused = insert(daemon, 101, month=2)  # the busiest partition counts, as in ClickHouse
    assert refused.status == 429  # type: ignore[attr-defined]
    ok(query(daemon.url, f"SYSTEM START MERGES {TABLE}", post=True))
    ok(query(daemon.url, f"OPTIMIZE TABLE {TABLE} PARTITION 202401 FINAL", post=True))
    deadline = time.monotonic() + 60
    while len(active_parts(daemon)) != 2:  # 202401 merged into one part, and 202402's
        assert time.monotonic() < deadline, active_parts(daemon)
        time.sleep(0.1)
    ok(insert(daemon, 5)[1])  # 1 part again: no wait
    assert len(delays(daemon)) == 2
    got = sorted(int(x) for x in ok(query(daemon.url, f"SELECT k FROM {TABLE}")).text.split())
    assert got == [0, 1, 2, 3, 5, 100]


def test_delay_follows_clickhouse_formula() -> None:
    """(pure) (max_delay_to_insert * 1000) ** (k / max_k) ms, k = 1 + parts - parts_to_delay_insert."""
    limit = PartsLimit(150, 300, 1.0)
    assert limit.delay_s(0) == limit.delay_s(149) == 0.0
    assert limit.delay_s(150) == pytest.approx(1000 ** (1 / 150) / 1000)
    assert limit.delay_s(225) == pytest.approx(1000 ** (76 / 150) / 1000)
    assert limit.delay_s(299) == pytest.approx(1.0)
    with pytest.raises(Exception, match=r"Too many parts \(300\)"):
        limit.delay_s(300)
    assert PartsLimit(2, 4, 0.0).delay_s(3) == 0.0  # max_delay_to_insert = 0: refused, never delayed
    assert PartsLimit(5, 5, 1.0).delay_s(4) == 0.0
    with pytest.raises(Exception, match="Too many parts"):
        PartsLimit(5, 5, 1.0).delay_s(5)
