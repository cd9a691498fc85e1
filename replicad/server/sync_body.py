"""A request body as a blocking file object for the insert parsers, with the limits a hostile client meets.

The parsers (pyarrow readers, generators) run in worker threads of their own pool (:class:`ParsePool`), never
in the event loop's default executor: a parser waiting for body bytes holds one of *those* threads only, so
commits, sends and other ``to_thread`` work never queue behind idle insert connections.  The pool has a thread
for every insert it admits (``api.max_concurrent_inserts``, as ClickHouse's ``max_concurrent_queries``; one
more is refused with 503, code 202), so an admitted insert never waits for a thread either.

Limits (each a 4xx with ClickHouse's code, nothing written):

* ``limit`` bytes in all (``api.max_body_bytes``, decompressed bytes: 413, code 307);
* ``receive_timeout_s`` without a byte from the client (``api.receive_timeout_s``, ClickHouse's
  ``http_receive_timeout``): 408, code 209, and the worker thread is free again;
* ``max_line_bytes`` for one line of a line-based format (``api.max_line_bytes``): 400, code 117 (a line
  up to twice the limit may pass when it starts at the end of one read); the line buffer grows linearly (a
  bytearray), never by re-copying itself per read.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from replicad.errors import BadInputError, BodyTooLargeError, ReplicadError
from replicad.memory import release_thread_cache, release_unused_memory

SOCKET_TIMEOUT = 209
INCORRECT_DATA = 117
TOO_MANY_SIMULTANEOUS_QUERIES = 202
DEFAULT_RECEIVE_TIMEOUT_S = 30.0
DEFAULT_MAX_LINE_BYTES = 64 << 20
SPOOL_PREFIX = "replicad-insert-"  # the daemon removes the spool files a crash left behind at start-up


class ReceiveTimeoutError(ReplicadError):
    """The client sent nothing for ``api.receive_timeout_s``."""

    code = SOCKET_TIMEOUT
    http_status = 408


class TooManyInsertsError(ReplicadError):
    """More inserts at once than ``api.max_concurrent_inserts``: retry later."""

    code = TOO_MANY_SIMULTANEOUS_QUERIES
    http_status = 503

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=True)


class BodySource(Protocol):
    async def read(self, n: int = -1) -> bytes: ...


class ParsePool:
    """The insert parsers' threads and the count of inserts being parsed."""

    def __init__(self, max_inserts: int) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(max_inserts, thread_name_prefix="insert-parse")
        self.max_inserts = max_inserts
        self.active = 0
        self.peak = 0  # most inserts parsed at once: the pool has started this many threads
        self._releasing: asyncio.Task[None] | None = None

    def enter(self) -> None:
        if self.active >= self.max_inserts:
            raise TooManyInsertsError(f"Too many simultaneous inserts: {self.active}, maximum "
                                      f"{self.max_inserts} (api.max_concurrent_inserts)")
        self.active += 1
        self.peak = max(self.peak, self.active)

    def release_memory_soon(self) -> None:
        """After a big insert: give the memory it used back to the system, in the background (the answer
        does not wait for it).  Arrow's allocator returns only the calling thread's cache, and the blocks
        were allocated by the parser threads: each releases its own, then malloc's arenas are trimmed (a
        15 MB insert left 70 MiB resident otherwise, measured).  One release at a time."""
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.get_running_loop().create_task(self._release())

    async def _release(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.gather(*(loop.run_in_executor(self.executor, release_thread_cache)
                                   for _ in range(max(self.peak, 1))))
            await asyncio.to_thread(release_unused_memory)
        except RuntimeError:  # the pool or the loop's executor was shut down meanwhile
            pass

    def leave(self) -> None:
        self.active -= 1

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


#: a read gathering a block returns what it has when no more data comes for this long
_STALL_S = 0.05


class SyncBody(io.RawIOBase):
    """A blocking file object over an async body, for use from a worker thread.

    ``read`` asks the event loop for the next chunk and waits for it (``receive_timeout_s`` at most);
    ``limit`` bytes at most may be read (BodyTooLargeError after that).  ``prefix`` is served first (bytes
    already read by the caller).
    """

    def __init__(self, source: BodySource, loop: asyncio.AbstractEventLoop, limit: int,
                 prefix: bytes | Sequence[bytes] = b"", chunk: int = 4 << 20, *,
                 receive_timeout_s: float = DEFAULT_RECEIVE_TIMEOUT_S,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, complete: bool = False) -> None:
        super().__init__()
        self._source, self._loop, self._limit, self._chunk = source, loop, limit, chunk
        self._timeout = receive_timeout_s
        self.max_line_bytes = max_line_bytes
        pieces = [prefix] if isinstance(prefix, (bytes, bytearray, memoryview)) else list(prefix)
        #: bytes held before the source's: ``prefix``'s pieces, not copied (a whole body given here is ~0.7 MB
        #: for 10k rows, and this runs on the loop; a piece is handed out as the object itself when it goes
        #: whole), and bytes given back (:meth:`unread`) in front of them
        self._held: collections.deque[bytes | memoryview] = collections.deque(p for p in pieces if len(p))
        #: the next read of :meth:`line_blocks`, asked of the loop while the parser works on the block before
        self._ahead: concurrent.futures.Future[list[bytes]] | None = None
        self.bytes_read = sum(len(p) for p in pieces)
        self._eof = complete  # ``prefix`` is the whole body: never ask the loop for more
        self.error: BaseException | None = None
        if self.bytes_read > limit:
            self.error = BodyTooLargeError(f"Request body is larger than api.max_body_bytes = {limit}")

    def readable(self) -> bool:
        return True

    def _fetch(self, n: int, ahead: bool = False) -> list[bytes]:
        """Up to ``n`` bytes from the loop, in the pieces they arrived in; [] at the end of the body.
        ``ahead``: ask for the next ``n`` at once (:meth:`line_blocks`), and take what such a read brought
        (up to its own ``n``) when there is one."""
        if self.error is not None:
            raise self.error
        if self._eof:
            return []
        fut, self._ahead = self._ahead, None
        if fut is None:
            fut = asyncio.run_coroutine_threadsafe(self._gather(n), self._loop)
        try:
            data = fut.result(self._timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            self.error = ReceiveTimeoutError(
                f"Timeout exceeded while reading from socket: no data for {self._timeout:g} s "
                f"(api.receive_timeout_s) after {self.bytes_read} bytes")
            raise self.error from None
        except BaseException as e:
            self.error = e
            raise
        if not data:
            self._eof = True
        self.bytes_read += sum(len(d) for d in data)
        if self.bytes_read > self._limit:
            self.error = BodyTooLargeError(f"Request body is larger than api.max_body_bytes = {self._limit}")
            raise self.error
        if ahead and data:  # the loop receives the next block while this one is parsed (2 cores)
            self._ahead = asyncio.run_coroutine_threadsafe(self._gather(n), self._loop)
        return data

    def cancel_read_ahead(self) -> None:
        """Stop a read :meth:`line_blocks` asked for ahead (the parse ended: done, failed or abandoned)."""
        fut, self._ahead = self._ahead, None
        if fut is not None:
            fut.cancel()

    async def _gather(self, n: int) -> list[bytes]:
        """Up to ``n`` bytes of the source, fewer only at its end or when it stalls: on the loop, so a read of
        a block is one hand-over between the threads, not one per piece the socket delivered (the HTTP
        reader holds ~128 KiB at a time; under CPU load every hand-over waits for the other thread to be
        scheduled).  A stall returns what has arrived; the stall itself is timed by the caller."""
        data = await self._source.read(n)
        if len(data) >= n or not data:
            return [data] if data else []
        parts = [data]
        got = len(data)
        while got < n:
            try:
                async with asyncio.timeout(_STALL_S):
                    more = await self._source.read(n - got)
            except TimeoutError:
                break
            if not more:
                break
            parts.append(more)
            got += len(more)
        return parts

    def read(self, n: int | None = -1) -> bytes:
        parts = self._read_parts(n)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_parts(self, n: int | None = -1, ahead: bool = False) -> list[bytes]:
        """What :meth:`read` returns, as the pieces it would join (no piece empty; none at the end);
        ``ahead`` (:meth:`line_blocks` only): reads ahead, and may return more than ``n`` bytes; bytes put
        back (a header line's read) are topped up to a whole block (not a block of their own)."""
        parts: list[bytes] = []
        if self._held:
            parts = self._take_held(n)
            size = sum(len(p) for p in parts)
            if not ahead or n is None or n <= size:
                return parts
            n -= size
        if n is None or n < 0:
            while got := self._fetch(self._chunk):
                parts += got
            return parts
        want = max(1, n)
        while want > 0:  # full reads (pyarrow treats every read as one block)
            got = self._fetch(min(want, self._chunk), ahead)
            if not got:
                break
            parts += got
            want -= sum(len(d) for d in got)
        return parts

    def _take_held(self, n: int | None) -> list[bytes]:
        """Up to ``n`` (all: None or < 0) of the bytes held, as pieces (none empty)."""
        out: list[bytes] = []
        want = -1 if n is None or n < 0 else n
        held = self._held
        while held and want != 0:
            piece = held[0]
            if want < 0 or len(piece) <= want:
                held.popleft()
                out.append(piece if isinstance(piece, bytes) else bytes(piece))
                want = want if want < 0 else want - len(piece)
            else:
                out.append(bytes(piece[:want]))
                held[0] = memoryview(piece)[want:]
                want = 0
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def unread(self, data: bytes) -> None:
        if data:
            self._held.appendleft(data)

    def check_line(self, length: int) -> None:
        if length > self.max_line_bytes:
            raise BadInputError(f"Cannot parse input: a line is longer than {self.max_line_bytes} bytes "
                                "(api.max_line_bytes)", code=INCORRECT_DATA)

    def readline_raw(self) -> bytes:
        """One line including its ``\\n`` (or up to EOF)."""
        buf = bytearray()
        while True:
            data = self.read(1 << 16)
            if not data:
                return bytes(buf)
            i = data.find(b"\n")
            if i >= 0:
                buf += data[:i + 1]
                self.unread(data[i + 1:])
                self.check_line(len(buf))
                return bytes(buf)
            buf += data
            self.check_line(len(buf))

    def line_blocks(self, size: int) -> Iterator[bytes]:
        """The rest of the body in pieces of about ``size`` bytes, each ending at a line end.  Reads are at
        most ``max_line_bytes``, so a line longer than that spills into the next read and is refused once
        the carried part exceeds the limit (the line buffer never exceeds the limit plus one read, and one
        read ahead: the next read is asked of the loop as soon as a block is handed out, so receiving the
        body and parsing it overlap; :meth:`cancel_read_ahead` stops it)."""
        size = min(size, self.max_line_bytes)
        carry = bytearray()
        while True:
            parts = self._read_parts(size, ahead=True)
            if not parts:
                if carry:
                    yield bytes(carry)
                return
            k = len(parts) - 1  # the last piece with a line end: the block ends there
            while k >= 0 and (cut := parts[k].rfind(b"\n")) < 0:
                k -= 1
            if k < 0:
                for p in parts:
                    carry += p
                self.check_line(len(carry))
                continue
            last = parts[k]
            if not carry and k == 0 and cut + 1 == len(last):
                block = last
            else:  # the block's pieces joined: one copy of its bytes
                block = b"".join([carry, *parts[:k], memoryview(last)[:cut + 1]])
            carry = bytearray(memoryview(last)[cut + 1:])
            for p in parts[k + 1:]:
                carry += p
            self.check_line(len(carry))
            yield block


@contextlib.contextmanager
def spooled(body: Any, spool_dir: str | None, suffix: str) -> Iterator[str]:
    """``body`` (a blocking file object) read to its end into a temporary file under ``spool_dir``, for the
    formats that need seeks (Parquet, Arrow file); the file's path, removed at exit."""
    fd, path = tempfile.mkstemp(prefix=SPOOL_PREFIX, suffix=suffix, dir=spool_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            while data := body.read(1 << 20):
                f.write(data)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
