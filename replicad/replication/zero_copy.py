"""The parts of one table that live on an S3 disk: offload at commit, locks in the commit multi, release at
removal (objects deleted only by the replica that removed the last lock), metadata for zero-copy fetches.

:class:`RemoteParts` is what :class:`~replicad.replication.part_store.PartStore` calls at each step of a
part's life.  With ``allow_remote_fs_zero_copy_replication = 0`` (``locks is None``) every replica keeps its
own objects and deletes them with its part; with it, replicas sharing the bucket share objects and
:class:`~replicad.replication.zero_copy_locks.ZeroCopyLocks` decides who deletes them.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicad.errors import ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Op
from replicad.logging import get_logger
from replicad.replication.zero_copy_locks import DEFAULT_ROOT, ZeroCopyLocks
from replicad.storage.disk_s3 import S3Disk

log = get_logger(__name__)

#: how long a zero-copy send waits for a part whose commit multi is in flight here (a peer can pull the
#: log entry and ask for the part before this replica has handled the multi's answer)
COMMIT_WAIT_S = 5.0

TMP_FETCH_PREFIX = "tmp-fetch_"


@dataclass
class RemoteInstance:
    """One part's instance on the disk: its unique id and whether the persistent lock is ours yet."""

    unique_id: str
    fresh: bool  # objects written by this replica for this part (a failed commit deletes them)
    temporary_held: bool = False  # an ephemeral fetch lock is held (swapped in the commit multi)
    committed: bool = False
    #: set once the commit's outcome is known here (committed, rolled back or abandoned)
    settled: asyncio.Event = field(default_factory=asyncio.Event, repr=False, compare=False)


