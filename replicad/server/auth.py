"""Who may call the HTTP API, and what they may do: users, credentials, readonly levels, browser requests.

Users are ``api.users`` (name, SHA-256 of the password, ClickHouse ``readonly`` level).  Without users the
API may only bind a loopback address (config validation) and everyone is ClickHouse's ``default`` user with
an empty password and every right.

Credentials are taken as ClickHouse's HTTP interface takes them, in exactly one of three ways: HTTP Basic
auth, the ``X-ClickHouse-User``/``X-ClickHouse-Key`` headers, or the ``user``/``password`` URL parameters.
None given means user ``default`` with an empty password.

Answers (ClickHouse's codes, in ``Code: N. DB::Exception: …`` and ``X-ClickHouse-Exception-Code``):

* no credentials, and no passwordless ``default`` user → 401, code 194 (REQUIRED_PASSWORD), with
  ``WWW-Authenticate: Basic``;
* unknown user or wrong password (indistinguishable, compared in constant time), or credentials given in
  more than one way → 403, code 516 (AUTHENTICATION_FAILED);
* a readonly user writing (INSERT, DDL, ALTER, TRUNCATE, OPTIMIZE, SYSTEM, ``/staging/commit|abort``), a
  ``readonly=1`` user passing settings in the URL, or a URL ``readonly`` less strict than the user's → 403,
  code 164 (READONLY);
* a request that can only come from a web page (a cross-origin ``Origin``, ``Sec-Fetch-Site`` other than
  same-origin, a ``multipart/form-data`` body) on any method but GET/HEAD/OPTIONS → 403, code 497
  (ACCESS_DENIED): a page open in a browser on the node cannot POST ``DROP TABLE`` to localhost.

``/ping`` and ``/replicas_status`` (health checks, as in ClickHouse) need no credentials; every other path
does.  A ``readonly`` URL parameter stricter than the user's level applies to that request, as in ClickHouse.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from replicad.config import UserConfig
from replicad.errors import ReplicadError
from replicad.logging import get_logger
from replicad.server.routing import InsertRoute, Route, SelectRoute
from replicad.service import StatementKind

log = get_logger(__name__)

REQUIRED_PASSWORD = 194
AUTHENTICATION_FAILED = 516
READONLY = 164
ACCESS_DENIED = 497

#: paths anyone may GET (health checks)
OPEN_PATHS = frozenset({"/ping", "/replicas_status"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: URL parameters of the HTTP interface itself (not settings): a ``readonly=1`` user may pass these
PLAIN_PARAMETERS = frozenset({
    "query", "database", "default_format", "query_id", "user", "password", "quota_key", "session_id",
    "session_timeout", "session_check", "compress", "decompress", "buffer_size", "wait_end_of_query",
})
REALM = 'Basic realm="replicad", charset="UTF-8"'
_DUMMY_HASH = hashlib.sha256(b"replicad: no such user").hexdigest()
_STATEMENT_WORDS = {
    StatementKind.CREATE_TABLE: "CREATE TABLE", StatementKind.DROP_TABLE: "DROP TABLE",
    StatementKind.ALTER_DELETE: "ALTER DELETE", StatementKind.ALTER_UPDATE: "ALTER UPDATE",
    StatementKind.DROP_PARTITION: "ALTER DROP PARTITION",
    StatementKind.DETACH_PARTITION: "ALTER DETACH PARTITION",
    StatementKind.OPTIMIZE: "OPTIMIZE", StatementKind.TRUNCATE: "TRUNCATE",
    StatementKind.SYNC_REPLICA: "SYSTEM SYNC REPLICA",
}


class PasswordRequiredError(ReplicadError):
    code = REQUIRED_PASSWORD
    http_status = 401


class AuthenticationFailedError(ReplicadError):
    code = AUTHENTICATION_FAILED
    http_status = 403


class ReadonlyAccessError(ReplicadError):
    code = READONLY
    http_status = 403


class BrowserRequestError(ReplicadError):
    code = ACCESS_DENIED
    http_status = 403


@dataclass(frozen=True)
class Credentials:
    user: str
    password: str
    source: str  # "basic" / "headers" / "url" (for messages)


@dataclass(frozen=True)
class Access:
    """The authenticated caller of one request: user name and effective readonly level."""

    user: str
    readonly: int = 0


#: the caller of the request being handled (set by the middleware for the handler's task)
CURRENT: contextvars.ContextVar[Access | None] = contextvars.ContextVar("replicad_access", default=None)


def hash_password(password: str) -> str:
    return hashlib.sha256(password.encode("utf-8")).hexdigest()


def extract_credentials(headers: Mapping[str, str], query: Mapping[str, str]) -> Credentials | None:
    """The request's credentials (None: none given).  More than one way at once is refused."""
    found: list[Credentials] = []
    header = headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            raise AuthenticationFailedError(f"Unsupported authorization scheme {scheme[:20]!r}: use Basic")
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise AuthenticationFailedError("Malformed HTTP Basic credentials") from None
        user, sep, password = decoded.partition(":")
        if not sep:
            raise AuthenticationFailedError("Malformed HTTP Basic credentials: no ':' after the user name")
        found.append(Credentials(user or "default", password, "basic"))
    if "X-ClickHouse-User" in headers or "X-ClickHouse-Key" in headers:
        found.append(Credentials(headers.get("X-ClickHouse-User") or "default",
                                 headers.get("X-ClickHouse-Key", ""), "headers"))
    if "user" in query or "password" in query:
        found.append(Credentials(query.get("user") or "default", query.get("password", ""), "url"))
    if len(found) > 1:
        ways = ", ".join(c.source for c in found)
        raise AuthenticationFailedError(f"Credentials given in more than one way ({ways}): use one of "
                                        "HTTP Basic auth, X-ClickHouse-User/X-ClickHouse-Key, user/password")
    return found[0] if found else None


