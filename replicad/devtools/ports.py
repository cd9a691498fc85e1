"""Free loopback TCP ports for test servers (never the well-known defaults)."""

from __future__ import annotations

import socket
import threading

_AVOID = {2181, 8123, 9000, 9009, 9181, 9234, 8443, 9440}
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now and was not handed out before in this process."""
    with _lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _AVOID and port not in _handed_out:
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