class RemoteParts:
    """Zero-copy bookkeeping of one table on one S3 disk."""

    def __init__(self, disk: S3Disk, metadata_root: Path, locks: ZeroCopyLocks | None) -> None:
        self.disk = disk
        self.metadata_root = metadata_root  # <disk metadata>/store/<db>/<table>
        self.locks = locks
        self.instances: dict[str, RemoteInstance] = {}
        self.objects_deleted = 0

    @property
    def zero_copy(self) -> bool:
        return self.locks is not None

    def metadata_dir(self, part: str) -> Path:
        return self.metadata_root / part

    def fetch_metadata_dir(self, part: str) -> Path:
        return self.metadata_root / (TMP_FETCH_PREFIX + part)

    # ------------------------------------------------------------------------------------------ loading

    async def load(self, part_names: list[str]) -> list[str]:
        """Know the instances of the local parts (their metadata directories); returns the parts that
        have a metadata directory but no local copy was given (their local copy is rebuilt)."""

        def scan() -> dict[str, str]:
            self.metadata_root.mkdir(parents=True, exist_ok=True)
            for p in self.metadata_root.iterdir():  # leftovers of fetches / offloads cut short
                if p.name.startswith(TMP_FETCH_PREFIX) or p.name.endswith(".tmp"):
                    shutil.rmtree(p, ignore_errors=True)
            out: dict[str, str] = {}
            for p in sorted(self.metadata_root.iterdir()):
                if p.is_dir() and (p / "checksums.txt").exists():
                    out[p.name] = self.disk.unique_id_sync(p)
            return out

        found = await asyncio.to_thread(scan)
        for name, uid in found.items():
            self.instances[name] = RemoteInstance(uid, fresh=False, committed=True)
        return sorted(set(found) - set(part_names))

    async def forget(self, part: str) -> None:
        """Drop a part's metadata without touching its lock or objects (it cannot be used: a leak at most,
        which the orphan scan finds once the lock is gone)."""
        self.instances.pop(part, None)
        await asyncio.to_thread(shutil.rmtree, self.metadata_dir(part), True)

    async def restore_local_copy(self, part: str, dest: Path) -> int:
        """Rebuild a part's local files from the bucket (the part reader then reads them)."""
        return await asyncio.to_thread(self.disk.materialize_sync, self.metadata_dir(part), dest)

    # ------------------------------------------------------------------------------------------ commit

    async def prepare_commit(self, part: str, part_dir: Path) -> RemoteInstance:
        """Before the commit multi: the part's objects exist and its metadata is in place; with zero-copy
        the ``<part>`` lock node exists.  A zero-copy fetch brought metadata (and holds an ephemeral lock);
        anything else (insert, merge, mutation, full fetch) is uploaded now as a fresh instance."""
        pending = self.instances.get(part)
        if pending is not None and not pending.fresh and not pending.committed:  # a zero-copy fetch
            src, dst = self.fetch_metadata_dir(part), self.metadata_dir(part)

            def place() -> None:
                shutil.rmtree(dst, ignore_errors=True)
                src.rename(dst)

            await asyncio.to_thread(place)
            instance = pending
        else:
            uid = await asyncio.to_thread(self.disk.offload_sync, part_dir, self.metadata_dir(part))
            instance = RemoteInstance(uid, fresh=True)
            self.instances[part] = instance
        if self.locks is not None:
            await self.locks.prepare(part)
        return instance

    def commit_ops(self, part: str) -> list[Op]:
        instance = self.instances.get(part)
        if self.locks is None or instance is None or instance.committed:
            return []
        return self.locks.commit_ops(
            part, instance.unique_id, fresh=instance.fresh, temporary_held=instance.temporary_held
        )

    def committed(self, part: str) -> None:
        instance = self.instances.get(part)
        if instance is not None:
            instance.committed = True
            instance.temporary_held = False
            instance.settled.set()

    async def rollback(self, part: str) -> None:
        """The commit multi failed: our lock was not created.  Fresh objects nobody else can lock (their id
        node was in the failed multi) are deleted; shared ones are kept and the fetch lock released."""
        instance = self.instances.pop(part, None)
        if instance is None:
            return
        instance.settled.set()
        if instance.committed:  # not a rollback: an active part being removed
            self.instances[part] = instance
            await self.release(part)
            return
        meta = self.metadata_dir(part)
        if instance.fresh:
            self.objects_deleted += await asyncio.to_thread(self.disk.remove_objects_sync, meta)
        elif instance.temporary_held and self.locks is not None:
            await self.locks.release_temporary(part, instance.unique_id)
        await asyncio.to_thread(shutil.rmtree, meta, True)
        await asyncio.to_thread(shutil.rmtree, self.fetch_metadata_dir(part), True)

    async def abandon_fetch(self, part: str) -> None:
        """A zero-copy download that will not be committed (dropped early download, failed check): release
        its ephemeral lock and remove its metadata; the objects stay (they are shared)."""
        instance = self.instances.get(part)
        if instance is None or instance.committed or instance.fresh:
            return
        del self.instances[part]
        instance.settled.set()
        if instance.temporary_held and self.locks is not None:
            await self.locks.release_temporary(part, instance.unique_id)
        await asyncio.to_thread(shutil.rmtree, self.fetch_metadata_dir(part), True)

    # ------------------------------------------------------------------------------------------ removal

    async def release(self, part: str) -> bool:
        """Let go of a part (outdated, dropped): unlock, delete its objects if this replica was the last
        holder, then remove its metadata.  True when objects were deleted."""
        instance = self.instances.get(part)
        meta = self.metadata_dir(part)
        if instance is None or not instance.committed:
            return False  # nothing, or a fetch of the same name in flight (rollback() is its way out)
        del self.instances[part]
        if self.locks is None:
            may_delete = True
        elif not instance.unique_id:
            may_delete = False
        else:
            # decided while the metadata is still in place (ClickHouse's #95597 ordering)
            may_delete = await self.locks.unlock(part, instance.unique_id)
        if may_delete:
            self.objects_deleted += await asyncio.to_thread(self.disk.remove_objects_sync, meta)
        await asyncio.to_thread(shutil.rmtree, meta, True)
        return may_delete

    async def release_all(self) -> int:
        """DROP TABLE: let go of every part (the last holder of an instance deletes it); returns the number
        of objects deleted."""
        before = self.objects_deleted
        for name in sorted(self.instances):
            await self.release(name)
        if self.locks is not None:
            await self.locks.remove_base_if_empty()
        await asyncio.to_thread(shutil.rmtree, self.metadata_root, True)
        return self.objects_deleted - before

    async def release_replica(self, replica: str) -> int:
        """SYSTEM DROP REPLICA: remove the dropped replica's lock leaves; an instance it held alone (this call
        removed its id node) is deleted by the instance stem its keys share.  Returns the objects deleted."""
        if self.locks is None:
            return 0
        deleted = 0
        for part, id_node, last in await self.locks.release_replica(replica):
            if not last:
                continue
            unique_id = next((i.unique_id for i in self.instances.values()
                              if i.unique_id.replace("/", "_") == id_node), None)
            if unique_id is not None:
                continue  # impossible while we hold a leaf on it; never delete what we use
            stem = self.disk.stem_of_id_node(id_node)
            if stem is None:
                log.warning("zero_copy_orphan_left", part=part, id=id_node, reason="unknown key shape")
                continue
            keys = [o.key for o in await self.disk.client.list(self.disk.full_key(stem))]
            deleted += await self.disk.client.delete(keys)
            log.info("zero_copy_released_dropped_replica", replica=replica, part=part, objects=len(keys))
        self.objects_deleted += deleted
        return deleted

    # ------------------------------------------------------------------------------------------ fetch

    def fetched_metadata(self, part: str, unique_id: str, temporary_held: bool) -> None:
        """A zero-copy fetch wrote ``fetch_metadata_dir(part)`` and holds the instance's ephemeral lock."""
        self.instances[part] = RemoteInstance(unique_id, fresh=False, temporary_held=temporary_held)

    async def serialized_metadata(self, part: str) -> tuple[str, dict[str, bytes]] | None:
        """(unique id, metadata texts with ref count 0) of a committed part, for a zero-copy send.  A part
        whose commit multi is in flight here is waited for (up to COMMIT_WAIT_S): a peer that pulled the
        multi's log entry may ask before this replica has handled the answer."""
        instance = self.instances.get(part)
        if instance is not None and not instance.committed:
            try:
                await asyncio.wait_for(instance.settled.wait(), COMMIT_WAIT_S)
            except TimeoutError:
                pass
            instance = self.instances.get(part)
        if instance is None or not instance.committed or not instance.unique_id:
            return None
        files = await asyncio.to_thread(self.disk.serialized_metadata_sync, self.metadata_dir(part))
        return instance.unique_id, files


class UnknownStoragePolicyError(ReplicadError):
    code = 478  # UNKNOWN_POLICY
    http_status = 400


def remote_parts_for(
    settings: Mapping[str, Any],
    *,
    database: str,
    table: str,
    table_zk_path: str,
    replica: str,
    disks: Mapping[str, S3Disk],
    policies: Mapping[str, str],
    keeper: Keeper,
) -> RemoteParts | None:
    """The table's :class:`RemoteParts` for its ``storage_policy`` (None for the local 'default')."""
    policy = str(settings.get("storage_policy", "default"))
    if policy == "default":
        return None
    disk_name = policies.get(policy)
    if disk_name is None or disk_name not in disks:
        raise UnknownStoragePolicyError(f"Unknown storage policy `{policy}`")
    disk = disks[disk_name]
    locks = None
    if int(settings.get("allow_remote_fs_zero_copy_replication", 0)):
        locks = ZeroCopyLocks(
            keeper,
            table_zk_path=table_zk_path,
            replica=replica,
            root=str(settings.get("remote_fs_zero_copy_zookeeper_path", DEFAULT_ROOT)),
            disk_type=disk.disk_type,
        )
    return RemoteParts(disk, disk.table_metadata_path(database, table), locks)
