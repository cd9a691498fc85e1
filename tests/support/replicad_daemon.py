"""Real ``python -m replicad run`` daemons for acceptance tests, and a plain HTTP client for their API.

    d = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], env={"REPLICAD_FAULT_INJECTION": "1"})
    r = request(d.url, "/?query=...", body=b"...")     # Reply(status, headers, body); never raises on 4xx/5xx
    r = query(d.url, "INSERT INTO db.t FORMAT TSV", b"1\\ta\\n")
    d.stop()                                             # SIGTERM, the exit code

Built on ``replicad.devtools.daemon.Daemon`` (process spawning, logs, ``wait_ready``).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from replicad.devtools.daemon import Daemon, replica_config
from replicad.devtools.ports import free_port
from replicad.devtools.zookeeper import ZooKeeperServer, find_classpath, find_java


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def exception_code(self) -> int | None:
        code = self.headers.get("X-ClickHouse-Exception-Code")
        return int(code) if code is not None else None


def request(url: str, path: str, body: bytes | None = None, *, method: str | None = None,
            headers: Mapping[str, str] | None = None, timeout: float = 60.0, chunked: bool = False) -> Reply:
    """One HTTP request; ``chunked`` sends the body with Transfer-Encoding: chunked (no Content-Length)."""
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)
    try:
        verb = method or ("GET" if body is None else "POST")
        if chunked and body is not None:
            conn.putrequest(verb, path)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            step = 1 << 16
            try:
                for i in range(0, len(body), step):
                    piece = body[i:i + step]
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early (413) and closed: read its answer
        else:
            conn.request(verb, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        return Reply(resp.status, {k: v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def query_path(sql: str, **params: object) -> str:
    return "/?" + urllib.parse.urlencode({"query": sql, **{k: str(v) for k, v in params.items()}})


def query(url: str, sql: str, body: bytes | None = None, *, post: bool | None = None, timeout: float = 60.0,
          chunked: bool = False, **params: object) -> Reply:
    """``sql`` in the URL; POST when there is a body (or ``post``), GET otherwise."""
    method = "POST" if (post if post is not None else body is not None) else "GET"
    return request(url, query_path(sql, **params), body if body is not None or method == "GET" else b"",
                   method=method, timeout=timeout, chunked=chunked)


def ok(reply: Reply) -> Reply:
    assert reply.status == 200, f"HTTP {reply.status}: {reply.text}"
    return reply


def make_chroot(zookeeper: ZooKeeperServer, name: str) -> str:
    """A fresh, created ZooKeeper path to use as a daemon's chroot."""
    return zookeeper.new_chroot(name)


def daemon_config(base: Path, zookeeper: ZooKeeperServer, chroot: str, name: str,
                  tables: Sequence[str] = (), api: Mapping[str, Any] | None = None,
                  settings: Mapping[str, Any] | None = None,
                  interserver: Mapping[str, Any] | None = None,
                  extra: Mapping[str, Any] | None = None) -> Path:
    cfg = replica_config(name, str(base / name / "data"), zookeeper.hosts + chroot, free_port(), free_port(),
                         tables=list(tables), settings=dict(settings or {}))
    cfg["api"] = {**cfg["api"], **dict(api or {})}
    cfg["interserver"] = {**cfg["interserver"], **dict(interserver or {})}
    cfg.update(dict(extra or {}))  # other top-level keys (clusters, distributed_ddl …)
    path = base / name / "replicad.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_daemon(base: Path, zookeeper: ZooKeeperServer, chroot: str, name: str = "r1", *,
                 tables: Sequence[str] = (), api: Mapping[str, Any] | None = None,
                 settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                 wait_table: str | None = None, timeout: float = 60.0,
                 interserver: Mapping[str, Any] | None = None,
                 extra: Mapping[str, Any] | None = None) -> Daemon:
    path = daemon_config(base, zookeeper, chroot, name, tables, api, settings, interserver, extra)
    d = Daemon(path, cwd=path.parent, log_path=path.parent / "replicad.log", env=dict(env or {}))
    d.start()
    try:
        d.wait_ready(wait_table, timeout=timeout)
    except Exception:
        d.kill()
        raise
    return d


def one_daemon(base: Path, zookeeper: ZooKeeperServer, chroot: str, ddl: str, table: str) -> Iterator[Daemon]:
    """(a fixture's body) one daemon, ``r1``, serving ``ddl``'s ``table``; killed at the end."""
    d = start_daemon(base, zookeeper, chroot, "r1", tables=[ddl], wait_table=table)
    try:
        yield d
    finally:
        d.kill()


def stop_cleanly(d: Daemon) -> None:
    """SIGTERM; the daemon must exit with 0 (else its log tail is printed and the assertion fails)."""
    code = d.stop()
    if code != 0:
        print(f"daemon exit code {code}; log tail:\n{d.log_tail(60)}")
    assert code == 0


def log_events(d: Daemon) -> list[dict[str, Any]]:
    """The daemon's JSON log lines (other lines skipped)."""
    assert d.log_path is not None
    out = []
    for line in d.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def zookeeper_transactions(zookeeper: ZooKeeperServer) -> list[str]:
    """ZooKeeper's transaction log, one line per transaction (``TxnLogToolkit`` dump, oldest first)."""
    java, cp = find_java(), find_classpath()
    assert java is not None and cp is not None
    lines: list[str] = []
    logs = sorted((zookeeper.data_dir / "version-2").glob("log.*"), key=lambda p: int(p.name[4:], 16))
    for log in logs:
        r = subprocess.run([java, "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", cp,
                            "org.apache.zookeeper.server.persistence.TxnLogToolkit", str(log)],
                           capture_output=True, timeout=120)
        lines += [ln for ln in r.stdout.decode("utf-8", "replace").splitlines() if " session 0x" in ln]
    return lines