class Authenticator:
    """Checks credentials against ``api.users`` (no users: only ``default`` without a password)."""

    def __init__(self, users: Sequence[UserConfig]) -> None:
        self.users = tuple(users)
        self._by_name = {u.name: u for u in self.users}
        if not self._by_name:
            self._by_name = {"default": UserConfig(name="default", password_sha256_hex=hash_password(""))}

    def authenticate(self, creds: Credentials | None) -> Access:
        if creds is None:
            default = self._by_name.get("default")
            if default is not None and hmac.compare_digest(default.password_sha256_hex, hash_password("")):
                return Access("default", default.readonly)
            raise PasswordRequiredError("Authentication required: send credentials (HTTP Basic auth, the "
                                        "X-ClickHouse-User/X-ClickHouse-Key headers, or user/password in the "
                                        "URL)")
        user = self._by_name.get(creds.user)
        expected = user.password_sha256_hex if user is not None else _DUMMY_HASH
        # the hash is always computed and compared: an unknown user costs the same as a wrong password
        matches = hmac.compare_digest(hash_password(creds.password), expected)
        if user is None or not matches:
            raise AuthenticationFailedError(f"{creds.user[:64]}: authentication failed: the password is "
                                            "wrong or there is no such user")
        return Access(user.name, user.readonly)


def _strictness(level: int) -> int:
    """0 < 2 (reads and settings) < 1 (reads only)."""
    return {0: 0, 2: 1, 1: 2}[level]


