"""Acceptance of the daemon's life cycle with real ``python -m replicad run`` processes on the test ZooKeeper.

* a crashed background task (fault injection, enabled only by ``REPLICAD_FAULT_INJECTION=1``) shows in
  ``/status`` (restart counted, last error) and ``/metrics``, and is back at work within seconds;
* CREATE TABLE / DROP TABLE over HTTP persist under ``data_path/metadata/`` and survive a restart;
* SIGTERM during a stream of inserts: exit code 0, the shutdown steps in order, ``is_active`` deleted by
  the replica itself before its ZooKeeper session is closed (read from ZooKeeper's transaction log), and
  after a restart every insert that got 200 is there exactly once (and nothing else is duplicated);
* two replicas: ``/tables/<t>/queue`` shows a fetch that cannot succeed while the source replica is down,
  ``/status`` counts total/active replicas, and SYSTEM SYNC REPLICA returns once the replica caught up.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc
import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import (
    daemon_config,
    log_events,
    make_chroot,
    ok,
    query,
    request,
    start_daemon,
    zookeeper_transactions,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TABLE = "db.t"
DDL = ("CREATE TABLE IF NOT EXISTS db.t (k UInt64, batch UInt32, v String) "
       "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY k")


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except (OSError, AssertionError, KeyError) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")


def keys(d: Daemon, table: str = TABLE) -> list[int]:
    r = ok(query(d.url, f"SELECT k FROM {table} FORMAT ArrowStream"))
    return [int(x) for x in ipc.open_stream(r.body).read_all().column("k").to_pylist()]


def tsv(batch: int, first_key: int, rows: int) -> bytes:
    return b"".join(b"%d\t%d\tv%d\n" % (k, batch, k) for k in range(first_key, first_key + rows))


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test started; killed at the end if still running (their logs printed on failure)."""
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.running:
            d.kill()


def launch(daemons: list[Daemon], tmp_path: Path, zookeeper: ZooKeeperServer, chroot: str, name: str = "r1",
           **kwargs: Any) -> Daemon:
    try:
        d = start_daemon(tmp_path, zookeeper, chroot, name, **kwargs)
    except RuntimeError as e:
        pytest.fail(str(e))
    daemons.append(d)
    return d


def restart(d: Daemon, wait_table: str | None = TABLE) -> None:
    d.start()
    d.wait_ready(wait_table, timeout=60)


# ---- crashed background tasks ----------------------------------------------------------------------------


def test_a_crashed_task_shows_in_status_and_is_back_within_seconds(
        zookeeper: ZooKeeperServer, tmp_path: Path, daemons: list[Daemon]) -> None:
    d = launch(daemons, tmp_path, zookeeper, make_chroot(zookeeper, "crash"), tables=[DDL],
               env={"REPLICAD_FAULT_INJECTION": "1"}, wait_table=TABLE)
    name = f"{TABLE}:queue_updating"

    def task() -> dict[str, Any]:
        tasks = {t["name"]: t for t in ok(request(d.url, "/status")).json()["tasks"]}
        return tasks[name]  # type: ignore[no-any-return]

    before = task()
    assert before["restarts"] == 0 and before["last_error"] is None and before["state"] == "running"
    crashed_at = time.time()
    r = ok(request(d.url, f"/_fault/crash_task?task={name}&message=boom+for+the+test", b""))
    assert r.json()["name"] == name
    after = wait_for(lambda: (t := task())["restarts"] == 1 and t["state"] == "running" and t, 10,
                     "the task restarted")
    assert after["last_error"] == "InjectedFault: boom for the test"
    assert after["last_error_time"] >= crashed_at - 1
    assert time.time() - crashed_at < 10  # back within seconds (the first back-off is 0.5 s)
    # and it works: our insert's log entry is pulled into the queue and the pointer moves past it
    pointer = ok(request(d.url, "/status")).json()["tables"][TABLE]["log_pointer"]
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(1, 0, 10)))
    wait_for(lambda: ok(request(d.url, "/status")).json()["tables"][TABLE]["log_pointer"] > pointer, 10,
             "the restarted queue_updating task pulled the log")
    assert task()["runs"] > before["runs"]
    metrics = ok(request(d.url, "/metrics")).text
    assert f'replicad_task_restarts_total{{task="{name}"}} 1.0' in metrics
    status_text = d.status_text()
    assert "last error: InjectedFault: boom for the test" in status_text
    # unknown task names are refused; the other tasks never crashed
    assert request(d.url, "/_fault/crash_task?task=nope", b"").status == 404
    others = [t for t in ok(request(d.url, "/status")).json()["tasks"] if t["name"] != name]
    assert others and all(t["restarts"] == 0 for t in others)
    assert d.stop() == 0
    assert any(e["event"] == "task_crashed" and e.get("task") == name for e in log_events(d))


