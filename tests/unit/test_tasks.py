"""The background task model: run_once/outcome, wakeup, crash → backoff → restart, ordered stop."""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad import tasks
from replicad.tasks import IDLE, BackgroundTask, FunctionTask, Outcome, Supervisor, TaskState, stop_in_reverse


class Counter(BackgroundTask):
    def __init__(self, name: str = "counter", period_s: float = 60.0, work: int = 0) -> None:
        super().__init__(name, period_s)
        self.calls = 0
        self.work = work  # this many runs report did_work (run again at once)
        self.stopped = False

    async def run_once(self) -> Outcome:
        self.calls += 1
        if self.calls <= self.work:
            return Outcome("did_one", did_work=True, fields={"n": self.calls})
        return IDLE

    async def on_stop(self) -> None:
        self.stopped = True


async def until(cond: object, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


async def test_run_once_outcome_is_recorded() -> None:
    t = Counter()
    assert await t.run_once() == IDLE
    assert t.last_outcome is None  # only run() records
    sup = Supervisor()
    sup.add(t)
    sup.start()
    await until(lambda: t.runs == 1)
    h = sup.health()["counter"]
    assert h.state is TaskState.RUNNING and h.last_outcome == IDLE and h.last_run is not None
    assert h.to_dict()["last_outcome"] == {"name": "idle", "did_work": False}
    await sup.stop()
    assert t.stopped and sup.health()["counter"].state is TaskState.STOPPED


async def test_did_work_runs_again_at_once_then_waits_for_period() -> None:
    t = Counter(work=5, period_s=60)
    sup = Supervisor()
    sup.add(t)
    sup.start()
    await until(lambda: t.calls == 6)
    await asyncio.sleep(0.05)
    assert t.calls == 6  # now idle: waits for the 60 s period
    await sup.stop()


async def test_wakeup_triggers_a_run_also_from_another_thread() -> None:
    t = Counter(period_s=60)
    sup = Supervisor()
    sup.add(t)
    sup.start()
    await until(lambda: t.calls == 1)
    t.wakeup()
    await until(lambda: t.calls == 2)
    th = threading.Thread(target=t.wakeup)
    th.start()
    th.join()
    await until(lambda: t.calls == 3)
    await sup.stop()


async def test_wakeup_during_run_once_is_not_lost() -> None:
    gate = asyncio.Event()
    runs: list[int] = []

    async def fn() -> Outcome:
        runs.append(1)
        if len(runs) == 1:
            await gate.wait()
        return IDLE

    t = FunctionTask("f", fn, period_s=60)
    sup = Supervisor()
    sup.add(t)
    sup.start()
    await until(lambda: len(runs) == 1)
    t.wakeup()  # arrives while the first run is still busy
    gate.set()
    await until(lambda: len(runs) == 2)
    await sup.stop()


async def test_delay_overrides_period() -> None:
    calls = []

    async def fn() -> Outcome:
        calls.append(1)
        return Outcome("retry_soon", delay_s=0.01)

    sup = Supervisor()
    sup.add(FunctionTask("f", fn, period_s=60))
    sup.start()
    await until(lambda: len(calls) >= 3)
    await sup.stop()


async def test_crash_is_counted_and_restarted_with_backoff() -> None:
    calls = []

    async def flaky() -> Outcome | None:
        calls.append(asyncio.get_running_loop().time())
        if len(calls) <= 3:
            raise RuntimeError(f"boom {len(calls)}")
        return None

    sup = Supervisor(backoff_initial_s=0.02, backoff_max_s=0.05)
    t = FunctionTask("flaky", flaky, period_s=60)
    sup.add(t)
    sup.start()
    await until(lambda: len(calls) == 4)
    h = sup.health()["flaky"]
    assert h.restarts == 3
    assert h.last_error == "RuntimeError: boom 3" and h.last_error_time is not None
    await until(lambda: sup.health()["flaky"].state is TaskState.RUNNING)
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.015 and gaps[1] >= 0.035 and gaps[2] >= 0.045  # 0.02, 0.04, capped at 0.05
    assert t.last_outcome == IDLE
    await sup.stop()


async def test_stop_during_backoff_is_prompt() -> None:
    async def broken() -> Outcome:
        raise ValueError("always")

    sup = Supervisor(backoff_initial_s=30)
    sup.add(FunctionTask("broken", broken))
    sup.start()
    await until(lambda: sup.health()["broken"].state is TaskState.BACKOFF)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sup.stop(timeout_s=5)
    assert loop.time() - started < 1
    assert sup.health()["broken"].state is TaskState.STOPPED


async def test_stuck_task_is_cancelled_after_the_grace_period() -> None:
    cancelled = asyncio.Event()

    async def stuck() -> Outcome:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return IDLE

    sup = Supervisor()
    sup.add(FunctionTask("stuck", stuck))
    sup.start()
    await asyncio.sleep(0.01)
    await sup.stop(timeout_s=0.05)
    assert cancelled.is_set()
    assert sup.health()["stuck"].state is TaskState.STOPPED


async def test_ordered_stop_by_group() -> None:
    order: list[str] = []

    class Named(Counter):
        async def on_stop(self) -> None:
            order.append(self.name)

    sup = Supervisor()
    for name, group in (("log_puller", "pull"), ("fetcher", "fetches"), ("merger", "merges"),
                        ("cleanup", "cleanup")):
        sup.add(Named(name), group=group)
    sup.start()
    await asyncio.sleep(0.01)
    await sup.stop(order=["fetches", "merges"])
    # named groups first, in that order; then the rest, last registered first
    assert order == ["fetcher", "merger", "cleanup", "log_puller"]


async def test_tasks_added_after_start_run_and_names_are_unique() -> None:
    sup = Supervisor()
    sup.start()
    t = Counter("late")
    sup.add(t)
    await until(lambda: t.calls == 1)
    with pytest.raises(ValueError):
        sup.add(Counter("late"))
    assert sup.get("late") is t and sup.tasks == [t] and sup.groups() == ["default"]
    await sup.stop()


async def test_one_shot_task_ends_stopped() -> None:
    class OneShot(BackgroundTask):
        async def run_once(self) -> Outcome:
            return IDLE

        async def run(self) -> None:  # a task may also finish by itself
            self.last_outcome = await self.run_once()

    sup = Supervisor()
    sup.add(OneShot("once"))
    sup.start()
    await until(lambda: sup.health()["once"].state is TaskState.STOPPED)
    assert sup.health()["once"].restarts == 0
    await sup.stop()


async def test_injected_fault_crashes_an_idle_task_which_is_restarted() -> None:
    sup = Supervisor(backoff_initial_s=0.02)
    t = Counter(period_s=60)  # idle: waits a minute between runs
    sup.add(t)
    sup.start()
    await until(lambda: t.calls == 1)
    t.inject_fault(RuntimeError("injected"))  # wakes the task; it raises before its next run_once
    await until(lambda: sup.health()["counter"].restarts == 1)
    assert sup.health()["counter"].last_error == "RuntimeError: injected"
    await until(lambda: t.calls == 2 and sup.health()["counter"].state is TaskState.RUNNING)
    await sup.stop()
    assert t.stopped


async def test_stop_group_forgets_the_group_but_stop_keeps_the_record() -> None:
    sup = Supervisor()
    table, other = Counter("table:queue"), Counter("other")
    sup.add(table, group="table:db.t")
    sup.add(other)
    sup.start()
    await until(lambda: table.calls == 1 and other.calls == 1)
    await sup.stop_group("table:db.t")  # a dropped table: its tasks leave /status, the name is free again
    assert table.stopped and list(sup.health()) == ["other"]
    again = Counter("table:queue")
    sup.add(again, group="table:db.t")
    await until(lambda: again.calls == 1)
    await sup.stop()  # the daemon's shutdown: every task stays listed, stopped
    assert {n: h.state for n, h in sup.health().items()} == {"other": TaskState.STOPPED,
                                                               "table:queue": TaskState.STOPPED}


class Recorded(BackgroundTask):
    """Records when it is asked to stop and when its last unit (the ``finally`` of run) ended."""

    def __init__(self, name: str, events: list[str], unit_s: float = 0.02, stuck: bool = False) -> None:
        super().__init__(name, period_s=60)
        self.events, self.unit_s, self.stuck = events, unit_s, stuck

    async def run_once(self) -> Outcome:
        return IDLE

    def request_stop(self) -> None:
        self.events.append(f"ask {self.name}")
        super().request_stop()

    async def on_stop(self) -> None:
        try:
            await asyncio.sleep(3600 if self.stuck else self.unit_s)  # the task's last unit takes a while
        finally:
            self.events.append(f"stopped {self.name}")


async def test_a_group_stops_in_reverse_start_order_each_task_awaited_before_the_next() -> None:
    events: list[str] = []
    sup = Supervisor()
    for name in ("queue_updating", "queue_executing", "cleanup", "staging"):
        sup.add(Recorded(name, events), group="table:db.t")
    sup.add(Recorded("other", events), group="other")
    sup.start()
    await until(lambda: all(t.runs == 1 for t in sup.tasks))
    await sup.stop_group("table:db.t")
    # asked all at once, the group would show four asks first and the stops in any order
    assert events == ["ask staging", "stopped staging", "ask cleanup", "stopped cleanup",
                      "ask queue_executing", "stopped queue_executing", "ask queue_updating",
                      "stopped queue_updating"]
    assert list(sup.health()) == ["other"]
    await sup.stop()


async def test_every_group_stops_last_registered_first() -> None:
    events: list[str] = []
    sup = Supervisor()
    sup.add(Recorded("a1", events, unit_s=0), group="a")
    sup.add(Recorded("b1", events, unit_s=0), group="b")
    sup.add(Recorded("b2", events, unit_s=0), group="b")
    sup.start()
    sup.add(Recorded("c1", events, unit_s=0), group="c")  # e.g. a table created while the daemon runs
    await until(lambda: all(t.runs == 1 for t in sup.tasks))
    await sup.stop()
    assert [e.removeprefix("stopped ") for e in events if e.startswith("stopped")] == ["c1", "b2", "b1", "a1"]


async def test_a_stuck_task_is_cancelled_after_its_grace_and_the_earlier_ones_still_stop() -> None:
    events: list[str] = []
    sup = Supervisor()
    for name, stuck in (("first", False), ("stuck", True), ("last", False)):
        sup.add(Recorded(name, events, unit_s=0, stuck=stuck), group="g")
    sup.start()
    await until(lambda: all(t.runs == 1 for t in sup.tasks))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sup.stop(timeout_s=0.1)
    assert loop.time() - started < 1
    assert events == ["ask last", "stopped last", "ask stuck", "stopped stuck", "ask first", "stopped first"]
    assert {h.state for h in sup.health().values()} == {TaskState.STOPPED}


async def test_stop_in_reverse_without_a_supervisor() -> None:
    """TableReplica's own runners (no supervisor): the same order, and a crashed runner does not stop it."""
    events: list[str] = []
    tasks = [Recorded(n, events) for n in ("a", "b", "c")]
    runners = [asyncio.get_running_loop().create_task(t.run()) for t in tasks]

    async def crash() -> None:
        raise RuntimeError("crashed earlier")

    crashed = asyncio.get_running_loop().create_task(crash())
    await until(lambda: all(t.runs == 1 for t in tasks) and crashed.done())
    await stop_in_reverse([(tasks[0], runners[0]), (Recorded("x", events), crashed),
                           (tasks[1], runners[1]), (tasks[2], runners[2])], timeout_s=5)
    assert events == ["ask c", "stopped c", "ask b", "stopped b", "ask x", "ask a", "stopped a"]
    assert all(r.done() for r in runners)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e6, allow_nan=False), st.floats(0, 3600, allow_nan=False))
