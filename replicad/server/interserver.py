"""The interserver HTTP server: ClickHouse's DataPartsExchange endpoint (port 9009).

``GET|POST /?endpoint=DataPartsExchange:<replica_zk_path>&part=<name>&compress=false``
``[&client_protocol_version=N]``

A small HTTP/1.1 server on asyncio streams.  It is not built on a general web framework on purpose:
ClickHouse 18.16's fetcher half-closes its socket right after sending the request, which general-purpose
servers take for a dropped client.  A connection serves further requests (keep-alive) unless the client
asks for ``Connection: close`` (as 18.16 does) or a body was cut short; an idle connection is closed after
``KEEP_ALIVE_TIMEOUT_S`` (longer than the fetchers' own pool timeout, so the client closes first).

Compatible with 18.16 and modern fetchers:

* no ``client_protocol_version`` → protocol 0, no cookie (what 18.16 sends and expects);
  otherwise ``Set-Cookie: server_protocol_version=min(client, SEND_MAX_PROTOCOL_VERSION)``;
* ``compress`` must be present (18.16 answers 500 without it); ``compress=true`` is refused (400): no
  ClickHouse fetcher asks for it;
* Basic auth as 18.16: 401 ``Client requires HTTP Basic authentification, but server doesn't provide it``
  when the client sends credentials we do not expect, ``Server requires …`` /
  ``Incorrect user or password …``;
* too many parallel sends → 429, ``Retry-After: 10``, empty body (``interserver.max_parallel_sends`` in all,
  ``replicated_max_parallel_sends[_for_table]`` as ClickHouse);
* limits a peer that misbehaves meets: ``interserver.max_connections`` open connections (one more is answered
  503 and closed), the request head and body within ``HEAD_TIMEOUT_S``, and every write of an answer taken
  by the peer within ``interserver.send_timeout_s`` (ClickHouse's ``http_send_timeout``): a reader that
  stops reading is cut off, freeing its send slot, its buffer and its reading thread;
* an unknown endpoint or part → 404 with a message (18.16 answers 200 with an empty body, which every fetcher
  treats as a failed fetch anyway); the part name is validated (PartInfo) before anything is looked up;
* a small part (its files add up to at most ``part_transfer.SMALL_PART_BYTES``) is read and checked whole
  in the loop's default executor before anything is answered (once for the replicas fetching it together:
  :mod:`replicad.server.small_bodies`), then sent with ``Content-Length`` in one
  write: a broken part always gets a 500 with the error.  A larger part is streamed chunked, its files read
  while the body goes out: an error after the headers shows up as a truncated body, which fetchers detect.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from replicad.errors import BadPartNameError, CorruptedDataError, UnsupportedPartFormatError
from replicad.logging import get_logger
from replicad.model.part_info import PartInfo
from replicad.server.small_bodies import SmallBodies
from replicad.server.tls import server_context
from replicad.storage import zero_copy_wire
from replicad.storage.checksums import Checksums
from replicad.storage.fresh_files import PartFiles
from replicad.storage.part_transfer import (
    SEND_MAX_PROTOCOL_VERSION,
    is_small_part,
    iter_part_body,
)

log = get_logger(__name__)

ENDPOINT_PREFIX = "DataPartsExchange:"
CANCELLED = "Transferring part to replica was cancelled"  # the error text while sends are blocked
MAX_HEAD = 64 * 1024
MAX_REQUEST_BODY = 1 << 20
HEAD_TIMEOUT_S = 30.0
SEND_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 1024
MAX_PARALLEL_SENDS = 64
KEEP_ALIVE_TIMEOUT_S = 30.0
SEND_BUFFER = 8 << 20  # bytes the transport may hold before drain() waits
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too many concurrent fetches, try again later",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class PartToSend:
    path: Path
    checksums: Checksums
    #: every file of the part held in memory (a part written here lately: replicad.storage.fresh_files)
    files: PartFiles = ()


#: part name -> the part (or None when this replica does not have it)
PartLookup = Callable[[str], PartToSend | None]


@dataclass
class Endpoint:
    lookup: PartLookup
    max_parallel_sends: int = 0  # replicated_max_parallel_sends_for_table (0 = unlimited)
    current_sends: int = 0
    blocked: bool = False  # SYSTEM STOP REPLICATED SENDS / shutting down
    on_broken_part: Callable[[str], None] | None = None
    #: S3 zero-copy: part name -> (unique id, metadata texts) of a committed part on a zero-copy disk
    zero_copy: Callable[[str], Awaitable[tuple[str, dict[str, bytes]] | None]] | None = None


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    query: dict[str, str]
    path: str


class BadRequest(Exception):
    pass


@dataclass(frozen=True)
class Reply:
    status: int
    text: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    reason: str | None = None


async def _aclose(it: AsyncIterator[bytes]) -> None:
    close = getattr(it, "aclose", None)
    if close is not None:
        await close()


def _chunk(data: bytes) -> tuple[bytes, bytes, bytes]:
    """One piece of a chunked body, without copying ``data``."""
    return b"%x\r\n" % len(data), data, b"\r\n"


def keep_alive(request: Request) -> bool:
    """Whether the client lets the connection serve another request after this one."""
    connection = request.headers.get("connection", "").lower()
    if request.version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


async def read_request(reader: asyncio.StreamReader, timeout_s: float = HEAD_TIMEOUT_S,
                       body_timeout_s: float = HEAD_TIMEOUT_S) -> Request:
    """Request line and headers (within ``timeout_s``); a body (Content-Length or chunked) is read and
    discarded (within ``body_timeout_s`` more)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    except asyncio.LimitOverrunError as e:
        raise BadRequest("request head too large") from e
    except asyncio.IncompleteReadError as e:
        raise ConnectionResetError("client closed the connection before sending a request") from e
    return await asyncio.wait_for(_parse_request(head, reader), body_timeout_s)


