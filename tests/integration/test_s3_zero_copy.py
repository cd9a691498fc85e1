"""S3 disks and zero-copy replication on a real ZooKeeper and a real S3-compatible server (moto, loopback).

What is asserted is what exists: objects in the bucket, ClickHouse-format metadata files on disk, lock
leaves in ZooKeeper, rows read back."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from replicad.keeper.client import Keeper
from replicad.model.remote_metadata import RemoteMetadata
from replicad.replica import TableReplica
from replicad.replication import merge_executor, zero_copy_scan
from replicad.replication.zero_copy import RemoteParts
from replicad.replication.zero_copy_scan import OrphanScan
from replicad.service import Statement, StatementKind
from replicad.sql.statements import parse_statement
from replicad.storage.disk_s3 import S3Disk
from tests.support.s3_server import S3Server
from tests.support.table_cluster import TABLE, ZK_PATH, Cluster, rows, sorted_rows, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ZERO_COPY: dict[str, Any] = {"storage_policy": "s3", "allow_remote_fs_zero_copy_replication": 1}
PREFIX = "data/"


@pytest.fixture
def bucket(s3: S3Server, request: pytest.FixtureRequest) -> str:
    name = "b" + request.node.name.lower().replace("_", "-")[-40:].strip("-")
    s3.client(name, PREFIX)
    return name


async def start(cluster: Cluster, s3: S3Server, bucket: str, name: str,
                settings: dict[str, Any] | None = None) -> TableReplica:
    disk = s3.disk(cluster.tmp_path / name, bucket, PREFIX)
    return await cluster.start(name, {**ZERO_COPY, **(settings or {})}, disks={"s3main": disk},
                               storage_policies={"s3": "s3main"})


def remote(replica: TableReplica) -> RemoteParts:
    assert replica.store.remote is not None
    return replica.store.remote


def bucket_keys(s3: S3Server, bucket: str) -> set[str]:
    return {o.key for o in s3.client(bucket, PREFIX).list_sync(PREFIX)}


def referenced_keys(replica: TableReplica) -> set[str]:
    rp = remote(replica)
    out: set[str] = set()
    for name in rp.instances:
        out |= {rp.disk.full_key(k) for k in rp.disk.read_metadata_sync(rp.metadata_dir(name)).keys()}
    return out


async def lock_leaves(keeper: Keeper, replica: TableReplica) -> set[str]:
    locks = remote(replica).locks
    assert locks is not None
    return {leaf.relative_path() for leaf in await locks.leaves()}


async def test_insert_writes_objects_metadata_and_lock(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(100)))
    [part] = r1.store.active_names()
    rp = remote(r1)
    meta_dir = rp.metadata_dir(part)
    local = sorted(p.name for p in r1.layout.part_path(part).iterdir())
    assert sorted(p.name for p in meta_dir.iterdir()) == local  # one metadata file per file of the part
    keys = set()
    for name in local:
        text = (meta_dir / name).read_bytes()
        assert text.startswith(b"3\n1\t")  # ClickHouse's current version, one object
        meta = RemoteMetadata.parse(text, PREFIX)
        assert meta.objects[0].size == (r1.layout.part_path(part) / name).stat().st_size
        keys.add(PREFIX + meta.objects[0].key)
    assert bucket_keys(s3, bucket) == keys
    # the object bytes are the file bytes
    uid = rp.instances[part].unique_id
    local_checksums = (r1.layout.part_path(part) / "checksums.txt").read_bytes()
    assert s3.client(bucket, PREFIX).get_bytes_sync(uid) == local_checksums
    shared_id = (await keeper.get(f"{ZK_PATH}/table_shared_id"))[0].decode()
    leaf = f"/clickhouse/zero_copy/zero_copy_s3/{shared_id}/{part}/{uid.replace('/', '_')}/r1"
    assert await keeper.exists(leaf) is not None
    assert await keeper.exists(f"{ZK_PATH}/zero_copy_s3/shared") is not None


async def test_part_is_read_back_from_the_bucket(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(50)))
    await r1.insert_table(rows(range(50, 80)))
    expected = await sorted_rows(r1)
    names = r1.store.active_names()
    await cluster.stop("r1")
    for name in names:  # the local copies are gone: only the metadata and the bucket remain
        shutil.rmtree(cluster.tmp_path / "r1" / "data" / "db" / "events" / name)
    r1 = await start(cluster, s3, bucket, "r1")
    assert r1.store.active_names() == names
    assert await sorted_rows(r1) == expected
    assert len(expected) == 80


async def test_removal_unlocks_and_the_last_holder_deletes(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    fast = {"old_parts_lifetime": 0, "cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}
    r1 = await start(cluster, s3, bucket, "r1", fast)
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3]))
    await wait_for(lambda: r1.puller.log_pointer == 2 and not len(r1.queue_state), what="the log pulled")
    before = bucket_keys(s3, bucket)
    await cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL")
    await wait_for(lambda: r1.store.active_names() == ["202611_0_1_1"], what="the merge")
    # (the instance is forgotten first, its objects deleted after its lock is gone: wait for both)
    await wait_for(lambda: sorted(remote(r1).instances) == ["202611_0_1_1"]
                   and not (before & bucket_keys(s3, bucket)), timeout=30,
                   what="the sources released and their objects deleted")
    after = bucket_keys(s3, bucket)
    assert after == referenced_keys(r1)
    assert {leaf.split("/")[0] for leaf in await lock_leaves(keeper, r1)} == {"202611_0_1_1"}
    assert sorted(r["id"] for r in await sorted_rows(r1)) == [1, 2, 3]


async def test_fetch_between_replicas_sharing_the_bucket_moves_metadata_only(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    r1 = await start(cluster, s3, bucket, "r1")
    r2 = await start(cluster, s3, bucket, "r2")
    await r1.insert_table(rows(range(1000)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    assert r2.fetcher.zero_copy_fetches == 1
    assert cluster.servers["r1"].zero_copy_sends == 1
    uid = remote(r1).instances[part].unique_id
    assert remote(r2).instances[part].unique_id == uid  # the same instance: no second copy
    assert bucket_keys(s3, bucket) == referenced_keys(r1) == referenced_keys(r2)
    id_node = uid.replace("/", "_")
    assert await lock_leaves(keeper, r1) == {f"{part}/{id_node}/r1", f"{part}/{id_node}/r2"}
    # r2's leaf is persistent now (the fetch's ephemeral one was swapped in the commit multi)
    stat = await keeper.exists(remote(r2).locks.leaf_path(part, uid))  # type: ignore[union-attr]
    assert stat is not None and stat.ephemeral_owner == 0
    assert await sorted_rows(r2) == await sorted_rows(r1)
    # r2's metadata files are the same texts (ClickHouse's format, ref count 0)
    for f in remote(r1).metadata_dir(part).iterdir():
        assert (remote(r2).metadata_dir(part) / f.name).read_bytes() == f.read_bytes()


async def test_fetch_racing_the_senders_commit_answer_is_still_zero_copy(
    cluster: Cluster, s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r2 can pull the log entry and ask r1 for the part before r1 has handled its own commit multi's
    answer (CI saw it once): r1 must wait for that answer and send metadata, not a second copy."""
    r1 = await start(cluster, s3, bucket, "r1")
    r2 = await start(cluster, s3, bucket, "r2")
    keeper = cluster.keepers["r1"]
    real_multi = keeper.multi

    async def answer_handled_late(ops: Any) -> Any:
        result = await real_multi(ops)
        await asyncio.sleep(1.0)  # the multi is applied: r2 sees the log entry meanwhile
        return result

    monkeypatch.setattr(keeper, "multi", answer_handled_late)
    await r1.insert_table(rows(range(1000)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    assert r2.fetcher.zero_copy_fetches == 1
    assert cluster.servers["r1"].zero_copy_sends == 1
    assert remote(r2).instances[part].unique_id == remote(r1).instances[part].unique_id
    assert bucket_keys(s3, bucket) == referenced_keys(r1) == referenced_keys(r2)


async def test_without_zero_copy_each_replica_keeps_its_own_objects(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    own = {"allow_remote_fs_zero_copy_replication": 0}
    r1 = await start(cluster, s3, bucket, "r1", own)
    r2 = await start(cluster, s3, bucket, "r2", own)
    await r1.insert_table(rows(range(10)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    assert r2.fetcher.zero_copy_fetches == 0
    k1, k2 = referenced_keys(r1), referenced_keys(r2)
    assert k1 and k2 and not (k1 & k2)
    assert bucket_keys(s3, bucket) == k1 | k2
    assert await keeper.exists("/clickhouse/zero_copy") is None


async def test_race_source_deletes_before_the_receiver_locks(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """Seed 003's first race: the source sent the metadata, then let the part go (last holder: objects
    deleted) before the receiver locked.  The receiver's lock needs the id node, which is gone: it falls back
    to a full fetch and keeps its own instance; nothing it references is missing, nothing is orphaned."""
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(200)))
    [part] = r1.store.active_names()
    first_instance = referenced_keys(r1)
    r2 = await start(cluster, s3, bucket, "r2")
    r2_locks = remote(r2).locks
    assert r2_locks is not None
    real_lock = r2_locks.lock_temporary
    released: list[bool] = []

    async def source_lets_go_first(part_name: str, unique_id: str) -> bool:
        if not released:  # the first attempt only (an early download and the queue may both try)
            released.append(await remote(r1).release(part_name))  # r1's removal of its last lock
        return await real_lock(part_name, unique_id)

    r2_locks.lock_temporary = source_lets_go_first  # type: ignore[method-assign]
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 has the part")
    assert released == [True]  # r1 was the last holder: it deleted the objects
    assert r2.fetcher.zero_copy_fetches == 0  # the zero-copy attempt was refused, the data was fetched
    keys = bucket_keys(s3, bucket)
    assert referenced_keys(r2) <= keys  # nothing r2 uses is missing
    assert not (first_instance & keys)  # r1's instance is gone for good
    # (r1 kept its local part: its mover puts it on the disk again, as a new instance or r2's)
    await wait_for(lambda: part in remote(r1).instances and remote(r1).instances[part].committed,
                   what="r1's part back on the disk")
    assert bucket_keys(s3, bucket) == referenced_keys(r1) | referenced_keys(r2)  # no orphan
    uid2 = remote(r2).instances[part].unique_id
    assert f"{part}/{uid2.replace('/', '_')}/r2" in await lock_leaves(keeper, r2)
    assert len(await sorted_rows(r2)) == 200


async def test_race_source_lets_go_after_the_receiver_locked(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """The other order: the receiver's ephemeral lock is in place when the source lets go, so the source is
    not the last holder and keeps the objects; the receiver completes the zero-copy fetch."""
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(200)))
    [part] = r1.store.active_names()
    keys_before = bucket_keys(s3, bucket)
    r2 = await start(cluster, s3, bucket, "r2")
    disk2 = remote(r2).disk
    real_materialize = disk2.materialize_sync
    released: list[bool] = []

    def source_lets_go_now(meta_dir: Any, dest: Any) -> int:  # runs in a worker thread
        if not released:  # the first attempt only
            released.append(asyncio.run_coroutine_threadsafe(remote(r1).release(part), loop).result(30))
        return real_materialize(meta_dir, dest)

    loop = asyncio.get_running_loop()
    disk2.materialize_sync = source_lets_go_now  # type: ignore[method-assign]
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 has the part")
    assert released == [False]  # r2's ephemeral leaf held the instance
    assert r2.fetcher.zero_copy_fetches == 1
    assert bucket_keys(s3, bucket) == keys_before == referenced_keys(r2)
    uid = remote(r2).instances[part].unique_id
    assert f"{part}/{uid.replace('/', '_')}/r2" in await lock_leaves(keeper, r2)
    # r1 kept its local part: its mover adopts r2's instance again, nothing is uploaded twice
    await wait_for(lambda: part in remote(r1).instances and remote(r1).instances[part].committed,
                   what="r1's part back on the disk")
    assert bucket_keys(s3, bucket) == keys_before == referenced_keys(r1)
    assert len(await sorted_rows(r2)) == 200


async def shared_part_then_r2_killed(cluster: Cluster, s3: S3Server, bucket: str) -> tuple[TableReplica, str]:
    """r1 and r2 share one part on the zero-copy disk (r2 fetched it), then r2 dies (its locks stay)."""
    r1 = await start(cluster, s3, bucket, "r1")
    r2 = await start(cluster, s3, bucket, "r2")
    await r1.insert_table(rows(range(30)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")

    def shared() -> bool:  # r2 holds r1's very instance (an in-process kill cannot stop an upload's thread)
        mine, theirs = remote(r1).instances.get(part), remote(r2).instances.get(part)
        if mine is None or theirs is None:
            return False
        return theirs.committed and theirs.unique_id == mine.unique_id

    await wait_for(shared, what="r2 shares r1's instance")
    await cluster.kill("r2")
    return r1, part


async def test_race_replica_removed_while_holding_locks(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """A replica that goes away for good leaves lock leaves behind; releasing them (ZeroCopyLocks.
    release_replica, the lost-replica path) must not delete objects another replica holds, and once the last
    live holder lets go, the objects go too: nothing lost, nothing orphaned."""
    r1, part = await shared_part_then_r2_killed(cluster, s3, bucket)
    locks = remote(r1).locks
    assert locks is not None
    released = await locks.release_replica("r2")
    assert [(p, last) for p, _i, last in released] == [(part, False)]  # r1 still holds it: objects stay
    assert bucket_keys(s3, bucket) == referenced_keys(r1)
    assert await remote(r1).release(part)  # r1 is now the last holder: it deletes
    assert bucket_keys(s3, bucket) == set(), f"left behind: {sorted(bucket_keys(s3, bucket))}"
    assert await locks.leaves() == []


def drop_replica_statement(name: str) -> Statement:
    sql = f"SYSTEM DROP REPLICA '{name}' FROM TABLE db.events"
    return Statement(StatementKind.DROP_REPLICA, TABLE, sql, parsed=parse_statement(sql))


async def test_drop_replica_releases_its_locks_and_the_last_holder_deletes(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """SYSTEM DROP REPLICA of a dead replica that shared a part: its leaves go, the objects stay for r1; when
    r1 lets go of the table (DROP TABLE's release), the bucket and the lock tree are empty."""
    r1, part = await shared_part_then_r2_killed(cluster, s3, bucket)
    await wait_for(lambda: _is_none(keeper.exists(f"{ZK_PATH}/replicas/r2/is_active")), what="r2 inactive")
    await r1.execute(drop_replica_statement("r2"))
    uid = remote(r1).instances[part].unique_id
    assert await lock_leaves(keeper, r1) == {f"{part}/{uid.replace('/', '_')}/r1"}
    assert bucket_keys(s3, bucket) == referenced_keys(r1)
    assert len(await sorted_rows(r1)) == 30
    locks = remote(r1).locks
    assert locks is not None
    await cluster.stop("r1")
    locks.keeper = keeper  # as DROP TABLE does it: table stopped, the daemon's session still open
    assert await remote(r1).release_all() > 0
    assert bucket_keys(s3, bucket) == set()
    assert await keeper.exists(locks.base) is None


async def test_drop_replica_that_held_an_instance_alone_deletes_it(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """Seed 003's last race: a replica removed while holding locks.  r2 alone held its part's instance; once
    it is dropped nobody can lock that instance again, so its objects go (no orphan)."""
    r2 = await start(cluster, s3, bucket, "r2")
    await r2.insert_table(rows(range(30)))
    assert bucket_keys(s3, bucket)
    await cluster.kill("r2")
    r1 = await start(cluster, s3, bucket, "r1")
    await wait_for(lambda: _is_none(keeper.exists(f"{ZK_PATH}/replicas/r2/is_active")), what="r2 inactive")
    await r1.execute(drop_replica_statement("r2"))
    assert await lock_leaves(keeper, r1) == set()
    assert bucket_keys(s3, bucket) == set()
    assert remote(r1).objects_deleted > 0


async def _is_none(aw: Any) -> bool:
    return (await aw) is None


async def test_race_merging_node_dies_mid_merge(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 003's second race.  r1 takes the merge's exclusive lock and dies mid-merge: r2 waits while the
    lock is held (it does not merge a second copy), then makes the part itself once the lock is gone; r1,
    back, fetches the result (metadata only).  After cleanup the bucket holds exactly the merged instance."""
    fast = {"old_parts_lifetime": 0, "cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}
    r1 = await start(cluster, s3, bucket, "r1", fast)
    r2 = await start(cluster, s3, bucket, "r2", fast)
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3]))
    await wait_for(lambda: len(r2.store.active_names()) == 2, what="r2 has both parts")
    merged = "202611_0_1_1"
    gate = threading.Event()
    real_merge = merge_executor.merge_parts

    def merge_blocking_on_r1(sources: Any, tmp_dir: Path, *a: Any) -> Any:
        if "/r1/" in str(tmp_dir):
            gate.wait(30)  # r1 "dies" while this merge runs
        return real_merge(sources, tmp_dir, *a)

    monkeypatch.setattr(merge_executor, "merge_parts", merge_blocking_on_r1)
    locks = remote(r1).locks
    assert locks is not None
    exclusive = f"{locks.part_path(merged)}/part_exclusive_lock"
    r2_locks = remote(r2).locks
    assert r2_locks is not None
    real_try = r2_locks.try_exclusive

    async def r1_goes_first(part: str) -> str | None:
        r2_locks.try_exclusive = real_try  # type: ignore[method-assign]
        await wait_for(lambda: keeper.exists(exclusive), what="r1 holds the exclusive lock")
        return await real_try(part)

    r2_locks.try_exclusive = r1_goes_first  # type: ignore[method-assign]
    await wait_for(lambda: r1.puller.log_pointer == 2 and not len(r1.queue_state), what="r1 idle")
    optimize = asyncio.create_task(cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL"))  # it waits
    await wait_for(lambda: keeper.exists(exclusive), what="r1 holds the exclusive lock")
    assert (await keeper.get(exclusive))[0] == b"r1"
    await wait_for(lambda: cluster.ops["r2"].producer.zero_copy_postponed_total > 0, what="r2 waits")
    assert merged not in r2.store.active_names()
    fetches_before = r2.fetcher.fetches_total
    kill = asyncio.create_task(cluster.kill("r1"))
    await asyncio.sleep(0.5)
    gate.set()
    await kill
    await asyncio.gather(optimize, return_exceptions=True)
    await wait_for(lambda: r2.store.active_names() == [merged], timeout=90, what="r2 made the part")
    assert r2.fetcher.fetches_total == fetches_before  # made on r2, not fetched
    r1 = await start(cluster, s3, bucket, "r1", fast)
    await wait_for(lambda: r1.store.active_names() == [merged], what="r1 fetched the part")
    assert r1.fetcher.zero_copy_fetches == 1
    await wait_for(lambda: bucket_keys(s3, bucket) == referenced_keys(r1) == referenced_keys(r2), timeout=60,
                   what="the sources' objects deleted")
    uid = remote(r2).instances[merged].unique_id
    assert remote(r1).instances[merged].unique_id == uid
    assert await lock_leaves(keeper, r1) == {f"{merged}/{uid.replace('/', '_')}/{r}" for r in ("r1", "r2")}
    assert sorted(r["id"] for r in await sorted_rows(r1)) == [1, 2, 3]


async def test_orphan_scan_deletes_only_unlocked_unreferenced_objects(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str, tmp_path: Path
) -> None:
    """An upload whose commit never happened (crash between the two) leaves objects no lock and no metadata
    references: the scan deletes exactly those, once older than the grace period; a shared part's objects
    and keys of another shape stay."""
    r1 = await start(cluster, s3, bucket, "r1")
    r2 = await start(cluster, s3, bucket, "r2")
    await r1.insert_table(rows(range(100)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    disk = remote(r1).disk
    crashed_meta = tmp_path / "crashed" / part
    crashed_meta.parent.mkdir()
    await asyncio.to_thread(disk.offload_sync, r1.layout.part_path(part), crashed_meta)
    orphans = {disk.full_key(k) for k in disk.read_metadata_sync(crashed_meta).keys()}
    disk.client.put_bytes_sync("data/foreign-object", b"x")  # not replicad's key shape: never touched
    live = referenced_keys(r1)
    assert bucket_keys(s3, bucket) == live | orphans | {"data/foreign-object"}
    patient = OrphanScan(remote(r2), 60)  # default grace: the fresh orphans are too young to judge
    assert (await patient.scan()).orphans == []
    scan = OrphanScan(remote(r2), 60, grace_s=0)
    outcome = await scan.run_once()
    assert outcome.name == "orphans_deleted"
    assert scan.last is not None and set(scan.last.orphans) == orphans and scan.last.foreign == 1
    assert bucket_keys(s3, bucket) == live | {"data/foreign-object"}
    assert await sorted_rows(r2) == await sorted_rows(r1)
    assert (await scan.run_once()).name == "scanned"  # nothing left to delete


async def test_orphan_scan_judges_ages_on_the_s3_clock_not_a_skewed_local_one(
    cluster: Cluster, s3: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose clock runs a day ahead sees every object as a day old.  An upload still on its way to
    its commit (objects in the bucket, no lock, no metadata yet) must stay: its age is what the S3 server's
    clock, which stamped it, says.  Judged on the local clock, it was deleted at once."""
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(10)))
    [part] = r1.store.active_names()
    disk = remote(r1).disk
    in_flight = tmp_path / "in-flight" / part
    in_flight.parent.mkdir()
    await asyncio.to_thread(disk.offload_sync, r1.layout.part_path(part), in_flight)
    uploading = {disk.full_key(k) for k in disk.read_metadata_sync(in_flight).keys()}
    real_time = time.time
    monkeypatch.setattr(zero_copy_scan.time, "time", lambda: real_time() + 86400)  # the replica's clock
    scan = OrphanScan(remote(r1), 60, grace_s=600)
    assert (await scan.scan()).orphans == []
    assert uploading <= bucket_keys(s3, bucket)
    monkeypatch.setattr(zero_copy_scan.time, "time", real_time)
    assert set((await OrphanScan(remote(r1), 60, grace_s=0).scan()).orphans) == uploading  # really orphans


async def test_race_two_movers_at_once(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 003's third race.  Two replicas hold the same local part and both restart with the S3 policy at
    once: the part's exclusive lock lets one upload it; the other postpones, then adopts that instance (its
    metadata, through a zero-copy request).  One instance in the bucket, locked by both."""
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(500)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    expected = await sorted_rows(r1)
    await cluster.stop("r1")
    await cluster.stop("r2")
    assert bucket_keys(s3, bucket) == set()
    other_postponed = threading.Event()
    uploads: list[str] = []
    real_offload = S3Disk.offload_sync

    def slow_first_upload(disk: S3Disk, part_dir: Path, metadata_dir: Path) -> str:
        uploads.append(str(part_dir))
        if len(uploads) == 1:  # the first mover is still uploading when the second one comes
            other_postponed.wait(30)
        return real_offload(disk, part_dir, metadata_dir)

    monkeypatch.setattr(S3Disk, "offload_sync", slow_first_upload)
    r1, r2 = await asyncio.gather(start(cluster, s3, bucket, "r1"), start(cluster, s3, bucket, "r2"))
    await wait_for(lambda: r1.mover.postponed_total + r2.mover.postponed_total > 0, what="a mover waits")
    other_postponed.set()
    await wait_for(lambda: part in remote(r1).instances and part in remote(r2).instances
                   and remote(r1).instances[part].committed and remote(r2).instances[part].committed,
                   what="both moved the part")
    movers = [r1.mover, r2.mover]
    assert len(uploads) == 1  # one upload in all
    assert sorted((m.moved_total, m.adopted_total) for m in movers) == [(0, 1), (1, 0)]
    uid = remote(r1).instances[part].unique_id
    assert remote(r2).instances[part].unique_id == uid
    assert bucket_keys(s3, bucket) == referenced_keys(r1) == referenced_keys(r2)
    assert await lock_leaves(keeper, r1) == {f"{part}/{uid.replace('/', '_')}/{r}" for r in ("r1", "r2")}
    assert await sorted_rows(r1) == await sorted_rows(r2) == expected


async def test_a_part_whose_objects_are_gone_does_not_stop_the_table(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """Local copies lost and one part's objects gone too: the table starts with the part it can rebuild; the
    other one's metadata is dropped (the replicas hold it, or it was let go)."""
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows(range(10)))
    await r1.insert_table(rows(range(10, 15)))
    kept, lost = r1.store.active_names()
    rp = remote(r1)
    lost_keys = [rp.disk.full_key(k) for k in rp.disk.read_metadata_sync(rp.metadata_dir(lost)).keys()]
    await cluster.stop("r1")
    for name in (kept, lost):
        shutil.rmtree(cluster.tmp_path / "r1" / "data" / "db" / "events" / name)
    s3.client(bucket, PREFIX).delete_sync(lost_keys)
    r1 = await start(cluster, s3, bucket, "r1")
    assert r1.store.active_names() == [kept]
    assert sorted(remote(r1).instances) == [kept]
    assert not remote(r1).metadata_dir(lost).exists()
    assert sorted(r["id"] for r in await sorted_rows(r1)) == list(range(10))


async def test_mutation_is_made_once_and_shared(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str
) -> None:
    """ALTER DELETE on a zero-copy table: one replica mutates the part under the exclusive lock, the other
    fetches the result's metadata; one instance of the new part, the old one's objects deleted."""
    fast = {"old_parts_lifetime": 0, "cleanup_delay_period": 1, "cleanup_delay_period_random_add": 0}
    r1 = await start(cluster, s3, bucket, "r1", fast)
    r2 = await start(cluster, s3, bucket, "r2", fast)
    await r1.insert_table(rows(range(20)))
    [part] = r1.store.active_names()
    await wait_for(lambda: r2.store.active_names() == [part], what="r2 fetched the part")
    await cluster.execute("r1", "ALTER TABLE db.events DELETE WHERE id < 5")
    mutated = "202611_0_0_0_1"
    for r in (r1, r2):
        await wait_for(lambda r=r: r.store.active_names() == [mutated], what="the mutated part")  # type: ignore[misc]
    assert remote(r1).instances[mutated].unique_id == remote(r2).instances[mutated].unique_id
    assert r1.fetcher.zero_copy_fetches + r2.fetcher.zero_copy_fetches == 2  # the first part + the result
    await wait_for(lambda: bucket_keys(s3, bucket) == referenced_keys(r1) == referenced_keys(r2), timeout=60,
                   what="the old part's objects deleted")
    assert sorted(r["id"] for r in await sorted_rows(r2)) == list(range(5, 20))


def test_big_files_are_uploaded_in_parts(s3: S3Server, bucket: str, tmp_path: Path) -> None:
    """A file above multipart_threshold goes up as a multipart upload (ETag '<md5>-<parts>') and reads back
    byte for byte; a missing key is NoSuchKeyError (a HEAD answers None)."""
    from replicad.s3 import NoSuchKeyError, S3Client, S3Endpoint

    client = S3Client(S3Endpoint.parse(s3.endpoint(bucket, PREFIX)), "testing", "testing",
                      multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    data = os.urandom(12 << 20)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    assert client.put_file_sync("data/big", path) == len(data)
    etag = client._s3.head_object(Bucket=bucket, Key="data/big")["ETag"]
    assert etag.strip('"').endswith("-3")
    assert client.get_bytes_sync("data/big") == data
    assert client.head_sync("data/nothing") is None
    with pytest.raises(NoSuchKeyError):
        client.get_bytes_sync("data/nothing")


async def test_a_merge_killed_before_its_commit_is_set_aside_at_restart(
    cluster: Cluster, keeper: Keeper, s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos suite (S3 seed 32, kill -9 of the merging replica: r1 served two mutated parts that
    had no lock leaf, and their objects were gone).  A replica killed between renaming its merged part into
    place and the commit multi found the part at restart, unregistered; 18.16's start-up check registers such
    a local part, but on a zero-copy disk that claimed objects nobody had locked.  It is set aside now, the
    sources it covered are active again, and the merge is made anew, locked."""
    r1 = await start(cluster, s3, bucket, "r1")
    await r1.insert_table(rows([1, 2]))
    await r1.insert_table(rows([3]))
    merged = "202611_0_1_1"
    hold, reached = asyncio.Event(), asyncio.Event()

    async def killed_before_the_multi(*_a: Any, **_k: Any) -> None:
        reached.set()  # renamed into place, its objects uploaded: the commit multi is next
        await hold.wait()

    async def no_rollback(*_a: Any, **_k: Any) -> None:  # kill -9: nothing is undone
        return None

    monkeypatch.setattr(r1.fetcher, "_commit_to_zookeeper", killed_before_the_multi)
    monkeypatch.setattr(r1.store, "rollback", no_rollback)
    await wait_for(lambda: r1.puller.log_pointer == 2 and not len(r1.queue_state), what="r1 idle")
    optimize = asyncio.create_task(cluster.execute("r1", "OPTIMIZE TABLE db.events FINAL"))
    await asyncio.wait_for(reached.wait(), 30)
    await cluster.kill("r1")
    await asyncio.gather(optimize, return_exceptions=True)
    assert await keeper.exists(f"{ZK_PATH}/replicas/r1/parts/{merged}") is None

    r1 = await start(cluster, s3, bucket, "r1")
    await wait_for(lambda: r1.store.active_names() == [merged], timeout=60, what="the merge made anew")
    leaves = await lock_leaves(keeper, r1)
    uid = remote(r1).instances[merged].unique_id
    assert f"{merged}/{uid.replace('/', '_')}/r1" in leaves  # the active part is locked: its objects stay
    assert any(p.name.startswith(f"ignored_{merged}") for p in r1.layout.detached_path.iterdir())
    assert sorted(r["id"] for r in await sorted_rows(r1)) == [1, 2, 3]
