"""A ClickHouse 18.16 server as a member of the rig (the mixed variant), behind the same small interface as a
replicad daemon: ``start``, ``wait_ready``, ``kill``, ``stop``, ``running``, ``proc``, ``url``, ``data_path``.

It listens on loopback only, so the mixed variant runs without network namespaces.  18.16 knows no
``insert_deduplication_token``: in the mixed variant every client relies on the block hash instead.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import process
from tests.support.clickhouse import ClickHouseServer


class ClickHouseMember:
    def __init__(self, base: Path, name: str, zk_hosts: str, chroot: str, ddl: str,
                 session_timeout_s: int) -> None:
        self.name = name
        self.ddl = ddl
        self.server = ClickHouseServer(base / name, replica=name, zookeeper=zk_hosts, zookeeper_root=chroot,
                                       zookeeper_session_timeout_ms=session_timeout_s * 1000)
        self.url = self.server.http_url
        self.data_path = self.server.data_dir

    @property
    def proc(self) -> object:
        return self.server.proc

    @property
    def running(self) -> bool:
        return self.server.running

    def start(self) -> None:
        self.server.start()

    def wait_ready(self, table: str | None = None, timeout: float = 90.0) -> None:
        self.server.wait_ready(timeout)
        self.server.query("CREATE DATABASE IF NOT EXISTS db")
        self.server.query(self.ddl)

    def kill(self) -> None:
        self.server.kill()

    def stop(self, timeout: float = 30.0) -> None:
        self.server.stop(timeout)

    def log_tail(self, lines: int = 40) -> str:
        return process.tail(self.server.err_log_path, lines)
