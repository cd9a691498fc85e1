"""``python -m replicad`` as a real process: check-config exit codes and problem lists, and ``run`` driving
the daemon shell (with the in-memory engine of tests/support/fake_engine.py) through READY, HTTP, SIGHUP,
``replicad status`` and an ordered SIGTERM shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from replicad.devtools.ports import free_port

REPO = Path(__file__).resolve().parents[2]
EX_CONFIG = 78
pytestmark = pytest.mark.integration


def replicad(*args: str, env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replicad", *args], cwd=REPO, env=_env(env),
                          capture_output=True, text=True, timeout=timeout)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    ours = ("REPLICAD_", "NOTIFY_SOCKET", "WATCHDOG_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def good_config(tmp_path: Path, api_port: int = 18123, interserver_port: int = 19009) -> dict[str, object]:
    return {
        "replica": "r1",
        "data_path": str(tmp_path / "data"),
        "macros": {"shard": "01"},
        "zookeeper": {"hosts": "127.0.0.1:1/replicad"},
        "interserver": {"listen_host": "127.0.0.1", "port": interserver_port},
        "api": {"listen_host": "127.0.0.1", "port": api_port},
        "settings": {"parts_to_throw_insert": 500},
        "tables": ["CREATE TABLE IF NOT EXISTS db.events (d Date, ts DateTime, user_id UInt64, kind String) "
                   "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') "
                   "PARTITION BY toYYYYMM(d) ORDER BY (kind, user_id, ts)"],
    }


def write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "replicad.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# ---- check-config ------------------------------------------------------------------------------------------


def test_check_config_accepts_a_good_config(tmp_path: Path) -> None:
    r = replicad("check-config", "--config", str(write(tmp_path, good_config(tmp_path))))
    assert r.returncode == 0, r.stderr
    assert "replicad.yaml: ok" in r.stdout and "replica      r1" in r.stdout
    assert "parts_to_throw_insert=500" in r.stdout and r.stderr == ""


def test_check_config_accepts_the_shipped_configs() -> None:
    for path in ["config/replicad.example.yaml", "config/cluster/r1.yaml", "config/cluster/r2.yaml",
                 "config/cluster/r3.yaml"]:
        r = replicad("check-config", "--config", path)
        assert r.returncode == 0, (path, r.stderr)


def test_check_config_lists_every_problem(tmp_path: Path) -> None:
    cfg = good_config(tmp_path)
    cfg.update({
        "replica": "",
        "timezone": "Nowhere/Town",
        "zookeeper": {"hosts": "zk1:2181,zk2:notaport", "session_timeout_s": "soon"},
        "api": {"listen_host": "127.0.0.1", "port": 9009, "max_body_bytes": 0},
        "interserver": {"listen_host": "127.0.0.1", "port": 9009, "colour": "blue"},
        "settings": {"index_granularity": -1, "parts_to_throw_insert": "many", "not_a_setting": 1},
        "tables": ["CREATE TABLE db.t (a UInt8) ENGINE = ReplicatedMergeTree('/t/{region}/t', '{replica}') "
                   "ORDER BY a"],
    })
    r = replicad("check-config", "--config", str(write(tmp_path, cfg)))
    assert r.returncode == EX_CONFIG
    assert r.stdout == ""
    problems = [line[4:] for line in r.stderr.splitlines() if line.startswith("  - ")]
    expected = ["replica:", "timezone:", "zookeeper.hosts:", "zookeeper.session_timeout_s:",
                "api.max_body_bytes:", "interserver.colour: unknown key", "settings.index_granularity:",
                "settings.parts_to_throw_insert:", "settings.not_a_setting: unknown setting",
                "tables[0]: macro {region} is not defined", "api.port and interserver.port are both 9009"]
    for prefix in expected:
        assert any(p.startswith(prefix) for p in problems), (prefix, problems)
    assert len(problems) == len(expected), problems


def test_check_config_environment_overrides(tmp_path: Path) -> None:
    path = str(write(tmp_path, good_config(tmp_path)))
    r = replicad("check-config", "--config", path, env={"REPLICAD_API__PORT": "not-a-port",
                                                         "REPLICAD_SETTINGS__NO_SUCH": "1"})
    assert r.returncode == EX_CONFIG
    assert "api.port" in r.stderr and "settings.no_such: unknown setting" in r.stderr
    r = replicad("check-config", "--config", path, env={"REPLICAD_REPLICA": "r7",
                                                         "REPLICAD_ZOOKEEPER__HOSTS": "10.1.1.1:2181"})
    assert r.returncode == 0 and "replica      r7" in r.stdout and "10.1.1.1:2181" in r.stdout


def test_check_config_unreadable_and_usage(tmp_path: Path) -> None:
    r = replicad("check-config", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == EX_CONFIG and "cannot read config file" in r.stderr
    (tmp_path / "bad.yaml").write_text("replica: r1\n  indented: wrong\n")
    r = replicad("check-config", "--config", str(tmp_path / "bad.yaml"))
    assert r.returncode == EX_CONFIG and "YAML syntax" in r.stderr
    r = replicad("check-config")
    assert r.returncode == 2 and "--config" in r.stderr


def test_run_refuses_an_invalid_config(tmp_path: Path) -> None:
    cfg = good_config(tmp_path)
    cfg["settings"] = {"no_such_setting": 1}
    r = replicad("run", "--config", str(write(tmp_path, cfg)))
    assert r.returncode == EX_CONFIG and "settings.no_such_setting: unknown setting" in r.stderr


def test_run_without_an_engine_fails_clearly(tmp_path: Path) -> None:
    r = replicad("run", "--config", str(write(tmp_path, good_config(tmp_path))),
                 env={"REPLICAD_ENGINE_FACTORY": "no_such_module_xyz:create"})
    assert r.returncode == 1 and "replication engine no_such_module_xyz:create is not available" in r.stderr


def test_status_of_nothing_listening() -> None:
    r = replicad("status", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "2")
    assert r.returncode == 2 and "cannot reach" in r.stderr


# ---- run --------------------------------------------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify.sock"))
    s.settimeout(20)
    yield s
    s.close()


def _wait_for(sock: socket.socket, prefix: str) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        msg = sock.recv(4096).decode()
        if msg.startswith(prefix):
            return msg
    raise AssertionError(f"no {prefix} notification")


def _http(url: str, data: bytes | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_run_serves_reloads_and_shuts_down_in_order(tmp_path: Path, notify_socket: socket.socket) -> None:
    api_port = free_port()
    cfg = good_config(tmp_path, api_port=api_port, interserver_port=free_port())
    path = write(tmp_path, cfg)
    env = _env({"REPLICAD_ENGINE_FACTORY": "tests.support.fake_engine:create_fake_engine",
                "NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "2000000"})
    proc = subprocess.Popen([sys.executable, "-m", "replicad", "run", "--config", str(path)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        ready = _wait_for(notify_socket, "READY=1")
        assert "STATUS=serving 1 table(s)" in ready
        base = f"http://127.0.0.1:{api_port}"
        assert _http(base + "/ping") == (200, b"Ok.\n")
        status, body = _http(base + "/?query=INSERT%20INTO%20db.events%20FORMAT%20CSV",
                             b"2026-11-22,2026-11-22 01:02:03,42,click\n")
        assert status == 200 and json.loads(body)["written_rows"] == 1
        assert _http(base + "/?query=SELECT%20user_id,kind%20FROM%20db.events") == (200, b"42\tclick\n")
        st = replicad("status", "--url", base)
        assert st.returncode == 0 and "db.events" in st.stdout and "fake_queue" in st.stdout
        st = replicad("status", "--config", str(path), "--json")
        assert st.returncode == 0 and json.loads(st.stdout)["tables"]["db.events"]["active_parts"] == 1

        cfg["log_level"] = "debug"
        path.write_text(yaml.safe_dump(cfg))
        proc.send_signal(signal.SIGHUP)
        assert _wait_for(notify_socket, "RELOADING=1")
        assert _wait_for(notify_socket, "READY=1")

        proc.send_signal(signal.SIGTERM)
        assert _wait_for(notify_socket, "STOPPING=1")
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.decode().splitlines()]  # every stdout line is JSON
    names = [e["event"] for e in events]
    assert names[0] == "daemon_starting" and "daemon_ready" in names and names[-1] == "daemon_stopped"
    assert "config_reloaded" in names and "insert_done" in names
    steps = [e["hook"] for e in events if e["event"] == "shutdown_step_done"]
    assert steps == ["api_stop_listening", "engine_stop_listening", "api_stop_writes", "engine_stop_inserts",
                     "supervisor_stop", "engine_stop_tables", "engine_close_interserver", "api_stop",
                     "engine_close_keeper"]
    assert all({"ts", "level", "event"} <= set(e) for e in events)
