"""The local parts of one table: which directories are active, pre-committed or outdated.

ClickHouse keeps a part in one of a few states: PreCommitted (renamed to its final name, its ZooKeeper commit
in flight), Committed (= active, visible to SELECT), Outdated (covered by a newer part; kept a while because
peers may still fetch it).  DataPartsExchange serves all three.  The store keeps that state in memory; the
directories live in :class:`~replicad.storage.layout.TableDataLayout`.  Every filesystem call runs in a worker
thread; the in-memory maps are only touched on the event loop.
"""

from __future__ import annotations

import asyncio
import enum
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from replicad.errors import ReplicadError
from replicad.logging import get_logger
from replicad.model.part_info import PartInfo
from replicad.storage.fresh_files import FreshFiles, PartFiles
from replicad.storage.layout import TableDataLayout
from replicad.storage.part import PartDirectory

if TYPE_CHECKING:
    from replicad.keeper.ops import Op
    from replicad.replication.zero_copy import RemoteParts
    from replicad.storage.checksums import Checksums

log = get_logger(__name__)


class PartState(enum.Enum):
    PRECOMMITTED = "PreCommitted"
    ACTIVE = "Committed"
    OUTDATED = "Outdated"


@dataclass
class LocalPart:
    info: PartInfo
    directory: PartDirectory
    state: PartState
    modification_time: float = field(default_factory=time.time)
    remove_time: float | None = None
    #: ``replicas/<me>/parts/<name>`` is known to exist: activated after this process registered it (the
    #: merge selection need not ask ZooKeeper; a part loaded from disk, or one whose commit's answer was
    #: lost, is asked about)
    registered: bool = False

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def path(self) -> Path:
        return self.directory.path


class DuplicatePartError(ReplicadError):
    code = 235  # DUPLICATE_DATA_PART


