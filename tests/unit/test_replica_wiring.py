"""TableReplica as a composition root: its collaborators wired together, its tasks one table in start order,
stopped in reverse.  No ZooKeeper: the keeper is never started."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from replicad.catalog import spec_from_ddl
from replicad.keeper.client import Keeper
from replicad.model.log_entry import LogEntry
from replicad.replica import ReplicaEnv, TableReplica
from replicad.replication.exchange import ServedPartLookup
from replicad.sql.ddl import parse_create_table

DDL = ("CREATE TABLE db.t (d Date, x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', "
       "'{replica}') PARTITION BY toYYYYMM(d) ORDER BY x")


class FakeExchange:
    port = 9009
    scheme = "http"

    def __init__(self) -> None:
        self.served: dict[str, ServedPartLookup] = {}

    def serve(self, replica_zk_path: str, lookup: ServedPartLookup, on_broken: Callable[[str], None]) -> None:
        self.served[replica_zk_path] = lookup

    def withdraw(self, replica_zk_path: str) -> None:
        self.served.pop(replica_zk_path, None)


def make_replica(tmp_path: Path) -> TableReplica:
    spec = spec_from_ddl(parse_create_table(DDL), {"shard": "01"}, "r1")
    env = ReplicaEnv(data_path=tmp_path, interserver=FakeExchange(), interserver_host="127.0.0.1",
                     fsync=False)
    return TableReplica(spec, Keeper("127.0.0.1:1"), env)


def test_the_tasks_are_one_table_in_start_order(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    assert list(replica.tasks) == [
        "queue_updating", "queue_executing", "cleanup", "part_check", "restarting",
        "leader_election", "merge_selecting", "mutations_updating", "mutations_finalizing", "staging",
        "alter",
    ]
    assert replica.tasks["queue_executing"] is replica.executor
    assert all(task.name.startswith("db.t:") for task in replica.tasks.values())


def test_the_collaborators_are_wired_to_each_other(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    assert replica.puller.on_read == replica.fetcher.precheck_sources
    assert replica.is_readonly and replica.executor.is_paused()  # no ZooKeeper session
    replica.blockers.fetches = True
    assert not replica.fetcher.early_allowed()
    assert replica.executor.blocked is not None
    assert replica.ops.leader is replica.leader


async def test_stop_asks_the_tasks_to_stop_in_reverse_start_order(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    asked: list[str] = []
    for key, task in replica.tasks.items():
        task.request_stop = (lambda k: lambda: asked.append(k))(key)  # type: ignore[method-assign]
    await replica.stop()
    assert asked == list(reversed(replica.tasks))


def test_a_merge_or_an_executed_entry_wakes_the_cleanup_only_when_parts_fall_due(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    cleanup = replica.cleanup
    replica.ops._on_part_made()  # the merged-away parts are removable only after old_parts_lifetime (480 s)
    replica._on_parts_changed()
    assert not cleanup._wake.is_set()
    cleanup.settings = replace(cleanup.settings, old_parts_lifetime=1.0)  # due before the next periodic round
    replica.ops._on_part_made()
    assert cleanup._wake.is_set()


def test_a_local_commit_leaves_our_own_log_entry_to_the_log_watch(tmp_path: Path) -> None:
    replica = make_replica(tmp_path)
    own = replica.puller.own
    assert own is not None and replica.committer.on_committed == own.committed
    replica.queue_updating._wake.clear()
    entry = LogEntry.get_part("202611_1_1_0", source_replica="r1")
    replica.committer.on_committed("log-0000000001", entry, entry.to_bytes())  # remembered, no second pull
    assert not replica.queue_updating._wake.is_set()
    assert own.known("log-0000000001") == (entry.with_znode("log-0000000001"), entry.to_bytes())
