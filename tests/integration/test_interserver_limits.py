"""The interserver port against peers that misbehave, on a real daemon: a peer that stops reading a part
is cut off after ``interserver.send_timeout_s`` and its send slot is free again; connections beyond
``interserver.max_connections`` are answered 503 at once."""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import log_events, make_chroot, ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TABLE = "db.big"
ZK_TABLE = "/clickhouse/tables/01/big"
DDL = ("CREATE TABLE IF NOT EXISTS db.big (k UInt64, s String) ENGINE = "
       f"ReplicatedMergeTree('{ZK_TABLE}', '{{replica}}') ORDER BY k")
SEND_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 6


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("islimits")
    limits = {"send_timeout_s": SEND_TIMEOUT_S, "max_connections": MAX_CONNECTIONS, "max_parallel_sends": 1}
    d = start_daemon(base, zookeeper, make_chroot(zookeeper, "islimits"), "r1", tables=[DDL],
                     wait_table=TABLE, interserver=limits)
    # ~40 MB of incompressible strings: more than the socket and send buffers hold
    rows = b"".join(b"%d\t%s\n" % (i, os.urandom(20_000).hex().encode()) for i in range(1000))
    ok(query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", rows))
    try:
        yield d
    finally:
        d.kill()


def _port_from_config(d: Daemon) -> int:
    import yaml

    return int(yaml.safe_load(d.config_path.read_text())["interserver"]["port"])


def _part(d: Daemon) -> str:
    return str(_parts_rows(d)[0]["name"])


def _fetch_request(part: str, replica: str = "r1") -> bytes:
    q = urlencode({"endpoint": f"DataPartsExchange:{ZK_TABLE}/replicas/{replica}", "part": part,
                   "compress": "false"})
    return f"POST /?{q} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


def _read_all(s: socket.socket) -> bytes:
    out = bytearray()
    try:
        while piece := s.recv(1 << 20):
            out += piece
    except ConnectionResetError:
        pass
    return bytes(out)


def test_a_peer_that_stops_reading_is_cut_off_and_frees_its_send_slot(daemon: Daemon) -> None:
    port = _port_from_config(daemon)
    part = _part(daemon)
    slow = socket.create_connection(("127.0.0.1", port), timeout=60)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.sendall(_fetch_request(part))
    assert slow.recv(4096).startswith(b"HTTP/1.1 200")
    try:
        # while it holds the only send slot, another fetch is told to come back later
        busy = socket.create_connection(("127.0.0.1", port), timeout=10)
        busy.sendall(_fetch_request(part))
        answer = _read_all(busy)
        busy.close()
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        time.sleep(SEND_TIMEOUT_S + 1.5)  # the slow reader took nothing all this time
        events = [e for e in log_events(daemon) if e.get("event") == "part_send_aborted"]
        assert any("interserver.send_timeout_s" in str(e.get("error")) for e in events), events
        # its slot is free while it still holds its connection open: a well-behaved fetch gets the whole part
        total = sum(int(str(p["bytes_on_disk"])) for p in _parts_rows(daemon))
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(_fetch_request(part))
        body = _read_all(s)
        s.close()
        assert body.startswith(b"HTTP/1.1 200"), body[:200]
        assert len(body) > total
    finally:
        slow.close()  # (the kernel may still hold a few MB for it: the daemon holds nothing)


def _parts_rows(d: Daemon) -> list[dict[str, object]]:
    parts = ok(request(d.url, f"/tables/{TABLE}/parts")).json()
    rows = parts if isinstance(parts, list) else parts.get("data", parts.get("parts", []))
    return [r for r in rows if isinstance(r, dict)]


def test_connections_beyond_the_cap_are_refused_at_once(daemon: Daemon) -> None:
    port = _port_from_config(daemon)
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        answer = _read_all(extra)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"Too many connections" in answer
        assert time.monotonic() - started < 2.0
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _read_all(s).startswith(b"HTTP/1.1 200")
    s.close()


def test_hostile_requests_get_an_answer_or_a_close_and_the_server_goes_on(daemon: Daemon) -> None:
    """Mutated and random requests to the interserver port (seeded; ``FUZZ_EXAMPLES``): each gets an HTTP
    answer other than 200 with a part, or the connection is closed; afterwards a real fetch still works."""
    port = _port_from_config(daemon)
    part = _part(daemon)
    good = _fetch_request(part)
    rng = random.Random(int(os.environ.get("FUZZ_SEED", "9009")))
    statuses: dict[bytes, int] = {}
    for i in range(int(os.environ.get("FUZZ_EXAMPLES", "150"))):
        kind = i % 5
        if kind == 0:
            req = os.urandom(rng.randrange(1, 400))
        elif kind == 1:
            b = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            req = bytes(b)
        elif kind == 2:
            req = good.replace(part.encode(), rng.choice([b"../../etc", b"all_1_1_0", b"%00", b"x" * 5000]))
        elif kind == 3:
            req = good.replace(b"Content-Length: 0", rng.choice([b"Content-Length: -1", b"Content-Length: x",
                                                                 b"Content-Length: 99999999999",
                                                                 b"Transfer-Encoding: chunked"]))
        else:
            req = good[:rng.randrange(len(good))]
        s = socket.create_connection(("127.0.0.1", port), timeout=35)
        try:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
            answer = _read_all(s)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        finally:
            s.close()
        status = answer[:12]
        statuses[status] = statuses.get(status, 0) + 1
        if status == b"HTTP/1.1 500":  # only where 18.16 answers 500 too: no compress parameter
            assert b"Not found: compress" in answer, answer[:300]
        if kind != 1:  # (a flipped byte may leave the request valid)
            assert not answer.startswith(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream"), req
    assert not any(k.startswith(b"HTTP/1.1 5") and not k.startswith(b"HTTP/1.1 500") for k in statuses)
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(good)
    assert _read_all(s).startswith(b"HTTP/1.1 200")
    s.close()
    assert ok(request(daemon.url, "/ping")).text == "Ok.\n"
