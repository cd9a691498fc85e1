"""Zero-copy locks in ZooKeeper, in ClickHouse's table-independent layout (since 21.12)::

    <root>/zero_copy_s3/<table_shared_id>/<part>                      persistent
    <root>/zero_copy_s3/<table_shared_id>/<part>/part_exclusive_lock  ephemeral, data = holder replica
    <root>/zero_copy_s3/<table_shared_id>/<part>/<unique id>          persistent ('/' in the id -> '_')
    <root>/zero_copy_s3/<table_shared_id>/<part>/<unique id>/<replica>  the lock leaf

``<root>`` is the MergeTree setting ``remote_fs_zero_copy_zookeeper_path`` (``/clickhouse/zero_copy``),
``table_shared_id`` the UUID in ``<table zk path>/table_shared_id``.  ClickHouse's legacy nodes
``<table zk path>/zero_copy_s3/shared`` are created empty, as ClickHouse does.

Rules kept here (ZERO_COPY_FACTS §6): a committed part's leaf is created in the part's commit multi
(:meth:`ZeroCopyLocks.commit_ops`); a fetch's temporary leaf is ephemeral and created *without* ancestors,
so an id whose last holder let go cannot be locked again; the objects may be deleted only by the replica
whose conditional removal of the ``<unique id>`` node succeeded (:meth:`ZeroCopyLocks.unlock`).
"""

from __future__ import annotations

import asyncio
import posixpath
import uuid
from dataclasses import dataclass

