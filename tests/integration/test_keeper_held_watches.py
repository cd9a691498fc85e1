"""Watch notifications held back while a write of ours is in flight (Keeper.holding_watches, the commit):
ZooKeeper sends them before the write's answer; held, they reach their callbacks after the caller has the
answer, in order, and none is ever lost (an error or a cancellation in the holding code delivers them too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest

from replicad.errors import KeeperMultiError
from replicad.keeper.client import Keeper, WatchEvent, WatchEventType
from replicad.keeper.ops import Create

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def _one_write(keeper: Keeper, path: str, hold: bool) -> tuple[WatchEvent, bool]:
    """(the notification of a child created by one multi, whether the multi had returned when it came)"""
    seen: list[tuple[WatchEvent, bool]] = []
    returned = False
    await keeper.get_children("/w", watch=lambda ev: seen.append((ev, returned)))
    with keeper.holding_watches() if hold else contextlib.nullcontext():
        await keeper.multi([Create(path)])
    returned = True
    await wait_until(lambda: bool(seen))
    await asyncio.sleep(0.05)
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("hold", [True, False])
async def test_own_write_notification_comes_after_the_answer_when_held(keeper: Keeper, hold: bool) -> None:
    await keeper.create("/w")
    for i in range(5):
        event, after_return = await _one_write(keeper, f"/w/c{i}", hold)
        assert event.kind is WatchEventType.CHILD
        # held: the callback ran after the multi returned; not held, before (ZooKeeper's order)
        assert after_return is hold


async def test_notifications_held_are_delivered_in_order_when_the_holder_fails(keeper: Keeper) -> None:
    await keeper.create("/a")
    await keeper.create("/b")
    seen: list[str] = []
    await keeper.get_children("/a", watch=lambda ev: seen.append(f"a {ev.kind.value}"))
    await keeper.get_children("/b", watch=lambda ev: seen.append(f"b {ev.kind.value}"))
    with pytest.raises(RuntimeError), keeper.holding_watches():
        await keeper.create("/a/x")  # not holding itself: its notification is held by the outer hold
        await keeper.create("/b/x")
        await wait_until(lambda: len(keeper._held) == 2)
        assert seen == []
        raise RuntimeError("the holder fails")
    await wait_until(lambda: len(seen) == 2)
    assert seen == ["a CHILD", "b CHILD"]


async def test_a_failed_held_multi_and_a_cancelled_holder_deliver_what_was_held(keeper: Keeper) -> None:
    await keeper.create("/c")
    await keeper.create("/d")
    await keeper.create("/exists")
    seen: list[str] = []
    await keeper.get_children("/c", watch=lambda ev: seen.append("c"))

    async def holder() -> None:
        with keeper.holding_watches():
            await keeper.create("/c/x")
            await asyncio.sleep(30)

    task = asyncio.ensure_future(holder())
    await wait_until(lambda: len(keeper._held) == 1)
    # a second hold, overlapping the first, whose multi fails: its end delivers what was held (the first
    # hold, still on, must not keep notifications back for longer than a write)
    with pytest.raises(KeeperMultiError), keeper.holding_watches():
        await keeper.multi([Create("/exists")])
    await wait_until(lambda: seen == ["c"])
    await keeper.get_children("/d", watch=lambda ev: seen.append("d"))
    await keeper.create("/d/x")
    await wait_until(lambda: len(keeper._held) == 1)  # the first hold is still on
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await wait_until(lambda: seen == ["c", "d"])
    assert keeper._held == [] and keeper._holds == 0