async def _parse_request(head: bytes, reader: asyncio.StreamReader) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"bad request line {lines[0][:200]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(f"bad header line {line[:200]!r}")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_REQUEST_BODY:
            raise BadRequest("bad Content-Length")
        await reader.readexactly(int(length))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            total += size
            if total > MAX_REQUEST_BODY:
                raise BadRequest("request body too large")
            await reader.readexactly(size + 2)
            if size == 0:
                break
    url = urlsplit(target)
    query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
    return Request(method, target, version, headers, query, url.path or "/")


class InterserverServer:
    """Serves the DataPartsExchange endpoints of all local replicas."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        user: str | None = None,
        password: str | None = None,
        max_parallel_sends: int = MAX_PARALLEL_SENDS,
        tls_files: tuple[Path, Path] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        send_timeout_s: float = SEND_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.tls_files = tls_files  # (certificate chain, key): serve HTTPS
        self.port = port
        self.user = user
        self.password = password
        self.max_parallel_sends = max_parallel_sends
        self.max_connections = max_connections
        self.send_timeout_s = send_timeout_s
        self.refused_connections = 0
        self.send_timeouts = 0
        self.endpoints: dict[str, Endpoint] = {}
        self.total_sends = 0
        self.sent_parts = 0
        self.zero_copy_sends = 0
        self.requests = 0
        #: small parts' bodies, built once for the replicas fetching a new part together
        self.small_bodies = SmallBodies()
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._idle: set[asyncio.Task[None]] = set()  # kept-alive connections waiting for a request
        self._stopping = False  # stop() runs: it cancels the connection handlers still open

    # --------------------------------------------------------------------------------------------- registry

    def register(self, replica_zk_path: str, endpoint: Endpoint) -> None:
        self.endpoints[ENDPOINT_PREFIX + replica_zk_path] = endpoint

    def unregister(self, replica_zk_path: str) -> None:
        self.endpoints.pop(ENDPOINT_PREFIX + replica_zk_path, None)

    # --------------------------------------------------------------------------------------------- lifecycle

    @property
    def scheme(self) -> str:
        """What peers must use, published in ``replicas/<r>/host``."""
        return "https" if self.tls_files is not None else "http"

    async def start(self) -> None:
        self._stopping = False
        context = None
        if self.tls_files is not None:
            context = await asyncio.to_thread(server_context, *self.tls_files)
        self._server = await asyncio.start_server(
            self._on_connection, self.host, self.port, reuse_address=True, limit=MAX_HEAD, ssl=context
        )
        if self.port == 0:
            self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("interserver_listening", host=self.host, port=self.port, scheme=self.scheme,
                 auth=self.user is not None)

    async def stop_listening(self) -> None:
        """Close the listening socket: no new connection; requests on open connections go on."""
        if self._server is not None and self._server.is_serving():
            self._server.close()
            log.info("interserver_listener_closed", port=self.port)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let sends in flight finish for ``grace_s``, then cut them."""
        self._stopping = True
        for ep in self.endpoints.values():
            ep.blocked = True
        await self.stop_listening()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._connections and loop.time() < deadline:
            for t in list(self._idle):
                t.cancel()
            await asyncio.sleep(0.05)
        for t in list(self._connections):
            t.cancel()
        for t in list(self._connections):
            try:
                await t
            except BaseException:  # cancelled connection handlers
                pass
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # ------------------------------------------------------------------------------------------- connections

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._connections) >= self.max_connections:
            self.refused_connections += 1
            log.warning("interserver_connection_refused", connections=len(self._connections),
                        max_connections=self.max_connections)
            try:
                await self._reply(writer, Reply(503, f"Too many connections (max {self.max_connections})\n"))
            except (ConnectionError, OSError, TimeoutError):
                pass
            writer.close()
            return
        if task is not None:
            self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError) as e:
            log.debug("interserver_connection_dropped", error=str(e))
        except asyncio.CancelledError:
            if not self._stopping or task is None:
                raise
            # cut by stop(): end normally.  asyncio's start_server callback (3.11) calls exception() on a
            # cancelled handler, which raises and is logged as "Exception in callback … CancelledError"
            task.uncancel()
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        first = True
        while True:
            if not first:
                if reader.at_eof():
                    return
                if task is not None:
                    self._idle.add(task)
            try:
                request = await read_request(reader, HEAD_TIMEOUT_S if first else KEEP_ALIVE_TIMEOUT_S)
            except BadRequest as e:
                await self._reply(writer, Reply(400, f"{e}\n"))
                return
            except (ConnectionResetError, TimeoutError):
                if first:
                    raise
                return  # the client closed its kept-alive connection, or left it idle
            finally:
                if task is not None:
                    self._idle.discard(task)
            first = False
            if not await self._handle(request, writer):
                return

    async def _handle(self, request: Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True when the connection may serve another one."""
        self.requests += 1
        keep = keep_alive(request)
        reply = self._route(request)
        if isinstance(reply, Reply):
            await self._reply(writer, reply, keep)
            return keep
        endpoint, part_name, part, version = reply
        self.total_sends += 1
        endpoint.current_sends += 1
        try:
            if endpoint.zero_copy is not None and await self._send_zero_copy(request, writer, endpoint,
                                                                             part_name, part, keep):
                return keep
            return await self._send(request, writer, endpoint, part_name, part, version, keep) and keep
        finally:
            self.total_sends -= 1
            endpoint.current_sends -= 1

    async def _reply(self, writer: asyncio.StreamWriter, reply: Reply, keep: bool = False) -> None:
        body = reply.text.encode()
        head = [f"HTTP/1.1 {reply.status} {reply.reason or _REASONS.get(reply.status, 'Error')}"]
        head += [f"{k}: {v}" for k, v in reply.headers]
        head += [
            f"Content-Length: {len(body)}",
            "Content-Type: text/plain; charset=UTF-8",
            "Connection: Keep-Alive" if keep else "Connection: Close",
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await self._drain(writer)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait until the peer takes what is buffered, ``send_timeout_s`` at most (then the connection is
        cut: TimeoutError)."""
        try:
            await asyncio.wait_for(writer.drain(), self.send_timeout_s)
        except TimeoutError:
            self.send_timeouts += 1
            writer.transport.abort()
            raise TimeoutError(f"peer took nothing for {self.send_timeout_s:g} s "
                               "(interserver.send_timeout_s)") from None

    # --------------------------------------------------------------------------------------------- routing

    def _check_auth(self, request: Request) -> Reply | None:
        header = request.headers.get("authorization")
        if self.user is None:
            if header is not None:
                return Reply(
                    401, "Client requires HTTP Basic authentification, but server doesn't provide it\n"
                )
            return None
        if header is None or not header.startswith("Basic "):
            return Reply(401, "Server requires HTTP Basic authentification, but client doesn't provide it\n")
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            user, password = "", ""
        ok_user = hmac.compare_digest(user.encode(), self.user.encode())
        ok_password = hmac.compare_digest(password.encode(), (self.password or "").encode())
        if not (ok_user and ok_password):
            return Reply(401, "Incorrect user or password in HTTP Basic authentification\n")
        return None

    def _route(self, request: Request) -> Reply | tuple[Endpoint, str, PartToSend, int]:
        if request.path == "/ping":
            return Reply(200, "Ok.\n")
        if request.path != "/":
            return Reply(404, f"There is no handle {request.path}\n")
        if request.method not in ("GET", "POST"):
            return Reply(405, f"Method {request.method} is not allowed\n")
        denied = self._check_auth(request)
        if denied is not None:
            return denied
        q = request.query
        endpoint_id = q.get("endpoint")
        if endpoint_id is None:
            return Reply(400, "No 'endpoint' parameter\n")
        if "compress" not in q:
            return Reply(
                500,
                "Poco::Exception. Code: 1000, e.code() = 0, e.displayText() = Not found: compress, "
                "e.what() = Not found\n",
            )
        if q["compress"] not in ("false", "0"):
            return Reply(400, "compress=true is not supported\n")
        endpoint = self.endpoints.get(endpoint_id)
        if endpoint is None:
            return Reply(404, f"No interserver IO endpoint named {endpoint_id}\n")
        part_name = q.get("part", "")
        try:
            PartInfo.parse(part_name)
        except BadPartNameError as e:
            return Reply(400, f"{e}\n")
        version_text = q.get("client_protocol_version")
        if version_text is None:
            version = 0
        elif version_text.isdigit():
            version = min(int(version_text), SEND_MAX_PROTOCOL_VERSION)
        else:
            return Reply(400, f"Bad client_protocol_version {version_text!r}\n")
        if endpoint.blocked:
            return Reply(500, CANCELLED + "\n")
        if (self.max_parallel_sends and self.total_sends >= self.max_parallel_sends) or (
            endpoint.max_parallel_sends and endpoint.current_sends >= endpoint.max_parallel_sends
        ):
            return Reply(429, "", (("Retry-After", "10"),))
        part = endpoint.lookup(part_name)
        if part is None:
            return Reply(404, f"No part {part_name} in table\n")
        return endpoint, part_name, part, version

    # --------------------------------------------------------------------------------------------- sending

    async def _send(
        self,
        request: Request,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        part_name: str,
        part: PartToSend,
        version: int,
        keep: bool = False,
    ) -> bool:
        """Send the part; True when the whole response went out (the connection may be kept)."""
        if is_small_part(part.checksums):
            return await self._send_small(request, writer, endpoint, part_name, part, version, keep)
        body = iter_part_body(part.path, part.checksums, version)
        try:
            try:
                first = await anext(body)
            except (OSError, CorruptedDataError) as e:
                await self._send_failed(writer, endpoint, part_name, e, keep)
                return True
            # drain() returns while a piece is still queued: the socket never waits for the next piece
            writer.transport.set_write_buffer_limits(high=SEND_BUFFER)
            writer.write(_ok_head(request, version, keep, "Transfer-Encoding: chunked"))
            writer.writelines(_chunk(first))
            async for piece in body:
                await self._drain(writer)
                if endpoint.blocked:
                    raise ConnectionAbortedError(CANCELLED)
                writer.writelines(_chunk(piece))
            writer.write(b"0\r\n\r\n")
            await self._drain(writer)
            self.sent_parts += 1
            log.debug("part_sent", part=part_name, version=version)
            return True
        except CorruptedDataError as e:
            # Headers are gone already: all we can do is cut the body short (the connection closes).
            if endpoint.on_broken_part is not None:
                endpoint.on_broken_part(part_name)
            log.warning("part_send_aborted", part=part_name, error=str(e))
        except (OSError, ConnectionError, TimeoutError) as e:
            log.info("part_send_aborted", part=part_name, error=str(e))
        finally:
            await _aclose(body)
        return False

    async def _send_small(
        self,
        request: Request,
        writer: asyncio.StreamWriter,
        endpoint: Endpoint,
        part_name: str,
        part: PartToSend,
        version: int,
        keep: bool,
    ) -> bool:
        """A small part: the whole body is built (and checked) before the head, then one write, one drain."""
        try:
            body = await self.small_bodies.body(part.path, part.checksums, version, part.files)
        except (OSError, CorruptedDataError) as e:
            await self._send_failed(writer, endpoint, part_name, e, keep)
            return True
        if endpoint.blocked:
            await self._reply(writer, Reply(500, CANCELLED + "\n"), keep)
            return True
        head = _ok_head(request, version, keep, f"Content-Length: {len(body)}")
        writer.transport.set_write_buffer_limits(high=SEND_BUFFER)
        try:
            writer.write(head + body)
            await self._drain(writer)
        except (OSError, ConnectionError, TimeoutError) as e:
            log.info("part_send_aborted", part=part_name, error=str(e))
            return False
        self.sent_parts += 1
        log.debug("part_sent", part=part_name, version=version, bytes=len(body))
        return True

    async def _send_zero_copy(
        self, request: Request, writer: asyncio.StreamWriter, endpoint: Endpoint, part_name: str,
        part: PartToSend, keep: bool,
    ) -> bool:
        """Answer with the part's S3 metadata instead of its bytes when the client asked for it and the part
        is a committed zero-copy part here; False: send the data as usual."""
        version = zero_copy_wire.send_version(request.query)
        if version is None or endpoint.zero_copy is None:
            return False
        shared = await endpoint.zero_copy(part_name)
        if shared is None:  # not committed yet (its lock may not exist) or not on a zero-copy disk
            return False
        body = zero_copy_wire.build_body(part.checksums, version, shared[0], shared[1])
        head = _ok_head(request, version, keep, f"Content-Length: {len(body)}")
        head = head[:-2] + f"Set-Cookie: {zero_copy_wire.COOKIE}=s3; Path=/\r\n\r\n".encode("latin-1")
        try:
            writer.write(head + body)
            await self._drain(writer)
        except (OSError, ConnectionError, TimeoutError) as e:
            log.info("part_send_aborted", part=part_name, error=str(e))
        self.sent_parts += 1
        self.zero_copy_sends += 1
        log.debug("part_sent_zero_copy", part=part_name, version=version, bytes=len(body))
        return True

    async def _send_failed(
        self, writer: asyncio.StreamWriter, endpoint: Endpoint, part_name: str, error: Exception, keep: bool
    ) -> None:
        """Nothing was answered yet: a 500 with the error (a damaged part is reported to its replica)."""
        broken = isinstance(error, CorruptedDataError) and not isinstance(error, UnsupportedPartFormatError)
        if broken and endpoint.on_broken_part is not None:
            endpoint.on_broken_part(part_name)
        log.warning("part_send_failed", part=part_name, error=str(error))
        await self._reply(writer, Reply(500, f"Cannot send part {part_name}: {error}\n"), keep)


def _ok_head(request: Request, version: int, keep: bool, framing: str) -> bytes:
    """The 200 head of a part's body; ``framing``: its Content-Length or Transfer-Encoding header."""
    head = [
        "HTTP/1.1 200 OK",
        "Content-Type: application/octet-stream",
        framing,
        "Connection: Keep-Alive" if keep else "Connection: Close",
    ]
    if "client_protocol_version" in request.query:
        head.append(f"Set-Cookie: server_protocol_version={version}; Path=/")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