# ---- DDL persistence ---------------------------------------------------------------------------------------


def test_created_tables_persist_under_metadata_and_come_back_after_restart(
        zookeeper: ZooKeeperServer, tmp_path: Path, daemons: list[Daemon]) -> None:
    d = launch(daemons, tmp_path, zookeeper, make_chroot(zookeeper, "ddl"))  # no tables in the config
    assert ok(request(d.url, "/status")).json()["tables"] == {}
    ok(query(d.url, DDL.replace("IF NOT EXISTS ", ""), post=True))
    ok(query(d.url, DDL.replace("db.t", "db.gone").replace("/t'", "/gone'").replace("IF NOT EXISTS ", ""),
             post=True))
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(1, 0, 100)))
    ok(query(d.url, "INSERT INTO db.gone FORMAT TSV", tsv(1, 0, 5)))
    meta = d.data_path / "metadata" / "db"
    assert sorted(p.name for p in meta.iterdir()) == ["gone.sql", "t.sql"]
    # pyarrow would import pandas (installed here) on its first DataFrame check: the daemon keeps it out
    assert d.proc is not None
    maps = Path(f"/proc/{d.proc.pid}/maps").read_text()
    assert "pyarrow" in maps and "pandas/" not in maps
    assert d.stop() == 0

    restart(d)
    assert sorted(ok(request(d.url, "/status")).json()["tables"]) == ["db.gone", TABLE]
    assert sorted(keys(d)) == list(range(100))
    assert ok(query(d.url, "SELECT count() FROM db.gone")).text == "5\n"
    ok(query(d.url, "DROP TABLE db.gone", post=True))
    assert sorted(p.name for p in meta.iterdir()) == ["t.sql"]
    assert not (d.data_path / "data" / "db" / "gone").exists()
    assert d.stop() == 0

    restart(d)
    assert sorted(ok(request(d.url, "/status")).json()["tables"]) == [TABLE]
    assert query(d.url, "SELECT count() FROM db.gone").status == 404
    assert sorted(keys(d)) == list(range(100))
    assert d.stop() == 0


# ---- SIGTERM during inserts --------------------------------------------------------------------------------


class Inserter(threading.Thread):
    """Inserts batches of 50 rows with unique keys until the daemon stops answering."""

    ROWS = 50

    def __init__(self, d: Daemon, worker: int) -> None:
        super().__init__(daemon=True)
        self.d, self.worker = d, worker
        self.acked: list[int] = []  # batch numbers answered 200
        self.refused: list[tuple[int, int, str]] = []  # (batch, status, text) answered with an error
        self.unknown: list[int] = []  # no answer (connection refused / reset)
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            batch = self.worker * 100_000 + n
            n += 1
            try:
                body = tsv(batch, batch * self.ROWS, self.ROWS)
                r = query(self.d.url, f"INSERT INTO {TABLE} FORMAT TSV", body, timeout=30)
            except OSError:
                self.unknown.append(batch)
                if not self.d.running or self.d.proc is None or self.d.proc.poll() is not None:
                    return
                time.sleep(0.02)
                continue
            if r.status == 200:
                self.acked.append(batch)
            else:
                self.refused.append((batch, r.status, r.text))
                time.sleep(0.01)


