"""replicad.keeper.client.Keeper against a real ZooKeeper 3.8 server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kazoo.client import KazooClient

from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.errors import (
    KeeperBadVersionError,
    KeeperConnectionLossError,
    KeeperError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    KeeperNotEmptyError,
    KeeperSessionExpiredError,
)
from replicad.keeper.client import Keeper, SessionState, WatchEvent, WatchEventType, ZnodeStat
from replicad.keeper.ops import Check, Create, Delete, Set

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def raw_zk(zookeeper: ZooKeeperServer) -> Iterator[KazooClient]:
    """A plain synchronous kazoo client without chroot, to look at what Keeper did."""
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(15)
    yield zk
    zk.stop()
    zk.close()


# ---------------------------------------------------------------------------- basic operations


async def test_create_get_set_exists_delete(keeper: Keeper, raw_zk: KazooClient, zk_root: str) -> None:
    assert keeper.session_state is SessionState.CONNECTED
    assert await keeper.create("/a", b"hello") == "/a"
    data, stat = await keeper.get("/a")
    assert data == b"hello" and isinstance(stat, ZnodeStat) and stat.version == 0 and stat.data_length == 5
    # the node really lives under the chroot
    assert raw_zk.get(zk_root + "/a")[0] == b"hello"

    stat2 = await keeper.set("/a", b"world", version=0)
    assert stat2.version == 1 and stat2.mzxid > stat.mzxid
    with pytest.raises(KeeperBadVersionError) as bad:
        await keeper.set("/a", b"x", version=0)
    assert not bad.value.retriable and bad.value.zk_code == -103

    st = await keeper.exists("/a")
    assert st is not None and st.version == 1
    assert await keeper.exists("/missing") is None
    with pytest.raises(KeeperNoNodeError):
        await keeper.get("/missing")
    with pytest.raises(KeeperNodeExistsError):
        await keeper.create("/a")
    with pytest.raises(KeeperNoNodeError):
        await keeper.create("/no/parent")

    await keeper.create("/a/child")
    with pytest.raises(KeeperNotEmptyError):
        await keeper.delete("/a")
    with pytest.raises(KeeperBadVersionError):
        await keeper.delete("/a/child", version=5)
    await keeper.delete("/a/child", version=0)
    await keeper.delete("/a")
    assert raw_zk.exists(zk_root + "/a") is None
    with pytest.raises(KeeperNoNodeError):
        await keeper.delete("/a")


async def test_sequential_ephemeral_and_parents(keeper: Keeper, raw_zk: KazooClient, zk_root: str) -> None:
    await keeper.create("/q")
    p1 = await keeper.create("/q/queue-", b"1", sequence=True)
    p2 = await keeper.create("/q/queue-", b"2", sequence=True)
    assert p1 == "/q/queue-0000000000" and p2 == "/q/queue-0000000001"

    eph = await keeper.create("/q/lock", ephemeral=True)
    st = await keeper.exists(eph)
    assert st is not None and st.ephemeral_owner == keeper.session_id

    assert await keeper.create("/x/y/z", b"deep", makepath=True) == "/x/y/z"
    assert await keeper.create("/m/n-", make_parents=True, sequence=True) == "/m/n-0000000000"
    await keeper.ensure_path("/x/y/z")  # existing: fine
    await keeper.ensure_path("/e1/e2/e3")
    assert raw_zk.exists(zk_root + "/e1/e2/e3") is not None

    children, parent = await keeper.get_children("/q", include_data=True)
    assert sorted(children) == ["lock", "queue-0000000000", "queue-0000000001"]
    assert parent.num_children == 3 and parent.cversion == 3
    assert sorted(await keeper.get_children("/q")) == sorted(children)
    with pytest.raises(KeeperNoNodeError):
        await keeper.get_children("/nope")
    await keeper.sync("/")


async def test_recursive_delete(keeper: Keeper) -> None:
    for i in range(30):
        await keeper.create(f"/t/b{i % 3}/n{i}/leaf", b"v", makepath=True)
    await keeper.delete("/t", recursive=True)
    assert await keeper.exists("/t") is None
    await keeper.delete("/t", recursive=True)  # already gone: quiet


async def test_get_many_pipelines_and_counts_requests(keeper: Keeper, zookeeper: ZooKeeperServer) -> None:
    await keeper.create("/log")
    n = 400
    await asyncio.gather(*(keeper.create(f"/log/log-{i:010d}", f"entry {i}".encode()) for i in range(n)))
    paths = [f"/log/log-{i:010d}" for i in range(n)] + ["/log/absent"]

    before = keeper.requests_total
    before_server = zookeeper.mntr()["zk_packets_received"]
    t0 = asyncio.get_running_loop().time()
    got = await keeper.get_many(paths)
    elapsed = asyncio.get_running_loop().time() - t0
    assert keeper.requests_total - before == n + 1
    assert keeper.requests["get"] >= n + 1
    # the server saw (at least) those requests too
    after_server = zookeeper.mntr()["zk_packets_received"]
    assert isinstance(after_server, int) and isinstance(before_server, int)
    assert after_server - before_server >= n + 1

    assert got[-1] is None
    for i, item in enumerate(got[:-1]):
        assert item is not None and item[0] == f"entry {i}".encode()
    assert elapsed < 5.0, elapsed

    kids = await keeper.get_children_many(["/log", "/absent"])
    assert kids[1] is None and kids[0] is not None and len(kids[0]) == n


async def test_chroot_is_created_when_missing(
    zookeeper: ZooKeeperServer, zk_root: str, raw_zk: KazooClient
) -> None:
    k = Keeper(f"{zookeeper.hosts}{zk_root}", session_timeout_s=10, chroot="/fresh/sub")
    assert k.chroot == zk_root + "/fresh/sub"
    await k.start()
    try:
        await k.create("/node", b"1")
        assert raw_zk.get(zk_root + "/fresh/sub/node")[0] == b"1"
        assert sorted(await k.get_children("/")) == ["node"]
    finally:
        await k.close()


async def test_start_fails_fast_without_server() -> None:
    from replicad.devtools.ports import free_port

    k = Keeper(f"127.0.0.1:{free_port()}", session_timeout_s=5)
    with pytest.raises(KeeperConnectionLossError):
        await k.start(timeout=1.0)
    with pytest.raises(KeeperConnectionLossError):
        await k.get("/")


async def test_close_removes_ephemerals_and_refuses_requests(
    zookeeper: ZooKeeperServer, zk_root: str
) -> None:
    states: list[SessionState] = []
    async with Keeper(zookeeper.hosts, 10, chroot=zk_root) as k:
        k.add_state_listener(states.append)
        await k.create("/eph", ephemeral=True)
        other = Keeper(zookeeper.hosts, 10, chroot=zk_root)
        await other.start()
    assert states == [SessionState.LOST]
    assert await other.exists("/eph") is None
    await other.close()
    with pytest.raises(KeeperSessionExpiredError):
        await k.get("/")


# ---------------------------------------------------------------------------- multi


async def test_multi_success_results(keeper: Keeper, raw_zk: KazooClient, zk_root: str) -> None:
    await keeper.create("/m", b"v0")
    results = await keeper.multi(
        [
            Create("/m/log-", b"entry", sequence=True),
            Create("/m/part", b"p"),
            Set("/m", b"v1", version=0),
            Check("/m", 1),
            Delete("/m/part"),
        ]
    )
    assert results[0] == "/m/log-0000000000"
    assert results[1] == "/m/part"
    assert isinstance(results[2], ZnodeStat) and results[2].version == 1
    assert results[3] is None and results[4] is None
    assert raw_zk.get(zk_root + "/m")[0] == b"v1"
    assert sorted(raw_zk.get_children(zk_root + "/m")) == ["log-0000000000"]
    assert keeper.requests["multi"] == 1
    assert await keeper.multi([]) == []


@pytest.mark.parametrize(
    ("ops", "index", "cause"),
    [
        ([Create("/f/new"), Create("/f/exists"), Set("/f", b"x")], 1, KeeperNodeExistsError),
        ([Create("/f/new"), Check("/f", 7), Delete("/f/exists")], 1, KeeperBadVersionError),
        ([Delete("/f/missing"), Create("/f/new")], 0, KeeperNoNodeError),
        ([Create("/f/new"), Create("/f/a"), Delete("/f")], 2, KeeperNotEmptyError),
        ([Create("/f/new"), Set("/f/exists", b"x", version=3)], 1, KeeperBadVersionError),
    ],
)
async def test_multi_failure_reports_the_failing_op(
    keeper: Keeper, ops: list[Create | Set | Delete | Check], index: int, cause: type[KeeperError]
) -> None:
    await keeper.create("/f", b"orig")
    await keeper.create("/f/exists")
    with pytest.raises(KeeperMultiError) as err:
        await keeper.multi(ops)
    assert err.value.index == index
    assert isinstance(err.value.cause, cause)
    assert err.value.zk_code == err.value.cause.zk_code  # type: ignore[attr-defined]
    assert not err.value.retriable
    # all-or-nothing: nothing was applied
    assert await keeper.exists("/f/new") is None
    assert (await keeper.get("/f"))[0] == b"orig"

    outcome = await keeper.try_multi(ops)
    assert not outcome.ok and outcome.failed_index == index and isinstance(outcome.error, cause)
    assert outcome.zk_code == err.value.zk_code and outcome.results == []
    ok = await keeper.try_multi([Create("/f/other")])
    assert ok.ok and ok.results == ["/f/other"] and ok.zk_code == 0


# ---------------------------------------------------------------------------- watches


async def test_one_shot_watches_fire_on_the_loop(keeper: Keeper) -> None:
    loop_thread = threading.get_ident()
    events: list[tuple[str, WatchEvent, int]] = []
    got = asyncio.Event()

    def recorder(name: str) -> Callable[[WatchEvent], None]:
        def cb(ev: WatchEvent) -> None:
            events.append((name, ev, threading.get_ident()))
            got.set()

        return cb

    await keeper.create("/w", b"0")
    await keeper.get("/w", watch=recorder("data"))
    await keeper.get_children("/w", watch=recorder("children"))
    assert await keeper.exists("/w/later", watch=recorder("exists")) is None

    await keeper.set("/w", b"1")
    await keeper.create("/w/later")
    await wait_until(lambda: len(events) == 3, what="three watch events")
    by_name = {name: ev for name, ev, _ in events}
    assert by_name["data"].kind is WatchEventType.CHANGED and by_name["data"].path == "/w"
    assert by_name["children"].kind is WatchEventType.CHILD and by_name["children"].path == "/w"
    assert by_name["exists"].kind is WatchEventType.CREATED and by_name["exists"].path == "/w/later"
    assert all(tid == loop_thread for _, _, tid in events)

    # one-shot: further changes do not call again
    await keeper.set("/w", b"2")
    await keeper.create("/w/more")
    await asyncio.sleep(0.3)
    assert len(events) == 3


async def test_watch_callback_may_be_a_coroutine(keeper: Keeper) -> None:
    seen: list[WatchEventType] = []

    async def cb(ev: WatchEvent) -> None:
        await asyncio.sleep(0)
        seen.append(ev.kind)

    await keeper.create("/c")
    await keeper.get("/c", watch=cb)
    await keeper.delete("/c")
    await wait_until(lambda: seen == [WatchEventType.DELETED], what="coroutine watch")


async def test_watch_children_rearms(keeper: Keeper) -> None:
    loop_thread = threading.get_ident()
    calls: list[list[str]] = []
    threads: set[int] = set()

    def cb(children: list[str]) -> None:
        calls.append(sorted(children))
        threads.add(threading.get_ident())

    w = keeper.watch_children("/queue", cb)  # does not exist yet
    await wait_until(lambda: calls == [[]], what="initial empty list")
    await keeper.create("/queue")
    await wait_until(lambda: len(calls) >= 2, what="creation noticed")
    for i in range(5):
        await keeper.create(f"/queue/q-{i}")
        await wait_until(lambda i=i: calls[-1] == [f"q-{j}" for j in range(i + 1)], what=f"child {i}")
    await keeper.delete("/queue", recursive=True)
    await wait_until(lambda: calls[-1] == [], what="deletion noticed")
    await keeper.create("/queue/again", makepath=True)
    await wait_until(lambda: calls[-1] == ["again"], what="re-creation noticed")
    assert threads == {loop_thread}

    w.cancel()
    n = len(calls)
    await keeper.create("/queue/after-cancel")
    await asyncio.sleep(0.3)
    assert len(calls) == n


async def test_watch_children_coalesces_bursts(keeper: Keeper) -> None:
    calls: list[list[str]] = []
    await keeper.create("/burst")
    keeper.watch_children("/burst", lambda ch: calls.append(sorted(ch)))
    await wait_until(lambda: calls == [[]])
    await asyncio.gather(*(keeper.create(f"/burst/n{i:03d}") for i in range(100)))
    await wait_until(lambda: len(calls[-1]) == 100, what="all 100 children seen")
    assert len(calls) <= 101


# ---------------------------------------------------------------------------- session trouble


async def test_session_expiry_is_detected_and_a_new_session_opens(
    keeper: Keeper, zookeeper: ZooKeeperServer
) -> None:
    states: list[SessionState] = []
    keeper.add_state_listener(states.append)
    events = keeper.session_events()
    await keeper.create("/eph", ephemeral=True)
    await keeper.create("/watched")
    calls: list[list[str]] = []
    keeper.watch_children("/watched", lambda ch: calls.append(sorted(ch)))
    await wait_until(lambda: calls == [[]])

    old = keeper.session_id_and_password
    assert old is not None
    await asyncio.to_thread(zookeeper.expire_session, *old)

    await wait_until(lambda: SessionState.LOST in states, what="LOST")
    await keeper.wait_for_state(SessionState.CONNECTED, timeout=15)
    assert states[-1] is SessionState.CONNECTED
    assert keeper.session_id is not None and keeper.session_id != old[0]
    assert await keeper.exists("/eph") is None  # the ephemeral died with the old session
    seen = [await anext(events) for _ in range(len(states))]
    assert seen == states

    # the children watch was re-armed on the new session
    await keeper.create("/watched/after")
    await wait_until(lambda: calls[-1] == ["after"], what="watch after expiry")


@pytest_asyncio.fixture
async def private_zk(tmp_path: Path) -> AsyncIterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own, to restart and kill freely."""
    server = ZooKeeperServer(tmp_path / "zk")
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        server.kill()


