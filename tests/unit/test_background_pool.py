"""Merges and mutations run in the daemon's background pool (replication/background_pool.py), never in the
default executor the INSERTs' short trips need."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, cast

import pytest

from replicad.replication import background_pool
from replicad.replication.merge_executor import PartProducer

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("_VAR", default="unset")


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background_pool, "_pool", None)
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


def test_part_producer_runs_merges_in_the_background_pool(fresh_pool: None) -> None:
    none = cast(Any, None)
    producer = PartProducer(none, none, none, none, none, none, none, none)

    def merge(*args: object) -> Any:
        return (args, threading.current_thread().name)

    async def main() -> Any:
        return await producer._reading([], merge, "a", "b")

    args, thread = asyncio.run(main())
    assert args == ("a", "b")
    assert thread.startswith("background-pool")