def test_sigterm_during_inserts_keeps_every_acknowledged_insert_exactly_once(
        zookeeper: ZooKeeperServer, tmp_path: Path, daemons: list[Daemon]) -> None:
    chroot = make_chroot(zookeeper, "sigterm")
    d = launch(daemons, tmp_path, zookeeper, chroot, tables=[DDL], wait_table=TABLE)
    session = ok(request(d.url, "/status")).json()["zookeeper"]["session_id"]
    workers = [Inserter(d, w) for w in range(4)]
    for w in workers:
        w.start()
    wait_for(lambda: sum(len(w.acked) for w in workers) >= 40, 60, "40 acknowledged inserts")
    assert d.proc is not None
    d.proc.send_signal(signal.SIGTERM)
    code = d.proc.wait(60)
    for w in workers:
        w.stop.set()
        w.join(60)
    assert code == 0, d.log_tail(60)
    d.proc = None

    # the shutdown steps ran in order, each one succeeded
    events = log_events(d)
    steps = [e["step"] for e in events if e["event"] == "shutdown_step_done"]
    order = ["stop_listening", "stop_inserts", "stop_tasks", "stop_tables", "close_interserver", "close_api",
             "close_keeper"]
    assert [s for s in order if s in steps] == order
    assert steps == sorted(steps, key=order.index)
    stopped = [e for e in events if e["event"] == "daemon_stopped"]
    assert stopped and stopped[-1]["failed_steps"] == []
    # is_active was deleted by the replica itself, before its session was closed (not by session expiry)
    sid = f"session 0x{session:x} "
    txns = [t for t in zookeeper_transactions(zookeeper) if sid in t]
    is_active = f"{chroot}/clickhouse/tables/01/t/replicas/r1/is_active"
    deleted = [i for i, t in enumerate(txns) if " delete '" in t and t.rstrip().endswith(is_active)]
    closed = [i for i, t in enumerate(txns) if "closeSession" in t]
    assert deleted and closed and deleted[-1] < closed[-1], txns[-5:]
    # refused inserts were refused because the replica was shutting down
    refused = [r for w in workers for r in w.refused]
    assert all(status == 503 for _, status, _ in refused), refused[:3]

    restart(d)
    got = keys(d)
    assert len(got) == len(set(got)), "a key is stored twice"
    present = {k // Inserter.ROWS for k in got}
    counts: dict[int, int] = {}
    for k in got:
        counts[k // Inserter.ROWS] = counts.get(k // Inserter.ROWS, 0) + 1
    acked = {b for w in workers for b in w.acked}
    assert acked <= present, f"acknowledged batches lost: {sorted(acked - present)[:10]}"
    assert all(counts[b] == Inserter.ROWS for b in present), "a batch is partly stored"
    assert not ({b for b, _, _ in refused} & present), "a refused insert was stored"
    assert present - acked <= {b for w in workers for b in w.unknown}
    print(f"inserts: {len(acked)} acknowledged, {len(refused)} refused (503), "
          f"{sum(len(w.unknown) for w in workers)} without answer, {len(present - acked)} of those stored")
    assert d.stop() == 0


# ---- ZooKeeper lost: read-only ----------------------------------------------------------------------------


def test_zookeeper_outage_makes_the_replica_read_only_until_it_is_back(
        zookeeper: ZooKeeperServer, tmp_path: Path, daemons: list[Daemon]) -> None:
    d = launch(daemons, tmp_path, zookeeper, make_chroot(zookeeper, "outage"), tables=[DDL], wait_table=TABLE)
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(1, 0, 10)))
    zookeeper.stop()
    try:
        wait_for(lambda: request(d.url, "/replicas_status").status == 503, 20, "read-only")
        r = request(d.url, "/replicas_status")
        assert r.text == f"{TABLE}:\tis read-only.\n"
        status = ok(request(d.url, "/status")).json()  # /status answers without ZooKeeper
        assert status["zookeeper"]["state"] != "connected" and status["tables"][TABLE]["is_readonly"] is True
        refused = query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(2, 10, 10))
        assert (refused.status, refused.exception_code) == (503, 242), refused.text
        assert "readonly" in refused.text
        assert ok(query(d.url, f"SELECT count() FROM {TABLE}")).text == "10\n"  # reads still work
        assert ok(request(d.url, "/ping")).body == b"Ok.\n"
    finally:
        zookeeper.start()
    wait_for(lambda: request(d.url, "/replicas_status").status == 200, 30, "writable again")
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(3, 20, 10)))
    assert sorted(keys(d)) == list(range(10)) + list(range(20, 30))
    assert d.stop() == 0


# ---- two replicas: queue, replica counts, SYNC REPLICA ----------------------------------------------------


