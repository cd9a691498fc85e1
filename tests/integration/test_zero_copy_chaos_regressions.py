"""Regressions found by the chaos suite's S3 runs (tests/chaos, ``make chaos S3=K``), on a real ZooKeeper and
a real S3-compatible server (moto).

* seed 101 (a ZooKeeper leader kill during a zero-copy fetch): the fetch's commit failed with a connection
  loss, and so did the removal of its ephemeral lock leaf in the rollback. The error escaped the rollback:
  the fetched part's directory stayed behind (every later fetch failed with "part directory already
  exists"), and the leaf stayed too — its session survived the reconnect — so every later zero-copy fetch
  found "an ephemeral lock exists already". The replica never got the part.
* seed 102 (kill -9 during a mutation, then a ZooKeeper partition): the mover's lock multi for a local part
  timed out but had been applied; the mover rolled back (deleting the fresh objects) and left a lock leaf
  for an instance it no longer had.
* seed 103 (DROP PARTITION while two replicas were fetching a new part): the last holder let go while the
  fetches held ephemeral leaves, so it kept the objects; the fetches ended, the id node stayed with no leaf,
  and the orphan scan counted its instance as locked: the objects were kept for good.
* seed 35 (kill -9 of every replica, a ZooKeeper partition, local copies wiped): a mutation stayed postponed
  on every replica ("zero-copy exclusive lock is held by …"); an exclusive lock whose removal failed on a
  lost connection stays while its session survives the reconnect, and nobody — its holder included — makes
  the part.  (The run's data was not kept: this is the shape the symptom fits; the leak itself is shown.)
"""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError, KeeperOperationTimeoutError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Op
from replicad.replica import TableReplica
from replicad.replication.zero_copy import RemoteParts
from replicad.replication.zero_copy_scan import OrphanScan
from tests.support.s3_server import S3Server
from tests.support.table_cluster import Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ZERO_COPY: dict[str, Any] = {"storage_policy": "s3", "allow_remote_fs_zero_copy_replication": 1}
PREFIX = "data/"


async def start(cluster: Cluster, s3: S3Server, name: str, bucket: str = "leak") -> TableReplica:
    disk = s3.disk(cluster.tmp_path / name, bucket, PREFIX)
    return await cluster.start(name, ZERO_COPY, disks={"s3main": disk}, storage_policies={"s3": "s3main"})


def remote(replica: TableReplica) -> RemoteParts:
    assert replica.store.remote is not None
    return replica.store.remote


class FlakyDeletes:
    """The replica's Keeper, whose first delete of a path ending in ``suffix`` fails (a connection loss)."""

    def __init__(self, keeper: Keeper, suffix: str) -> None:
        self._keeper = keeper
        self._suffix = suffix
        self.failed: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._keeper, name)

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        if path.endswith(self._suffix) and not self.failed:
            self.failed.append(path)
            raise KeeperConnectionLossError(f"delete {path}: not connected to ZooKeeper (injected)")
        await self._keeper.delete(path, version=version, recursive=recursive)


async def test_a_fetch_lock_whose_removal_failed_does_not_block_the_part(
    cluster: Cluster, keeper: Keeper, s3: S3Server
) -> None:
    s3.client("leak", PREFIX)
    r1 = await start(cluster, s3, "r1")
    await r1.insert_table(rows(range(300)))
    [part] = r1.store.active_names()
    r2 = await start(cluster, s3, "r2")
    locks = remote(r2).locks
    assert locks is not None
    flaky = FlakyDeletes(locks.keeper, "/r2")
    locks.keeper = flaky  # type: ignore[assignment]
    real_commit = r2.fetcher._commit_to_zookeeper
    commits: list[str] = []

    async def commit_loses_the_connection_once(part_name: str, *args: Any, **kwargs: Any) -> Any:
        if not commits:
            commits.append(part_name)
            raise KeeperConnectionLossError("multi: not connected to ZooKeeper (injected)")
        return await real_commit(part_name, *args, **kwargs)

    r2.fetcher._commit_to_zookeeper = commit_loses_the_connection_once  # type: ignore[method-assign]
    await wait_for(lambda: r2.store.active_names() == [part], timeout=60, what="r2 has the part")
    assert commits == [part] and len(flaky.failed) == 1  # both faults happened
    uid = remote(r1).instances[part].unique_id
    assert remote(r2).instances[part].unique_id == uid  # zero-copy after all: the same instance
    leaf = await keeper.exists(locks.leaf_path(part, uid))
    assert leaf is not None and leaf.ephemeral_owner == 0  # r2's lock is the committed, persistent one
    assert locks.leaked == set()
    assert await sorted_rows(r2) == await sorted_rows(r1)


