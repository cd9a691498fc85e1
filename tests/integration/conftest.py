"""Fixtures of the integration tests (the session-wide ZooKeeper and the rest are in ``tests/conftest.py``).

- ``cluster`` (function, async): an empty :class:`tests.support.table_cluster.Cluster` (in-process replicad
  replicas of ``db.events`` on the test ZooKeeper, data under ``tmp_path/<replica>``); every replica
  started through it is stopped after the test.
- ``s3`` (module): a moto S3 server on loopback (tests/support/s3_server.py); ``chaos_ensemble`` (module): the
  fault suite's 3-node ZooKeeper ensemble (skips without ZooKeeper).
- ``zk`` (function): a kazoo client on the test's ZooKeeper root with the distributed DDL queue
  (``/clickhouse/task_queue/ddl``) made, stopped after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kazoo.client import KazooClient

from replicad.devtools.zookeeper import ZooKeeperServer, available
from tests.chaos.ensemble import Ensemble
from tests.support.s3_server import S3Server
from tests.support.table_cluster import Cluster


@pytest_asyncio.fixture
async def cluster(zookeeper: ZooKeeperServer, zk_root: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(zookeeper, zk_root, tmp_path)
    try:
        yield c
    finally:
        await c.close()


DDL_QUEUE = "/clickhouse/task_queue/ddl"


@pytest.fixture
def zk(zookeeper: ZooKeeperServer, zk_root: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.hosts + zk_root)
    client.start(15)
    client.ensure_path(DDL_QUEUE)
    try:
        yield client
    finally:
        client.stop()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server.start(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chaos_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    if not available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    e = Ensemble(tmp_path_factory.mktemp("chaos-zk"))
    e.start()
    try:
        yield e
    finally:
        e.stop()
