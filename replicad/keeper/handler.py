"""kazoo's threading handler as the keeper client runs it: the connection thread waits with poll(2)
(:mod:`replicad.keeper.poll`) and hands each answer straight to the asyncio loop, one thread hop less per
request than kazoo's completion thread."""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable
from typing import Any

from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler

from replicad.keeper import held_io
from replicad.keeper.poll import poll_select

log = logging.getLogger("replicad.keeper.client")


class _WakeSocket:
    """The write end of kazoo's wake-up socket pair: each request queued by the loop writes one byte to it.

    ``socket.send`` lets go of the GIL for the system call; the byte wakes kazoo's connection thread, and
    whichever thread takes the GIL meanwhile (that one, a part writer, a merge) keeps the loop waiting for it
    (a cProfile of the inserting daemon's loop: 158 µs per wake-up, 18 % of its time, one per ZooKeeper
    request).  This send keeps the GIL (a non-blocking send of one byte cannot wait); kazoo's thread runs
    once the loop lets go of the GIL anyway, waiting for its next event.  A full buffer, a closed socket
    or no libc: the socket's own send."""

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def send(self, data: bytes) -> int:
        # fileno() is -1 once closed (and no close can run while this holds the GIL)
        if held_io.send(self._sock.fileno(), data) == len(data):
            return len(data)
        return self._sock.send(data)

    def close(self) -> None:
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class RunsAnywhere:
    """Marks a kazoo callback that only hands its work to the asyncio loop (never blocks): kazoo may run it
    on the thread that read the answer or the watch notification instead of queueing it for its completion
    thread (one thread wake-up, and one more thread wanting the GIL, less)."""

    __slots__ = ()

    def __call__(self, *args: Any) -> None:
        raise NotImplementedError


class LoopHandoff(RunsAnywhere):
    """A request's answer callback that only hands the result to the asyncio loop."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[AsyncResult], None]) -> None:
        self.fn = fn

    def __call__(self, result: AsyncResult) -> None:
        self.fn(result)


class _Result(AsyncResult):
    """kazoo's AsyncResult, running :class:`LoopHandoff` callbacks at once on the answering thread: one
    thread wake-up less per request (connection thread → loop, not connection → completion thread → loop)."""

    def _do_callbacks(self) -> None:
        callbacks: list[Any] = self._callbacks
        for callback in callbacks:
            if isinstance(callback, LoopHandoff) or not self._handler.running:
                try:
                    callback(self)
                except Exception:  # never break kazoo's connection thread
                    log.exception("keeper_answer_callback_failed")
            else:
                self._handler.completion_queue.put(functools.partial(callback, self))


class PollHandler(SequentialThreadingHandler):
    """kazoo's threading handler, its connection thread waiting with poll(2) (see replicad.keeper.poll), its
    results handing answers straight to the loop (:class:`_Result`)."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return poll_select(*args, **kwargs)

    def create_socket_pair(self) -> tuple[Any, Any]:
        """kazoo's wake-up pair (a ``socketpair``, as kazoo makes it), write end: :class:`_WakeSocket`."""
        read_sock, write_sock = socket.socketpair()
        return read_sock, _WakeSocket(write_sock)

    def async_result(self) -> AsyncResult:
        return _Result(self)

    def dispatch_callback(self, callback: Any) -> None:
        """A watch notification's callback: one that :class:`RunsAnywhere` runs at once on the reading thread
        (before kazoo reads the answer behind it), any other goes to kazoo's completion thread."""
        fn = callback.func
        if isinstance(fn, RunsAnywhere):
            try:
                fn(*callback.args)
            except Exception:  # never break kazoo's connection thread
                log.exception("keeper_watch_callback_failed")
            return
        super().dispatch_callback(callback)
