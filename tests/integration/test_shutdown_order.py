"""The daemon's shutdown order, on the real engine and the test ZooKeeper.

* in process (the real ``Daemon`` and ``ReplicationEngine``, probes wrapped around the table's tasks and
  ``TableReplica.stop``): both listeners refuse connections before any table stops, while open API and
  interserver connections are still answered; the table's background tasks stop in reverse start order,
  each awaited before the next is asked, all before the table's own teardown; ``is_active`` is deleted by
  the table while the ZooKeeper session is still open, and the session closes last;
* a real ``python -m replicad run`` process with open interserver and API connections (one kept alive and
  idle, one in the middle of sending its request head) shuts down on SIGTERM with exit code 0 and nothing on
  its output but info-level JSON lines (before the fix, asyncio logged "Exception in callback …
  CancelledError" with a traceback for each interserver connection cut at shutdown).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicad.config import build_config
from replicad.daemon import Daemon
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.keeper.client import SessionState
from replicad.replica import TableReplica
from replicad.service import TableName
from replicad.tasks import BackgroundTask
from tests.support.replicad_daemon import make_chroot, ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DDL = ("CREATE TABLE IF NOT EXISTS db.t (k UInt64, v String) "
       "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY k")


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def http_get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> bytes:
    """One keep-alive GET on an open connection; the answer's status line."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    return head.split(b"\r\n")[0]


async def test_listeners_close_first_tasks_stop_in_reverse_and_zookeeper_closes_last(
        zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "shutdown-order")
    interserver_port = free_port()
    cfg = build_config({
        "replica": "r1", "data_path": str(tmp_path / "data"), "timezone": "UTC", "macros": {"shard": "01"},
        "zookeeper": {"hosts": zookeeper.hosts + chroot, "session_timeout_s": 10},
        "interserver": {"listen_host": "127.0.0.1", "port": interserver_port, "host": "127.0.0.1"},
        "api": {"listen_host": "127.0.0.1"}, "tables": [DDL]}, {})
    d = Daemon(cfg, api_port=0)
    await d.start()
    assert d.engine is not None
    engine: Any = d.engine
    table: TableReplica = engine.catalog.replica_of(TableName("db", "t"))
    keeper = table.keeper
    is_active = table.paths.me.is_active
    assert await keeper.exists(is_active) is not None
    api_conn = await asyncio.open_connection("127.0.0.1", d.api.port)  # kept alive through the shutdown
    assert await http_get(*api_conn, "/ping") == b"HTTP/1.1 200 OK"
    peer_conn = await asyncio.open_connection("127.0.0.1", interserver_port)  # a peer's kept-alive connection
    assert await http_get(*peer_conn, "/ping") == b"HTTP/1.1 200 OK"

    events: list[str] = []
    probes: dict[str, Any] = {}

    def record(task: BackgroundTask) -> None:
        ask, on_stop = task.request_stop, task.on_stop

        def request_stop() -> None:
            events.append(f"ask {task.name}")
            ask()

        async def stopped() -> None:
            try:
                await on_stop()
            finally:
                events.append(f"stopped {task.name}")

        task.request_stop = request_stop  # type: ignore[method-assign]
        task.on_stop = stopped  # type: ignore[method-assign]

    for task in table.tasks.values():
        record(task)
    table_stop, keeper_close = table.stop, keeper.close

    async def probed_table_stop() -> None:
        events.append("table stop")
        probes["api_refused"] = await refused(d.api.port)
        probes["interserver_refused"] = await refused(interserver_port)
        probes["open_api_connection"] = await http_get(*api_conn, "/ping")
        probes["open_interserver_connection"] = await http_get(*peer_conn, "/ping")
        probes["keeper_at_table_stop"] = keeper.session_state
        await table_stop()
        probes["is_active_after_table_stop"] = await keeper.exists(is_active)
        events.append("table stopped")

    async def probed_keeper_close() -> None:
        events.append("keeper close")
        await keeper_close()

    table.stop = probed_table_stop  # type: ignore[method-assign]
    keeper.close = probed_keeper_close  # type: ignore[method-assign]

    assert await d.shutdown() == []
    api_conn[1].close()
    peer_conn[1].close()

    names = [t.name for t in table.tasks.values()]  # start order
    assert len(names) >= 9
    expected = [e for name in reversed(names) for e in (f"ask {name}", f"stopped {name}")]
    assert events[:len(expected)] == expected, events
    # table.stop asks its (already stopped) tasks again so a half-started table's never start: no unit runs
    rest = [e for e in events[len(expected):] if not e.startswith("ask ")]
    assert rest == ["table stop", "table stopped", "keeper close"], events
    assert probes == {
        "api_refused": True, "interserver_refused": True, "open_api_connection": b"HTTP/1.1 200 OK",
        "open_interserver_connection": b"HTTP/1.1 200 OK",
        "keeper_at_table_stop": SessionState.CONNECTED, "is_active_after_table_stop": None,
    }


def test_sigterm_with_open_connections_logs_no_error(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "quiet-shutdown")
    d = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table="db.t")
    try:
        ok(query(d.url, "INSERT INTO db.t FORMAT TSV", b"1\ta\n2\tb\n"))
        cfg = yaml.safe_load(d.config_path.read_text())
        interserver_port = int(cfg["interserver"]["port"])
        idle = socket.create_connection(("127.0.0.1", interserver_port), timeout=10)
        idle.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")  # now kept alive, waiting for a next request
        half = socket.create_connection(("127.0.0.1", interserver_port), timeout=10)
        half.sendall(b"GET /?endpoint=DataPartsExchange:x HTTP/1.1\r\n")  # the head never ends
        api = socket.create_connection(("127.0.0.1", int(cfg["api"]["port"])), timeout=10)
        api.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert api.recv(4096).startswith(b"HTTP/1.1 200")
        assert d.log_path is not None
        before = len(d.log_path.read_text().splitlines())
        started = time.monotonic()
        assert d.stop(timeout=60) == 0
        seconds = time.monotonic() - started
        for s in (idle, half, api):
            s.close()
    finally:
        if d.running:
            d.kill()
    lines = d.log_path.read_text(errors="replace").splitlines()[before:]
    events = [json.loads(line) for line in lines]  # every line is JSON: no traceback printed by Python
    # a loop stall warning says the machine was busy (two test workers on two cores), not that shutdown failed
    quiet = ("debug", "info")
    noisy = [e for e in events
             if (e["level"] not in quiet and e["event"] != "event_loop_stalled") or "exception" in e]
    assert noisy == [], noisy
    names = [e["event"] for e in events]
    assert names[0] == "shutdown_requested" and names[-1] == "daemon_stopped"
    assert events[-1]["failed_steps"] == []
    print(f"shutdown with 3 open connections: {seconds:.2f} s, {len(events)} log lines")