def test_a_sleep_ends_no_earlier_than_asked_and_long_ones_on_the_grid(now: float, seconds: float) -> None:
    when = tasks.wake_time(now, seconds)
    assert when >= now + seconds - 1e-6
    if seconds < tasks.COALESCE_MIN_S:
        assert when == now + seconds
    else:
        assert when - (now + seconds) <= tasks.COALESCE_GRID_S + 1e-6
        ticks = when / tasks.COALESCE_GRID_S
        assert abs(ticks - round(ticks)) < 1e-6


async def test_the_idle_sleeps_of_many_tasks_end_together() -> None:
    """Forty tasks sleeping 1.0-1.2 s from moments spread over 0.2 s (ends spread over 0.4 s) wake on at most
    three timer ticks, not forty: with every sleep ending on its own, an idle daemon with many tables woke
    once per task and sleep."""
    loop = asyncio.get_running_loop()
    woke: list[float] = []

    async def sleeper(i: int) -> None:
        await asyncio.sleep(0.005 * i)
        t = BackgroundTask(f"t{i}", period_s=1.0)
        await t.wait(1.0 + 0.005 * (i % 40))
        woke.append(loop.time())

    await asyncio.gather(*(sleeper(i) for i in range(40)))
    assert len(woke) == 40
    woke.sort()
    batches = 1 + sum(1 for a, b in itertools.pairwise(woke) if b - a > 0.003)  # one loop iteration each
    assert batches <= 3, woke
