"""Authentication with real daemons and a real ZooKeeper: API users and readonly levels, browser requests,
interserver credentials (and TLS) between two replicas, and the refusal to start exposed.

Every refusal is checked for its effect too: the table still exists, no row was written, nothing was sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from replicad.devtools.daemon import Daemon, daemon_env
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import Reply, daemon_config, make_chroot, query_path, request
from tests.support.tls import self_signed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLE = "db.auth_t"
DDL = ("CREATE TABLE db.auth_t (k UInt64, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/{shard}/auth_t', '{replica}') ORDER BY k")
ZK_TABLE = "/clickhouse/tables/01/auth_t"
EX_CONFIG = 78


def sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


USERS = [
    {"name": "writer", "password_sha256_hex": sha("w-secret"), "readonly": 0},
    {"name": "reader", "password_sha256_hex": sha("r-secret"), "readonly": 1},
]
WRITER = {"X-ClickHouse-User": "writer", "X-ClickHouse-Key": "w-secret"}
READER = {"X-ClickHouse-User": "reader", "X-ClickHouse-Key": "r-secret"}
INTERSERVER = {"user": "repl", "password": "peer-secret"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def start(base: Path, zookeeper: ZooKeeperServer, chroot: str, name: str, *, api: Mapping[str, Any],
          interserver: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> Daemon:
    path = daemon_config(base, zookeeper, chroot, name, [DDL], api)
    cfg = yaml.safe_load(path.read_text())
    cfg["interserver"] = {**cfg["interserver"], **dict(interserver or {})}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    d = Daemon(path, cwd=path.parent, log_path=path.parent / "replicad.log", env=dict(env or {}))
    d.start()
    try:
        d.wait_ready(None, timeout=60)  # /ping needs no credentials
        deadline = time.monotonic() + 60
        while sql(d, f"SELECT count() FROM {TABLE}", headers=WRITER).status != 200:
            assert time.monotonic() < deadline, d.log_tail()
            time.sleep(0.2)
    except BaseException:
        d.kill()
        raise
    return d


def sql(d: Daemon, text: str, body: bytes | None = None, *, post: bool | None = None,
        headers: Mapping[str, str] | None = None, **params: object) -> Reply:
    method = "POST" if (post if post is not None else body is not None) else "GET"
    return request(d.url, query_path(text, **params), body if body is not None or method == "GET" else b"",
                   method=method, headers=headers)


def count(d: Daemon) -> int:
    r = sql(d, f"SELECT count() FROM {TABLE}", headers=WRITER)
    assert r.status == 200, r.text
    return int(r.text.strip())


def table_exists(d: Daemon) -> bool:
    return request(d.url, f"/tables/{TABLE}/parts", headers=WRITER).status == 200


def interserver_port(d: Daemon) -> int:
    return int(yaml.safe_load(d.config_path.read_text())["interserver"]["port"])


@pytest.fixture
def users_daemon(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[Daemon]:
    d = start(tmp_path, zookeeper, make_chroot(zookeeper, "auth_users"), "r1", api={"users": USERS})
    try:
        yield d
    finally:
        d.stop()


def test_no_credentials_401_wrong_403_and_nothing_happens(users_daemon: Daemon) -> None:
    d = users_daemon
    r = sql(d, f"DROP TABLE {TABLE}", post=True)
    assert r.status == 401 and r.exception_code == 194, r.text
    assert r.headers["WWW-Authenticate"].startswith("Basic ")
    assert r.text.startswith("Code: 194. DB::Exception: ")
    for headers in ({"X-ClickHouse-User": "writer", "X-ClickHouse-Key": "nope"}, basic("writer", "nope"),
                    basic("nobody", "w-secret")):
        r = sql(d, f"DROP TABLE {TABLE}", post=True, headers=headers)
        assert r.status == 403 and r.exception_code == 516, r.text
    r = sql(d, f"DROP TABLE {TABLE}", post=True, user="writer", password="nope")
    assert r.status == 403 and r.exception_code == 516
    r = sql(d, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n")
    assert r.status == 401
    assert table_exists(d) and count(d) == 0
    # health checks stay open; everything else asks for credentials
    assert request(d.url, "/ping").status == 200
    assert request(d.url, "/replicas_status").status == 200
    for path in ("/status", "/metrics", f"/tables/{TABLE}/parts", f"/tables/{TABLE}/queue"):
        assert request(d.url, path).status == 401, path
        assert request(d.url, path, headers=READER).status == 200, path


def test_readonly_user_cannot_write(users_daemon: Daemon) -> None:
    d = users_daemon
    for statement in (f"DROP TABLE {TABLE}", f"TRUNCATE TABLE {TABLE}", f"ALTER TABLE {TABLE} DELETE WHERE 1",
                      f"OPTIMIZE TABLE {TABLE} FINAL", f"SYSTEM SYNC REPLICA {TABLE}",
                      "CREATE TABLE db.other (x UInt64) ENGINE = "
                      "ReplicatedMergeTree('/clickhouse/tables/01/other', '{replica}') ORDER BY x"):
        r = sql(d, statement, post=True, headers=READER)
        assert r.status == 403 and r.exception_code == 164, (statement, r.text)
        assert "readonly" in r.text
    r = sql(d, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n", headers=READER)
    assert r.status == 403 and r.exception_code == 164
    r = request(d.url, "/", f"INSERT INTO {TABLE} FORMAT TSV\n1\ta\n".encode(), headers=READER)
    assert r.status == 403
    r = request(d.url, "/staging/abort", json.dumps({"table": TABLE, "job_id": "j", "run": "ab"}).encode(),
                headers={**READER, "Content-Type": "application/json"})
    assert r.status == 403 and r.exception_code == 164
    r = sql(d, f"SELECT count() FROM {TABLE}", headers=READER, max_threads=1)
    assert r.status == 403 and r.exception_code == 164  # readonly=1: no settings either
    assert table_exists(d) and count(d) == 0
    assert request(d.url, "/", b"", method="POST").status == 401
    r = sql(d, "CREATE TABLE db.other (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/01/other', "
               "'{replica}') ORDER BY x", post=True, headers=WRITER)
    assert r.status == 200, r.text  # the writer may; the refusals above were the reader's level
    # and the reader may read
    assert sql(d, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n", headers=WRITER).status == 200
    r = sql(d, f"SELECT k, s FROM {TABLE}", headers=READER)
    assert r.status == 200 and r.text == "1\ta\n"


def test_every_way_of_giving_credentials_works(users_daemon: Daemon) -> None:
    d = users_daemon
    insert = f"INSERT INTO {TABLE} FORMAT TSV"
    assert sql(d, insert, b"1\ta\n", headers=basic("writer", "w-secret")).status == 200
    assert sql(d, insert, b"2\tb\n", headers=WRITER).status == 200
    assert sql(d, insert, b"3\tc\n", user="writer", password="w-secret").status == 200
    # curl --data-binary: a form content type, no Origin
    r = sql(d, insert, b"4\td\n", headers={**WRITER, "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 200, r.text
    assert count(d) == 4


def test_browser_post_is_refused(users_daemon: Daemon) -> None:
    d = users_daemon
    # a page with the user's Basic credentials cached by the browser
    for headers in ({"Origin": "http://evil.example"}, {"Origin": "null", "Content-Type": "text/plain"},
                    {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}):
        r = sql(d, f"DROP TABLE {TABLE}", post=True, headers={**basic("writer", "w-secret"), **headers})
        assert r.status == 403 and r.exception_code == 497, r.text
        r = sql(d, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n", headers={**WRITER, **headers})
        assert r.status == 403
    assert table_exists(d) and count(d) == 0


def test_status_command_with_credentials(users_daemon: Daemon) -> None:
    d = users_daemon
    argv = [sys.executable, "-m", "replicad", "status", "--url", d.url]
    r = subprocess.run(argv, env=daemon_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "401" in r.stderr
    r = subprocess.run([*argv, "--user", "reader"], env=daemon_env({"REPLICAD_PASSWORD": "r-secret"}),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "r1" in r.stdout and TABLE in r.stdout


def test_spark_http_client_passes(users_daemon: Daemon) -> None:
    from replicad.spark.http import ReplicadSparkError, auth_headers, query_url
    from replicad.spark.http import request as spark_request

    d = users_daemon
    url = query_url(d.url, f"INSERT INTO {TABLE} FORMAT TSV")
    spark_request(url, b"7\tspark\n", timeout_s=30, retries=0, what="insert",
                  headers=auth_headers("writer", "w-secret"))
    assert count(d) == 1
    with pytest.raises(ReplicadSparkError, match="HTTP 403"):
        spark_request(url, b"8\tspark\n", timeout_s=30, retries=0, what="insert",
                      headers=auth_headers("reader", "r-secret"))
    assert count(d) == 1


def fetch_part(d: Daemon, part: str, headers: Mapping[str, str], *, scheme: str = "http",
               context: ssl.SSLContext | None = None) -> int:
    params = {"endpoint": f"DataPartsExchange:{ZK_TABLE}/replicas/{d.name}", "part": part,
              "compress": "false", "client_protocol_version": "8"}
    url = f"{scheme}://127.0.0.1:{interserver_port(d)}/?" + urllib.parse.urlencode(params)
    req = urllib.request.Request(url, data=b"", method="POST", headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("tls", [False, True, "system"], ids=["plain", "tls", "tls-system-ca"])
def test_interserver_credentials_between_two_replicas(zookeeper: ZooKeeperServer, tmp_path: Path,
                                                      tls: bool | str) -> None:
    """``tls-system-ca``: no tls_ca_file, the peer's certificate is trusted as a system CA (OpenSSL's
    SSL_CERT_FILE); the daemon imports aiohttp with those locations unset (replicad.memory), so the fetch
    works only through the fetcher's own context, made from the system's CAs when first needed."""
    inter: dict[str, Any] = dict(INTERSERVER)
    context = None
    env: dict[str, str] = {}
    if tls:
        cert, key = self_signed(tmp_path)
        inter.update(tls_cert_file=str(cert), tls_key_file=str(key))
        if tls == "system":
            env = {"SSL_CERT_FILE": str(cert), "SSL_CERT_DIR": str(tmp_path / "no-ca-directory")}
        else:
            inter.update(tls_ca_file=str(cert))
        context = ssl.create_default_context(cafile=str(cert))
    chroot = make_chroot(zookeeper, f"auth_inter_{tls}")
    r1 = start(tmp_path, zookeeper, chroot, "r1", api={"users": USERS}, interserver=inter, env=env)
    try:
        r2 = start(tmp_path, zookeeper, chroot, "r2", api={"users": USERS}, interserver=inter, env=env)
        try:
            r = sql(r1, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n2\tb\n", headers=WRITER)
            assert r.status == 200, r.text
            r = sql(r2, f"SYSTEM SYNC REPLICA {TABLE}", post=True, headers=WRITER)
            assert r.status == 200, r.text
            assert count(r2) == 2
            parts = request(r1.url, f"/tables/{TABLE}/parts", headers=WRITER).json()
            name = parts[0]["name"]
            scheme = "https" if tls else "http"
            good = basic(INTERSERVER["user"], INTERSERVER["password"])
            assert fetch_part(r1, name, {}, scheme=scheme, context=context) == 401
            assert fetch_part(r1, name, basic("repl", "guess"), scheme=scheme, context=context) == 401
            assert fetch_part(r1, name, good, scheme=scheme, context=context) == 200
            if tls:  # plain HTTP to the TLS port gets no part
                with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                    fetch_part(r1, name, good, scheme="http")
        finally:
            r2.stop()
    finally:
        r1.stop()


def test_interserver_without_credentials_cannot_fetch_from_protected_peer(zookeeper: ZooKeeperServer,
                                                                          tmp_path: Path) -> None:
    """A replica that does not know the interserver credentials gets no parts (and does not break)."""
    chroot = make_chroot(zookeeper, "auth_inter_mismatch")
    r1 = start(tmp_path, zookeeper, chroot, "r1", api={"users": USERS}, interserver=INTERSERVER)
    try:
        r2 = start(tmp_path, zookeeper, chroot, "r2", api={"users": USERS},
                   interserver={"user": "repl", "password": "wrong"})
        try:
            assert sql(r1, f"INSERT INTO {TABLE} FORMAT TSV", b"1\ta\n", headers=WRITER).status == 200
            time.sleep(3)
            assert count(r2) == 0
            queue = request(r2.url, f"/tables/{TABLE}/queue", headers=WRITER).json()
            assert queue and any("401" in str(e.get("last_exception", "")) for e in queue), queue
        finally:
            r2.stop()
    finally:
        r1.stop()


@pytest.mark.parametrize("sections, expected", [
    ({"api": {"listen_host": "0.0.0.0"}}, ["api.listen_host: 0.0.0.0", "api.users"]),
    ({"interserver": {"listen_host": "0.0.0.0"}}, ["interserver.listen_host: 0.0.0.0"]),
    ({"api": {"listen_host": "0.0.0.0"}, "interserver": {"listen_host": "::", "user": "u"}},
     ["api.listen_host: 0.0.0.0", "interserver.listen_host: ::"]),
])
def test_daemon_refuses_to_start_exposed(tmp_path: Path, sections: dict[str, Any],
                                         expected: list[str]) -> None:
    cfg: dict[str, Any] = {"replica": "r1", "data_path": str(tmp_path / "data"),
                           "zookeeper": {"hosts": "127.0.0.1:1"}}
    cfg.update(sections)
    path = tmp_path / "replicad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "replicad", "run", "--config", str(path)], env=daemon_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == EX_CONFIG, r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_writes_and_reads_with_credentials(users_daemon: Daemon) -> None:
    from tests.support.spark import local_spark

    d = users_daemon
    sessions = local_spark("replicad-auth")
    spark = next(sessions)
    try:
        from pyspark.sql import functions as F

        df = spark.range(0, 1000, 1, 2).select(F.col("id").alias("k"), F.col("id").cast("string").alias("s"))

        def write(**options: str) -> None:
            w = df.write.format("replicad").mode("append").option("url", d.url).option("table", TABLE)
            for k, v in options.items():
                w = w.option(k, v)
            w.save()

        with pytest.raises(Exception, match="401"):
            write()
        with pytest.raises(Exception, match="403"):
            write(user="reader", password="r-secret")
        assert count(d) == 0
        write(user="writer", password="w-secret")  # two-phase: staged inserts, commit, publish
        assert count(d) == 1000
        back = (spark.read.format("replicad").option("url", d.url).option("table", TABLE)
                .option("user", "reader").option("password", "r-secret").load())
        assert back.count() == 1000
    finally:
        sessions.close()
