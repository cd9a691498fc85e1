"""The threads merges and mutations run in: 18.16's BackgroundProcessingPool (``background_pool_size``).

A merge is one long blocking call (seconds for big parts).  Run through ``asyncio.to_thread`` it held one of
the default executor's ``cpu_count + 4`` threads, the same threads every INSERT needs for its short trips
(writing the part, renaming it): on 2 cores, three merges of 10k-row parts under 16 inserting clients left
three threads to the inserts, whose ``rename`` trip then waited 90 ms (median) in the executor's queue and
the part's hand-back to the loop 57 ms.  ClickHouse keeps merges in a pool of their own; so does this
module.  The pool is process-wide (one per daemon, whatever the tables): the daemon sizes it from
``background_pool_size`` (:func:`configure`) before its tables start; idle threads cost nothing.

:func:`run_yielding` runs a merge in a twin pool whose threads have a lower scheduling priority (nice
:data:`YIELDING_NICE`, set by each thread on itself: on Linux the nice value is a thread's own), so that on a
busy machine the inserts' and fetches' threads get the CPU first.  On the 2-core bench machine the lag
batch's merges of ~20 small parts took 75-150 ms, and every one of the 5 % slowest small inserts ran
during one (10 % of the others did); with the merging threads at nice 10 or 19 the replication lag p99 fell
from a median 1.38x ClickHouse 18.16's to 1.06x over six alternating pairs of lag-bench runs.  The price is
slower merges under a sustained insert load (more parts at once), so the merge executor uses it only while
the table's partitions are far from the insert delay (``parts_to_delay_insert``).  A thread cannot raise its
priority back without privileges: the two pools never swap threads.  Both together run at most
``background_pool_size`` jobs at once (a job waits in its thread for one of that many slots).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["DEFAULT_SIZE", "YIELDING_NICE", "configure", "pool", "run", "run_yielding", "yielding_pool"]

P = ParamSpec("P")
T = TypeVar("T")

#: background_pool_size's default (ClickHouse 18.16: 16)
DEFAULT_SIZE = 16

#: how much lower (nice) the yielding pool's threads run than the process
YIELDING_NICE = 10

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_yielding: ThreadPoolExecutor | None = None
_slots: threading.Semaphore | None = None
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


def _lower_own_priority() -> None:
    """(a yielding pool thread, once) this thread's nice value raised by :data:`YIELDING_NICE`."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) + YIELDING_NICE)
    except (OSError, AttributeError):  # not permitted, or no such call here: the thread runs as the others
        pass


def yielding_pool() -> ThreadPoolExecutor:
    """The background pool's twin whose threads run at a lower priority (:func:`run_yielding`)."""
    global _yielding
    with _lock:
        if _yielding is None:
            _yielding = ThreadPoolExecutor(_size, thread_name_prefix="background-pool-low",
                                           initializer=_lower_own_priority)
        return _yielding


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the background pool, as ``asyncio.to_thread`` runs it in the default
    executor (the caller's context variables go with it)."""
    return await _run_in(pool(), fn, *args, **kwargs)


async def run_yielding(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """As :func:`run`, in a thread of lower priority (:func:`yielding_pool`)."""
    return await _run_in(yielding_pool(), fn, *args, **kwargs)


def _job_slots() -> threading.Semaphore:
    """The slots the two pools' jobs share (``background_pool_size`` of them, made with the first pool)."""
    global _slots
    with _lock:
        if _slots is None:
            _slots = threading.Semaphore(_size)
        return _slots


def _in_a_slot(slots: threading.Semaphore, call: Callable[[], T]) -> T:
    with slots:
        return call()


async def _run_in(executor: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    ctx = contextvars.copy_context()
    call = functools.partial(_in_a_slot, _job_slots(), functools.partial(ctx.run, fn, *args, **kwargs))
    return await asyncio.get_running_loop().run_in_executor(executor, call)