async def test_a_mover_lock_multi_applied_despite_a_timeout_is_kept(
    cluster: Cluster, keeper: Keeper, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3.client("moves", PREFIX)
    r1 = await cluster.start("r1")
    await r1.insert_table(rows(range(400)))
    [part] = r1.store.active_names()
    expected = await sorted_rows(r1)
    await cluster.stop("r1")
    real_multi = Keeper.multi
    timeouts: list[str] = []

    async def applied_but_timed_out(self: Keeper, ops: list[Op]) -> Any:
        result = await real_multi(self, ops)
        if not timeouts and ops and isinstance(ops[0], Check) and "/replicas/r1/parts/" in ops[0].path:
            timeouts.append(ops[0].path)
            raise KeeperOperationTimeoutError("multi: no answer in 5.0s (injected, after it was applied)")
        return result

    monkeypatch.setattr(Keeper, "multi", applied_but_timed_out)
    r1 = await start(cluster, s3, "r1", "moves")  # an S3 policy now: the mover puts the part on the disk
    await wait_for(lambda: part in remote(r1).instances and remote(r1).instances[part].committed,
                   what="the part moved to the disk")
    assert len(timeouts) == 1
    uid = remote(r1).instances[part].unique_id
    locks = remote(r1).locks
    assert locks is not None
    leaves = {leaf.relative_path() for leaf in await locks.leaves()}
    assert leaves == {f"{part}/{uid.replace('/', '_')}/r1"}  # one instance, locked once
    keys = {o.key for o in s3.client("moves", PREFIX).list_sync(PREFIX)}
    meta = remote(r1).disk.read_metadata_sync(remote(r1).metadata_dir(part))
    assert {remote(r1).disk.full_key(k) for k in meta.keys()} == keys  # its objects are all there
    assert r1.mover.moved_total == 1
    assert await sorted_rows(r1) == expected


async def test_an_instance_whose_last_lock_was_a_fetch_is_deleted_by_the_orphan_scan(
    cluster: Cluster, keeper: Keeper, s3: S3Server
) -> None:
    s3.client("empty", PREFIX)
    r1 = await start(cluster, s3, "r1", "empty")
    await r1.insert_table(rows(range(100)))
    [part] = r1.store.active_names()
    locks = remote(r1).locks
    assert locks is not None
    uid = remote(r1).instances[part].unique_id
    fetch_leaf = locks.leaf_path(part, uid, "r9")
    await keeper.create(fetch_leaf, b"", ephemeral=True)  # another replica's fetch is under way
    assert not await remote(r1).release(part)  # r1 lets go: not the last holder, the objects stay
    await keeper.delete(fetch_leaf)  # the fetch ends (or its replica dies): nobody holds the instance
    assert await keeper.exists(locks.id_path(part, uid)) is not None  # an id node without a leaf
    keys = {o.key for o in s3.client("empty", PREFIX).list_sync(PREFIX)}
    assert keys  # kept: nobody will ever delete them but the scan
    scan = OrphanScan(remote(r1), 60, grace_s=0)
    result = await scan.scan()
    assert set(result.orphans) == keys
    # (r1's mover may upload its still active local part again meanwhile: a new instance, other keys)
    assert not keys & {o.key for o in s3.client("empty", PREFIX).list_sync(PREFIX)}
    assert await keeper.exists(locks.id_path(part, uid)) is None


async def test_an_exclusive_lock_whose_removal_failed_is_taken_again(
    cluster: Cluster, keeper: Keeper, s3: S3Server
) -> None:
    s3.client("excl", PREFIX)
    r1 = await start(cluster, s3, "r1", "excl")
    locks = remote(r1).locks
    assert locks is not None
    assert await locks.try_exclusive("all_1_2_1") is None  # r1 merges all_1_2_1
    flaky = FlakyDeletes(locks.keeper, "/part_exclusive_lock")
    locks.keeper = flaky  # type: ignore[assignment]
    await locks.release_exclusive("all_1_2_1")  # the connection is lost: not removed (and no error)
    assert len(flaky.failed) == 1
    path = f"{locks.part_path('all_1_2_1')}/part_exclusive_lock"
    assert await keeper.exists(path) is not None  # still there: its session is alive
    assert await locks.try_exclusive("all_1_2_1") is None  # r1 takes it again instead of waiting for itself
    await locks.release_exclusive("all_1_2_1")
    assert await keeper.exists(path) is None
    # a leaked one is also removed by the mover's next run, before anyone asks for it
    assert await locks.try_exclusive("all_3_4_1") is None
    flaky.failed.clear()
    await locks.release_exclusive("all_3_4_1")
    await r1.mover.run_once()
    assert await keeper.exists(f"{locks.part_path('all_3_4_1')}/part_exclusive_lock") is None
    assert locks.leaked == set()