def effective_access(access: Access, query: Mapping[str, str], path: str) -> Access:
    """Apply the URL's ``readonly`` and, for ``readonly=1``, refuse settings in the URL."""
    level = access.readonly
    raw = query.get("readonly") if path == "/" else None
    if raw is not None:
        if raw.strip() not in ("0", "1", "2"):
            raise ReadonlyAccessError(f"Setting readonly must be 0, 1 or 2, not {raw[:20]!r}")
        asked = int(raw)
        if _strictness(asked) < _strictness(level):
            raise ReadonlyAccessError(f"{access.user}: cannot lower readonly from {level} to {asked}: "
                                      "the user is in readonly mode")
        level = asked
    if access.readonly == 1 and path == "/":
        for name in query:
            if name in PLAIN_PARAMETERS or name.startswith("param_") or (name == "readonly" and level == 1):
                continue
            raise ReadonlyAccessError(f"{access.user}: cannot change setting {name[:64]} in readonly mode "
                                      "(readonly = 1)")
    return Access(access.user, level)


def check_route(r: Route) -> None:
    """Called by the query handler once the statement is known: readonly callers may only read."""
    access = CURRENT.get()
    if access is None or access.readonly == 0 or isinstance(r, SelectRoute):
        return
    what = "INSERT" if isinstance(r, InsertRoute) else _STATEMENT_WORDS.get(r.kind, r.kind.value)
    raise ReadonlyAccessError(f"{access.user}: cannot execute {what} in readonly mode "
                              f"(readonly = {access.readonly})")


def _literal_or_localhost(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_browser(request: web.Request) -> None:
    """Refuse the state-changing requests only a web page would send (CSRF from a browser on the node).

    Same origin (``Origin`` naming exactly the Host the request went to, and that Host an IP address or
    ``localhost``, so DNS rebinding cannot pass it off) is let through; curl, clickhouse clients and the
    Spark writer send no ``Origin`` at all."""
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("Origin")
    if origin is not None:
        parts = urlsplit(origin.strip())
        scheme = "https" if request.secure else "http"
        same = (parts.scheme == scheme and parts.netloc.lower() == request.host.lower()
                and _literal_or_localhost(parts.hostname or ""))
        if not same:
            raise BrowserRequestError(f"Cross-origin request refused (Origin {origin[:100]!r}): the API "
                                      "does not take requests from web pages")
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() not in ("same-origin", "none"):
        raise BrowserRequestError(f"Cross-site request refused (Sec-Fetch-Site: {site[:40]}): the API does "
                                  "not take requests from web pages")
    if request.content_type == "multipart/form-data":
        raise BrowserRequestError("multipart/form-data bodies are refused (what an HTML form sends)")


def _unauthorized(e: PasswordRequiredError) -> web.Response:
    return web.Response(status=e.http_status, text=f"Code: {e.code}. DB::Exception: {e}\n",
                        headers={"X-ClickHouse-Exception-Code": str(e.code), "WWW-Authenticate": REALM},
                        content_type="text/plain", charset="utf-8")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def middleware(users: Callable[[], Sequence[UserConfig]]) -> Middleware:
    """The aiohttp middleware; ``users()`` is read per request, so a reloaded config applies at once.
    Errors other than 401 are raised as :class:`ReplicadError` for the API's error middleware to render."""
    current: list[Authenticator] = [Authenticator(users())]

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS and request.method in ("GET", "HEAD"):
            return await handler(request)
        check_browser(request)
        configured = users()
        if tuple(configured) != current[0].users:
            current[0] = Authenticator(configured)
        try:
            access = current[0].authenticate(extract_credentials(request.headers, request.query))
        except PasswordRequiredError as e:
            log.info("auth_required", path=request.path, peer=request.remote)
            return _unauthorized(e)
        except AuthenticationFailedError as e:
            log.warning("auth_failed", path=request.path, peer=request.remote, error=str(e))
            raise
        access = effective_access(access, request.query, request.path)
        if access.readonly and request.method not in SAFE_METHODS and request.path != "/":
            # /staging/commit|abort and every other state-changing route (the query route decides per
            # statement, in check_route)
            raise ReadonlyAccessError(f"{access.user}: cannot POST {request.path[:64]} in readonly mode "
                                      f"(readonly = {access.readonly})")
        token = CURRENT.set(access)
        try:
            return await handler(request)
        finally:
            CURRENT.reset(token)

    return authenticate
