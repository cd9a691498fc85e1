"""HTTP content encodings of request and answer bodies, and streaming a query result as the answer.

Request bodies: ``Content-Encoding: gzip | deflate | br | zstd`` are decompressed by aiohttp as the body
is read (in bounded steps, as the reader asks for data); ``lz4`` (the LZ4 *frame* format, one or more
concatenated frames: what clickhouse-connect sends by default, one frame per insert block) is decompressed
here, also in bounded steps (:data:`LZ4_STEP` bytes of output at most per step).  Either way the readers
count decompressed bytes, so ``api.max_body_bytes`` limits what the body inflates to.  Any other encoding
is refused (400, code 89) before anything is read.

Answers: with ``enable_http_compression=1`` and an ``Accept-Encoding`` naming ``lz4``, ``zstd``, ``gzip``
or ``deflate``, a SELECT's answer is compressed with the first of those the client lists (as ClickHouse
does; without the setting the answer is plain, which every client accepts).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import lz4.frame
import zstandard
from aiohttp import web

from replicad.errors import BadInputError, ReplicadError
from replicad.logging import get_logger
from replicad.server.output_formats import render
from replicad.service import QueryResult

log = get_logger(__name__)
UNKNOWN_COMPRESSION_METHOD = 89
#: encodings aiohttp decompresses itself while the body is read
AIOHTTP_DECODED = frozenset({"gzip", "deflate", "br", "zstd"})
#: at most this many decompressed bytes per step
LZ4_STEP = 1 << 20
#: answer chunks larger than this are compressed in a worker thread
THREAD_COMPRESS_BYTES = 256 << 10
ANSWER_ENCODINGS = ("lz4", "zstd", "gzip", "deflate")


class BodySource(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class Lz4Body:
    """An async reader of the decompressed bytes of an LZ4-frame body (concatenated frames allowed)."""

    def __init__(self, source: BodySource, read_size: int = 1 << 16) -> None:
        self._source = source
        self._read_size = read_size
        self._decompressor = lz4.frame.LZ4FrameDecompressor()
        self._pending = b""  # compressed bytes not yet given to the decompressor
        self._out = bytearray()
        self._in_frame = False  # bytes of the current frame were given to the decompressor
        self._eof = False

    def _step(self, data: bytes) -> None:
        try:
            out = self._decompressor.decompress(data, max_length=LZ4_STEP)
        except RuntimeError as e:
            raise BadInputError(f"Cannot decompress the request body (Content-Encoding: lz4): {e}",
                                code=UNKNOWN_COMPRESSION_METHOD) from None
        self._in_frame = True
        self._out += out
        if self._decompressor.eof:
            self._pending = (self._decompressor.unused_data or b"") + self._pending
            self._decompressor = lz4.frame.LZ4FrameDecompressor()
            self._in_frame = False

    async def read(self, n: int = -1) -> bytes:
        while not self._out and not self._eof:
            if self._in_frame and not self._decompressor.needs_input:
                self._step(b"")
                continue
            if self._pending:
                data, self._pending = self._pending, b""
                self._step(data)
                continue
            raw = await self._source.read(self._read_size)
            if not raw:
                self._eof = True
                if self._in_frame:
                    raise BadInputError("Cannot decompress the request body (Content-Encoding: lz4): it "
                                        "ends inside a frame", code=UNKNOWN_COMPRESSION_METHOD)
                break
            self._step(raw)
        size = len(self._out) if n is None or n < 0 else min(n, len(self._out))
        chunk = bytes(self._out[:size])
        del self._out[:size]
        return chunk


_BODY = web.RequestKey("replicad_decoded_body", object)


def request_body(request: web.Request) -> Any:
    """The request body as decompressed bytes (``read(n)``); the same reader on every call."""
    body = request.get(_BODY)
    if body is None:
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding in ("", "identity") or encoding in AIOHTTP_DECODED:
            body = request.content
        elif encoding == "lz4":
            body = Lz4Body(request.content)
        else:
            raise BadInputError(f"Unknown Content-Encoding {encoding[:40]!r} (supported: gzip, deflate, br, "
                                "zstd, lz4)", code=UNKNOWN_COMPRESSION_METHOD)
        request[_BODY] = body
    return body


# ---- compressed answers ----------------------------------------------------------------------------------


def answer_encoding(params: Mapping[str, str], headers: Mapping[str, str]) -> str | None:
    """The answer's encoding, asked for by ``enable_http_compression`` + ``Accept-Encoding``, or None."""
    if params.get("enable_http_compression", "0").strip().lower() not in ("1", "true"):
        return None
    for item in headers.get("Accept-Encoding", "").split(","):
        name, _, q = item.strip().partition(";")
        name = name.strip().lower()
        refused = q.replace(" ", "").lower() in ("q=0", "q=0.0", "q=0.00", "q=0.000")
        if name in ANSWER_ENCODINGS and not refused:
            return name
    return None


