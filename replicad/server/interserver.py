"""The interserver HTTP server: ClickHouse's DataPartsExchange endpoint (port 9009).

``GET|POST /?endpoint=DataPartsExchange:<replica_zk_path>&part=<name>&compress=false``
``[&client_protocol_version=N]``

Compatible with 18.16 and modern fetchers:

* no ``client_protocol_version`` → protocol 0, no cookie (what 18.16 sends and expects);
  otherwise ``Set-Cookie: server_protocol_version=min(client, SEND_MAX_PROTOCOL_VERSION)``;
* ``compress`` must be present (18.16 answers 500 without it); ``compress=true`` is refused (400): no
  ClickHouse fetcher asks for it;
* Basic auth as 18.16: 401 ``Client requires HTTP Basic authentification, but server doesn't provide it``
  when the client sends credentials we do not expect, ``Server requires …`` /
  ``Incorrect user or password …``;
* too many parallel sends → 429, ``Retry-After: 10``, empty body;
* an unknown endpoint or part → 404 with a message (18.16 answers 200 with an empty body, which every fetcher
  treats as a failed fetch anyway); the part name is validated (PartInfo) before anything is looked up;
* errors after the headers were sent show up as a truncated body (the fetcher validates hashes and EOF).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from replicad.errors import BadPartNameError, CorruptedDataError
from replicad.logging import get_logger
from replicad.model.checksums import Checksums
from replicad.model.part_info import PartInfo
from replicad.storage.part_transfer import SEND_MAX_PROTOCOL_VERSION, iter_part_body

log = get_logger(__name__)

ENDPOINT_PREFIX = "DataPartsExchange:"


@dataclass(frozen=True)
class PartToSend:
    path: Path
    checksums: Checksums


#: part name -> the part (or None when this replica does not have it)
PartLookup = Callable[[str], PartToSend | None]


@dataclass
class Endpoint:
    lookup: PartLookup
    max_parallel_sends: int = 0  # replicated_max_parallel_sends_for_table (0 = unlimited)
    current_sends: int = 0
    blocked: bool = False  # SYSTEM STOP REPLICATED SENDS / shutting down
    on_broken_part: Callable[[str], None] | None = None


async def _aclose(it: AsyncIterator[bytes]) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


class InterserverServer:
    """One aiohttp server serving the DataPartsExchange endpoints of all local replicas."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        user: str | None = None,
        password: str | None = None,
        max_parallel_sends: int = 0,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.max_parallel_sends = max_parallel_sends
        self.endpoints: dict[str, Endpoint] = {}
        self.total_sends = 0
        self.sent_parts = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    # --------------------------------------------------------------------------------------------- registry

    def register(self, replica_zk_path: str, endpoint: Endpoint) -> None:
        self.endpoints[ENDPOINT_PREFIX + replica_zk_path] = endpoint

    def unregister(self, replica_zk_path: str) -> None:
        self.endpoints.pop(ENDPOINT_PREFIX + replica_zk_path, None)

    # --------------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/", self._handle)
        app.router.add_route("GET", "/ping", self._ping)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await self._site.start()
        if self.port == 0:
            server = self._site._server
            sockets = getattr(server, "sockets", None) or []
            if sockets:
                self.port = int(sockets[0].getsockname()[1])
        log.info("interserver_listening", host=self.host, port=self.port)

    async def stop(self, grace_s: float = 5.0) -> None:
        for ep in self.endpoints.values():
            ep.blocked = True
        deadline = asyncio.get_running_loop().time() + grace_s
        while self.total_sends and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --------------------------------------------------------------------------------------------- handlers

    async def _ping(self, _request: web.Request) -> web.Response:
        return web.Response(text="Ok.\n")

    def _check_auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization")
        if self.user is None:
            if header is not None:
                return web.Response(
                    status=401,
                    text="Client requires HTTP Basic authentification, but server doesn't provide it\n",
                )
            return None
        if header is None or not header.startswith("Basic "):
            return web.Response(
                status=401,
                text="Server requires HTTP Basic authentification, but client doesn't provide it\n",
            )
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, password = "", ""
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), (self.password or "").encode())
        if not (ok_user and ok_password):
            return web.Response(
                status=401, text="Incorrect user or password in HTTP Basic authentification\n"
            )
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        denied = self._check_auth(request)
        if denied is not None:
            return denied
        q = request.query
        endpoint_id = q.get("endpoint")
        if endpoint_id is None:
            return web.Response(status=400, text="No 'endpoint' parameter\n")
        if "compress" not in q:
            return web.Response(
                status=500,
                text="Poco::Exception. Code: 1000, e.code() = 0, e.displayText() = Not found: compress, "
                "e.what() = Not found\n",
            )
        if q.get("compress") not in ("false", "0"):
            return web.Response(status=400, text="compress=true is not supported\n")
        endpoint = self.endpoints.get(endpoint_id)
        if endpoint is None:
            return web.Response(status=404, text=f"No interserver IO endpoint named {endpoint_id}\n")
        part_name = q.get("part", "")
        try:
            PartInfo.parse(part_name)
        except BadPartNameError as e:
            return web.Response(status=400, text=f"{e}\n")
        version_text = q.get("client_protocol_version")
        if version_text is None:
            version = 0
        elif version_text.isdigit():
            version = min(int(version_text), SEND_MAX_PROTOCOL_VERSION)
        else:
            return web.Response(status=400, text=f"Bad client_protocol_version {version_text!r}\n")
        if endpoint.blocked:
            return web.Response(status=500, text="Transferring part to replica was cancelled\n")
        if (self.max_parallel_sends and self.total_sends >= self.max_parallel_sends) or (
            endpoint.max_parallel_sends and endpoint.current_sends >= endpoint.max_parallel_sends
        ):
            return web.Response(
                status=429,
                reason="Too many concurrent fetches, try again later",
                headers={"Retry-After": "10", "Connection": "Close"},
            )
        part = endpoint.lookup(part_name)
        if part is None:
            return web.Response(status=404, text=f"No part {part_name} in table\n")

        self.total_sends += 1
        endpoint.current_sends += 1
        try:
            return await self._send(request, part_name, part, version, endpoint)
        finally:
            self.total_sends -= 1
            endpoint.current_sends -= 1

    async def _send(
        self, request: web.Request, part_name: str, part: PartToSend, version: int, endpoint: Endpoint
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/octet-stream"
        if request.query.get("client_protocol_version") is not None:
            resp.set_cookie("server_protocol_version", str(version))
        body = iter_part_body(part.path, part.checksums, version)
        try:
            first = await anext(body)
        except StopAsyncIteration:  # pragma: no cover - a body always has its file count
            first = b""
        except (OSError, CorruptedDataError) as e:
            await _aclose(body)
            if isinstance(e, CorruptedDataError) and endpoint.on_broken_part is not None:
                endpoint.on_broken_part(part_name)
            log.warning("part_send_failed", part=part_name, error=str(e))
            return web.Response(status=500, text=f"Cannot send part {part_name}: {e}\n")
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            await resp.write(first)
            async for piece in body:
                if endpoint.blocked:
                    raise ConnectionAbortedError("Transferring part to replica was cancelled")
                await resp.write(piece)
            await resp.write_eof()
            self.sent_parts += 1
            log.debug("part_sent", part=part_name, version=version)
        except (OSError, CorruptedDataError, ConnectionError) as e:
            # Headers are gone already: all we can do is cut the body short.
            if isinstance(e, CorruptedDataError) and endpoint.on_broken_part is not None:
                endpoint.on_broken_part(part_name)
            log.warning("part_send_aborted", part=part_name, error=str(e))
            if request.transport is not None:
                request.transport.close()
        finally:
            await _aclose(body)
        return resp
