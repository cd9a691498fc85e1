"""Merges and mutations run in the daemon's background pool (replication/background_pool.py), never in the
default executor the INSERTs' short trips need."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from replicad.replication import background_pool
from replicad.replication.merge_executor import ExecutorSettings, PartProducer

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background_pool, "_pool", None)
    monkeypatch.setattr(background_pool, "_yielding", None)
    monkeypatch.setattr(background_pool, "_slots", None)
    monkeypatch.setattr(background_pool, "_size", background_pool.DEFAULT_SIZE)


def test_a_long_job_in_the_pool_leaves_the_default_executor_free(fresh_pool: None) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        loop.set_default_executor(ThreadPoolExecutor(1))  # one thread: a merge there would block it
        release = threading.Event()
        long_job = asyncio.ensure_future(background_pool.run(release.wait, 10))
        await asyncio.sleep(0.05)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "trip"), 2) == "trip"
        assert not long_job.done()
        release.set()
        assert await long_job is True

    asyncio.run(main())


def test_run_carries_arguments_context_and_errors(fresh_pool: None) -> None:
    def job(a: int, *, b: int) -> tuple[int, str, str]:
        return a + b, _VAR.get(), threading.current_thread().name

    def boom() -> None:
        raise ValueError("merge failed")

    async def main() -> None:
        _VAR.set("caller")
        total, seen, thread = await background_pool.run(job, 1, b=2)
        assert (total, seen) == (3, "caller")
        assert thread.startswith("background-pool")
        with pytest.raises(ValueError, match="merge failed"):
            await background_pool.run(boom)

    asyncio.run(main())


def test_configure_sizes_the_pool_made_after_it(fresh_pool: None) -> None:
    background_pool.configure(3)
    assert background_pool.pool()._max_workers == 3
    background_pool.configure(7)  # a running pool keeps its size
    assert background_pool.pool()._max_workers == 3


def test_configure_rejects_nothing_below_one(fresh_pool: None) -> None:
    background_pool.configure(0)
    assert background_pool.pool()._max_workers == 1


def _producer(most_parts_in_a_partition: int) -> PartProducer:
    none = cast(Any, None)
    store = cast(Any, SimpleNamespace(max_active_in_partition=lambda: most_parts_in_a_partition))
    return PartProducer(none, none, store, none, none, none, none, none,
                        settings=ExecutorSettings(parts_to_delay_insert=150))


def _merge(*args: object) -> tuple[tuple[object, ...], str, int]:
    return args, threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, 0)


def test_part_producer_runs_merges_in_the_background_pool(fresh_pool: None) -> None:
    async def main() -> Any:
        return await _producer(1)._reading([], _merge, "a", "b")

    args, thread, _nice = asyncio.run(main())
    assert args == ("a", "b")
    assert thread.startswith("background-pool")


def test_run_yielding_runs_below_the_process_priority_and_run_does_not(fresh_pool: None) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base + background_pool.YIELDING_NICE > 19:
        pytest.skip("the process runs at the lowest priority already")

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)

    async def main() -> tuple[int, int]:
        return await background_pool.run_yielding(nice), await background_pool.run(nice)

    low, normal = asyncio.run(main())
    assert low == base + background_pool.YIELDING_NICE
    assert normal == base
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the thread's own value: the caller's is untouched


def test_both_pools_together_run_at_most_the_configured_jobs(fresh_pool: None) -> None:
    background_pool.configure(1)
    release = threading.Event()

    async def main() -> None:
        busy = asyncio.ensure_future(background_pool.run(release.wait, 10))
        await asyncio.sleep(0.05)
        second = asyncio.ensure_future(background_pool.run_yielding(lambda: "ran"))
        await asyncio.sleep(0.3)
        assert not second.done()  # one slot, taken: it waits although its pool has an idle thread
        release.set()
        assert await busy is True
        assert await asyncio.wait_for(second, 5) == "ran"

    asyncio.run(main())


def test_merges_yield_only_far_from_the_insert_delay(fresh_pool: None) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if base + background_pool.YIELDING_NICE > 19:
        pytest.skip("the process runs at the lowest priority already")

    async def main(parts: int) -> tuple[str, int]:
        _args, thread, nice = await _producer(parts)._reading([], _merge)
        return thread, nice

    for parts in (1, 74):  # 74 * 2 < 150: yields
        thread, nice = asyncio.run(main(parts))
        assert thread.startswith("background-pool-low") and nice == base + background_pool.YIELDING_NICE
    for parts in (75, 400):  # half-way to the delay and beyond: a merge keeps the inserts' priority
        thread, nice = asyncio.run(main(parts))
        assert not thread.startswith("background-pool-low") and nice == base


def test_executor_settings_take_the_tables_insert_delay() -> None:
    assert ExecutorSettings.from_settings({"parts_to_delay_insert": 40}).parts_to_delay_insert == 40
    assert ExecutorSettings.from_settings({}).parts_to_delay_insert == 150
