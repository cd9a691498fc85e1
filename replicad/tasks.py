"""The background task model: small tasks with one shape, owned by a :class:`Supervisor`.

A :class:`BackgroundTask` implements ``run_once()``, which does one unit of work and returns an
:class:`Outcome` (tests assert it, ``/status`` shows it).  ``run()`` loops over ``run_once()``; between
runs it waits for ``wakeup()`` (a ZooKeeper watch fired, an insert committed …) or for its period.
An exception escaping ``run_once()`` crashes the task; the supervisor logs it, counts it and restarts
the task after an exponential backoff.  Shutdown stops tasks in reverse start order (groups last registered
first, a group's tasks last started first): each task is asked to stop and awaited, a grace period at most
to finish its current unit (then it is cancelled), before the next one is asked (:func:`stop_task`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replicad.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one ``run_once()`` did.

    ``name`` is a snake_case word (``idle``, ``pulled_entries``, ``fetched_part`` …); ``did_work=True``
    asks for another run at once (more work is probably waiting); ``delay_s`` overrides the wait before
    the next run (e.g. a short retry after a retriable error); ``fields`` carries details for /status.
    """

    name: str
    did_work: bool = False
    delay_s: float | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "did_work": self.did_work, **dict(self.fields)}


IDLE = Outcome("idle")

#: How long a task whose work is announced by wake-ups (a ZooKeeper watch, a local event) sleeps when idle
#: before it looks anyway (a safety net, not the way work is found): an idle table costs next to nothing.
IDLE_RECHECK_S = 60.0

#: sleeps of at least COALESCE_MIN_S end on a grid of COALESCE_GRID_S of the loop's clock (up to that much
#: later than asked): the timers of many tables' tasks then fall due together and one wake-up of the process
#: serves them all.  Idle with 500 tables a daemon woke ~280 times a second, ~0.17 ms of CPU each.
COALESCE_MIN_S = 1.0
COALESCE_GRID_S = 0.25


class BackgroundTask:
    """Base class.  Subclasses override :meth:`run_once` (and optionally :meth:`on_stop`)."""

    def __init__(self, name: str, period_s: float = 1.0) -> None:
        self.name = name
        self.period_s = period_s
        self.runs = 0
        self.last_run: float | None = None  # wall-clock time of the last finished run_once
        self.last_outcome: Outcome | None = None
        self._wake = asyncio.Event()
        #: what ``wait`` sleeps on: resolved by a wake-up (True) or by its timer (False)
        self._waiter: asyncio.Future[bool] | None = None
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fault: Exception | None = None

    async def run_once(self) -> Outcome:
        raise NotImplementedError

    async def on_stop(self) -> None:
        """Called once after the loop ended because of a stop request (release resources here)."""

    @property
    def stopping(self) -> bool:
        return self._stopping

    def wakeup(self) -> None:
        """Run again as soon as possible.  Safe from any thread."""
        loop = self._loop
        if loop is not None and not _in_loop(loop):
            loop.call_soon_threadsafe(self._set_wake)
        else:
            self._set_wake()

    def _set_wake(self) -> None:
        self._wake.set()
        _resolve(self._waiter, True)

    def request_stop(self) -> None:
        self._stopping = True
        self.wakeup()

    def inject_fault(self, error: Exception) -> None:
        """Make the task crash with ``error`` before its next unit of work (fault injection for tests:
        the supervisor counts the crash and restarts the task as for any other).  Safe from any thread."""
        self._fault = error
        self.wakeup()

    def reset(self) -> None:
        """Make a stopped task runnable again (the supervisor restarts tasks with it)."""
        self._stopping = False

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            while not self._stopping:
                self._wake.clear()  # before the run: a wakeup during run_once is not lost
                if self._fault is not None:
                    fault, self._fault = self._fault, None
                    raise fault
                outcome = await self.run_once()
                self.runs += 1
                self.last_run = time.time()
                self.last_outcome = outcome
                if self._stopping:
                    break
                if outcome.did_work and outcome.delay_s is None:
                    await asyncio.sleep(0)  # let others run, then continue at once
                    continue
                await self.wait(self.period_s if outcome.delay_s is None else outcome.delay_s)
        finally:
            if self._stopping:
                await self.on_stop()

    async def wait(self, seconds: float) -> bool:
        """Sleep until woken up or ``seconds`` passed.  Returns True when woken.

        One future and one timer handle per sleep (``asyncio.wait_for`` would add a task and more
        callbacks): hundreds of tables' tasks sleep and wake here."""
        if self._wake.is_set():
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_at(wake_time(loop.time(), seconds), _resolve, waiter, False)
        try:
            return await waiter
        finally:
            timer.cancel()
            if self._waiter is waiter:
                self._waiter = None


