"""systemd's notify protocol, without a dependency: datagrams to the unix socket in ``$NOTIFY_SOCKET``.

``READY=1`` once the replica serves, ``RELOADING=1`` around a SIGHUP reload, ``STOPPING=1`` at shutdown,
``STATUS=…`` for ``systemctl status`` and ``WATCHDOG=1`` pings every half ``$WATCHDOG_USEC``.
Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from replicad.logging import get_logger

log = get_logger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if addr.startswith("@"):
            self.address = "\0" + addr[1:]  # abstract namespace
        elif addr.startswith("/"):
            self.address = addr
        self.watchdog_usec: int | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_usec = int(usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half the watchdog timeout, as systemd recommends."""
        return None if self.watchdog_usec is None else self.watchdog_usec / 2 / 1_000_000

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=value`` lines in one datagram.  Never raises; returns whether it was sent."""
        if self.address is None or not fields:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(fields).encode("utf-8"), socket.MSG_DONTWAIT, self.address)
        except OSError as e:
            log.warning("sd_notify_failed", error=str(e), message=fields[0])
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> bool:
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")