async def test_zookeeper_restart_suspends_then_reconnects(private_zk: ZooKeeperServer) -> None:
    k = Keeper(private_zk.hosts, session_timeout_s=20)
    await k.start()
    try:
        states: list[SessionState] = []
        k.add_state_listener(states.append)
        sid = k.session_id
        await k.create("/eph", ephemeral=True)
        await k.create("/dir")
        calls: list[list[str]] = []
        k.watch_children("/dir", lambda ch: calls.append(sorted(ch)))
        await wait_until(lambda: calls == [[]])

        await asyncio.to_thread(private_zk.stop)
        await k.wait_for_state(SessionState.SUSPENDED, timeout=10)
        with pytest.raises(KeeperConnectionLossError) as err:
            await k.get("/eph")
        assert err.value.retriable

        await asyncio.to_thread(private_zk.start)
        await k.wait_for_state(SessionState.CONNECTED, timeout=20)
        assert states == [SessionState.SUSPENDED, SessionState.CONNECTED]
        assert k.session_id == sid  # same session: it survived the restart
        assert await k.exists("/eph") is not None
        await k.create("/dir/new")
        await wait_until(lambda: calls[-1] == ["new"], what="watch re-armed after restart")
    finally:
        await k.close()


async def test_server_killed_session_reported_lost_then_recovers(private_zk: ZooKeeperServer) -> None:
    k = Keeper(private_zk.hosts, session_timeout_s=2)
    await k.start()
    try:
        states: list[SessionState] = []
        k.add_state_listener(states.append)
        await asyncio.to_thread(private_zk.kill)
        await k.wait_for_state(SessionState.SUSPENDED, timeout=10)
        # nobody answers: after the session timeout the session counts as lost
        await k.wait_for_state(SessionState.LOST, timeout=10)
        assert states == [SessionState.SUSPENDED, SessionState.LOST]
        with pytest.raises(KeeperConnectionLossError):
            await k.create("/x")

        await asyncio.to_thread(private_zk.start)
        await k.wait_for_state(SessionState.CONNECTED, timeout=20)
        assert states[-1] is SessionState.CONNECTED
        assert await k.create("/x") == "/x"
    finally:
        await k.close()


