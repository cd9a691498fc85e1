"""Async facade over kazoo — with replicad.keeper.handler, the only code of replicad importing kazoo.

kazoo keeps its own connection and callback threads.  Every request is issued with kazoo's
``*_async`` call (non-blocking: it only queues the request and pokes kazoo's socket pair); its
result is handed to the asyncio loop with ``loop.call_soon_threadsafe`` and resolved there, with
kazoo exceptions translated into ``replicad.errors.Keeper*Error``.  Watch callbacks and session
state changes are delivered on the loop as well; a callback may be a plain function or return a
coroutine (which is then run as a task).

Session states (``SessionState``: connected / suspended / lost, a long suspension reported as lost) are
tracked by :class:`replicad.keeper.session.SessionTracker`, which Keeper extends: after ``lost`` callers
should re-initialise as after an expiry (ephemeral nodes and watches are gone).  kazoo itself reconnects
forever; after an expiry it opens a new session (``session_id`` changes).

Requests are refused at once with ``KeeperConnectionLossError`` while not connected, so nothing is
queued to run at some unknown later time.  A write that fails with ConnectionLoss or
OperationTimeout may or may not have been applied.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar, overload

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionDropped,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
    SessionMovedError,
    ZookeeperError,
)
from kazoo.handlers.threading import AsyncResult, KazooTimeoutError
from kazoo.protocol.states import KazooState, WatchedEvent
from kazoo.protocol.states import ZnodeStat as _KazooStat

from replicad import stage_times
from replicad.errors import (
    KeeperBadVersionError,
    KeeperConnectionLossError,
    KeeperError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    KeeperNotEmptyError,
    KeeperOperationTimeoutError,
    KeeperSessionExpiredError,
)
from replicad.keeper.connection import DirectClient
from replicad.keeper.handler import LoopHandoff, PollHandler, RunsAnywhere
from replicad.keeper.multi_wire import PackedTransaction, chroot_prefix, pack_multi
from replicad.keeper.ops import (
    Create,
    MultiOutcome,
    MultiResult,
    Op,
    SessionState,
    Set,
    WatchCallback,
    WatchEvent,
    WatchEventType,
    ZnodeStat,
)
from replicad.keeper.session import SessionEvents, SessionTracker
from replicad.keeper.watches import ChildrenWatch

__all__ = [
    "ChildrenWatch",
    "Keeper",
    "MultiOutcome",
    "MultiResult",
    "SessionEvents",
    "SessionState",
    "WatchEvent",
    "WatchEventType",
    "ZnodeStat",
    "translate_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Requests kept in flight at once by the pipelined helpers (get_many, recursive delete, ...).
PIPELINE_WINDOW = 1000


def _stat(s: _KazooStat) -> ZnodeStat:
    return ZnodeStat(*s)


_TRANSLATION: tuple[tuple[type[BaseException], type[KeeperError], str], ...] = (
    (NoNodeError, KeeperNoNodeError, "no node"),
    (NodeExistsError, KeeperNodeExistsError, "node exists"),
    (BadVersionError, KeeperBadVersionError, "bad version"),
    (NotEmptyError, KeeperNotEmptyError, "node not empty"),
    (SessionExpiredError, KeeperSessionExpiredError, "session expired or closed"),
    (ConnectionLoss, KeeperConnectionLossError, "connection loss"),
    (ConnectionDropped, KeeperConnectionLossError, "connection dropped"),
    (SessionMovedError, KeeperConnectionLossError, "session moved"),
    (OperationTimeoutError, KeeperOperationTimeoutError, "operation timeout"),
    (KazooTimeoutError, KeeperOperationTimeoutError, "timeout"),
)


def translate_error(exc: BaseException, what: str) -> KeeperError:
    """A kazoo exception → the matching ``KeeperError`` subclass (message names the request)."""
    for kazoo_cls, our_cls, text in _TRANSLATION:
        if isinstance(exc, kazoo_cls):
            return our_cls(f"{what}: {text}")
    if isinstance(exc, ZookeeperError):
        return KeeperError(f"{what}: {type(exc).__name__} (ZooKeeper code {getattr(exc, 'code', '?')})")
    return KeeperError(f"{what}: {type(exc).__name__}: {exc}")


def _describe(op: Op) -> str:
    return f"{type(op).__name__.lower()} {op.path}"


class Keeper(SessionTracker):
    """One ZooKeeper session, used from one asyncio loop.

    ``hosts`` is ``"h1:p1,h2:p2"`` with an optional ``/chroot`` suffix; ``chroot`` (if given) is
    appended to it.  All paths are relative to the chroot, which ``start()`` creates if missing.
    """

    def __init__(
        self,
        hosts: str,
        session_timeout_s: float = 30.0,
        chroot: str | None = None,
        *,
        request_timeout_s: float | None = None,
        reconnect_max_delay_s: float = 1.0,
    ) -> None:
        host_list, _, host_chroot = hosts.partition("/")
        parts = [p.strip("/") for p in (host_chroot, chroot or "") if p and p.strip("/")]
        self.hosts = host_list
        self.chroot = posixpath.normpath("/" + "/".join(parts)) if parts else ""
        super().__init__(session_timeout_s)
        self.request_timeout_s = request_timeout_s if request_timeout_s is not None else session_timeout_s
        self._zk = DirectClient(
            hosts=host_list + self.chroot,
            timeout=session_timeout_s,
            handler=PollHandler(),
            connection_retry={
                "max_tries": -1,
                "delay": 0.05,
                "backoff": 2,
                "max_jitter": 0.2,
                "max_delay": reconnect_max_delay_s,
            },
        )
        self._chroot_prefix = chroot_prefix(self._zk.chroot)
        self._watches: set[ChildrenWatch] = set()
        self._started = False
        self._closed = False
        #: Requests issued, by kind ("get", "create", "multi", ...): for benchmarks and tests.
        self.requests: collections.Counter[str] = collections.Counter()
        #: called (from kazoo's thread) with (request kind, seconds) for every answered request
        self.latency_observer: Callable[[str, float], None] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self, timeout: float = 15.0, *, require_connection: bool = True) -> None:
        """Connect (raise KeeperConnectionLossError if not connected within ``timeout``).

        With ``require_connection=False`` an unreachable ZooKeeper is not an error: kazoo keeps trying in the
        background, the state stays ``lost`` until it connects (listeners hear ``connected`` then), and the
        chroot is created at that moment if missing."""
        if self._started:
            raise RuntimeError("Keeper.start() called twice")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._zk.add_listener(self._on_kazoo_state)
        event = await asyncio.to_thread(self._zk.start_async)
        if not await asyncio.to_thread(event.wait, timeout):
            if not require_connection:
                log.warning("zookeeper_unreachable_at_start: %s; retrying in the background", self.hosts)
                self.add_state_listener(self._ensure_chroot_when_connected)
                return
            await asyncio.to_thread(self._stop_kazoo)
            raise KeeperConnectionLossError(f"could not connect to ZooKeeper {self.hosts} within {timeout}s")
        self._apply_kazoo_state(KazooState.CONNECTED)
        if self.chroot and await self.exists("/") is None:
            await asyncio.to_thread(self._create_chroot, timeout)

    async def _ensure_chroot_when_connected(self, state: SessionState) -> None:
        if state is not SessionState.CONNECTED:
            return
        self.remove_state_listener(self._ensure_chroot_when_connected)
        if self.chroot and await self.exists("/") is None:
            await asyncio.to_thread(self._create_chroot, self.session_timeout_s)

    def _create_chroot(self, timeout: float) -> None:
        """Create the chroot node with a short-lived unchrooted session (blocking; in a thread)."""
        zk = KazooClient(hosts=self.hosts, timeout=self.session_timeout_s)
        zk.start(timeout)
        try:
            zk.ensure_path(self.chroot)
        finally:
            zk.stop()
            zk.close()

    def _stop_kazoo(self) -> None:
        try:
            self._zk.stop()
        finally:
            self._zk.close()

    async def close(self) -> None:
        """Close the session (its ephemeral nodes disappear) and stop kazoo's threads."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        for w in list(self._watches):
            w.cancel()
        self._cancel_lost_timer()
        self._zk.remove_listener(self._on_kazoo_state)
        await asyncio.to_thread(self._stop_kazoo)
        self._set_state(SessionState.LOST)

    async def __aenter__(self) -> Keeper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ session state

    @property
    def connected(self) -> bool:
        return self._zk.connected

    @property
    def session_id(self) -> int | None:
        cid = self._zk.client_id
        return None if cid is None else cid[0]

    @property
    def session_id_and_password(self) -> tuple[int, bytes] | None:
        return self._zk.client_id

    @property
    def requests_total(self) -> int:
        return sum(self.requests.values())

    def _on_kazoo_state(self, state: str) -> None:
        """kazoo's listener (connection thread): forward to the loop."""
        self._post(self._apply_kazoo_state, state)

    def _apply_kazoo_state(self, kstate: str) -> None:
        if self._closed:
            return
        if kstate == KazooState.CONNECTED:
            if not self._zk.connected:  # a stale notification; a newer one is on its way
                return
            self._cancel_lost_timer()
            was = self._state
            self._set_state(SessionState.CONNECTED)
            if was is not SessionState.CONNECTED:
                for w in list(self._watches):
                    w.rearm()
        elif kstate == KazooState.SUSPENDED:
            self._suspended()
        elif kstate == KazooState.LOST:
            self._cancel_lost_timer()
            self._set_state(SessionState.LOST)

    # ------------------------------------------------------------------ plumbing

    def _submit(self, kind: str, what: str, start: Callable[[], AsyncResult]) -> asyncio.Future[Any]:
        """Issue one request; its future resolves on the loop (raw kazoo value or translated error).  Also
        called from a worker thread (:meth:`send_multi`): nothing here touches the loop but making the
        future, which is only resolved and awaited on the loop."""
        loop = self._require_loop()
        if self._closed:
            raise KeeperSessionExpiredError(f"{what}: client closed")
        if not self._zk.connected:
            raise KeeperConnectionLossError(f"{what}: not connected to ZooKeeper ({self._state})")
        self.requests[kind] += 1
        stage_times.zk_request(kind)
        fut: asyncio.Future[Any] = loop.create_future()
        started = time.monotonic()
        result = start()
        result.rawlink(LoopHandoff(lambda r: self._answered(fut, r, what, kind, started)))
        return fut

    def _answered(self, fut: asyncio.Future[Any], result: AsyncResult, what: str, kind: str,
                  started: float) -> None:
        """(kazoo's connection thread) an answer arrived: time it, resolve the future on the loop."""
        observe = self.latency_observer
        if observe is not None:
            try:
                observe(kind, time.monotonic() - started)
            except Exception:  # metrics must never break a request
                pass
        self._post(self._resolve, fut, result, what)

    @staticmethod
    def _resolve(fut: asyncio.Future[Any], result: AsyncResult, what: str) -> None:
        if fut.done():
            return
        exc = result.exception
        if exc is None:
            fut.set_result(result.value)
        else:
            fut.set_exception(translate_error(exc, what))

    async def _wait(self, fut: Awaitable[T], what: str) -> T:
        try:
            async with asyncio.timeout(self.request_timeout_s):
                return await fut
        except TimeoutError:
            raise KeeperOperationTimeoutError(f"{what}: no answer in {self.request_timeout_s}s") from None

    def _watch_adapter(self, cb: WatchCallback | None) -> _WatchAdapter | None:
        return None if cb is None else _WatchAdapter(self, cb)

    async def _pipelined(
        self, kind: str, items: Sequence[str], start: Callable[[str], AsyncResult]
    ) -> list[Any]:
        """Run one request per path with up to PIPELINE_WINDOW in flight; NoNode → None."""
        out: list[Any] = []
        for lo in range(0, len(items), PIPELINE_WINDOW):
            chunk = items[lo : lo + PIPELINE_WINDOW]
            futs = [self._submit(kind, f"{kind} {p}", functools.partial(start, p)) for p in chunk]
            answers = await self._wait(asyncio.gather(*futs, return_exceptions=True), f"{kind} x{len(chunk)}")
            for ans in answers:
                if isinstance(ans, KeeperNoNodeError):
                    out.append(None)
                elif isinstance(ans, BaseException):
                    raise ans
                else:
                    out.append(ans)
        return out

    # ------------------------------------------------------------------ reads

    async def get(self, path: str, watch: WatchCallback | None = None) -> tuple[bytes, ZnodeStat]:
        fut = self._submit("get", f"get {path}", lambda: self._zk.get_async(path, self._watch_adapter(watch)))
        data, stat = await self._wait(fut, f"get {path}")
        return data or b"", _stat(stat)

    async def get_many(self, paths: Sequence[str]) -> list[tuple[bytes, ZnodeStat] | None]:
        """Read many nodes with all requests pipelined; ``None`` for a node that does not exist."""
        raw = await self._pipelined("get", paths, self._zk.get_async)
        return [None if r is None else (r[0] or b"", _stat(r[1])) for r in raw]

    async def exists(self, path: str, watch: WatchCallback | None = None) -> ZnodeStat | None:
        fut = self._submit(
            "exists", f"exists {path}", lambda: self._zk.exists_async(path, self._watch_adapter(watch))
        )
        stat = await self._wait(fut, f"exists {path}")
        return None if stat is None else _stat(stat)

    @overload
    async def get_children(
        self, path: str, watch: WatchCallback | None = None, include_data: Literal[False] = False
    ) -> list[str]: ...

    @overload
    async def get_children(
        self, path: str, watch: WatchCallback | None = None, *, include_data: Literal[True]
    ) -> tuple[list[str], ZnodeStat]: ...

    async def get_children(
        self, path: str, watch: WatchCallback | None = None, include_data: bool = False
    ) -> list[str] | tuple[list[str], ZnodeStat]:
        """Child names (unsorted, as ZooKeeper returns them); with ``include_data`` also the node's stat."""
        what, adapter = f"get_children {path}", self._watch_adapter(watch)
        fut = self._submit(
            "get_children", what, lambda: self._zk.get_children_async(path, adapter, include_data)
        )
        res = await self._wait(fut, what)
        return (list(res[0]), _stat(res[1])) if include_data else list(res)

    async def get_children_many(self, paths: Sequence[str]) -> list[list[str] | None]:
        """Children of many nodes, pipelined; ``None`` for a node that does not exist."""
        raw = await self._pipelined("get_children", paths, self._zk.get_children_async)
        return [None if r is None else list(r) for r in raw]

    def watch_children(self, path: str, callback: Callable[[list[str]], object]) -> ChildrenWatch:
        """Call ``callback(children)`` on the loop now and after every change, re-arming the one-shot
        ZooKeeper watch each time (and after reconnects).  ``[]`` while the node does not exist.
        Calls may be spurious (same list twice); the handle's ``cancel()`` stops it."""
        w = ChildrenWatch(self, path, callback)
        self._watches.add(w)
        w.rearm()
        return w

    def _forget_watch(self, w: ChildrenWatch) -> None:
        self._watches.discard(w)

    # ------------------------------------------------------------------ writes

    async def create(
        self,
        path: str,
        data: bytes = b"",
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
        *,
        make_parents: bool = False,
    ) -> str:
        """Create a node; returns its path (with the sequence suffix).  ``makepath``/``make_parents``
        (synonyms) create missing ancestors as persistent empty nodes."""
        try:
            return await self._create_once(path, data, ephemeral, sequence)
        except KeeperNoNodeError:
            if not (makepath or make_parents):
                raise
        await self.ensure_path(posixpath.dirname(path))
        return await self._create_once(path, data, ephemeral, sequence)

    async def _create_once(self, path: str, data: bytes, ephemeral: bool, sequence: bool) -> str:
        what = f"create {path}"
        fut = self._submit(
            "create", what, lambda: self._zk.create_async(path, data, ephemeral=ephemeral, sequence=sequence)
        )
        created: str = await self._wait(fut, what)
        return created

    async def ensure_path(self, path: str) -> None:
        """Create ``path`` and its missing ancestors (persistent, empty); existing nodes are fine."""
        if path in ("", "/"):
            return
        try:
            await self._create_once(path, b"", False, False)
            return
        except KeeperNodeExistsError:
            return
        except KeeperNoNodeError:
            pass
        await self.ensure_path(posixpath.dirname(path))
        try:
            await self._create_once(path, b"", False, False)
        except KeeperNodeExistsError:
            pass

    async def set(self, path: str, data: bytes, version: int = -1) -> ZnodeStat:
        what = f"set {path}"
        fut = self._submit("set", what, lambda: self._zk.set_async(path, data, version))
        return _stat(await self._wait(fut, what))

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        """Delete a node.  ``recursive`` deletes the whole subtree (pipelined, deepest level first,
        not atomic) and is quiet if the node is already gone."""
        if not recursive:
            what = f"delete {path}"
            await self._wait(self._submit("delete", what, lambda: self._zk.delete_async(path, version)), what)
            return
        levels: list[list[str]] = [[path]]
        while True:
            kids = await self.get_children_many(levels[-1])
            nxt = [posixpath.join(p, c) for p, cs in zip(levels[-1], kids, strict=True) if cs for c in cs]
            if not nxt:
                break
            levels.append(nxt)
        for level in reversed(levels):
            await self._pipelined("delete", level, lambda p: self._zk.delete_async(p, -1))

    async def sync(self, path: str = "/") -> None:
        """Make the server catch up with the leader before the next read (ZooKeeper ``sync``)."""
        what = f"sync {path}"
        await self._wait(self._submit("sync", what, lambda: self._zk.sync_async(path)), what)

    # ------------------------------------------------------------------ transactions

    async def multi(self, ops: Iterable[Op]) -> list[MultiResult]:
        """Run ``ops`` atomically.  Results per op: Create → path, Set → ZnodeStat, Delete/Check → None.
        If an op fails, raises KeeperMultiError (``.index``, ``.cause``) and nothing was applied."""
        ops = list(ops)
        if not ops:
            return []
        return await self.multi_answer(self.send_multi(ops), ops)

    def send_multi(self, ops: list[Op]) -> asyncio.Future[Any]:
        """Send a (non-empty) multi now, from any thread (kazoo's request queue and wake-up are thread-safe):
        a worker thread need not hand it to the loop first.  The returned future resolves on the loop; await
        it there with :meth:`multi_answer`."""
        what = f"multi ({len(ops)} ops, first: {_describe(ops[0])})"
        return self._submit("multi", what, functools.partial(self._multi_request, ops))

    async def multi_answer(self, sent: asyncio.Future[Any], ops: list[Op]) -> list[MultiResult]:
        """(loop) The results of a multi sent by :meth:`send_multi` (errors as :meth:`multi` raises them)."""
        what = f"multi ({len(ops)} ops, first: {_describe(ops[0])})"
        raw: list[Any] = await self._wait(sent, what)
        return _multi_results(ops, raw)

    def _multi_request(self, ops: list[Op]) -> AsyncResult:
        request = PackedTransaction(pack_multi(ops, self._chroot_prefix))
        result: AsyncResult = self._zk.handler.async_result()
        self._zk._call(request, result)
        return result

    async def try_multi(self, ops: Iterable[Op]) -> MultiOutcome:
        """Like ``multi`` but an op failure is returned (``failed_index``, ``error``, ``zk_code``) instead
        of raised.  Connection-level failures (loss, expiry, timeout) still raise."""
        try:
            return MultiOutcome(await self.multi(ops))
        except KeeperMultiError as e:
            return MultiOutcome([], e.index, e.cause)