class FunctionTask(BackgroundTask):
    """A task whose unit of work is a coroutine function returning an :class:`Outcome` (or None = idle)."""

    def __init__(self, name: str, fn: Callable[[], Awaitable[Outcome | None]], period_s: float = 1.0) -> None:
        super().__init__(name, period_s)
        self._fn = fn

    async def run_once(self) -> Outcome:
        outcome = await self._fn()
        return IDLE if outcome is None else outcome


CANCEL_WAIT_S = 1.0  # how long a task cancelled at stop gets to unwind before stop moves on


async def stop_task(task: BackgroundTask, runner: asyncio.Task[Any] | None, timeout_s: float) -> None:
    """Ask ``task`` to stop and wait up to ``timeout_s`` for its ``runner`` to end; cancel it after that.

    Returns once the runner ended (or, cancelled, did not unwind within :data:`CANCEL_WAIT_S`).  A runner that
    ended with an error is logged here (nothing else would retrieve it).  The caller's own cancellation is not
    swallowed."""
    task.request_stop()
    if runner is None:
        return
    if not runner.done():
        await asyncio.wait([runner], timeout=timeout_s)
    if not runner.done():
        log.warning("task_cancelled_at_stop", task=task.name, timeout_s=timeout_s)
        runner.cancel()
        await asyncio.wait([runner], timeout=CANCEL_WAIT_S)
        if not runner.done():
            log.error("task_ignored_cancel_at_stop", task=task.name)
            return
    if not runner.cancelled() and runner.exception() is not None:
        log.warning("task_stopped_with_error", task=task.name, error=repr(runner.exception()))


async def stop_in_reverse(runners: Iterable[tuple[BackgroundTask, asyncio.Task[Any] | None]],
                          timeout_s: float) -> None:
    """:func:`stop_task` for each (task, runner), last one first: a task is stopped only once every task
    started after it has stopped."""
    for task, runner in reversed(list(runners)):
        await stop_task(task, runner, timeout_s)


def wake_time(now: float, seconds: float) -> float:
    """When a sleep of ``seconds`` from ``now`` (the loop's clock) ends: exactly ``now + seconds`` for a sleep
    under :data:`COALESCE_MIN_S`, else the first multiple of :data:`COALESCE_GRID_S` at or after that."""
    due = now + max(seconds, 0.0)
    if seconds < COALESCE_MIN_S:
        return due
    return math.ceil(due / COALESCE_GRID_S) * COALESCE_GRID_S


def _resolve(waiter: asyncio.Future[bool] | None, woken: bool) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(woken)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class TaskState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    BACKOFF = "backoff"  # crashed, waiting to restart
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class TaskHealth:
    name: str
    group: str
    state: TaskState
    restarts: int
    last_error: str | None
    last_error_time: float | None
    last_run: float | None
    last_outcome: Outcome | None
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "state": self.state.value,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "last_error_time": self.last_error_time,
            "last_run": self.last_run,
            "last_outcome": self.last_outcome.to_dict() if self.last_outcome else None,
            "runs": self.runs,
        }