async def test_requests_in_flight_fail_with_connection_loss(private_zk: ZooKeeperServer) -> None:
    k = Keeper(private_zk.hosts, session_timeout_s=10)
    await k.start()
    try:
        await k.create("/n")
        rounds = 0

        async def hammer() -> None:
            nonlocal rounds
            while True:
                await k.get_many(["/n"] * 50)
                rounds += 1

        task = asyncio.ensure_future(hammer())
        await wait_until(lambda: rounds > 3, what="requests flowing")
        await asyncio.to_thread(private_zk.kill)
        with pytest.raises(KeeperConnectionLossError) as err:
            await asyncio.wait_for(task, 10)
        assert err.value.retriable
    finally:
        await k.close()


async def test_same_callback_registered_twice_fires_once(keeper: Keeper) -> None:
    events: list[WatchEvent] = []
    await keeper.create("/dup")
    await keeper.get("/dup", watch=events.append)
    await keeper.get("/dup", watch=events.append)
    await keeper.set("/dup", b"x")
    await wait_until(lambda: len(events) >= 1)
    await asyncio.sleep(0.2)
    assert len(events) == 1


def test_error_translation_and_retriable_flags() -> None:
    from kazoo import exceptions as kz

    from replicad.errors import KeeperOperationTimeoutError
    from replicad.keeper.client import translate_error

    cases: list[tuple[Exception, type[KeeperError], bool]] = [
        (kz.NoNodeError(), KeeperNoNodeError, False),
        (kz.NodeExistsError(), KeeperNodeExistsError, False),
        (kz.BadVersionError(), KeeperBadVersionError, False),
        (kz.NotEmptyError(), KeeperNotEmptyError, False),
        (kz.ConnectionLoss(), KeeperConnectionLossError, True),
        (kz.SessionExpiredError(), KeeperSessionExpiredError, True),
        (kz.ConnectionClosedError(), KeeperSessionExpiredError, True),
        (kz.OperationTimeoutError(), KeeperOperationTimeoutError, True),
        (kz.NoAuthError(), KeeperError, False),
    ]
    for exc, cls, retriable in cases:
        err = translate_error(exc, "get /p")
        assert type(err) is cls and err.retriable is retriable and "get /p" in str(err)
