"""The periodic orphan scan of an S3 disk used by zero-copy tables: bucket contents against locks.

An object is an orphan when its part instance (the key stem its objects share, see
:mod:`replicad.storage.disk_s3`) has no ``<unique id>`` node under any table's lock tree
(``<root>/zero_copy_s3/*/*/``), is not referenced by any metadata file of this replica's disk, and all its
objects are older than the grace period (an instance is uploaded before its commit multi creates the id
node).  Orphans come from crashes between an upload and its commit, or between removing the last lock
and deleting the objects.  Objects whose keys do not have replicad's shape (written by ClickHouse) are
counted, never deleted.  The disk must be used by zero-copy tables only: another replica's objects of a
table without zero-copy have no locks to be found.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from replicad.errors import KeeperError, KeeperNoNodeError
from replicad.logging import get_logger
from replicad.model.remote_metadata import RemoteMetadata
from replicad.replication.zero_copy import RemoteParts
from replicad.replication.zero_copy_locks import EXCLUSIVE_LOCK
from replicad.tasks import BackgroundTask, Outcome

log = get_logger(__name__)

DEFAULT_GRACE_S = 3600.0


@dataclass(frozen=True)
class ScanResult:
    objects: int
    locked_instances: int
    orphans: list[str]  # keys deleted (or that would be, with delete=False)
    foreign: int  # keys not of replicad's shape: left alone


class OrphanScan(BackgroundTask):
    def __init__(self, remote: RemoteParts, period_s: float, *, grace_s: float = DEFAULT_GRACE_S,
                 delete: bool = True, name: str = "zero_copy_orphan_scan") -> None:
        super().__init__(name, period_s)
        self.remote = remote
        self.grace_s = grace_s
        self.delete = delete
        self.deleted_total = 0
        self.last: ScanResult | None = None

    async def run_once(self) -> Outcome:
        result = await self.scan()
        self.last = result
        return Outcome("orphans_deleted" if result.orphans and self.delete else "scanned",
                       fields={"objects": result.objects, "orphans": len(result.orphans),
                               "foreign": result.foreign, "deleted_total": self.deleted_total})

    async def _locked_stems(self, empty: dict[str, list[str]] | None = None) -> set[str]:
        """Stems of every id node of every table under the lock root (all tables share the disk).  With
        ``empty``: a stem whose id nodes have no lock leaf at all is left out and put there (stem -> the id
        node paths) instead."""
        locks = self.remote.locks
        assert locks is not None
        await locks.ready()
        keeper, disk = locks.keeper, self.remote.disk
        root = locks.base.rsplit("/", 1)[0]  # <root>/zero_copy_s3
        stems: set[str] = set()
        empties: dict[str, list[str]] = {}
        try:
            tables = await keeper.get_children(root)
        except KeeperNoNodeError:
            return stems
        for table in tables:
            parts = await keeper.get_children_many([f"{root}/{table}"])
            names = parts[0] or []
            ids = await keeper.get_children_many([f"{root}/{table}/{p}" for p in names])
            found: list[tuple[str, str]] = []
            for part, kids in zip(names, ids, strict=True):
                for id_node in kids or []:
                    if id_node != EXCLUSIVE_LOCK and (stem := disk.stem_of_id_node(id_node)) is not None:
                        found.append((stem, f"{root}/{table}/{part}/{id_node}"))
            holders = [] if empty is None else await keeper.get_children_many([path for _s, path in found])
            for i, (stem, path) in enumerate(found):
                if empty is not None and not holders[i]:
                    empties.setdefault(stem, []).append(path)
                else:
                    stems.add(stem)
        if empty is not None:
            empty.update({stem: paths for stem, paths in empties.items() if stem not in stems})
        return stems

    async def _remove_empty(self, stem: str, paths: list[str]) -> bool:
        """Remove id nodes nobody holds any more (True: all gone).  Their last holder let go while a fetch
        still held an ephemeral leaf, so it kept the objects; then the fetch ended (or its replica died) and
        nobody was left to delete them (found by the chaos suite's S3 run, seed 103).  Safe: a leaf can
        only be created under an existing id node, and a non-recursive delete fails while one exists."""
        keeper = self.remote.locks.keeper  # type: ignore[union-attr]
        for path in paths:
            try:
                await keeper.delete(path)
            except KeeperNoNodeError:
                continue
            except KeeperError as e:  # NotEmpty: someone locked it meanwhile; or no answer: next scan
                log.info("zero_copy_empty_lock_kept", path=path, error=str(e))
                return False
        log.info("zero_copy_empty_lock_removed", stem=stem, nodes=len(paths))
        return True

    def _referenced_stems_sync(self) -> set[str]:
        """Stems of every object this replica's metadata files (all tables on the disk) reference."""
        from replicad.storage.disk_s3 import stem_of

        stems: set[str] = set()
        for dirpath, _dirs, files in os.walk(self.remote.disk.metadata_path):
            for f in files:
                try:
                    with open(os.path.join(dirpath, f), "rb") as fh:
                        meta = RemoteMetadata.parse(fh.read(), self.remote.disk.prefix)
                except (OSError, ValueError):
                    continue
                stems |= {s for o in meta.objects if (s := stem_of(o.key)) is not None}
        return stems

    async def scan(self) -> ScanResult:
        from replicad.storage.disk_s3 import stem_of

        disk = self.remote.disk
        # objects first: an instance uploaded after the listing cannot be judged by it
        objects, server_now = await disk.client.list_with_clock(disk.prefix)
        empty: dict[str, list[str]] = {}
        locked = await self._locked_stems(empty)
        referenced = await asyncio.to_thread(self._referenced_stems_sync)
        # ages on the S3 server's clock (it stamped LastModified): a replica whose own clock runs a day ahead
        # must not take an upload in flight for an old orphan (seen possible under the chaos clock nemesis)
        now = server_now if server_now is not None else time.time()
        by_stem: dict[str, list[tuple[str, float]]] = {}
        foreign = 0
        for o in objects:
            rel = disk.relative_key(o.key)
            stem = stem_of(rel) if rel is not None else None
            if stem is None:
                foreign += 1
                continue
            by_stem.setdefault(stem, []).append((o.key, o.mtime))
        orphans: list[str] = []
        for stem, objs in by_stem.items():
            if stem in locked or stem in referenced:
                continue
            if any(now - mtime < self.grace_s for _k, mtime in objs):
                continue
            if stem in empty and not (self.delete and await self._remove_empty(stem, empty[stem])):
                continue
            orphans += [k for k, _m in objs]
        if orphans and self.delete:
            # re-check the locks right before deleting: an instance locked meanwhile is not an orphan
            still = await self._locked_stems() | await asyncio.to_thread(self._referenced_stems_sync)
            orphans = [k for k in orphans if stem_of(disk.relative_key(k) or "") not in still]
            await disk.client.delete(orphans)
            self.deleted_total += len(orphans)
            instances = sorted({stem_of(disk.relative_key(k) or "") or k for k in orphans})
            log.warning("zero_copy_orphans_deleted", count=len(orphans), disk=disk.name,
                        instances=len(instances), examples=instances[:5])
        return ScanResult(len(objects), len(locked), sorted(orphans), foreign)