def _compressor(encoding: str) -> tuple[Callable[[bytes], bytes], Callable[[], bytes]]:
    if encoding == "lz4":
        c = lz4.frame.LZ4FrameCompressor()
        header = [c.begin()]

        def lz4_chunk(data: bytes) -> bytes:
            out = header.pop() + c.compress(data) if header else c.compress(data)
            return out  # type: ignore[no-any-return]

        return lz4_chunk, lambda: (header.pop() if header else b"") + c.flush()
    if encoding == "zstd":
        z = zstandard.ZstdCompressor().compressobj()
        return z.compress, z.flush
    zo = zlib.compressobj(wbits=31 if encoding == "gzip" else 15)
    return zo.compress, zo.flush


class CompressedResponse(web.StreamResponse):
    """A streamed answer compressed with ``encoding`` (chunks compressed as they are written)."""

    def __init__(self, encoding: str, headers: Mapping[str, str]) -> None:
        super().__init__(headers={**headers, "Content-Encoding": encoding})
        self._compress, self._flush = _compressor(encoding)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        raw = bytes(data)
        out = await asyncio.to_thread(self._compress, raw) if len(raw) > THREAD_COMPRESS_BYTES \
            else self._compress(raw)
        if out:
            await super().write(out)

    async def write_eof(self, data: bytes | bytearray | memoryview = b"") -> None:
        # aiohttp ends every answer with write_eof once more after the handler's own: the compressor is
        # flushed once (a second flush raises "compressor object already finished")
        if self._eof_sent:
            return
        if data:
            await self.write(data)
        tail = self._flush()
        if tail:
            await super().write(tail)
        await super().write_eof()


def stream_response(request: web.Request, headers: Mapping[str, str]) -> web.StreamResponse:
    """A StreamResponse, compressed when the client asked for it (:func:`answer_encoding`)."""
    encoding = answer_encoding(request.query, request.headers)
    if encoding is None:
        return web.StreamResponse(headers=headers)
    return CompressedResponse(encoding, headers)


def error_text(e: ReplicadError) -> str:
    return f"Code: {e.code}. DB::Exception: {e}\n"


async def send_result(request: web.Request, result: QueryResult, fmt: str, headers: Mapping[str, str],
                      tz: str, content_type: str, what: str = "") -> web.StreamResponse:
    """Stream ``result`` in ``fmt`` (compressed when asked); an error before the first byte is raised (the
    caller answers it with its status), one after it is appended to the body as ClickHouse does."""
    chunks = render(result, fmt, tz)
    all_headers = {**headers, "X-ClickHouse-Format": fmt, "Content-Type": content_type}
    head = [c for c in [await anext(chunks, None)] if c is not None]
    plain = answer_encoding(request.query, request.headers) is None
    if plain and head:
        head += [c for c in [await anext(chunks, None)] if c is not None]
    if plain and len(head) < 2:  # the whole answer in one piece (a count(), a few rows): one plain response
        return web.Response(body=head[0] if head else b"", headers=all_headers)
    resp = stream_response(request, all_headers)
    await resp.prepare(request)
    try:
        for chunk in head:
            if chunk:
                await resp.write(chunk)
        async for chunk in chunks:
            await resp.write(chunk)
    except ReplicadError as e:
        log.warning("select_failed_midway", query=what[:200], error=str(e))
        await resp.write(error_text(e).encode())
    await resp.write_eof()
    return resp
