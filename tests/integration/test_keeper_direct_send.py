"""Requests written to ZooKeeper's socket by the thread that makes them (replicad.keeper.connection): answers
matched to their requests whatever thread sent them, in order behind kazoo's queue, and a socket that takes
a request only in part."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.errors import KeeperConnectionLossError
from replicad.keeper import connection, held_io
from replicad.keeper.client import Keeper, SessionState
from replicad.keeper.connection import DirectConnection
from replicad.keeper.ops import Create, Set

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _conn(keeper: Keeper) -> DirectConnection:
    conn = keeper._zk._connection
    assert isinstance(conn, DirectConnection)
    return conn


async def _mixed_traffic(keeper: Keeper, threads: int = 4, rounds: int = 60) -> None:
    """Gets on the loop and multis from worker threads at once; every answer must be its own request's."""
    await keeper.create("/c")
    await keeper.create("/m")
    names = [f"/c/n{i}" for i in range(50)]
    for i, n in enumerate(names):
        await keeper.create(n, f"value {i}".encode())
    loop = asyncio.get_running_loop()
    sent: list[tuple[int, int, asyncio.Future[Any]]] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        for r in range(rounds):
            i = (t + r) % 50
            fut = keeper.send_multi([Create(f"/m/t{t}-r{r}-", b"", sequence=True),
                                     Set(names[i], f"value {i}".encode())])
            with lock:
                sent.append((t, r, fut))

    workers = [loop.run_in_executor(None, worker, t) for t in range(threads)]
    for _ in range(rounds // 4):
        got = await keeper.get_many(names)
        values = [g[0] if g is not None else None for g in got]
        assert values == [f"value {i}".encode() for i in range(50)]
    await asyncio.gather(*workers)
    for t, r, fut in sent:
        ops = [Create(f"/m/t{t}-r{r}-", b"", sequence=True), Set(names[(t + r) % 50], b"")]
        created, _stat = await keeper.multi_answer(fut, ops)
        assert str(created).startswith(f"/m/t{t}-r{r}-"), (t, r, created)
    assert len(await keeper.get_children("/m")) == threads * rounds


async def test_requests_from_many_threads_get_their_own_answers(keeper: Keeper) -> None:
    before = _conn(keeper).sent_now
    await _mixed_traffic(keeper)
    assert _conn(keeper).sent_now - before > 400  # the direct path carried them (not kazoo's queue)


@pytest.fixture
def partial_sends(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every non-blocking send takes only the first 5 bytes: the rest is always left to the connection
    thread (as when the socket's buffer is full)."""
    calls: list[int] = []
    real = held_io.send

    def send(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real(fd, data[:5])

    monkeypatch.setattr(connection.held_io, "send", send)
    yield calls


async def test_requests_the_socket_takes_in_part_are_finished_in_order(
    keeper: Keeper, partial_sends: list[int]
) -> None:
    conn = _conn(keeper)
    before = conn.sent_in_part
    await _mixed_traffic(keeper, threads=3, rounds=30)
    assert conn.sent_in_part - before > 100
    assert partial_sends


def _hold(lock: Any, taken: threading.Event, release: threading.Event) -> None:
    with lock:  # from another thread: the loop's non-blocking acquire fails
        taken.set()
        release.wait(10)


async def test_a_request_never_overtakes_one_queued_before_it(keeper: Keeper) -> None:
    """While the send lock is busy requests go to kazoo's queue; one made after them, once the lock is free,
    must not be written before them (sequential nodes number them in the order ZooKeeper received them).
    The connection thread is held at the gate of its queue meanwhile, so the queue is still full then."""
    conn = _conn(keeper)
    await keeper.create("/o")
    gate = threading.Event()
    real_send_request = conn._send_request

    def gated(read_timeout: float, connect_timeout: float) -> None:
        gate.wait(10)
        real_send_request(read_timeout, connect_timeout)

    conn._send_request = gated  # type: ignore[method-assign]
    try:
        for attempt in range(3):
            gate.clear()
            taken, release = threading.Event(), threading.Event()
            holder = threading.Thread(target=_hold, args=(conn._send_lock, taken, release))
            holder.start()
            taken.wait(10)
            queued = [asyncio.ensure_future(keeper.create(f"/o/a{attempt}-q{i}-", sequence=True))
                      for i in range(3)]
            await asyncio.sleep(0)  # the creates are issued (and queued: the lock is taken)
            release.set()
            holder.join()
            assert len(keeper._zk._queue) == 3
            after = asyncio.ensure_future(keeper.create(f"/o/a{attempt}-z-", sequence=True))
            await asyncio.sleep(0)  # issued while the queue is full and the lock free
            gate.set()
            names = [await q for q in queued]
            seqs = [int(n[-10:]) for n in names]
            last = await after
            assert seqs == sorted(seqs) and int(last[-10:]) > max(seqs), (names, last)
    finally:
        gate.set()
        del conn._send_request


class _Mute:
    """Stands in for kazoo's wake-up socket: the connection thread is not told of bytes left for it."""

    def send(self, data: bytes) -> int:
        return len(data)


@pytest_asyncio.fixture
async def private_zk(tmp_path: Path) -> AsyncIterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path / "zk")
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        server.kill()


async def test_bytes_left_for_a_dropped_connection_never_reach_the_next(
    private_zk: ZooKeeperServer, partial_sends: list[int]
) -> None:
    """A request the socket took only in part when the connection dropped fails with a connection loss, and
    its remaining bytes are not written to the next connection (ZooKeeper would answer an xid nobody waits
    for, or read garbage): requests after the reconnect get their own answers."""
    k = Keeper(private_zk.hosts, session_timeout_s=20)
    await k.start()
    try:
        conn = _conn(k)
        await k.create("/n", b"before")
        wake = conn._write_sock
        conn._write_sock = _Mute()
        try:
            stuck = asyncio.ensure_future(k.get("/n"))  # 5 bytes sent, the rest left in the buffer
            await asyncio.sleep(0)
            assert conn.sent_in_part >= 1 and conn._out
            await asyncio.to_thread(private_zk.stop)
            with pytest.raises(KeeperConnectionLossError):
                await stuck
        finally:
            conn._write_sock = wake
        await k.wait_for_state(SessionState.SUSPENDED, timeout=10)
        await asyncio.to_thread(private_zk.start)
        await k.wait_for_state(SessionState.CONNECTED, timeout=20)
        monkeypatched_before = len(partial_sends)
        for i in range(20):
            await k.set("/n", f"after {i}".encode())
            assert (await k.get("/n"))[0] == f"after {i}".encode()
        assert len(partial_sends) > monkeypatched_before
        assert k.session_state is SessionState.CONNECTED
    finally:
        await k.close()


async def test_kazoos_connection_drop_sentinel_still_goes_through_its_queue(keeper: Keeper) -> None:
    """kazoo's testing sentinels (no request type, no bytes) are never written by the caller: queued, the
    connection thread acts on them (a dropped connection, then a reconnect in the same session)."""
    from kazoo.protocol.connection import _CONNECTION_DROP

    await keeper.create("/s", b"v")
    sid = keeper.session_id
    keeper._zk._call(_CONNECTION_DROP, keeper._zk.handler.async_result())
    await keeper.wait_for_state(SessionState.SUSPENDED, timeout=10)
    await keeper.wait_for_state(SessionState.CONNECTED, timeout=20)
    assert keeper.session_id == sid
    assert (await keeper.get("/s"))[0] == b"v"
