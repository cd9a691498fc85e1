"""kazoo's client and connection as the keeper runs them: each request written to ZooKeeper's socket by the
thread that makes it, answers read with calls that keep the GIL.

kazoo queues a request and wakes its connection thread, which then serializes and writes it; for every
answer that thread polls and reads the socket with four more GIL-releasing system calls.  Timed in an
inserting daemon (perf_counter_ns marks on each hop, 100 small inserts): the block-number lock's multi, sent
from the part writer's thread, left 279 µs after it was queued and took 357 µs more to be written (p50; p90
1.9 and 1.3 ms), because the connection thread had to win the GIL back from the writer at each of those
calls; the commit multi's answer waited 385 µs (p50, p90 2.1 ms) behind the watch notification ZooKeeper
sends first, read the same way.

Here a request made while the session is connected is written at once by its own thread (the xid, the
``_pending`` entry and the bytes under one lock, in the order ZooKeeper will answer), with a non-blocking
send that keeps the GIL; what the socket cannot take now is left to the connection thread (woken as kazoo
wakes it for a queued request), as is every request while kazoo's queue is not empty, while the lock is
busy, and while the session is not connected: the order of requests, the xid sequence and the failure of
unanswered requests on a disconnection stay kazoo's.  Answers are read into a buffer with non-blocking
recvs that keep the GIL (the connection thread's only GIL-releasing wait is its poll), and every complete
packet in the buffer is handled before polling again (a watch notification and the answer after it often
come in one read).
"""

from __future__ import annotations

import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionDropped
from kazoo.handlers.threading import AsyncResult
from kazoo.protocol.connection import CLOSE_RESPONSE, ConnectionHandler
from kazoo.protocol.serialization import int_struct
from kazoo.protocol.states import KeeperState

from replicad.keeper import held_io

#: request types never written by the calling thread: Auth (its own xid), Close (kazoo's stop), and none
_QUEUED_TYPES = frozenset({100, -11, None})
_MAX_XID = 2147483647
_UP = (KeeperState.CONNECTED, KeeperState.CONNECTED_RO)


def frame(request: Any, xid: int) -> bytes:
    """A request's bytes on the wire (as kazoo's ``ConnectionHandler._submit`` writes them)."""
    body: bytes = int_struct.pack(xid) + int_struct.pack(request.type) + request.serialize()
    return int_struct.pack(len(body)) + body


