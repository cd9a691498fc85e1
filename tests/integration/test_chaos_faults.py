"""The chaos suite's clock and link faults do what they claim, measured from outside: a process under the
clock shim reads a skewed wall clock (and nothing else changes), and a link under the packet queue really
delays, drops and reorders packets.  Then the regression the clock nemesis found (temporary directories
removed while being written by a replica whose clock is a day ahead)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from replicad.devtools.zookeeper import available
from tests.chaos import clock, linkfaults
from tests.chaos.ensemble import Ensemble
from tests.chaos.netns import Network
from tests.chaos.rig import Rig, netns_support
from tests.chaos.workload import http_query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, threading, time, datetime
t0 = time.time(); m0 = time.monotonic()
time.sleep(0.3)
ev = threading.Event(); w0 = time.monotonic(); ev.wait(0.1); waited = time.monotonic() - w0
print(json.dumps({"wall": t0, "wall_after": time.time(), "mono": m0, "mono_after": time.monotonic(),
                  "datetime": datetime.datetime.now(datetime.timezone.utc).timestamp(), "waited": waited}))
"""


def _probe(env: dict[str, str]) -> tuple[dict[str, float], float, float]:
    mono, wall = time.monotonic(), time.time()
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60,
                       env={**env, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), mono, wall


@pytest.mark.parametrize("offset_s", [-93600.0, 420.0])
def test_clock_shim_skews_the_wall_clock_only(offset_s: float) -> None:
    if clock.clock_support() is not None:
        pytest.skip(str(clock.clock_support()))
    lib = clock.shim()
    assert lib is not None
    got, mono, wall = _probe(clock._env(lib, offset_s, 1.0))
    assert abs(got["wall"] - wall - offset_s) < 10, got  # time.time() (clock_gettime REALTIME)
    assert abs(got["datetime"] - wall - offset_s) < 10, got  # datetime.now() (C level)
    assert 0 <= got["mono"] - mono < 10, got  # CLOCK_MONOTONIC is the machine's, untouched
    assert 0.3 <= got["wall_after"] - got["wall"] < 5, got  # time.sleep works (libfaketime's EINVAL)
    assert 0.09 <= got["waited"] < 5, got  # timed waits work (libfaketime's hang)


def test_clock_shim_drift_runs_the_wall_clock_faster() -> None:
    if clock.clock_support() is not None:
        pytest.skip(str(clock.clock_support()))
    lib = clock.shim()
    assert lib is not None
    got, _, _ = _probe(clock._env(lib, 0.0, 3.0))
    wall_elapsed = got["wall_after"] - got["wall"]
    mono_elapsed = got["mono_after"] - got["mono"]
    assert wall_elapsed == pytest.approx(3 * mono_elapsed, rel=0.2), got


ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7777)); s.listen()
s.settimeout(60); print("ready", flush=True)
c, _ = s.accept()
while (d := c.recv(65536)):
    c.sendall(d)
"""

CLIENT = """
import json, socket, sys, time
c = socket.create_connection((sys.argv[1], 7777), timeout=30)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(7):
    t = time.monotonic(); c.sendall(b"x" * 64); got = b""
    while len(got) < 64:
        got += c.recv(64 - len(got))
    rtts.append(time.monotonic() - t)
blob = bytes(range(256)) * 512  # 128 KiB each way, checked byte for byte
c.sendall(blob); back = b""
while len(back) < len(blob):
    back += c.recv(1 << 16)
print(json.dumps({"median_rtt": sorted(rtts)[len(rtts) // 2], "intact": back == blob}))
"""


@pytest.fixture()
def pair() -> Iterator[Network]:
    if netns_support() is not None:
        pytest.skip(f"no network namespaces here: {netns_support()}")
    if linkfaults.link_fault_support()[0] != "nfqueue":
        pytest.skip(str(linkfaults.link_fault_support()[1]))
    net = Network(["a", "b"])
    net.setup()
    try:
        yield net
    finally:
        net.teardown()


def _exchange(net: Network) -> dict[str, float]:
    server = subprocess.Popen([*net.prefix("b"), sys.executable, "-c", ECHO], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        r = subprocess.run([*net.prefix("a"), sys.executable, "-c", CLIENT, net.ip("b")], capture_output=True,
                           text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        out: dict[str, float] = json.loads(r.stdout)
        return out
    finally:
        server.kill()
        server.wait(timeout=10)


def test_link_queue_delays_drops_and_reorders(pair: Network) -> None:
    assert _exchange(pair)["median_rtt"] < 0.05  # a clean link first
    delayed = linkfaults.QueuedLink(pair, "a", delay_ms=100, jitter_ms=10).start()
    try:
        slow = _exchange(pair)
    finally:
        delayed.stop()
    assert slow["median_rtt"] >= 0.17 and slow["intact"], slow  # 100 ms out of a, 100 ms into a
    lossy = linkfaults.QueuedLink(pair, "a", loss=0.1, reorder=0.3, reorder_ms=20, seed=1).start()
    try:
        rough = _exchange(pair)
    finally:
        counts = lossy.stop()
    accepted, dropped, reordered = (int(w) for w in counts.split()[1::2])
    assert rough["intact"], rough  # TCP got everything across, in order, by retransmitting
    assert dropped > 0.04 * (accepted + dropped) and reordered > 0.2 * accepted, counts
    assert _exchange(pair)["median_rtt"] < 0.05  # healed: nothing left in the way


def test_replica_a_day_ahead_keeps_its_temporary_directories(tmp_path: Path) -> None:
    """Regression (found with clock_skew): a replica whose wall clock is 26 h ahead of its file times (a
    skewed host, a clock stepped forward) removed the temporary directories of inserts and merges still being
    written, since the cleanup compared their file times with the wall clock: inserts failed with
    FileNotFoundError, and once a part committed while its files were being deleted was detached broken.
    Inserts of 20 000 rows from 3 clients for 4 s with the cleanup every second: none may fail, the cleanup
    removes nothing, every acknowledged row is there."""
    if not available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    if clock.clock_support() is not None:
        pytest.skip(str(clock.clock_support()))
    lib = clock.shim()
    assert lib is not None
    ensemble = Ensemble(tmp_path / "zk", size=1)
    ensemble.start()
    rig = Rig(tmp_path, ensemble, ["r1"])
    try:
        cfg_path = tmp_path / "r1" / "replicad.yaml"
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["settings"] = {"cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}
        cfg_path.write_text(yaml.safe_dump(cfg))
        rig.daemons["r1"].env.update(clock._env(lib, 93600.0, 1.0))
        rig.start()
        assert abs(clock.measured_skew(rig.url("r1")) - 93600) < 10
        outcomes: list[tuple[int, bytes]] = []

        def client(k: int) -> None:
            deadline = time.monotonic() + 4.0
            i = 0
            while time.monotonic() < deadline:
                i += 1
                body = "".join(f"{k}\t{k * 10**9 + i * 10**5 + j}\t{k}\t{j}\n" for j in range(20000))
                status, _h, text = http_query(rig.url("r1"), "INSERT INTO db.t FORMAT TSV",
                                              body=body.encode(), timeout=60)
                outcomes.append((status, text[:300]))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [o for o in outcomes if o[0] != 200]
        assert outcomes and not failed, failed[:3]
        status, _h, count = http_query(rig.url("r1"), "SELECT count() FROM db.t", timeout=60)
        assert status == 200 and int(count) == 20000 * len(outcomes), count
        log = (tmp_path / "r1" / "replicad.log").read_text()
        assert "removed_old_temporary_directories" not in log
        assert "broken_part" not in log
    finally:
        rig.close()
        ensemble.stop()
