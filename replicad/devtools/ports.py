"""Free loopback TCP ports for test servers (never the well-known defaults)."""

from __future__ import annotations

import os
import socket
import threading

_AVOID = {2181, 8123, 9000, 9009, 9181, 9234, 8443, 9440}
_handed_out: set[int] = set()
_lock = threading.Lock()


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
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if (port // 2) % count == index and port not in _AVOID and port not in _handed_out:
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