def _multi_results(ops: list[Op], raw: list[Any]) -> list[MultiResult]:
    if len(raw) != len(ops):
        raise KeeperError(f"multi: {len(raw)} results for {len(ops)} ops")
    errors = [i for i, r in enumerate(raw) if isinstance(r, BaseException)]
    if errors:
        # The failing op carries the real error; the others say RolledBack (before) or
        # RuntimeInconsistency (after).
        real = [i for i in errors if not isinstance(raw[i], RolledBackError | RuntimeInconsistency)]
        index = real[0] if real else errors[0]
        cause = translate_error(raw[index], f"multi op #{index} ({_describe(ops[index])})")
        raise KeeperMultiError(f"multi failed at op #{index}: {cause}", index=index, cause=cause)
    out: list[MultiResult] = []
    for op, r in zip(ops, raw, strict=True):
        if isinstance(op, Create):
            out.append(str(r))
        elif isinstance(op, Set):
            out.append(_stat(r))
        else:
            out.append(None)
    return out


class _WatchAdapter(RunsAnywhere):
    """kazoo-side watch callback that hands the event to the loop.  Adapters of equal callbacks are
    equal, so kazoo (which keeps a set of watchers per path) triggers a re-registered callback once."""

    __slots__ = ("cb", "keeper")

    def __init__(self, keeper: Keeper, cb: WatchCallback) -> None:
        self.keeper = keeper
        self.cb = cb

    def __call__(self, ev: WatchedEvent) -> None:  # kazoo's connection thread (RunsAnywhere)
        self.keeper._post(self.keeper.watch_fired, self.cb, _watch_event(ev))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _WatchAdapter) and other.keeper is self.keeper and other.cb == self.cb

    def __hash__(self) -> int:
        return hash((id(self.keeper), self.cb))


def _watch_event(ev: WatchedEvent) -> WatchEvent:
    try:
        kind = WatchEventType(ev.type)
    except ValueError:
        kind = WatchEventType.NONE
    return WatchEvent(kind, ev.path, str(ev.state))