def test_queue_and_sync_replica_with_two_replicas(zookeeper: ZooKeeperServer, tmp_path: Path,
                                                   daemons: list[Daemon]) -> None:
    chroot = make_chroot(zookeeper, "two")
    r1 = launch(daemons, tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    r2 = launch(daemons, tmp_path, zookeeper, chroot, "r2", tables=[DDL], wait_table=TABLE)
    ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(1, 0, 1000)))
    assert ok(query(r2.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True)).body == b""
    assert sorted(keys(r2)) == list(range(1000))
    s2 = ok(request(r2.url, "/status")).json()["tables"][TABLE]
    assert (s2["total_replicas"], s2["active_replicas"], s2["queue_size"]) == (2, 2, 0)
    assert s2["is_leader"] is False and s2["log_pointer"] == s2["log_max_index"] + 1 == 1

    # r1 dies (SIGKILL: its session and is_active stay until they expire) before r2 could fetch its new
    # part (r2 is frozen meanwhile): the fetch cannot succeed
    assert r1.proc is not None and r2.proc is not None
    r2.proc.send_signal(signal.SIGSTOP)
    try:
        ok(query(r1.url, f"INSERT INTO {TABLE} FORMAT TSV", tsv(2, 1000, 500)))
        r1.kill()
    finally:
        r2.proc.send_signal(signal.SIGCONT)
    entry = wait_for(lambda: [q for q in ok(request(r2.url, f"/tables/{TABLE}/queue")).json()
                              if q["type"] == "GET_PART" and q["num_tries"] >= 1 and q["last_exception"]],
                     30, "a failing fetch")[0]
    assert entry["type"] == "GET_PART" and entry["source_replica"] == "r1"
    assert entry["new_part_name"] == "all_1_1_0" and entry["database"] == "db" and entry["table"] == "t"
    assert entry["replica_name"] == "r2" and entry["node_name"].startswith("queue-")
    for f in ("position", "create_time", "required_quorum", "parts_to_merge", "is_detach",
              "is_currently_executing", "last_attempt_time", "num_postponed", "postpone_reason"):
        assert f in entry, f
    s2 = ok(request(r2.url, "/status")).json()["tables"][TABLE]
    assert s2["inserts_in_queue"] == 1 and s2["queue_size"] >= 1 and s2["oldest_part_to_get"] == "all_1_1_0"
    assert s2["queue_oldest_time"] > 0
    wait_for(lambda: ok(request(r2.url, "/status")).json()["tables"][TABLE]["active_replicas"] == 1, 30,
             "r1's session expired")
    sync = {}

    def sync_r2() -> None:
        sync["reply"] = query(r2.url, f"SYSTEM SYNC REPLICA {TABLE}", post=True, timeout=120)

    syncer = threading.Thread(target=sync_r2)
    syncer.start()
    time.sleep(0.5)
    assert syncer.is_alive(), "SYNC REPLICA returned before the part could be fetched"
    restart(r1)
    syncer.join(120)
    assert sync["reply"].status == 200, sync["reply"].text
    assert sorted(keys(r2)) == list(range(1500))
    assert ok(request(r2.url, f"/tables/{TABLE}/queue")).json() == []
    assert ok(request(r2.url, "/replicas_status")).body == b"Ok.\n"
    codes = [r1.stop(), r2.stop()]
    assert codes == [0, 0]


def test_environment_switch_is_the_only_way_to_enable_fault_injection() -> None:
    from replicad.server import fault_injection

    assert not fault_injection.enabled({})
    assert not fault_injection.enabled({"REPLICAD_FAULT_INJECTION": "0"})
    assert fault_injection.enabled({"REPLICAD_FAULT_INJECTION": "1"})


# ---- readiness -------------------------------------------------------------------------------------------


def test_insert_the_instant_ping_answers_never_gets_503(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    """/ping is liveness: it answers while the tables load.  A request sent the instant it answers waits for
    its table (bounded, api.startup_wait_s) instead of failing with 503."""
    chroot = make_chroot(zookeeper, "ready")
    tables = [DDL.replace("db.t ", f"db.t{i} ").replace("/t'", f"/t{i}'") for i in range(12)]
    start_daemon(tmp_path, zookeeper, chroot, "r1", tables=tables, wait_table="db.t11").stop()
    path = daemon_config(tmp_path, zookeeper, chroot, "r1", tables)  # the same data: tables load at start
    d = Daemon(path, cwd=path.parent, log_path=path.parent / "replicad.log")
    d.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, d.log_tail()
            try:
                if d.http("/ping", timeout=1).strip() == "Ok.":
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(0.005)
        r = query(d.url, "INSERT INTO db.t11 FORMAT TSV", b"1\t1\tx\n2\t1\ty\n")
        assert r.status == 200, r.text
        assert ok(query(d.url, "SELECT count() FROM db.t11")).text.strip() == "2"
    finally:
        d.kill()
