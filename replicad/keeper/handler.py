"""kazoo's threading handler as the keeper client runs it: the connection thread waits with poll(2)
(:mod:`replicad.keeper.poll`) and hands each answer straight to the asyncio loop, one thread hop less per
request than kazoo's completion thread."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from kazoo.handlers.threading import AsyncResult, SequentialThreadingHandler

from replicad.keeper.poll import poll_select

log = logging.getLogger("replicad.keeper.client")


class LoopHandoff:
    """A request's answer callback that only hands the result to the asyncio loop (never blocks): kazoo may
    run it on the thread that read the answer instead of queueing it for its completion thread."""

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

    def async_result(self) -> AsyncResult:
        return _Result(self)
