"""A real ClickHouse 18.16 server for tests, set up as a replica (macros + ZooKeeper), on free ports.

    ch = ClickHouseServer(tmp_path / "r1", replica="r1", zookeeper=zk.hosts, zookeeper_root="/t/x")
    ch.start()                      # returns when /ping answers (≈0.1 s for 18.16)
    ch.query("CREATE TABLE ... ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ...")
    ch.query("INSERT INTO t FORMAT TSV", data=b"1\\t2\\n")
    ch.query("SELECT count() FROM t")  # -> "1\\n"

Everything lives under ``base_dir`` (config, data = ``data_dir``, logs); it listens on 127.0.0.1 only.
The binary is found at run time (``$REPLICAD_CLICKHOUSE_SERVER``, ``clickhouse`` → ``clickhouse server``,
``clickhouse-server``); ``find_server_command()`` is None when ClickHouse is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from xml.sax.saxutils import escape

from replicad.devtools import process
from replicad.devtools.ports import free_port


def find_server_command() -> list[str] | None:
    """The argv prefix that runs a ClickHouse server, or None if none is installed."""
    env = os.environ.get("REPLICAD_CLICKHOUSE_SERVER")
    if env:
        return env.split()
    for name, extra in (("clickhouse-server", []), ("clickhouse", ["server"])):
        found = shutil.which(name)
        if found:
            return [found, *extra]
    for path, extra in (("/usr/sbin/clickhouse-server", []), ("/usr/bin/clickhouse", ["server"])):
        if os.access(path, os.X_OK):
            return [path, *extra]
    return None


def available() -> bool:
    return find_server_command() is not None


class ClickHouseError(Exception):
    """A query failed: ``code`` is ClickHouse's error code (0 if unknown), ``status`` the HTTP status."""

    def __init__(self, message: str, code: int = 0, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def _settings_xml(settings: Mapping[str, object]) -> str:
    return "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in settings.items())


_CONFIG = """<?xml version="1.0"?>
<yandex>
    <logger>
        <level>{log_level}</level>
        <log>{root}/log/clickhouse-server.log</log>
        <errorlog>{root}/log/clickhouse-server.err.log</errorlog>
        <size>200M</size>
        <count>1</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http_port}</http_port>
    <tcp_port>{tcp_port}</tcp_port>
    <interserver_http_port>{interserver_port}</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>
    {credentials}
    <path>{root}/data/</path>
    <tmp_path>{root}/tmp/</tmp_path>
    <user_files_path>{root}/user_files/</user_files_path>
    <format_schema_path>{root}/format_schemas/</format_schema_path>
    <users_config>users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>{timezone}</timezone>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
    {zookeeper}
    <macros>{macros}</macros>
    <merge_tree>{merge_tree}</merge_tree>
    {extra}
</yandex>
"""

_USERS = """<?xml version="1.0"?>
<yandex>
    <profiles><default>{profile}</default></profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default></default></quotas>
</yandex>
"""


class ClickHouseServer(process.ServerProcess):
    def __init__(
        self,
        base_dir: Path | str,
        *,
        replica: str = "r1",
        shard: str = "01",
        zookeeper: str | None = None,
        zookeeper_root: str | None = None,
        zookeeper_session_timeout_ms: int = 30_000,
        macros: Mapping[str, str] | None = None,
        interserver_credentials: tuple[str, str] | None = None,
        merge_tree_settings: Mapping[str, object] | None = None,
        profile_settings: Mapping[str, object] | None = None,
        timezone: str = "UTC",
        log_level: str = "information",
        extra_config: str = "",
    ) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.replica = replica
        self.shard = shard
        self.zookeeper = zookeeper
        self.zookeeper_root = zookeeper_root.rstrip("/") if zookeeper_root else None
        self.zookeeper_session_timeout_ms = zookeeper_session_timeout_ms
        self.macros = {"shard": shard, "replica": replica, **(macros or {})}
        self.interserver_credentials = interserver_credentials
        self.merge_tree_settings = dict(merge_tree_settings or {})
        self.profile_settings = dict(profile_settings or {})
        self.timezone = timezone
        self.log_level = log_level
        self.extra_config = extra_config
        self.http_port = free_port()
        self.tcp_port = free_port()
        self.interserver_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None

    # ------------------------------------------------------------------ paths

    @property
    def config_path(self) -> Path:
        return self.base_dir / "config.xml"

    @property
    def data_dir(self) -> Path:
        """ClickHouse's ``<path>``: tables live in ``data_dir/data/<db>/<table>/``."""
        return self.base_dir / "data"

    def table_dir(self, database: str, table: str) -> Path:
        return self.data_dir / "data" / database / table

    @property
    def log_path(self) -> Path:
        return self.base_dir / "log" / "clickhouse-server.log"

    @property
    def err_log_path(self) -> Path:
        return self.base_dir / "log" / "clickhouse-server.err.log"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def interserver_host(self) -> str:
        return "127.0.0.1"

    # ------------------------------------------------------------------ config

    def _zookeeper_xml(self) -> str:
        if not self.zookeeper:
            return ""
        nodes = []
        for hp in self.zookeeper.split("/", 1)[0].split(","):
            host, _, port = hp.strip().rpartition(":")
            nodes.append(f"<node><host>{escape(host)}</host><port>{port}</port></node>")
        root = f"<root>{escape(self.zookeeper_root)}</root>" if self.zookeeper_root else ""
        return (
            f"<zookeeper>{''.join(nodes)}"
            f"<session_timeout_ms>{self.zookeeper_session_timeout_ms}</session_timeout_ms>{root}</zookeeper>"
        )

    def write_config(self) -> None:
        for sub in ("log", "data", "tmp", "user_files", "format_schemas"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        credentials = ""
        if self.interserver_credentials:
            user, password = self.interserver_credentials
            credentials = (
                "<interserver_http_credentials>"
                f"<user>{escape(user)}</user><password>{escape(password)}</password>"
                "</interserver_http_credentials>"
            )
        self.config_path.write_text(
            _CONFIG.format(
                log_level=self.log_level,
                root=self.base_dir,
                http_port=self.http_port,
                tcp_port=self.tcp_port,
                interserver_port=self.interserver_port,
                credentials=credentials,
                timezone=escape(self.timezone),
                zookeeper=self._zookeeper_xml(),
                macros=_settings_xml(self.macros),
                merge_tree=_settings_xml(self.merge_tree_settings),
                extra=self.extra_config,
            )
        )
        (self.base_dir / "users.xml").write_text(_USERS.format(profile=_settings_xml(self.profile_settings)))

    def _ensure_zookeeper_root(self) -> None:
        """18.16 refuses to start unless its ZooKeeper ``<root>`` node exists."""
        if not (self.zookeeper and self.zookeeper_root):
            return
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=self.zookeeper.split("/", 1)[0])
        zk.start(15)
        try:
            zk.ensure_path(self.zookeeper_root)
        finally:
            zk.stop()
            zk.close()

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        command = find_server_command()
        if command is None:
            raise RuntimeError("clickhouse-server is not installed")
        self.write_config()
        self._ensure_zookeeper_root()
        t0 = time.monotonic()
        self.proc = process.spawn(
            [*command, f"--config-file={self.config_path}"],
            self.base_dir / "log" / "stdout.log",
            cwd=self.base_dir,
        )
        self.wait_ready(timeout)
        self.start_seconds = time.monotonic() - t0

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Return when ``/ping`` answers ``Ok.``; raise (with the log tail) if the server died."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"clickhouse-server exited with {self.proc.returncode}:\n"
                    f"{process.tail(self.err_log_path)}\n{process.tail(self.base_dir / 'log' / 'stdout.log')}"
                )
            try:
                with urllib.request.urlopen(f"{self.http_url}/ping", timeout=1) as r:
                    if r.read().strip() == b"Ok.":
                        return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"clickhouse-server not ready in {timeout}s:\n{process.tail(self.err_log_path)}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful: closes its ZooKeeper session), SIGKILL after ``timeout``."""
        self._terminate(timeout)

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    def __enter__(self) -> ClickHouseServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries

    def query_bytes(
        self,
        sql: str,
        data: bytes | None = None,
        settings: Mapping[str, object] | None = None,
        timeout: float = 120.0,
    ) -> bytes:
        """Run ``sql`` over HTTP.  With ``data`` the SQL goes in the URL and ``data`` is the body (INSERT)."""
        params: dict[str, str] = {k: str(v) for k, v in (settings or {}).items()}
        if data is None:
            body = sql.encode()
        else:
            params["query"] = sql
            body = data
        url = self.http_url + "/"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        req = urllib.request.Request(url, data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            code_header = e.headers.get("X-ClickHouse-Exception-Code")
            code = int(code_header) if code_header and code_header.isdigit() else _code_from_text(text)
            raise ClickHouseError(f"{text.strip()} [query: {sql[:300]}]", code=code, status=e.code) from None

    def query(
        self,
        sql: str,
        data: bytes | None = None,
        settings: Mapping[str, object] | None = None,
        timeout: float = 120.0,
    ) -> str:
        return self.query_bytes(sql, data, settings, timeout).decode()

    def query_rows(self, sql: str, settings: Mapping[str, object] | None = None) -> list[list[str]]:
        """A SELECT's TabSeparated answer split into rows and fields (no unescaping)."""
        text = self.query(sql, settings=settings)
        return [line.split("\t") for line in text.splitlines()]

    def sync_replica(self, table: str, timeout: float = 120.0) -> None:
        self.query(f"SYSTEM SYNC REPLICA {table}", timeout=timeout)


def _code_from_text(text: str) -> int:
    # 18.16 answers "Code: 60, e.displayText() = DB::Exception: ..."
    if text.startswith("Code: "):
        digits = text[6:].split(",", 1)[0]
        if digits.isdigit():
            return int(digits)
    return 0