class PartStore:
    """In-memory part set of one table, backed by its data directory."""

    def __init__(self, layout: TableDataLayout, old_parts_lifetime_s: float = 480.0) -> None:
        self.layout = layout
        self.old_parts_lifetime_s = old_parts_lifetime_s
        self._parts: dict[str, LocalPart] = {}
        #: the parts that are not outdated (active or pre-committed): the store keeps every outdated part
        #: for ``old_parts_lifetime``, and the queries below would otherwise scan them all
        self._live: dict[str, LocalPart] = {}
        #: the same parts by partition: a part covers only parts of its own partition, so the covering
        #: queries of a fetch look at one partition, not at every part (a new replica of a table of 10,000
        #: one-part partitions spent most of its fetches' CPU walking every live part)
        self._live_by_partition: dict[str, dict[str, LocalPart]] = {}
        #: bumped on every change of the active set (SELECT snapshots, status)
        self.version = 0
        #: the files of parts written whole here lately, for the replicas that fetch them
        self.fresh = FreshFiles()
        self._active: list[LocalPart] = []
        self._active_version = -1  # the version ``_active`` was sorted at
        #: the table's parts live on an S3 disk (storage_policy): offloaded at pre-commit, locked in the
        #: commit multi (zero-copy), released at removal
        self.remote: RemoteParts | None = None

    # ---------------------------------------------------------------------------------------- loading

    async def load(self) -> list[str]:
        """Create the directories, drop ``tmp*`` leftovers, load active parts; returns covered leftovers."""
        if self.remote is not None:
            await self._restore_remote_parts(self.remote)
        active, removed = await asyncio.to_thread(self.layout.startup)
        if removed:
            log.info("removed_tmp_dirs", dirs=removed)
        covered = await asyncio.to_thread(self.layout.covered_parts)
        for info in active:
            directory = PartDirectory.at(self.layout.part_path(info.name))
            part = self._parts[info.name] = LocalPart(
                info, directory, PartState.ACTIVE, directory.path.stat().st_mtime
            )
            self._set_live(part)
        for name in covered:
            info = PartInfo.parse(name)
            directory = PartDirectory.at(self.layout.part_path(name))
            self._parts[name] = LocalPart(info, directory, PartState.OUTDATED, remove_time=time.time())
        self.version += 1
        return covered

    async def _restore_remote_parts(self, remote: RemoteParts) -> None:
        """Parts whose metadata is on the S3 disk but whose local copy is gone are read back from the
        bucket (through their metadata) before the directory is loaded."""
        local = await asyncio.to_thread(self.layout.list_part_names)
        for name in await remote.load(local):
            tmp = self.layout.tmp_path("tmp_restore_", name)
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            try:
                size = await remote.restore_local_copy(name, tmp)
            except ReplicadError as e:  # objects gone (it was let go before a crash): the replicas have it
                log.error("cannot_restore_part_from_s3", part=name, error=str(e))
                await asyncio.to_thread(shutil.rmtree, tmp, True)
                await remote.forget(name)
                continue
            await asyncio.to_thread(self.layout.commit, tmp, name)
            log.info("restored_part_from_s3", part=name, bytes=size)

    # ---------------------------------------------------------------------------------------- queries

    def get(self, name: str) -> LocalPart | None:
        return self._parts.get(name)

    def knows(self, name: str) -> bool:
        """A part of this name is in the set, in any state (one dictionary look-up: the writer's thread asks
        it before renaming a fresh part, see :mod:`replicad.replication.early_lock`)."""
        return name in self._parts

    def active(self) -> list[LocalPart]:
        """The active parts in part order (kept between changes)."""
        if self._active_version != self.version:
            self._active = sorted(
                (p for p in self._live.values() if p.state is PartState.ACTIVE), key=lambda p: p.info
            )
            self._active_version = self.version
        return list(self._active)

    def active_rows(self) -> int:
        """Rows of the active parts (no ordering: a count() polled during a drain sorted every part anew after
        each fetch)."""
        return sum(p.directory.rows for p in self._live.values() if p.state is PartState.ACTIVE)

    def max_active_in_partition(self) -> int:
        """The most active parts any one partition has (the insert's too-many-parts check, before every
        block: counted, not sorted as :meth:`active` sorts them after each change)."""
        worst = 0
        for parts in self._live_by_partition.values():
            n = sum(1 for p in parts.values() if p.state is PartState.ACTIVE)
            worst = max(worst, n)
        return worst

    def active_names(self) -> list[str]:
        return [p.name for p in self.active()]

    def all_parts(self) -> list[LocalPart]:
        return sorted(self._parts.values(), key=lambda p: p.info)

    def for_send(self, name: str) -> LocalPart | None:
        """A part a peer may download: pre-committed, active or outdated (as 18.16's findPart)."""
        return self._parts.get(name)

    def _set_live(self, part: LocalPart) -> None:
        self._live[part.name] = part
        self._live_by_partition.setdefault(part.info.partition_id, {})[part.name] = part

    def _unset_live(self, part: LocalPart) -> None:
        if self._live.pop(part.name, None) is None:
            return
        partition = self._live_by_partition.get(part.info.partition_id)
        if partition is not None:
            partition.pop(part.name, None)
            if not partition:
                del self._live_by_partition[part.info.partition_id]

    def _live_in(self, partition_id: str) -> list[LocalPart]:
        return list(self._live_by_partition.get(partition_id, {}).values())

    def active_containing(self, info: PartInfo) -> LocalPart | None:
        """The active (or pre-committed) part equal to or covering ``info``."""
        best: LocalPart | None = None
        lo, hi = info.min_block, info.max_block
        for p in self._live_in(info.partition_id):
            pi = p.info  # the block range first (plain integers): what contains() needs before anything else
            if pi.min_block <= lo and pi.max_block >= hi and (pi == info or pi.contains(info)):
                if best is None or p.info.contains(best.info):
                    best = p
        return best

    def covered_by(self, info: PartInfo) -> list[LocalPart]:
        """Active parts strictly covered by ``info``."""
        lo, hi = info.min_block, info.max_block
        return [
            p
            for p in self._live_in(info.partition_id)
            if lo <= p.info.min_block and p.info.max_block <= hi  # the block range first, as above
            and p.state is PartState.ACTIVE and p.info != info and info.contains(p.info)
        ]

    # ---------------------------------------------------------------------------------------- changes

    async def precommit(self, tmp_dir: Path, info: PartInfo,
                        written: tuple[Checksums, str, int, int | None] | None = None, *,
                        renamed: Path | None = None, files: PartFiles = ()) -> LocalPart:
        """Rename a finished temporary directory to the part's name; the part becomes servable.  ``written``:
        the (checksums, columns.txt text, rows, bytes on disk) its writer produced, taken instead of reading
        them back.  ``renamed``: the writer's thread already renamed it there (it checked that no part of
        the name was known: see :mod:`replicad.replication.early_lock`), with ``written`` given.  ``files``:
        every file of the part as its writer held them (kept a few seconds for the replicas that fetch it:
        :mod:`replicad.storage.fresh_files`)."""
        name = info.name
        existing = self._parts.get(name)
        if renamed is not None:
            if renamed != self.layout.part_path(name) or written is None:
                raise ReplicadError(f"part {name} was renamed to {renamed}, not to its own name")
            if existing is not None:  # cannot be (checked before the rename, and the name was ours alone)
                raise DuplicatePartError(f"Part {name} already exists")
            directory = PartDirectory.at(renamed).known(*written)
        else:
            directory = await self._rename(tmp_dir, name, existing, written)
        if self.remote is not None:
            try:
                await self.remote.prepare_commit(name, directory.path)
            except BaseException:
                await self.remote.rollback(name)
                await asyncio.to_thread(shutil.rmtree, directory.path, True)
                raise
        if files:
            self.fresh.keep(name, directory.checksums, files)
        return self._precommitted(info, directory)

    async def _rename(self, tmp_dir: Path, name: str, existing: LocalPart | None,
                      written: tuple[Checksums, str, int, int | None] | None) -> PartDirectory:
        if existing is not None and existing.state is not PartState.OUTDATED:
            raise DuplicatePartError(f"Part {name} already exists")
        if existing is not None:  # an outdated leftover of the same name: drop it first
            await self._remove_dir(existing)

        def commit() -> PartDirectory:  # rename, and read its metadata files in the same worker-thread trip
            path = self.layout.commit(tmp_dir, name)
            if written is not None:
                return PartDirectory.at(path).known(*written)
            try:
                return PartDirectory.at(path).preload()
            except BaseException:  # unreadable: it must not stay behind under the part's name
                shutil.rmtree(path, ignore_errors=True)
                raise

        return await asyncio.to_thread(commit)

    def _precommitted(self, info: PartInfo, directory: PartDirectory) -> LocalPart:
        part = LocalPart(info, directory, PartState.PRECOMMITTED)
        self._parts[info.name] = part
        self._set_live(part)
        return part

    def commit_ops(self, name: str) -> list[Op]:
        """What the part's ZooKeeper commit multi must also do (its zero-copy lock); [] on a local disk."""
        return self.remote.commit_ops(name) if self.remote is not None else []

    def activate(self, name: str, *, registered: bool = True) -> list[LocalPart]:
        """Make a pre-committed part active (``registered``: its part node is known to exist, made by this
        process); active parts it covers become outdated (returned).  A part an
        active part already covers (a fetch that finished after the fetch of a merged part covering it) is
        added outdated at once, as 18.16's renameTempPartAndReplace does ("Tried to add obsolete part"): both
        active would serve its rows twice (found by the chaos suite's S3 run, seed 103)."""
        part = self._parts[name]
        if self.remote is not None:
            self.remote.committed(name)
        info = part.info
        covering = [p for p in self._live_in(info.partition_id)
                    if p.info.min_block <= info.min_block and p.info.max_block >= info.max_block
                    and p.state is PartState.ACTIVE and p.info != info and p.info.contains(info)]
        if covering:
            log.warning("obsolete_part_added", part=name, covered_by=covering[0].name)
            self._outdate(part, 0.0)  # removed by the next cleanup
            self.version += 1
            return []
        self._set_live(part)
        part.state = PartState.ACTIVE
        part.registered = registered
        replaced = self.covered_by(part.info)
        now = time.time()
        for p in replaced:
            self._outdate(p, now)
        self.version += 1
        return replaced

    async def rollback(self, name: str) -> None:
        """Forget a pre-committed part and delete its directory (duplicate or failed commit)."""
        part = self._parts.get(name)
        self.fresh.forget(name)
        if part is None:
            return
        try:
            if self.remote is not None and part.state is PartState.PRECOMMITTED:
                await self.remote.rollback(name)
        finally:  # the directory goes whatever happens: left behind, every later fetch of the part fails
            await self._remove_dir(part)

    async def detach(self, name: str, prefix: str) -> Path | None:
        """Move a part to ``detached/<prefix>_<name>`` and forget it."""
        part = self._parts.pop(name, None)
        if part is None:
            return None
        self._unset_live(part)
        self.version += 1
        if self.remote is not None:  # detached/ keeps the local copy: the shared instance is let go
            await self.remote.release(name)
        return await asyncio.to_thread(self.layout.detach, name, prefix)

    def reactivate(self, name: str) -> bool:
        """An outdated part made active again, if no active part covers it (its covering part was set aside
        at start-up); True when done."""
        part = self._parts.get(name)
        if part is None or part.state is not PartState.OUTDATED:
            return False
        if self.active_containing(part.info) is not None:
            return False
        part.state, part.remove_time = PartState.ACTIVE, None
        self._set_live(part)
        self.version += 1
        return True

    def make_outdated(self, name: str) -> None:
        part = self._parts.get(name)
        if part is not None and part.state is not PartState.OUTDATED:
            self._outdate(part, time.time())
            self.version += 1

    def _outdate(self, part: LocalPart, now: float) -> None:
        part.state = PartState.OUTDATED
        part.remove_time = now
        self._unset_live(part)

    async def remove_outdated(self, name: str) -> bool:
        """Delete an outdated part's directory and forget it (the cleanup, after ZooKeeper let it go)."""
        part = self._parts.get(name)
        if part is None or part.state is not PartState.OUTDATED:
            return False
        await self._remove_dir(part)
        return True

    async def _remove_dir(self, part: LocalPart) -> None:
        if self._parts.get(part.name) is part:
            del self._parts[part.name]
            self._unset_live(part)
            self.version += 1
        if self.remote is not None:
            await self.remote.release(part.name)  # before the local copy goes (#95597's ordering)
        await asyncio.to_thread(self.layout.remove_part, part.name)

    async def clear_old_parts(self, max_age_s: float | None = None) -> list[str]:
        """Delete outdated parts older than ``old_parts_lifetime`` (or ``max_age_s``); their names."""
        lifetime = self.old_parts_lifetime_s if max_age_s is None else max_age_s
        deadline = time.time() - lifetime
        old = [
            p
            for p in self._parts.values()
            if p.state is PartState.OUTDATED and (p.remove_time or 0.0) <= deadline
        ]
        for p in old:
            await self._remove_dir(p)
        return [p.name for p in old]
