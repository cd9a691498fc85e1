"""``ahead``: an iterator's items produced in a helper thread, a bounded number ahead of the consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

_T = TypeVar("_T")
_DONE = object()


def ahead(items: Iterator[_T], depth: int) -> Generator[_T, None, None]:
    """``items``, produced in a helper thread up to ``depth`` items ahead (``depth`` 0: in this thread).

    An exception in the producer is re-raised here; leaving the loop early stops the producer.
    """
    if depth <= 0:
        try:
            yield from items
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        return
    q: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as e:  # handed to the consumer
            put(e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # runs the producer's own clean-up (e.g. its read pool) in this thread

    thread = threading.Thread(target=run, name="merge-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join()
