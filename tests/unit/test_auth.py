"""API authentication and authorisation (replicad.server.auth), through the real app over a fake catalog.

Adversarial: each test names the attack (no credentials, wrong ones, a readonly user writing, a web page
posting, credentials smuggled in two ways at once) and checks that nothing was done.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from replicad.config import UserConfig
from replicad.server import auth
from replicad.server.api import ApiState
from tests.support.fake_engine import FakeCatalog, FakeTable, serve_fake_api

ROWS = b"2020-01-02\t2020-01-02 03:04:05\t5\tclick\n"
INSERT = "INSERT INTO db.events FORMAT TabSeparated"
ERROR_RE = re.compile(r"^Code: (\d+)\. DB::Exception: (.+)\n$", re.S)


def sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


USERS = [
    {"name": "writer", "password_sha256_hex": sha("w-secret"), "readonly": 0},
    {"name": "reader", "password_sha256_hex": sha("r-secret"), "readonly": 1},
    {"name": "tuner", "password_sha256_hex": sha("t-secret"), "readonly": 2},
]
WRITER = {"X-ClickHouse-User": "writer", "X-ClickHouse-Key": "w-secret"}
READER = {"X-ClickHouse-User": "reader", "X-ClickHouse-Key": "r-secret"}
TUNER = {"X-ClickHouse-User": "tuner", "X-ClickHouse-Key": "t-secret"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


class Api:
    def __init__(self, client: TestClient[Any, Any], state: ApiState, table: FakeTable,
                 catalog: FakeCatalog) -> None:
        self.client, self.state, self.table, self.catalog = client, state, table, catalog

    async def call(self, method: str, path: str = "/", *, data: bytes | None = None,
                   headers: Mapping[str, str] | None = None,
                   **params: str) -> tuple[int, dict[str, str], str]:
        async with self.client.request(method, path, params=params, data=data,
                                       headers=dict(headers or {})) as r:
            return r.status, dict(r.headers), (await r.read()).decode()

    async def post(self, query: str, data: bytes = b"", headers: Mapping[str, str] | None = None,
                   **params: str) -> tuple[int, dict[str, str], str]:
        return await self.call("POST", "/", data=data, headers=headers, query=query, **params)

    async def get(self, query: str, headers: Mapping[str, str] | None = None,
                  **params: str) -> tuple[int, dict[str, str], str]:
        return await self.call("GET", "/", headers=headers, query=query, **params)


def code_of(body: str) -> int:
    m = ERROR_RE.match(body)
    assert m, body
    return int(m.group(1))


async def make_api(tmp_path: Path, users: list[dict[str, Any]]) -> Api:
    return Api(*await serve_fake_api(str(tmp_path), {"users": users}))


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    a = await make_api(tmp_path, USERS)
    try:
        yield a
    finally:
        await a.client.close()


@pytest.fixture
async def open_api(tmp_path: Path) -> AsyncIterator[Api]:
    a = await make_api(tmp_path, [])
    try:
        yield a
    finally:
        await a.client.close()


# ---- who may call --------------------------------------------------------------------------------------


async def test_no_credentials_is_401_with_basic_challenge_and_nothing_runs(api: Api) -> None:
    status, headers, body = await api.post("DROP TABLE db.events")
    assert status == 401 and code_of(body) == auth.REQUIRED_PASSWORD
    assert headers["X-ClickHouse-Exception-Code"] == "194"
    assert headers["WWW-Authenticate"].startswith("Basic ")
    assert api.catalog.tables()  # the table is still there
    status, _, _ = await api.post(INSERT, ROWS)
    assert status == 401 and not api.table.blocks


@pytest.mark.parametrize("headers", [
    {"X-ClickHouse-User": "writer", "X-ClickHouse-Key": "wrong"},
    {"X-ClickHouse-User": "writer"},  # no key: empty password
    {"X-ClickHouse-User": "nobody", "X-ClickHouse-Key": "w-secret"},
    basic("writer", "wrong"),
    basic("writer", "w-secret "),
    {"Authorization": "Basic !!!notbase64"},
    {"Authorization": "Basic " + base64.b64encode(b"writer").decode()},  # no ':'
    {"Authorization": "Bearer w-secret"},
])
async def test_wrong_credentials_are_403_code_516_and_nothing_runs(api: Api, headers: dict[str, str]) -> None:
    status, resp_headers, body = await api.post("DROP TABLE db.events", headers=headers)
    assert status == 403 and code_of(body) == auth.AUTHENTICATION_FAILED, body
    assert resp_headers["X-ClickHouse-Exception-Code"] == "516"
    assert "w-secret" not in body
    assert api.catalog.tables()


async def test_wrong_password_in_url_is_403(api: Api) -> None:
    status, _, body = await api.post(INSERT, ROWS, user="writer", password="nope")
    assert status == 403 and code_of(body) == 516 and not api.table.blocks


async def test_unknown_user_and_wrong_password_answer_alike(api: Api) -> None:
    _, _, a = await api.get("SELECT 1", headers={"X-ClickHouse-User": "nobody", "X-ClickHouse-Key": "x"})
    _, _, b = await api.get("SELECT 1", headers={"X-ClickHouse-User": "writer", "X-ClickHouse-Key": "x"})
    assert a.replace("nobody", "U") == b.replace("writer", "U")


async def test_credentials_in_two_ways_are_refused(api: Api) -> None:
    status, _, body = await api.get("SELECT 1", headers={**basic("writer", "w-secret"), **READER})
    assert status == 403 and code_of(body) == 516 and "more than one way" in body
    status, _, body = await api.get("SELECT 1", headers=READER, user="writer", password="w-secret")
    assert status == 403 and code_of(body) == 516


@pytest.mark.parametrize("how", ["basic", "headers", "url"])
async def test_each_way_of_giving_credentials_works(api: Api, how: str) -> None:
    headers: dict[str, str] = {}
    params: dict[str, str] = {}
    if how == "basic":
        headers = basic("writer", "w-secret")
    elif how == "headers":
        headers = WRITER
    else:
        params = {"user": "writer", "password": "w-secret"}
    status, _, body = await api.post(INSERT, ROWS, headers=headers, **params)
    assert status == 200, body
    assert len(api.table.blocks) == 1
    status, _, body = await api.post("DROP TABLE db.events", headers=headers, **params)
    assert status == 200, body
    assert not api.catalog.tables()


async def test_passwordless_default_user_may_call_without_credentials(tmp_path: Path) -> None:
    a = await make_api(tmp_path, [{"name": "default", "password_sha256_hex": sha(""), "readonly": 1}])
    try:
        assert (await a.get("SELECT count() FROM db.events"))[0] == 200
        status, _, body = await a.post("DROP TABLE db.events")  # but only with the default user's rights
        assert status == 403 and code_of(body) == auth.READONLY
    finally:
        await a.client.close()


async def test_health_checks_are_open_everything_else_is_not(api: Api) -> None:
    assert (await api.call("GET", "/ping"))[0] == 200
    assert (await api.call("GET", "/replicas_status"))[0] == 200
    for path in ("/status", "/metrics", "/tables/db.events/parts", "/staging/status?table=db.events&run=ab",
                 "/no/such/path"):
        status, _, body = await api.call("GET", path)
        assert status == 401, (path, body)
        assert (await api.call("GET", path, headers=READER))[0] in (200, 400, 404), path
    status, _, _ = await api.call("POST", "/staging/commit", data=b"{}")
    assert status == 401


# ---- no users configured: "default" only --------------------------------------------------------------


async def test_without_users_default_may_do_everything(open_api: Api) -> None:
    assert (await open_api.post(INSERT, ROWS))[0] == 200
    assert (await open_api.post(INSERT, ROWS, headers={"X-ClickHouse-User": "default"}))[0] == 200
    assert (await open_api.call("GET", "/status"))[0] == 200
    assert (await open_api.post("DROP TABLE db.events"))[0] == 200


async def test_without_users_other_credentials_are_refused(open_api: Api) -> None:
    status, _, body = await open_api.post(INSERT, ROWS, user="writer", password="w")
    assert status == 403 and code_of(body) == 516 and not open_api.table.blocks
    status, _, _ = await open_api.post(INSERT, ROWS, user="default", password="something")
    assert status == 403


# ---- readonly -----------------------------------------------------------------------------------------


WRITES = [
    "DROP TABLE db.events",
    "CREATE TABLE db.x (x UInt64) ENGINE = ReplicatedMergeTree('/t/x', '{replica}') ORDER BY x",
    "TRUNCATE TABLE db.events",
    "ALTER TABLE db.events DELETE WHERE 1",
    "ALTER TABLE db.events UPDATE kind = 'x' WHERE 1",
    "ALTER TABLE db.events DROP PARTITION 202001",
    "ALTER TABLE db.events DETACH PARTITION 202001",
    "OPTIMIZE TABLE db.events FINAL",
    "SYSTEM SYNC REPLICA db.events",
]


@pytest.mark.parametrize("who", [READER, TUNER], ids=["readonly1", "readonly2"])
@pytest.mark.parametrize("sql", WRITES)
async def test_readonly_users_cannot_write(api: Api, who: dict[str, str], sql: str) -> None:
    status, headers, body = await api.post(sql, headers=who)
    assert status == 403 and code_of(body) == auth.READONLY, body
    assert headers["X-ClickHouse-Exception-Code"] == "164"
    assert "readonly" in body
    assert [str(t.name) for t in api.catalog.tables()] == ["db.events"]
    assert not api.table.statements


@pytest.mark.parametrize("who", [READER, TUNER], ids=["readonly1", "readonly2"])
async def test_readonly_users_cannot_insert_in_any_way(api: Api, who: dict[str, str]) -> None:
    assert (await api.post(INSERT, ROWS, headers=who))[0] == 403
    # the statement in the body instead of the URL
    async with api.client.post("/", data=INSERT.encode() + b"\n" + ROWS, headers=who) as r:
        assert r.status == 403
    async with api.client.post("/", data=b"DROP TABLE db.events", headers=who) as r:
        assert r.status == 403
    assert not api.table.blocks and api.catalog.tables()


@pytest.mark.parametrize("who", [READER, TUNER], ids=["readonly1", "readonly2"])
async def test_readonly_users_may_read(api: Api, who: dict[str, str]) -> None:
    assert (await api.post(INSERT, ROWS, headers=WRITER))[0] == 200
    status, _, body = await api.get("SELECT count() FROM db.events", headers=who)
    assert status == 200 and body.strip() == "1"
    status, _, body = await api.post("SELECT count() FROM db.events", headers=who)
    assert status == 200 and body.strip() == "1"
    assert (await api.call("GET", "/status", headers=who))[0] == 200


@pytest.mark.parametrize("path", ["/staging/commit", "/staging/abort"])
@pytest.mark.parametrize("who", [READER, TUNER], ids=["readonly1", "readonly2"])
async def test_readonly_users_cannot_commit_or_abort_staged_runs(api: Api, path: str,
                                                                 who: dict[str, str]) -> None:
    status, _, body = await api.call("POST", path, data=b'{"table": "db.events"}', headers=who)
    assert status == 403 and code_of(body) == auth.READONLY


async def test_readonly_1_cannot_pass_settings_but_2_can(api: Api) -> None:
    q = "SELECT count() FROM db.events"
    status, _, body = await api.get(q, headers=READER, max_insert_block_size="10")
    assert status == 403 and code_of(body) == auth.READONLY and "max_insert_block_size" in body
    assert (await api.get(q, headers=TUNER, max_insert_block_size="10"))[0] == 200
    # interface parameters are not settings
    assert (await api.get(q, headers=READER, database="db", query_id="x", default_format="CSV"))[0] == 200
    assert (await api.get(q, headers=READER, readonly="1"))[0] == 200


async def test_url_readonly_cannot_be_lowered_but_can_be_raised(api: Api) -> None:
    status, _, body = await api.post("DROP TABLE db.events", headers=TUNER, readonly="0")
    assert status == 403 and code_of(body) == auth.READONLY
    status, _, body = await api.post("DROP TABLE db.events", headers=READER, readonly="2")
    assert status == 403
    # a writer asking for readonly gets it, as in ClickHouse
    status, _, body = await api.post("DROP TABLE db.events", headers=WRITER, readonly="1")
    assert status == 403 and code_of(body) == auth.READONLY
    assert (await api.get("SELECT 1", headers=WRITER, readonly="x"))[0] == 403
    assert api.catalog.tables()


# ---- browsers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://evil.example", "Content-Type": "text/plain"},
    {"Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Content-Type": "multipart/form-data; boundary=x"},
])
async def test_browser_posts_are_refused_even_without_users(open_api: Api, headers: dict[str, str]) -> None:
    status, _, body = await open_api.post("DROP TABLE db.events", headers=headers)
    assert status == 403 and code_of(body) == auth.ACCESS_DENIED, body
    assert open_api.catalog.tables()
    status, _, _ = await open_api.post(INSERT, ROWS, headers=headers)
    assert status == 403 and not open_api.table.blocks


async def test_dns_rebinding_origin_is_refused(open_api: Api) -> None:
    # the page's name resolves to 127.0.0.1: Origin and Host agree, but the host is a name
    port = open_api.client.port
    headers = {"Origin": f"http://rebind.example:{port}", "Host": f"rebind.example:{port}"}
    status, _, _ = await open_api.post("DROP TABLE db.events", headers=headers)
    assert status == 403 and open_api.catalog.tables()


async def test_plain_clients_keep_working(open_api: Api) -> None:
    port = open_api.client.port
    # curl -d / --data-binary sends a form content type and no Origin
    ctype = {"Content-Type": "application/x-www-form-urlencoded"}
    assert (await open_api.post(INSERT, ROWS, headers=ctype))[0] == 200
    assert (await open_api.post(INSERT, ROWS, headers={"Content-Type": "text/plain"}))[0] == 200
    # same origin (an IP address): allowed
    same = {"Origin": f"http://127.0.0.1:{port}", "Host": f"127.0.0.1:{port}"}
    assert (await open_api.post(INSERT, ROWS, headers=same))[0] == 200
    # a browser GET only reads
    assert (await open_api.get("SELECT 1", headers={"Origin": "http://evil.example"}))[0] == 200


# ---- the module's pieces -------------------------------------------------------------------------------


def test_extract_credentials() -> None:
    assert auth.extract_credentials({}, {}) is None
    c = auth.extract_credentials(basic("u", "p:q"), {})
    assert c is not None and (c.user, c.password) == ("u", "p:q")
    c = auth.extract_credentials({"X-ClickHouse-Key": "k"}, {})
    assert c is not None and (c.user, c.password) == ("default", "k")
    c = auth.extract_credentials({}, {"user": "u"})
    assert c is not None and (c.user, c.password) == ("u", "")


def test_authenticator() -> None:
    users = [UserConfig(name="a", password_sha256_hex=sha("pa"), readonly=2)]
    a = auth.Authenticator(users)
    assert a.authenticate(auth.Credentials("a", "pa", "url")) == auth.Access("a", 2)
    with pytest.raises(auth.AuthenticationFailedError):
        a.authenticate(auth.Credentials("a", "pb", "url"))
    with pytest.raises(auth.PasswordRequiredError):
        a.authenticate(None)
    assert auth.Authenticator([]).authenticate(None) == auth.Access("default", 0)


def test_effective_access() -> None:
    w, r1, r2 = auth.Access("w", 0), auth.Access("r", 1), auth.Access("t", 2)
    assert auth.effective_access(w, {"readonly": "2"}, "/") == auth.Access("w", 2)
    assert auth.effective_access(r2, {"readonly": "1"}, "/") == auth.Access("t", 1)
    assert auth.effective_access(r2, {"insert_quorum": "2"}, "/") == r2
    assert auth.effective_access(r1, {"table": "db.t", "run": "ab"}, "/staging/status") == r1
    for who, q in ((r1, {"readonly": "2"}), (r2, {"readonly": "0"}), (r1, {"insert_quorum": "2"})):
        with pytest.raises(auth.ReadonlyAccessError):
            auth.effective_access(who, q, "/")


async def test_reloaded_users_apply_at_once(api: Api) -> None:
    assert (await api.get("SELECT 1", headers=READER))[0] == 200
    cfg = api.state.config
    new_users = (UserConfig(name="reader", password_sha256_hex=sha("new"), readonly=1),)
    api.state.config = cfg.model_copy(update={"api": cfg.api.model_copy(update={"users": new_users})})
    assert (await api.get("SELECT 1", headers=READER))[0] == 403
    assert (await api.get("SELECT 1", headers={**READER, "X-ClickHouse-Key": "new"}))[0] == 200
