"""A throwaway ClickHouse 18.16 server for tests: own config in a temp dir, free loopback ports.

Usage::

    with ClickHouseServer(tmp_path) as ch:
        ch.query("CREATE TABLE t (x UInt8) ENGINE = MergeTree ORDER BY x")
        ch.query("INSERT INTO t FORMAT TSV", data=b"1\\n")
        assert ch.query("SELECT count() FROM t") == b"1\\n"

Nothing listens outside 127.0.0.1; no interserver port unless asked for.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType

SERVER_BINARIES = ("/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server", "/usr/bin/clickhouse")


def find_server_binary() -> list[str] | None:
    """The command that starts a ClickHouse server, or None if none is installed."""
    for path in SERVER_BINARIES:
        if os.access(path, os.X_OK):
            return [path] if not path.endswith("/clickhouse") else [path, "server"]
    found = shutil.which("clickhouse-server")
    return [found] if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CONFIG = """<?xml version="1.0"?>
<yandex>
    <logger>
        <level>information</level>
        <log>{root}/log/server.log</log>
        <errorlog>{root}/log/server.err.log</errorlog>
        <size>100M</size>
        <count>1</count>
        <console>0</console>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http_port}</http_port>
    <tcp_port>{tcp_port}</tcp_port>
    {interserver}
    <max_concurrent_queries>100</max_concurrent_queries>
    <uncompressed_cache_size>104857600</uncompressed_cache_size>
    <mark_cache_size>104857600</mark_cache_size>
    <path>{root}/data/</path>
    <tmp_path>{root}/tmp/</tmp_path>
    <user_files_path>{root}/user_files/</user_files_path>
    <format_schema_path>{root}/format_schemas/</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>{timezone}</timezone>
    <mlock_executable>false</mlock_executable>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
    {extra}
</yandex>
"""

USERS = """<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>4000000000</max_memory_usage>
            <allow_experimental_low_cardinality_type>1</allow_experimental_low_cardinality_type>
            {profile_extra}
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
        <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
    </interval></default></quotas>
</yandex>
"""


class ClickHouseError(RuntimeError):
    pass


class ClickHouseServer:
    """Start/stop a private ``clickhouse-server`` (18.16) rooted at ``root``."""

    def __init__(
        self,
        root: Path,
        *,
        timezone: str = "UTC",
        interserver_port: int | None = None,
        extra_config: str = "",
        profile_extra: str = "",
    ) -> None:
        self.root = Path(root)
        self.timezone = timezone
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.interserver_port = interserver_port
        self.extra_config = extra_config
        self.profile_extra = profile_extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def data_path(self) -> Path:
        return self.root / "data"

    def start(self, timeout: float = 30.0) -> None:
        cmd = find_server_binary()
        if cmd is None:
            raise ClickHouseError("no clickhouse-server binary installed")
        for sub in ("log", "data", "tmp", "user_files", "format_schemas"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        interserver = ""
        if self.interserver_port is not None:
            interserver = (
                f"<interserver_http_port>{self.interserver_port}</interserver_http_port>"
                "<interserver_http_host>127.0.0.1</interserver_http_host>"
            )
        (self.root / "config.xml").write_text(
            CONFIG.format(
                root=self.root,
                http_port=self.http_port,
                tcp_port=self.tcp_port,
                interserver=interserver,
                timezone=self.timezone,
                extra=self.extra_config,
            )
        )
        (self.root / "users.xml").write_text(USERS.format(profile_extra=self.profile_extra))
        stdout = open(self.root / "log" / "stdout.log", "wb")
        try:
            self.proc = subprocess.Popen(
                [*cmd, f"--config-file={self.root / 'config.xml'}"],
                cwd=self.root,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            stdout.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ClickHouseError(
                    f"clickhouse-server exited with {self.proc.returncode}: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/ping", timeout=1) as r:
                    if r.read() == b"Ok.\n":
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise ClickHouseError(f"clickhouse-server did not start in {timeout}s: {self._log_tail()}")

    def _log_tail(self) -> str:
        parts = []
        for name in ("stdout.log", "server.err.log"):
            p = self.root / "log" / name
            if p.exists():
                parts.append(p.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def query(self, sql: str, data: bytes | None = None, timeout: float = 120.0, **settings: str) -> bytes:
        """Run one statement over HTTP; ``data`` is the INSERT body.  Raises ClickHouseError with the text."""
        params = {"query": sql, **settings}
        url = f"http://127.0.0.1:{self.http_port}/?{urllib.parse.urlencode(params)}"
        req = urllib.request.Request(url, data=data if data is not None else b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            raise ClickHouseError(e.read().decode(errors="replace")) from None

    def table_path(self, database: str, table: str) -> Path:
        return self.data_path / "data" / database / table

    def __enter__(self) -> ClickHouseServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
