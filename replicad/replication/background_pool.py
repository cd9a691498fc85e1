"""The threads merges and mutations run in: 18.16's BackgroundProcessingPool (``background_pool_size``).

A merge is one long blocking call (seconds for big parts).  Run through ``asyncio.to_thread`` it held one of
the default executor's ``cpu_count + 4`` threads, the same threads every INSERT needs for its short trips
(writing the part, renaming it): on 2 cores, three merges of 10k-row parts under 16 inserting clients left
three threads to the inserts, whose ``rename`` trip then waited 90 ms (median) in the executor's queue and
the part's hand-back to the loop 57 ms.  ClickHouse keeps merges in a pool of their own; so does this
module.  The pool is process-wide (one per daemon, whatever the tables): the daemon sizes it from
``background_pool_size`` (:func:`configure`) before its tables start; idle threads cost nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["DEFAULT_SIZE", "configure", "pool", "run"]

P = ParamSpec("P")
T = TypeVar("T")

#: background_pool_size's default (ClickHouse 18.16: 16)
DEFAULT_SIZE = 16

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_size = DEFAULT_SIZE


def configure(size: int) -> None:
    """Threads for the pool (``background_pool_size``): takes effect when the pool is made, at its first
    use; a pool already running keeps its size."""
    global _size
    with _lock:
        _size = max(1, int(size))


def pool() -> ThreadPoolExecutor:
    """The daemon's background pool."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_size, thread_name_prefix="background-pool")
        return _pool


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the background pool, as ``asyncio.to_thread`` runs it in the default
    executor (the caller's context variables go with it)."""
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(pool(), call)
