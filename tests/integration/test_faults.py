"""Faults while inserting, on a real ZooKeeper: three ``replicad run`` daemons (5 s ZooKeeper sessions) for
kill -9, SIGSTOP beyond the session timeout, a ZooKeeper restart and a start-up without ZooKeeper; in-process
replicas for a session expiry forced through ZooKeeper (the test needs the session's password).

A client inserts numbered batches, each retried — on another replica, with the same
``insert_deduplication_token`` — until one attempt is acknowledged.  After each fault heals: every
acknowledged row is on every replica exactly once, the replicas hold the same parts with byte-identical
``checksums.txt``, and their queues drain within 60 s of the heal.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import Reply, log_events, make_chroot, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLE = "db.t"
DDL = (
    "CREATE TABLE IF NOT EXISTS db.t (id UInt64, s String) "
    "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY id"
)
SESSION_TIMEOUT_S = 5
ENV = {"REPLICAD_ZOOKEEPER__SESSION_TIMEOUT_S": str(SESSION_TIMEOUT_S)}
ROWS_PER_BATCH = 10
DRAIN_LIMIT_S = 60.0


# ------------------------------------------------------------------------------------------------ client


def batch_ids(k: int) -> list[int]:
    return list(range(k * ROWS_PER_BATCH, (k + 1) * ROWS_PER_BATCH))


def batch_body(k: int) -> bytes:
    return "".join(f"{i}\tbatch {k} row {i}\n" for i in batch_ids(k)).encode()


class Writer(threading.Thread):
    """Inserts batches 0..n-1 in order; each is retried on the next replica until acknowledged."""

    def __init__(
        self, urls: Sequence[str], batches: int, pause_s: float = 0.05, timeout_s: float = 3.0
    ) -> None:
        super().__init__(daemon=True)
        self.urls = list(urls)
        self.batches = batches
        self.pause_s = pause_s
        self.timeout_s = timeout_s
        self.acked: list[int] = []
        self.failures: collections.Counter[str] = collections.Counter()
        self.error: BaseException | None = None
        self.deadline = time.monotonic() + 150

    def insert(self, url: str, k: int) -> Reply:
        return query(
            url,
            f"INSERT INTO {TABLE} FORMAT TabSeparated",
            batch_body(k),
            timeout=self.timeout_s,
            insert_deduplication_token=f"batch-{k}",
        )

    def run(self) -> None:
        try:
            for k in range(self.batches):
                attempt = 0
                while True:
                    if time.monotonic() > self.deadline:
                        raise TimeoutError(f"batch {k} never acknowledged: {dict(self.failures)}")
                    url = self.urls[(k + attempt) % len(self.urls)]
                    attempt += 1
                    try:
                        reply = self.insert(url, k)
                    except OSError as e:  # refused (killed), timed out (stopped), reset
                        self.failures[type(e).__name__] += 1
                        time.sleep(0.1)
                        continue
                    if reply.status == 200:
                        self.acked.append(k)
                        break
                    self.failures[f"HTTP {reply.status} code {reply.exception_code}"] += 1
                    time.sleep(0.1)
                time.sleep(self.pause_s)
        except BaseException as e:
            self.error = e

    def progress(self) -> int:
        return len(self.acked)

    def finish(self, timeout: float = 180.0) -> list[int]:
        self.join(timeout)
        assert not self.is_alive(), "the writer did not finish"
        if self.error is not None:
            raise self.error
        return [i for k in self.acked for i in batch_ids(k)]


def wait_until(cond: Any, timeout: float, what: str, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


# ------------------------------------------------------------------------------------------------ checks


def table_status(d: Daemon) -> dict[str, Any]:
    body: dict[str, Any] = request(d.url, "/status", timeout=10).json()
    return dict(body["tables"][TABLE])


def active_parts(d: Daemon) -> dict[str, bytes]:
    rows = request(d.url, f"/tables/{TABLE}/parts", timeout=10).json()
    return {r["name"]: (Path(r["path"]) / "checksums.txt").read_bytes() for r in rows if r["active"]}


def ids_of(d: Daemon) -> list[int]:
    reply = query(d.url, f"SELECT id FROM {TABLE} ORDER BY id FORMAT TabSeparated", timeout=30)
    assert reply.status == 200, reply.text
    return [int(x) for x in reply.text.split()]


def assert_converged(daemons: Sequence[Daemon], expected_ids: list[int], healed_at: float) -> float:
    """Queues empty and identical parts everywhere within DRAIN_LIMIT_S of the heal; every row once.
    Returns the seconds from the heal to convergence."""
    expected = sorted(expected_ids)

    def done() -> bool:
        try:
            statuses = [table_status(d) for d in daemons]
            if any(s["queue_size"] or s["is_readonly"] for s in statuses):
                return False
            parts = [active_parts(d) for d in daemons]
            counts = [int(query(d.url, f"SELECT count() FROM {TABLE}").text) for d in daemons]
        except (OSError, ValueError, KeyError):
            return False
        return all(p == parts[0] for p in parts) and counts == [len(expected)] * len(daemons)

    remaining = healed_at + DRAIN_LIMIT_S - time.monotonic()
    wait_until(done, max(remaining, 1.0), "queues to drain and the replicas to agree within 60 s of the heal")
    took = time.monotonic() - healed_at
    for d in daemons:
        assert ids_of(d) == expected, f"{d.name}: acknowledged rows missing or duplicated"
    return took


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture
def daemons(
    zookeeper: ZooKeeperServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[list[Daemon]]:
    if not zookeeper.running:
        zookeeper.start()
    chroot = make_chroot(zookeeper, request.node.name)

    def start(name: str) -> Daemon:
        return start_daemon(tmp_path, zookeeper, chroot, name, tables=[DDL], env=ENV, wait_table=TABLE)

    with ThreadPoolExecutor(3) as pool:
        started = list(pool.map(start, ["r1", "r2", "r3"]))
    try:
        yield started
    finally:
        failed = getattr(request.node, "rep_call", None)
        for d in started:
            if d.proc is not None and d.proc.poll() is None and os.name == "posix":
                try:
                    os.kill(d.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            if failed is not None and failed.failed:
                print(f"\n--- {d.name} log tail ---\n{d.log_tail(60)}")
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda d: d.stop(timeout=20), started))


def restart(d: Daemon) -> None:
    d.start()
    d.wait_ready(TABLE, timeout=60)


def event_names(d: Daemon) -> list[str]:
    return [str(e.get("event")) for e in log_events(d)]


# ------------------------------------------------------------------------------------------------ tests


def test_kill_9_of_a_replica_during_inserts(daemons: list[Daemon]) -> None:
    writer = Writer([d.url for d in daemons], batches=60)
    writer.start()
    wait_until(lambda: writer.progress() >= 15, 60, "the first inserts")
    victim = daemons[1]
    victim.kill()  # SIGKILL: no clean shutdown, is_active stays until the session times out
    wait_until(lambda: writer.progress() >= 30, 60, "inserts to go on without r2")
    restart(victim)  # the old is_active must vanish first; the restarted process waits for it
    healed_at = time.monotonic()
    ids = writer.finish()
    took = assert_converged(daemons, ids, healed_at)
    print(f"\nkill -9: {len(ids)} rows, converged {took:.1f} s after the restart; client retries "
          f"{dict(writer.failures)}")
    assert sum(writer.failures.values()) >= 1


def test_sigstop_beyond_the_session_timeout(daemons: list[Daemon]) -> None:
    writer = Writer([d.url for d in daemons], batches=50)
    writer.start()
    wait_until(lambda: writer.progress() >= 10, 60, "the first inserts")
    victim = daemons[2]
    assert victim.proc is not None
    os.kill(victim.proc.pid, signal.SIGSTOP)
    time.sleep(SESSION_TIMEOUT_S + 3)  # its ZooKeeper session expires meanwhile
    os.kill(victim.proc.pid, signal.SIGCONT)
    healed_at = time.monotonic()
    ids = writer.finish()
    took = assert_converged(daemons, ids, healed_at)
    names = event_names(victim)
    assert "replica_readonly" in names and "replica_restarted" in names, "r3 re-initialised its session"
    print(f"\nSIGSTOP: {len(ids)} rows, converged {took:.1f} s after SIGCONT; "
          f"retries {dict(writer.failures)}")


def test_zookeeper_restart_during_inserts(daemons: list[Daemon], zookeeper: ZooKeeperServer) -> None:
    writer = Writer([d.url for d in daemons], batches=50)
    writer.start()
    wait_until(lambda: writer.progress() >= 10, 60, "the first inserts")
    zookeeper.restart(down_for=SESSION_TIMEOUT_S + 1)
    healed_at = time.monotonic()
    ids = writer.finish()
    took = assert_converged(daemons, ids, healed_at)
    refused = [k for k in writer.failures if k.startswith("HTTP 503")]
    assert refused, "inserts were refused (read-only) while ZooKeeper was down"
    for d in daemons:
        assert "replica_readonly" in event_names(d)
    # the election formed again: one leader (it trims the log and assigns merges)
    wait_until(lambda: sum(bool(table_status(d)["is_leader"]) for d in daemons) == 1, 30, "one leader")
    print(f"\nZooKeeper restart: {len(ids)} rows, converged {took:.1f} s after it was back; "
          f"retries {dict(writer.failures)}")


def test_start_up_without_zookeeper_serves_reads(daemons: list[Daemon], zookeeper: ZooKeeperServer) -> None:
    writer = Writer([d.url for d in daemons], batches=5)
    writer.start()
    ids = writer.finish()
    assert_converged(daemons, ids, time.monotonic())
    r1 = daemons[0]
    r1.stop()
    zookeeper.stop()
    try:
        restart(r1)  # ready without ZooKeeper: the table is loaded from disk, read-only
        assert ids_of(r1) == sorted(ids)
        refused = query(r1.url, f"INSERT INTO {TABLE} FORMAT TabSeparated", batch_body(100), timeout=10)
        assert refused.status == 503, refused.text
        assert table_status(r1)["is_readonly"]
    finally:
        zookeeper.start()
    healed_at = time.monotonic()
    late = Writer([r1.url], batches=1)

    def insert_late() -> bool:
        try:
            return late.insert(r1.url, 100).status == 200
        except OSError:
            return False

    wait_until(insert_late, 60, "r1 to become writable")
    assert_converged(daemons, [*ids, *batch_ids(100)], healed_at)


# ------------------------------------------------------------------------------------------------ in-process


async def test_session_expiry_forced_through_zookeeper(
    zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path
) -> None:
    from replicad.errors import ReplicadError
    from replicad.service import InsertSettings
    from tests.support.table_cluster import Cluster, part_checksums, rows, sorted_rows

    cluster = Cluster(zookeeper, zk_root, tmp_path)
    try:
        replicas = [await cluster.start(n) for n in ("r1", "r2", "r3")]
        acked: list[int] = []
        retries = collections.Counter[str]()

        async def write(batches: int) -> None:
            for k in range(batches):
                for attempt in range(200):
                    replica = replicas[(k + attempt) % 3]
                    try:
                        token = InsertSettings(insert_deduplication_token=f"b{k}")
                        await replica.insert_table(rows(batch_ids(k), month=1 + k % 12), token)
                    except ReplicadError as e:
                        retries[type(e).__name__] += 1
                        await asyncio.sleep(0.05)
                        continue
                    acked.append(k)
                    break
                await asyncio.sleep(0.02)

        writing = asyncio.create_task(write(60))
        while len(acked) < 20:
            await asyncio.sleep(0.05)
        victim = cluster.keepers["r2"]
        old_session = victim.session_id
        creds = victim.session_id_and_password
        assert creds is not None
        await asyncio.to_thread(zookeeper.expire_session, *creds)
        await writing
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while True:
            sets = [part_checksums(r) for r in replicas]
            if all(s == sets[0] for s in sets) and not any(len(r.queue_state) for r in replicas):
                break
            assert time.monotonic() < deadline, "replicas did not converge within 60 s"
            await asyncio.sleep(0.1)
        assert victim.session_id != old_session
        assert replicas[1].restarting.startups_total >= 2  # re-initialised in the new session
        expected = sorted(i for k in acked for i in batch_ids(k))
        for r in replicas:
            assert sorted(row["id"] for row in await sorted_rows(r)) == expected
        print(f"\nsession expiry: {len(expected)} rows, retries {dict(retries)}")
    finally:
        await cluster.close()