@dataclass
class _Entry:
    task: BackgroundTask
    group: str
    state: TaskState = TaskState.PENDING
    restarts: int = 0
    last_error: str | None = None
    last_error_time: float | None = None
    runner: asyncio.Task[None] | None = None
    stop_requested: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class Supervisor:
    """Owns background tasks: starts them, restarts crashed ones with backoff, stops them in order."""

    def __init__(
        self,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        healthy_after_s: float = 60.0,
    ) -> None:
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.healthy_after_s = healthy_after_s
        self._entries: dict[str, _Entry] = {}
        self._started = False

    def add(self, task: BackgroundTask, group: str = "default") -> None:
        """Register a task (started at once if the supervisor runs).  Names are unique."""
        if task.name in self._entries:
            raise ValueError(f"a task named {task.name!r} is already supervised")
        entry = _Entry(task, group)
        self._entries[task.name] = entry
        if self._started:
            self._launch(entry)

    def get(self, name: str) -> BackgroundTask:
        return self._entries[name].task

    @property
    def tasks(self) -> list[BackgroundTask]:
        return [e.task for e in self._entries.values()]

    def start(self) -> None:
        self._started = True
        for entry in self._entries.values():
            if entry.runner is None:
                self._launch(entry)

    def _launch(self, entry: _Entry) -> None:
        entry.stop_requested = False
        entry.task.reset()
        entry.runner = asyncio.get_running_loop().create_task(
            self._supervise(entry), name=f"task:{entry.task.name}")

    async def _supervise(self, entry: _Entry) -> None:
        task = entry.task
        backoff = self.backoff_initial_s
        while not entry.stop_requested:
            entry.state = TaskState.RUNNING
            started = time.monotonic()
            try:
                await task.run()
                break  # a normal return: the task stopped (or was a one-shot)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if time.monotonic() - started >= self.healthy_after_s:
                    backoff = self.backoff_initial_s
                entry.restarts += 1
                entry.last_error = f"{type(e).__name__}: {e}"
                entry.last_error_time = time.time()
                entry.state = TaskState.BACKOFF
                log.error("task_crashed", task=task.name, error=entry.last_error, restarts=entry.restarts,
                          retry_in_s=round(backoff, 3), exc_info=True)
                entry.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.wake.wait(), timeout=backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
                if not entry.stop_requested:
                    task.reset()
                    log.info("task_restarting", task=task.name, restarts=entry.restarts)
        entry.state = TaskState.STOPPED

    def health(self) -> dict[str, TaskHealth]:
        return {
            name: TaskHealth(name, e.group, e.state, e.restarts, e.last_error, e.last_error_time,
                             e.task.last_run, e.task.last_outcome, e.task.runs)
            for name, e in self._entries.items()
        }

    def groups(self) -> list[str]:
        """Group names in registration order."""
        return list(dict.fromkeys(e.group for e in self._entries.values()))

    async def stop_group(self, group: str, timeout_s: float = 10.0, *, forget: bool = True) -> None:
        """Stop the group's tasks, last started first, each within ``timeout_s`` (:func:`stop_task`); with
        ``forget`` (the default: a dropped or detached table's tasks) they are also unregistered, so they
        leave ``/status`` and their names can be used again."""
        entries = [e for e in self._entries.values() if e.group == group]
        await self._stop(entries, timeout_s)
        if forget:
            for e in entries:
                if self._entries.get(e.task.name) is e:
                    del self._entries[e.task.name]

    async def stop(self, order: Iterable[str] | None = None, timeout_s: float = 10.0) -> None:
        """Stop every task: the named groups first (in that order), then the rest in reverse start order (the
        group registered last first; in each group the task started last first)."""
        done: set[str] = set()
        for group in order or ():
            await self.stop_group(group, timeout_s, forget=False)
            done.add(group)
        for group in reversed(self.groups()):
            if group not in done:
                await self.stop_group(group, timeout_s, forget=False)
        self._started = False

    async def _stop(self, entries: list[_Entry], timeout_s: float) -> None:
        for e in reversed(entries):  # registration order is start order
            e.stop_requested = True
            e.wake.set()  # a task waiting out its backoff ends at once
            if e.runner is not None and not e.runner.done():
                e.state = TaskState.STOPPING
            await stop_task(e.task, e.runner, timeout_s)
            e.state = TaskState.STOPPED
            e.runner = None