from replicad import fault_plant
from replicad.errors import (
    KeeperError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    KeeperNotEmptyError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Create, Delete, Op
from replicad.logging import get_logger

log = get_logger(__name__)

DEFAULT_ROOT = "/clickhouse/zero_copy"
EXCLUSIVE_LOCK = "part_exclusive_lock"
NIL_UUID = "00000000-0000-0000-0000-000000000000"


class ZeroCopyLockLostError(ReplicadError):
    """The part instance's id node is gone (its last holder let go): its objects may be deleted already."""

    code = 564  # ZERO_COPY_REPLICATION_ERROR
    retriable = True


def id_node_name(unique_id: str) -> str:
    """A unique id as a node name ('/' replaced by '_', as ClickHouse does)."""
    if not unique_id:
        raise ValueError("empty unique id")
    return unique_id.replace("/", "_")


@dataclass(frozen=True)
class LockLeaf:
    """One lock leaf, parsed from its path below ``<root>/zero_copy_<type>/<table_shared_id>``."""

    part: str
    id_node: str
    replica: str

    def relative_path(self) -> str:
        return f"{self.part}/{self.id_node}/{self.replica}"

    @classmethod
    def parse_relative(cls, path: str) -> LockLeaf:
        parts = path.split("/")
        if len(parts) != 3 or not all(parts) or parts[1] == EXCLUSIVE_LOCK:
            raise ValueError(f"not a zero-copy lock leaf path: {path!r}")
        return cls(parts[0], parts[1], parts[2])


class ZeroCopyLocks:
    """The lock tree of one table, as seen by one replica."""

    def __init__(
        self,
        keeper: Keeper,
        *,
        table_zk_path: str,
        replica: str,
        root: str = DEFAULT_ROOT,
        disk_type: str = "s3",
    ) -> None:
        self.keeper = keeper
        self.table_zk_path = table_zk_path.rstrip("/")
        self.replica = replica
        self.root = root.rstrip("/") or "/"
        self.disk_type = disk_type
        self.table_shared_id = ""
        #: ephemeral nodes of ours (fetch leaves, exclusive locks) whose removal failed (connection loss): the
        #: session that owns them may survive the reconnect, so they would stay — blocking our next fetch or
        #: merge of the part and keeping its objects alive.  Removed by :meth:`release_leaked` (the mover
        #: calls it each period) and by the next attempt to take the same node.
        self.leaked: set[str] = set()
        self._leak_mutex = asyncio.Lock()

    @property
    def base(self) -> str:
        if not self.table_shared_id:
            raise RuntimeError("ZeroCopyLocks.init() was not called")
        return posixpath.join(self.root, f"zero_copy_{self.disk_type}", self.table_shared_id)

    def part_path(self, part: str) -> str:
        return f"{self.base}/{part}"

    def id_path(self, part: str, unique_id: str) -> str:
        return f"{self.base}/{part}/{id_node_name(unique_id)}"

    def leaf_path(self, part: str, unique_id: str, replica: str | None = None) -> str:
        return f"{self.id_path(part, unique_id)}/{replica or self.replica}"

    # ------------------------------------------------------------------------------------------ set-up

    async def init(self) -> str:
        """Read or create ``table_shared_id``; create the lock tree's base and the legacy nodes."""
        node = f"{self.table_zk_path}/table_shared_id"
        candidate = str(uuid.uuid4())
        try:
            await self.keeper.create(node, candidate.encode())
            shared = candidate
        except KeeperNodeExistsError:
            shared = (await self.keeper.get(node))[0].decode()
        except KeeperNoNodeError:
            shared = NIL_UUID
        uuid.UUID(shared)  # strict: the node holds a UUID
        self.table_shared_id = shared
        for legacy in (f"zero_copy_{self.disk_type}/shared", "zero_copy_hdfs/shared"):
            await self.keeper.ensure_path(f"{self.table_zk_path}/{legacy}")
        await self.keeper.ensure_path(self.base)
        return shared

    # ------------------------------------------------------------------------------------------ locking

    async def ready(self) -> None:
        if not self.table_shared_id:
            await self.init()

    async def prepare(self, part: str) -> None:
        """Make sure ``<part>`` exists (the commit multi creates only the id node and the leaf)."""
        await self.ready()
        await self.keeper.ensure_path(self.part_path(part))

    def commit_ops(self, part: str, unique_id: str, *, fresh: bool, temporary_held: bool) -> list[Op]:
        """Ops that make this replica's persistent leaf part of a commit multi.  ``fresh``: the objects
        were just written here (the id node is new); ``temporary_held``: an ephemeral leaf of a fetch is
        swapped for the persistent one."""
        leaf = self.leaf_path(part, unique_id)
        if fresh:
            return [Create(self.id_path(part, unique_id), b""), Create(leaf, b"")]
        if temporary_held:
            return [Delete(leaf), Create(leaf, b"")]
        return [Check(leaf, -1)]  # a persistent leaf of ours exists already (re-fetched instance)

    async def lock_temporary(self, part: str, unique_id: str, attempts: int = 20) -> bool:
        """The fetch-time ephemeral leaf, created under an existing id node only.  True when the ephemeral
        leaf was created; False when our persistent leaf exists already.  ZeroCopyLockLostError when the
        id node is gone."""
        await self.ready()
        leaf = self.leaf_path(part, unique_id)
        try:
            await self.keeper.create(leaf, b"", ephemeral=True)
        except KeeperNoNodeError:
            raise ZeroCopyLockLostError(
                f"Cannot lock part {part} instance {unique_id}: it was unlocked (its objects may be gone)"
            ) from None
        except KeeperNodeExistsError:
            stat = await self.keeper.exists(leaf)
            if stat is not None and not stat.ephemeral_owner:
                return False
            if leaf in self.leaked:  # our own earlier fetch's leaf, whose removal failed: remove it now
                await self.release_leaked()
                return await self.lock_temporary(part, unique_id, attempts - 1)
            if attempts <= 1:
                raise ZeroCopyLockLostError(f"part {part}: an ephemeral lock {leaf} exists already") from None
            # another fetch of ours is ending (its lock goes with it) or it just went: try again
            await asyncio.sleep(0.2)
            return await self.lock_temporary(part, unique_id, attempts - 1)
        return True

    async def release_temporary(self, part: str, unique_id: str) -> None:
        """Remove a fetch's ephemeral leaf.  Never raises: a removal that fails (connection loss) is
        remembered and retried (:meth:`release_leaked`), so a failed fetch's clean-up always completes."""
        leaf = self.leaf_path(part, unique_id)
        try:
            await self.keeper.delete(leaf)
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            self.leaked.add(leaf)
            log.warning("zero_copy_temporary_lock_leaked", leaf=leaf, error=str(e))

    async def release_leaked(self) -> int:
        """Retry removing the ephemeral leaves whose removal failed; returns how many are still left.  Only
        ephemeral leaves are removed (a persistent leaf of the same path is a committed part's lock)."""
        async with self._leak_mutex:  # one at a time: a leaf removed here may be created again right after
            for leaf in sorted(self.leaked):
                try:
                    stat = await self.keeper.exists(leaf)
                    if stat is not None and stat.ephemeral_owner:
                        await self.keeper.delete(leaf, version=stat.version)
                    self.leaked.discard(leaf)
                except KeeperNoNodeError:
                    self.leaked.discard(leaf)
                except KeeperError as e:
                    log.warning("zero_copy_temporary_lock_still_leaked", leaf=leaf, error=str(e))
            return len(self.leaked)

    async def unlock(self, part: str, unique_id: str) -> bool:
        """Remove this replica's leaf; True only when this call then removed the id node itself, i.e. no
        replica holds the instance any more and its objects may be deleted (by the caller, now)."""
        await self.ready()
        try:
            await self.keeper.delete(self.leaf_path(part, unique_id))
        except KeeperNoNodeError:
            log.warning("zero_copy_lock_missing", part=part, unique_id=unique_id)
            return False  # not ours to decide: keep the objects (a leak the orphan scan reports)
        last = False
        try:
            await self.keeper.delete(self.id_path(part, unique_id))
            last = True
        except KeeperNotEmptyError:
            last = fault_plant.planted("delete_shared_objects")  # test-only planted bug: others hold it
        except KeeperNoNodeError:
            pass
        try:
            await self.keeper.delete(self.part_path(part))
        except (KeeperNotEmptyError, KeeperNoNodeError):
            pass
        log.info("zero_copy_unlocked", part=part, unique_id=unique_id, last=last)
        return last

    # ------------------------------------------------------------------------------------------ exclusive

    async def try_exclusive(self, part: str) -> str | None:
        """Take ``<part>/part_exclusive_lock``; None when taken, else the holder's name."""
        await self.prepare(part)
        path = f"{self.part_path(part)}/{EXCLUSIVE_LOCK}"
        try:
            await self.keeper.create(path, self.replica.encode(), ephemeral=True)
            return None
        except KeeperNodeExistsError:
            if path in self.leaked:  # ours, from a merge whose release failed: remove it, take it again
                await self.release_leaked()
                if path not in self.leaked:
                    return await self.try_exclusive(part)
            try:
                return (await self.keeper.get(path))[0].decode() or "?"
            except KeeperNoNodeError:
                return await self.try_exclusive(part)

    async def release_exclusive(self, part: str) -> None:
        """Never raises for a lost connection: the lock is remembered and removed later
        (:meth:`release_leaked`).  Left in place while its session survives the reconnect, it makes every
        replica — its holder included — postpone the merge or mutation for good."""
        path = f"{self.part_path(part)}/{EXCLUSIVE_LOCK}"
        try:
            await self.keeper.delete(path)
        except KeeperNoNodeError:
            pass
        except KeeperError as e:
            self.leaked.add(path)
            log.warning("zero_copy_exclusive_lock_leaked", path=path, error=str(e))
            return
        try:
            await self.keeper.delete(self.part_path(part))
        except (KeeperNotEmptyError, KeeperNoNodeError):
            pass
        except KeeperError:
            pass  # an empty <part> node is harmless

    async def remove_base_if_empty(self) -> None:
        """The table's lock tree goes with its last replica (other replicas' leaves keep it)."""
        if not self.table_shared_id:
            return
        try:
            await self.keeper.delete(self.base)
        except (KeeperNotEmptyError, KeeperNoNodeError):
            pass

    # ------------------------------------------------------------------------------------------ scanning

    async def leaves(self) -> list[LockLeaf]:
        """Every lock leaf of the table (not atomic: a scan's snapshot)."""
        await self.ready()
        out: list[LockLeaf] = []
        parts = await self.keeper.get_children(self.base)
        ids = await self.keeper.get_children_many([self.part_path(p) for p in parts])
        pairs = [(p, i) for p, kids in zip(parts, ids, strict=True)
                 for i in (kids or []) if i != EXCLUSIVE_LOCK]
        holders = await self.keeper.get_children_many([f"{self.base}/{p}/{i}" for p, i in pairs])
        for (p, i), replicas in zip(pairs, holders, strict=True):
            out += [LockLeaf(p, i, r) for r in replicas or []]
        return out

    async def id_nodes(self) -> set[str]:
        """Every ``<unique id>`` node name under any part (held or not)."""
        await self.ready()
        parts = await self.keeper.get_children(self.base)
        ids = await self.keeper.get_children_many([self.part_path(p) for p in parts])
        return {i for kids in ids for i in (kids or []) if i != EXCLUSIVE_LOCK}

    async def release_replica(self, replica: str) -> list[tuple[str, str, bool]]:
        """Remove every leaf of ``replica`` (a dropped/lost replica).  Returns (part, id node, last) per leaf;
        ``last``: the id node was then removed by this call (its objects may be deleted by the caller)."""
        out: list[tuple[str, str, bool]] = []
        for leaf in await self.leaves():
            if leaf.replica != replica:
                continue
            id_path = f"{self.base}/{leaf.part}/{leaf.id_node}"
            try:
                await self.keeper.delete(f"{id_path}/{replica}")
            except KeeperNoNodeError:
                continue
            last = False
            try:
                await self.keeper.delete(id_path)
                last = True
            except (KeeperNotEmptyError, KeeperNoNodeError):
                pass
            try:
                await self.keeper.delete(self.part_path(leaf.part))
            except (KeeperNotEmptyError, KeeperNoNodeError):
                pass
            out.append((leaf.part, leaf.id_node, last))
        return out
