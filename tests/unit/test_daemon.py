"""Daemon lifecycle with a fake engine: READY after start, ordered shutdown, reload, sd_notify datagrams."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from replicad.config import Config, build_config
from replicad.daemon import SHUTDOWN_ORDER, Daemon, ShutdownPlan
from replicad.sd_notify import Notifier
from replicad.server.metrics import Metrics
from replicad.tasks import Supervisor, TaskState
from tests.support.fake_engine import FakeEngine


class NotifySocket:
    """A unix datagram socket standing in for systemd's notify socket."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def messages(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    s = NotifySocket(tmp_path / "notify.sock")
    yield s
    s.sock.close()


def config(tmp_path: Path, **extra: object) -> Config:
    return build_config({"replica": "r1", "data_path": str(tmp_path / "data"),
                         "api": {"listen_host": "127.0.0.1", "port": 1}, **extra}, {})


def make(tmp_path: Path, notify: NotifySocket, **extra: object) -> tuple[Daemon, list[FakeEngine]]:
    engines: list[FakeEngine] = []

    def factory(cfg: Config, sup: Supervisor, metrics: Metrics) -> FakeEngine:
        engines.append(FakeEngine(cfg, sup, metrics))
        return engines[-1]

    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump({"replica": "r1", "data_path": str(tmp_path / "data"), **extra}))
    notifier = Notifier({"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "40000"})
    d = Daemon(config(tmp_path, **extra), config_path=cfg_path, engine_factory=factory, notifier=notifier,
               api_port=0)
    return d, engines


async def test_start_then_ordered_shutdown(tmp_path: Path, notify: NotifySocket) -> None:
    d, engines = make(tmp_path, notify)
    run = asyncio.create_task(d.run())
    for _ in range(200):
        if d.api_state.state == "running":
            break
        await asyncio.sleep(0.01)
    assert d.api_state.state == "running" and d.api.port > 0
    await asyncio.sleep(0.06)  # a watchdog ping or two (every 20 ms)
    msgs = notify.messages()
    ready = [m for m in msgs if m.startswith("READY=1")]
    assert len(ready) == 1 and "STATUS=serving 1 table(s)" in ready[0]
    assert msgs.index(ready[0]) > 0  # status messages came first, READY only after the engine started
    assert "WATCHDOG=1" in msgs
    engine = engines[0]
    assert engine.calls == ["start"]
    assert d.supervisor.health()["fake_queue"].state is TaskState.RUNNING
    d.request_stop("test")
    assert await asyncio.wait_for(run, 5) == 0
    assert engine.calls == ["start", "stop_listening", "stop_inserts", "stop_tables", "close_interserver",
                            "close_keeper"]
    assert d.supervisor.health()["fake_queue"].state is TaskState.STOPPED
    assert d.api_state.accepting_writes is False and d.api_state.state == "stopping"
    assert any(m.startswith("STOPPING=1") for m in notify.messages())


async def test_shutdown_plan_runs_every_step_in_order_despite_failures() -> None:
    plan = ShutdownPlan()
    seen: list[str] = []

    def hook(name: str, fail: bool = False, hang: bool = False):  # type: ignore[no-untyped-def]
        async def run() -> None:
            seen.append(name)
            if hang:
                await asyncio.sleep(10)
            if fail:
                raise RuntimeError(name)
        return run

    for step in reversed(SHUTDOWN_ORDER):  # registration order does not matter across steps
        plan.add(step, step, hook(step, fail=step == "stop_tables", hang=step == "stop_tasks"),
                 timeout_s=0.05)
    plan.add("stop_listening", "second", hook("second"))
    failed = await plan.run()
    assert seen == ["stop_listening", "second", *SHUTDOWN_ORDER[1:]]
    assert failed == ["stop_tasks", "stop_tables"]
    with pytest.raises(ValueError):
        plan.add("nope", "x", hook("x"))


async def test_startup_failure_exits_1_and_cleans_up(tmp_path: Path, notify: NotifySocket) -> None:
    engines: list[FakeEngine] = []

    def factory(cfg: Config, sup: Supervisor, metrics: Metrics) -> FakeEngine:
        e = FakeEngine(cfg, sup, metrics)
        e.fail_start = ConnectionError("ZooKeeper unreachable")
        engines.append(e)
        return e

    notifier = Notifier({"NOTIFY_SOCKET": str(notify.path)})
    d = Daemon(config(tmp_path), engine_factory=factory, notifier=notifier, api_port=0)
    assert await asyncio.wait_for(d.run(), 5) == 1
    assert engines[0].calls[0] == "start" and engines[0].calls[-1] == "close_keeper"
    msgs = notify.messages()
    assert not any(m.startswith("READY=1") for m in msgs)
    assert any("start-up failed: ZooKeeper unreachable" in m for m in msgs)


async def test_reload_applies_what_it_can(tmp_path: Path, notify: NotifySocket) -> None:
    d, engines = make(tmp_path, notify)
    await d.start()
    try:
        path = d.config_path
        assert path is not None
        path.write_text(yaml.safe_dump({
            "replica": "other", "data_path": str(tmp_path / "data"), "log_level": "debug",
            "api": {"max_body_bytes": 123, "port": 9}, "settings": {"parts_to_throw_insert": 1000}}))
        assert await d.reload() is True
        assert d.config.replica == "r1"  # needs a restart: kept
        assert d.config.api.port == 1 and d.config.api.max_body_bytes == 123
        assert d.config.log_level == "debug" and d.config.settings == {"parts_to_throw_insert": 1000}
        assert d.api_state.config is d.config and engines[0].calls[-1] == "reload"
        msgs = notify.messages()
        assert any(m.startswith("RELOADING=1\nMONOTONIC_USEC=") for m in msgs)
        assert msgs[-1].startswith("READY=1")
        path.write_text("replica: [broken\n")
        assert await d.reload() is False
        assert d.config.settings == {"parts_to_throw_insert": 1000}
    finally:
        from replicad.logging import set_level

        set_level("info")
        await d.shutdown()


def test_notifier_addresses_and_watchdog(tmp_path: Path) -> None:
    assert not Notifier({}).enabled and Notifier({}).notify("READY=1") is False
    n = Notifier({"NOTIFY_SOCKET": "@abstract-name", "WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "1"})
    assert n.address == "\0abstract-name" and n.watchdog_interval_s is None  # watchdog is for another pid
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "absent.sock"), "WATCHDOG_USEC": "10000000"})
    assert n.watchdog_interval_s == 5.0
    assert n.notify("READY=1") is False  # nobody listens: logged, not raised


async def test_stop_signal_during_a_hanging_start(tmp_path: Path, notify: NotifySocket) -> None:
    class Hanging(FakeEngine):
        async def start(self) -> None:
            self.calls.append("start")
            await asyncio.sleep(3600)  # ZooKeeper never answers

    engines: list[FakeEngine] = []

    def factory(cfg: Config, sup: Supervisor, metrics: Metrics) -> FakeEngine:
        engines.append(Hanging(cfg, sup, metrics))
        return engines[-1]

    notifier = Notifier({"NOTIFY_SOCKET": str(notify.path)})
    d = Daemon(config(tmp_path), engine_factory=factory, notifier=notifier, api_port=0)
    run = asyncio.create_task(d.run())
    for _ in range(200):
        if engines and engines[0].calls:
            break
        await asyncio.sleep(0.01)
    d.request_stop("test")
    assert await asyncio.wait_for(run, 5) == 1
    assert engines[0].calls[-1] == "close_keeper"
    assert not any(m.startswith("READY=1") for m in notify.messages())
