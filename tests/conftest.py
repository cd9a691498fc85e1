"""Shared fixtures: one real ZooKeeper per test run, a fresh chroot per test, ClickHouse 18.16 replicas.

- ``zookeeper`` (session): a ``ZooKeeperServer``; tests are skipped if ZooKeeper/Java are missing.
- ``zk_root`` (function): a unique, already created path such as ``/tests/test_x-1a2b3c4d``; on failure
  the tree under it is printed in the test's teardown output.
- ``zk_hosts`` (function): ``"127.0.0.1:<port>/tests/test_x-…"`` — a connect string with that chroot.
- ``keeper`` (function, async): a started ``replicad.keeper.client.Keeper`` chrooted at ``zk_root``.
- ``clickhouse_factory`` (function): ``clickhouse_factory("r1", **kwargs)`` starts a ClickHouse 18.16
  replica whose ZooKeeper ``<root>`` is ``zk_root``; all are stopped after the test.  Tests using it
  should carry ``@pytest.mark.clickhouse`` (skipped when the binary is absent).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from replicad.devtools import clickhouse as ch_support
from replicad.devtools import zookeeper as zk_support
from replicad.devtools.clickhouse import ClickHouseServer
from replicad.devtools.zookeeper import ZooKeeperServer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("clickhouse") is not None and not ch_support.available():
        pytest.skip("clickhouse-server (18.16) is not installed")


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return bool(rep is not None and rep.failed)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    if not zk_support.available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.kill()  # nothing to flush: the data dir is thrown away


@pytest.fixture
def zk_root(zookeeper: ZooKeeperServer, request: pytest.FixtureRequest) -> Iterator[str]:
    if not zookeeper.running:  # a previous test may have killed it
        zookeeper.start()
    root = zookeeper.new_chroot(request.node.name)
    yield root
    if _failed(request) and zookeeper.running:
        try:
            print(f"\n--- ZooKeeper tree under {root} ---\n{zookeeper.dump_tree(root)}")
        except Exception as e:  # diagnostics only
            print(f"(could not dump ZooKeeper tree: {e})")


@pytest.fixture
def zk_hosts(zookeeper: ZooKeeperServer, zk_root: str) -> str:
    return zookeeper.hosts + zk_root


@pytest_asyncio.fixture
async def keeper(zookeeper: ZooKeeperServer, zk_root: str) -> AsyncIterator[Any]:
    from replicad.keeper.client import Keeper

    k = Keeper(zookeeper.hosts, session_timeout_s=10.0, chroot=zk_root)
    await k.start()
    try:
        yield k
    finally:
        await k.close()


@pytest.fixture
def clickhouse_factory(
    zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ClickHouseServer]]:
    """``factory(replica="r1", start=True, **ClickHouseServer kwargs) -> ClickHouseServer``."""
    if not ch_support.available():
        pytest.skip("clickhouse-server (18.16) is not installed")
    servers: list[ClickHouseServer] = []

    def factory(replica: str = "r1", *, start: bool = True, **kwargs: Any) -> ClickHouseServer:
        kwargs.setdefault("zookeeper", zookeeper.hosts)
        kwargs.setdefault("zookeeper_root", zk_root)
        server = ClickHouseServer(tmp_path / f"clickhouse-{replica}", replica=replica, **kwargs)
        servers.append(server)
        if start:
            server.start()
        return server

    yield factory
    if _failed(request):
        for s in servers:
            print(f"\n--- {s.replica}: {s.err_log_path} (tail) ---")
            print(ch_support.process.tail(s.err_log_path, 30))
    if servers:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers))
