"""Cleanup of the distributed DDL queue by real replicad daemons, as ClickHouse 18.16's DDLWorker does it:
after a change of the queue (``cleanup_delay_period`` apart), a task is deleted when it is older than
``task_max_lifetime`` or outside the newest ``max_tasks_in_queue``; never one with a child under
``active/`` (a worker still on it), never one whose ``query-N/lock`` another server holds (18.16's per-task
cleanup lock: one cleaner at a time per task), and each task by one cleaner only.

Tasks are planted straight into ZooKeeper (sequential nodes, as an initiator creates them) listing a host
that is not a daemon, so only the cleaners touch them; the queue is compared as an exact set, so a cap off
by one either way, a lifetime read in the wrong unit, or a cleaner ignoring ``active/`` or the lock fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from replicad.ddl.entry import DDLEntry
from replicad.devtools.daemon import Daemon
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.chaos import clock
from tests.support.replicad_daemon import log_events, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUE = "/clickhouse/task_queue/ddl"
OTHER = "other%2Dhost:9000"  # listed in every planted task; no daemon is this host


def plant(zk: KazooClient, n: int) -> list[str]:
    """``n`` finished tasks (as an initiator and one worker leave them); their names, oldest first."""
    names = []
    for i in range(n):
        entry = DDLEntry(f"DROP TABLE IF EXISTS db.t{i} ON CLUSTER c", (OTHER,), OTHER).to_bytes()
        path = zk.create(f"{QUEUE}/query-", entry, sequence=True)
        zk.ensure_path(f"{path}/active")  # a daemon's worker may create them first, as 18.16's does
        zk.ensure_path(f"{path}/finished")
        zk.create(f"{path}/finished/{OTHER}", b"0\n")
        names.append(path.rsplit("/", 1)[1])
    return names


def queue(zk: KazooClient) -> set[str]:
    return {n for n in zk.get_children(QUEUE) if n.startswith("query-")}


def settles_at(zk: KazooClient, expected: set[str], timeout: float = 30.0, stable_s: float = 2.5) -> None:
    """The queue becomes exactly ``expected`` and stays so (no over-deletion a moment later)."""
    deadline = time.monotonic() + timeout
    while queue(zk) != expected:
        assert time.monotonic() < deadline, (sorted(queue(zk)), sorted(expected))
        time.sleep(0.2)
    time.sleep(stable_s)
    assert queue(zk) == expected


def daemons(tmp_path: Path, zookeeper: ZooKeeperServer, zk_root: str, n: int,
            env: dict[str, str] | None = None, first: int = 1, **ddl: Any) -> list[Daemon]:
    out = []
    for i in range(first - 1, first - 1 + n):
        port = free_port()
        out.append(start_daemon(tmp_path, zookeeper, zk_root, f"rd{i + 1}", env=env, extra={
            "clusters": {"c": [{"replicas": [f"127.0.0.1:{port}"], "internal_replication": True}]},
            "distributed_ddl": {"host": "127.0.0.1", "port": port, "path": QUEUE,
                                "cleanup_delay_period": 0, **ddl}}))
    return out


def deleted_by(ds: list[Daemon]) -> list[str]:
    return [e["task"] for d in ds for e in log_events(d) if e.get("event") == "ddl_task_deleted"]


@pytest.fixture
def stopper() -> Iterator[Callable[[list[Daemon]], list[Daemon]]]:
    started: list[Daemon] = []

    def keep(ds: list[Daemon]) -> list[Daemon]:
        started.extend(ds)
        return ds

    yield keep
    for d in started:
        d.kill()


def test_queue_capped_keeping_the_newest_never_active_or_locked_tasks(
    zk: KazooClient, zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
    stopper: Callable[[list[Daemon]], list[Daemon]],
) -> None:
    names = plant(zk, 12)
    # a worker (another server's session: ephemeral) still on task 1; another server cleaning task 2
    worker = KazooClient(hosts=zookeeper.hosts + zk_root)
    worker.start(15)
    try:
        worker.create(f"{QUEUE}/{names[1]}/active/{OTHER}", b"", ephemeral=True)
        worker.create(f"{QUEUE}/{names[2]}/lock", b"other-host:9000", ephemeral=True)
        # two daemons clean the same queue (every server runs a cleaner in 18.16)
        ds = stopper(daemons(tmp_path, zookeeper, zk_root, 2, max_tasks_in_queue=5))
        keep = set(names[-5:]) | {names[1], names[2]}
        settles_at(zk, keep)
        # the locked task is untouched (its children too), the active one keeps its worker
        assert sorted(zk.get_children(f"{QUEUE}/{names[2]}")) == ["active", "finished", "lock"]
        assert zk.get(f"{QUEUE}/{names[2]}/finished/{OTHER}")[0] == b"0\n"
        assert zk.get_children(f"{QUEUE}/{names[1]}/active") == [OTHER]
        # each deleted task was deleted by exactly one of the two cleaners
        deleted = [names[0], *names[3:7]]
        assert sorted(deleted_by(ds)) == sorted(deleted)
        # nothing the daemons do leaves a cleanup lock behind
        assert all(zk.exists(f"{QUEUE}/{n}/lock") is None for n in keep - {names[2]})
    finally:
        worker.stop()  # the worker's active node and the foreign lock go with its session
    # the next change of the queue: the two old tasks are now outside the window as well
    [new] = plant(zk, 1)
    settles_at(zk, {*names[-4:], new})
    assert sorted(deleted_by(ds)) == sorted([names[0], *names[1:8]])


def test_tasks_older_than_task_max_lifetime_are_removed(
    zk: KazooClient, zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
    stopper: Callable[[list[Daemon]], list[Daemon]],
) -> None:
    lifetime = 4
    ds = stopper(daemons(tmp_path, zookeeper, zk_root, 1, task_max_lifetime=lifetime))
    old = plant(zk, 3)
    busy = KazooClient(hosts=zookeeper.hosts + zk_root)
    busy.start(15)
    try:
        busy.create(f"{QUEUE}/{old[0]}/active/{OTHER}", b"", ephemeral=True)
        # young tasks stay, although the queue changed (each plant wakes the cleaner)
        settles_at(zk, set(old), stable_s=1.0)
        ctime_s = zk.exists(f"{QUEUE}/{old[-1]}").ctime / 1000
        time.sleep(max(0.0, ctime_s + lifetime + 1.2 - time.time()))
        [young] = plant(zk, 1)  # a change of the queue: the cleaner runs
        settles_at(zk, {old[0], young})  # expired ones gone; the one with a worker and the young one stay
        assert deleted_by(ds) == old[1:]
    finally:
        busy.stop()
    [newest] = plant(zk, 1)
    settles_at(zk, {young, newest})  # the worker has gone: the expired task goes too
    assert zk.exists(f"{QUEUE}/{young}") is not None


def test_task_ages_are_judged_on_zookeepers_clock(
    zk: KazooClient, zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path,
    stopper: Callable[[list[Daemon]], list[Daemon]],
) -> None:
    """A daemon whose wall clock runs 8 days ahead (the chaos suite's clock shim) keeps tasks younger than the
    default week; one 8 days behind still removes tasks past a 4 s lifetime."""
    if clock.clock_support() is not None:
        pytest.skip(str(clock.clock_support()))
    lib = clock.shim()
    assert lib is not None
    ahead = stopper(daemons(tmp_path, zookeeper, zk_root, 1, env=clock._env(lib, 8 * 86400.0, 1.0)))
    tasks = plant(zk, 3)
    tasks += plant(zk, 1)  # a change of the queue after the first ones: the cleaner runs again
    settles_at(zk, set(tasks), stable_s=3.0)
    assert deleted_by(ahead) == []
    ahead[0].kill()

    ctime_s = zk.exists(f"{QUEUE}/{tasks[-1]}").ctime / 1000  # (a slow start may find them expired already)
    behind = stopper(daemons(tmp_path, zookeeper, zk_root, 1, env=clock._env(lib, -8 * 86400.0, 1.0),
                             first=2, task_max_lifetime=4))
    time.sleep(max(0.0, ctime_s + 4 + 1.2 - time.time()))
    [young] = plant(zk, 1)
    settles_at(zk, {young})
    assert sorted(deleted_by(behind)) == sorted(tasks)
