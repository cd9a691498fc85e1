"""Long-lived subscriptions on a ``Keeper``: re-arming children watches.

They run entirely on the asyncio loop and use only the narrow :class:`WatchedKeeper` (no kazoo here);
``Keeper`` (``client.py``) satisfies it.  Session event streams live in ``session.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from replicad.errors import KeeperError, KeeperNoNodeError
from replicad.keeper.ops import WatchCallback, WatchEvent, WatchEventType


class WatchedKeeper(Protocol):
    """What a :class:`ChildrenWatch` needs of its keeper."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def connected(self) -> bool: ...

    async def get_children(self, path: str, watch: WatchCallback | None = None) -> list[str]: ...

    async def exists(self, path: str, watch: WatchCallback | None = None) -> object: ...

    def dispatch(self, cb: Callable[[list[str]], object], arg: list[str]) -> None: ...

    def _forget_watch(self, w: ChildrenWatch) -> None: ...


class ChildrenWatch:
    """Calls ``callback(children)`` after every change of ``path``'s children (see
    ``Keeper.watch_children``).  ZooKeeper watches are one-shot; this re-arms after each event,
    after a reconnect (the keeper calls ``rearm()``), and waits with an ``exists`` watch while the
    node is missing (reporting ``[]``)."""

    def __init__(self, keeper: WatchedKeeper, path: str, callback: Callable[[list[str]], object]) -> None:
        self.keeper = keeper
        self.path = path
        self.callback = callback
        self.fired = 0  # callbacks delivered so far
        self._cancelled = False
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def cancel(self) -> None:
        self._cancelled = True
        self.keeper._forget_watch(self)
        if self._task is not None and not self._task.done():
            self._task.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def rearm(self) -> None:
        """(Re-)read the children with a new watch; coalesces with a read already under way."""
        if self._cancelled:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = self.keeper.loop.create_task(self._run())

    def _on_event(self, ev: WatchEvent) -> None:
        # NONE: the connection dropped and the watch is gone.  The keeper re-arms every watch when
        # it reconnects; re-arming here as well covers an event that arrives after the reconnect.
        if ev.kind is not WatchEventType.NONE or self.keeper.connected:
            self.rearm()

    async def _run(self) -> None:
        while not self._cancelled:
            self._again = False
            try:
                children = await self.keeper.get_children(self.path, watch=self._on_event)
            except KeeperNoNodeError:
                try:
                    if await self.keeper.exists(self.path, watch=self._on_event) is not None:
                        continue  # created in between: read its children
                except KeeperError:
                    return  # connection trouble: re-armed on reconnect
                children = []
            except KeeperError:
                return
            self.fired += 1
            self.keeper.dispatch(self.callback, children)
            if not self._again:
                return
