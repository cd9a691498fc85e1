"""Insert bodies from a hostile client, against a real daemon: idle bodies time out (408, code 209) and hold
only the insert parsers' own threads (the rest of the daemon keeps answering), inserts beyond
``api.max_concurrent_inserts`` are refused (503, code 202), over-long lines are refused (400, code 117) and
none of it writes a row or leaves a temporary directory."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import make_chroot, ok, query, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TABLE = "db.lim"
DDL = ("CREATE TABLE IF NOT EXISTS db.lim (k UInt64, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/01/lim', '{replica}') ORDER BY k")
RECEIVE_TIMEOUT_S = 2.0
MAX_INSERTS = 3
MAX_LINE = 4096


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("limits")
    api = {"receive_timeout_s": RECEIVE_TIMEOUT_S, "max_concurrent_inserts": MAX_INSERTS,
           "max_line_bytes": MAX_LINE}
    d = start_daemon(base, zookeeper, make_chroot(zookeeper, "limits"), "r1", tables=[DDL], api=api,
                     wait_table=TABLE)
    try:
        yield d
    finally:
        d.kill()


def _port(d: Daemon) -> int:
    return int(d.url.rsplit(":", 1)[1].rstrip("/"))


def _stalled_insert(d: Daemon, fmt: str = "TSV") -> socket.socket:
    """An INSERT whose body promises 1 MB and sends one row, then nothing."""
    s = socket.create_connection(("127.0.0.1", _port(d)), timeout=30)
    target = "/?query=" + quote(f"INSERT INTO {TABLE} FORMAT {fmt}")
    s.sendall(f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".encode() + b"1\ta\n")
    return s


def _answer(s: socket.socket) -> tuple[int, str]:
    data = b""
    while b"\r\n\r\n" not in data or not data.split(b"\r\n\r\n", 1)[1]:
        piece = s.recv(65536)
        if not piece:
            break
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body.decode("utf-8", "replace")


def _table_dir(d: Daemon) -> Path:
    return d.config_path.parent / "data" / "data" / "db" / "lim"


def _count(d: Daemon) -> int:
    return int(ok(query(d.url, f"SELECT count() FROM {TABLE}")).text)


def test_idle_bodies_time_out_and_never_hold_the_rest_of_the_daemon(daemon: Daemon) -> None:
    before = _count(daemon)
    stalled = [_stalled_insert(daemon) for _ in range(MAX_INSERTS)]
    try:
        time.sleep(0.5)  # all three are being parsed, each waiting for body bytes
        # one more insert is refused at once: no thread is held for it
        r = query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"2\tb\n", timeout=10)
        assert r.status == 503 and r.exception_code == 202, r.text
        # everything that is not an insert parse goes on (it does not use the parsers' threads)
        started = time.monotonic()
        assert ok(query(daemon.url, f"SELECT count() FROM {TABLE}", timeout=10)).text == f"{before}\n"
        ok(query(daemon.url, f"OPTIMIZE TABLE {TABLE}", post=True, timeout=10))
        assert time.monotonic() - started < RECEIVE_TIMEOUT_S, "other requests waited for the idle bodies"
        answers = [_answer(s) for s in stalled]
    finally:
        for s in stalled:
            s.close()
    for status, text in answers:
        assert status == 408, text
        assert text.startswith("Code: 209.") and "api.receive_timeout_s" in text, text
    assert _count(daemon) == before  # the row each stalled body sent is not written
    assert [p.name for p in _table_dir(daemon).iterdir() if p.name.startswith("tmp")] == []
    # the slots are free again
    ok(query(daemon.url, f"INSERT INTO {TABLE} FORMAT TSV", b"3\tc\n"))
    assert _count(daemon) == before + 1


@pytest.mark.parametrize("fmt,make", [
    ("TSV", lambda n: b"1\tok\n" + b"2\t" + b"x" * n + b"\n"),
    ("JSONEachRow", lambda n: b'{"k":1,"s":"ok"}\n{"k":2,"s":"' + b"x" * n + b'"}\n'),
    ("TSVWithNames", lambda n: b"k\ts\n1\tok\n2\t" + b"x" * n + b"\n"),
    ("TSV", lambda n: b"1\t" + b"x" * n),  # no line end at all
])
def test_an_over_long_line_is_refused_and_nothing_is_written(daemon: Daemon, fmt: str, make: object) -> None:
    before = _count(daemon)
    r = query(daemon.url, f"INSERT INTO {TABLE} FORMAT {fmt}", make(2 * MAX_LINE))  # type: ignore[operator]
    assert r.status == 400 and r.exception_code == 117, r.text
    assert "api.max_line_bytes" in r.text
    assert _count(daemon) == before
    assert [p.name for p in _table_dir(daemon).iterdir() if p.name.startswith("tmp")] == []
    # lines under the limit are fine, in the same formats
    good = query(daemon.url, f"INSERT INTO {TABLE} FORMAT {fmt}", make(MAX_LINE // 4),  # type: ignore[operator]
                 insert_deduplicate=0)
    ok(good)
    assert _count(daemon) > before


def test_an_over_long_header_line_is_refused(daemon: Daemon) -> None:
    before = _count(daemon)
    for fmt in ("TSVWithNames", "CSVWithNames"):
        r = query(daemon.url, f"INSERT INTO {TABLE} FORMAT {fmt}", b"k," + b"s" * (4 * MAX_LINE) + b"\n1,a\n")
        assert r.status == 400 and r.exception_code == 117, r.text
    assert _count(daemon) == before


def test_an_error_before_the_body_is_read_says_connection_close(daemon: Daemon) -> None:
    """A refused insert whose body was not read: the answer says ``Connection: close`` (a keep-alive client
    must not reuse the connection), and the server does close it; an error after the whole body was read
    keeps the connection."""
    s = socket.create_connection(("127.0.0.1", _port(daemon)), timeout=30)
    body = b"1\ta\n" * 200_000
    target = "/?query=" + quote("INSERT INTO db.nope FORMAT TSV")
    head_out = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    s.sendall(head_out + body[:1000])
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(4096)
    assert head.startswith(b"HTTP/1.1 404"), head[:200]
    assert b"Connection: close" in head, head
    s.close()
    r = query(daemon.url, "SELECT nonsense FROM db.lim")  # no body: the connection may stay
    assert r.status == 400 and r.headers.get("Connection", "").lower() != "close"