class DirectConnection(ConnectionHandler):
    """kazoo's connection handler, written to by any thread (see the module's docstring)."""

    def __init__(self, client: KazooClient, retry_sleeper: Any, logger: Any = None,
                 sasl_options: Any = None) -> None:
        super().__init__(client, retry_sleeper, logger=logger, sasl_options=sasl_options)
        #: held while a request's xid, _pending entry and bytes are made and written (re-entrant: the
        #: connection thread's send → its write)
        self._send_lock = threading.RLock()
        #: the socket requests may be written to by their own thread (None: through kazoo's queue)
        self._live: Any = None
        #: bytes of requests the socket could not take at once: the connection thread writes them first
        self._out = bytearray()
        #: bytes read and not yet handled
        self._in = bytearray()
        self._receiver = held_io.Receiver()
        self._fast = held_io.AVAILABLE and not client.use_ssl
        #: requests written by their own thread, and those of them the socket took only in part (tests)
        self.sent_now = 0
        self.sent_in_part = 0

    # ------------------------------------------------------------------ the calling thread

    def send_now(self, request: Any, async_object: AsyncResult) -> bool:
        """(any thread) Write ``request`` now; False (nothing done): queue it as kazoo does."""
        if getattr(request, "type", None) in _QUEUED_TYPES or not hasattr(request, "serialize") \
                or not self._send_lock.acquire(blocking=False):  # kazoo's test sentinels have neither
            return False
        try:
            sock = self._live
            if sock is None or self.client._queue:  # not connected, or requests queued before this one
                return False
            self._xid = (self._xid % _MAX_XID) + 1
            data = frame(request, self._xid)
            self.client._pending.append((request, async_object, self._xid))
            sent = 0 if self._out else held_io.send(sock.fileno(), data)
            self.sent_now += 1
            if sent < len(data):  # the rest (or a failure, which the connection thread will raise) to it
                self.sent_in_part += 1
                self._out += data[max(sent, 0):]
                wake = self._write_sock
                if wake is not None:
                    wake.send(b"\0")
            return True
        finally:
            self._send_lock.release()

    # ------------------------------------------------------------------ the connection thread

    def going_down(self) -> None:
        """The session is not connected (kazoo is about to fail the unanswered requests): queue from now."""
        with self._send_lock:
            self._live = None
            self._out.clear()

    def _connect(self, host: str, hostip: str, port: int) -> tuple[float, float]:
        with self._send_lock:
            self._live = None
            self._out.clear()
        self._in.clear()
        timeouts = super()._connect(host, hostip, port)
        if self._fast:
            with self._send_lock:
                self._live = self._socket
        return timeouts

    def _connect_attempt(self, host: str, hostip: str, port: int, retry: Any) -> object:
        try:
            return super()._connect_attempt(host, hostip, port, retry)
        finally:
            self.going_down()

    def _send_request(self, read_timeout: float, connect_timeout: float) -> None:
        with self._send_lock:
            self._flush(connect_timeout)
            super()._send_request(read_timeout, connect_timeout)

    def _write(self, msg: bytes, timeout: float) -> None:
        with self._send_lock:
            self._flush(timeout)
            self._write_now(msg, timeout)

    def _flush(self, timeout: float) -> None:
        if self._out:
            out = bytes(self._out)
            self._out.clear()
            self._write_now(out, timeout)

    def _write_now(self, msg: bytes, timeout: float) -> None:
        sock = self._socket
        sent = held_io.send(sock.fileno(), msg) if self._fast and sock is not None else -1
        if sent < len(msg):
            super()._write(msg[max(sent, 0):], timeout)

    def _read(self, length: int, timeout: float) -> bytes:
        if not self._fast:
            return super()._read(length, timeout)
        buf = self._in
        waited = False
        while len(buf) < length:
            sock = self._socket
            n = self._receiver.recv_into(sock.fileno() if sock is not None else -1, buf)
            if n > 0:
                waited = False
            elif n == 0:
                raise ConnectionDropped("socket connection broken")
            elif waited:  # readable, yet nothing read: the socket's own recv raises the error (or reads)
                buf += super()._read(1, timeout)
                waited = False
            else:  # nothing ready: wait for it
                with self._socket_error_handling():
                    if not self.handler.select([sock], [], [], timeout)[0]:
                        raise self.handler.timeout_exception("socket time-out during read")
                waited = True
        out = bytes(buf[:length])
        del buf[:length]
        return out

    def _read_socket(self, read_timeout: float) -> object:
        while True:
            response = super()._read_socket(read_timeout)
            if response == CLOSE_RESPONSE or not self._packet_ready():
                return response

    def _packet_ready(self) -> bool:
        buf = self._in
        return len(buf) >= 4 and len(buf) >= 4 + int_struct.unpack_from(buf)[0]


class DirectClient(KazooClient):
    """KazooClient whose requests go through :meth:`DirectConnection.send_now` when they can."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        queued = self._connection
        self._connection = DirectConnection(self, self._conn_retry.copy(), logger=self.logger,
                                            sasl_options=queued.sasl_options)

    def _call(self, request: Any, async_object: AsyncResult) -> bool | None:
        conn = self._connection
        if self._state == KeeperState.CONNECTED and isinstance(conn, DirectConnection) \
                and conn.send_now(request, async_object):
            return None
        return super()._call(request, async_object)

    def _session_callback(self, state: str) -> None:
        conn = getattr(self, "_connection", None)
        if isinstance(conn, DirectConnection) and state not in _UP:
            conn.going_down()
        super()._session_callback(state)
