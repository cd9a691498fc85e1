"""The distributed DDL queue's texts (replicad.ddl.entry) against the bytes 18.16 wrote."""

from __future__ import annotations

import pytest

from replicad.ddl.entry import (
    DDLEntry,
    EntryFormatError,
    exception_message,
    host_id,
    parse_status,
    status_text,
)
from replicad.ddl.worker import Shard, remove_on_cluster

LIVE = (b"version: 1\nquery: CREATE TABLE d1.t ON CLUSTER c2 ( d Date,  k UInt64,  v String) ENGINE = "
        b"ReplicatedMergeTree(\\'/clickhouse/tables/{shard}/d1/t\\', \\'{replica}\\') "
        b"PARTITION BY toYYYYMM(d) ORDER BY k\nhosts: ['127%2E0%2E0%2E1:9301','127%2E0%2E0%2E1:9302']\n"
        b"initiator: vm:9301\n")


def test_entry_round_trips_18_16_bytes() -> None:
    e = DDLEntry.parse(LIVE)
    assert e.hosts == ("127%2E0%2E0%2E1:9301", "127%2E0%2E0%2E1:9302") and e.initiator == "vm:9301"
    assert "ReplicatedMergeTree('/clickhouse/tables/{shard}/d1/t', '{replica}')" in e.query
    assert e.to_bytes() == LIVE
    assert host_id("127.0.0.1", 9301) == "127%2E0%2E0%2E1:9301"
    no_initiator = LIVE[: LIVE.index(b"initiator")]
    assert DDLEntry.parse(no_initiator).initiator == ""


@pytest.mark.parametrize("data,code", [
    (LIVE.replace(b"version: 1", b"version: 2"), 287),
    (LIVE + b"extra: 1\n", 27),
    (LIVE[:-1], 27),
    (b"version: 1\nhosts: []\n", 27),
    (LIVE.replace(b"['127", b"[127"), 27),
])
def test_entries_18_16_refuses_are_refused(data: bytes, code: int) -> None:
    with pytest.raises(EntryFormatError) as e:
        DDLEntry.parse(data)
    assert e.value.code == code


def test_statuses() -> None:
    assert status_text(0) == b"0\n"
    msg = exception_message(57, "Table d1.mac already exists.")
    assert status_text(57, msg) == (b"57\nCode: 57, e.displayText() = DB::Exception: Table d1.mac already "
                                    b"exists., e.what() = DB::Exception")
    assert parse_status(b"48\nCannot enqueue replicated DDL query for a replicated shard") == (
        48, "Cannot enqueue replicated DDL query for a replicated shard")
    assert parse_status(b"x") == (-1, "Cannot obtain error message")
    assert exception_message(60, "t", before_execution=True).startswith("An error occured before execution: ")


def test_on_cluster_removed_and_shard_names() -> None:
    assert remove_on_cluster("ALTER TABLE d1.t ON CLUSTER c2 ADD COLUMN  x UInt8 DEFAULT 7 ") == (
        "ALTER TABLE d1.t ADD COLUMN  x UInt8 DEFAULT 7", "c2")
    assert remove_on_cluster("DROP TABLE t ON CLUSTER 'my c'") == ("DROP TABLE t", "my c")
    assert remove_on_cluster("DROP TABLE t") == ("DROP TABLE t", None)
    assert remove_on_cluster("CREATE TABLE t (on String) ENGINE = Memory") == (
        "CREATE TABLE t (on String) ENGINE = Memory", None)
    assert Shard(("127.0.0.1:9302", "127.0.0.1:9301")).node_name == "127.0.0.1:9301,127.0.0.1:9302"
