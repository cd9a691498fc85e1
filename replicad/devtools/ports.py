"""Free loopback TCP ports for test servers (never the well-known defaults).

Ports are drawn below the kernel's ephemeral range when there is room: a test that stops a server and starts
it again on the same port must not find it taken meanwhile by an outgoing connection's local port (those come
from the ephemeral range; CI saw a restarted daemon fail with "address already in use" once).
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_AVOID = {2181, 8123, 9000, 9009, 9181, 9234, 8443, 9440}
_handed_out: set[int] = set()
_lock = threading.Lock()
_random = random.Random(os.urandom(16))
#: the lowest port drawn outside the ephemeral range; fewer than MIN_SPAN ports below it: bind to port 0
LOWEST = 10_000
MIN_SPAN = 4_000


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def _candidate(host: str) -> int:
    lo, _hi = ephemeral_range()
    if lo - LOWEST >= MIN_SPAN:
        return _random.randrange(LOWEST, lo)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def worker_share() -> tuple[int, int]:
    """(index, count) of this pytest-xdist worker (inherited by the servers it starts), else (0, 1): each
    worker takes only the ports ``p`` with ``(p // 2) % count == index`` (Linux hands out odd ports for a bind
    to port 0), so two workers never pick the same port between probing it and their server binding it."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now and was not handed out before in this process."""
    index, count = worker_share()
    with _lock:
        for _ in range(100 * count):
            port = _candidate(host)
            if (port // 2) % count == index and port not in _AVOID and port not in _handed_out \
                    and _bindable(port, host):
                _handed_out.add(port)
                return port
    raise RuntimeError("no free port found")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    return [free_port(host) for _ in range(n)]


def port_is_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
