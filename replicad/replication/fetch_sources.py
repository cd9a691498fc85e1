"""Where to fetch a part from: the source choice of executeFetch.

Among the *active* replicas (``is_active`` exists) other than us that hold the part or a part covering it in
``replicas/<r>/parts``, the largest covering part wins; ties are broken by the largest ``log_pointer`` (the
replica that has executed most of the log) and then the shortest ``queue``.  A replica that failed to deliver
the part recently (truncated or corrupt body, HTTP error) is tried last.

A GET_PART entry names the replica that made the part: that hint is checked first, in one round that also
reads its ``host`` and its checksums of the part (kept for the download that follows).  For live
replication the check starts as the entry is read from the log (:meth:`SourceFinder.precheck`), overlapping
with the copy of the entry into our queue.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from replicad.errors import KeeperNoNodeError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import ZnodeStat
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.storage.checksums import MinimalisticChecksums, PartHeader

#: a replica that failed to deliver a part is tried last for this long
FAILED_SOURCE_PENALTY_S = 60.0
#: host and checksums read by a source check serve the fetch that follows for this long
DETAILS_TTL_S = 10.0
#: source checks started as entries are pulled (beyond that, or for a bigger batch, none are started)
MAX_PRECHECKS = 16


@dataclass(frozen=True)
class FetchSource:
    replica: str
    part_name: str  # the part to download: the entry's part or a part covering it
    log_pointer: int
    queue_size: int


@dataclass(frozen=True)
class SourceDetails:
    """A source replica's ``host`` and its checksums of a part, read by a source check for the fetch."""

    host: bytes
    checksums: MinimalisticChecksums | None
    read_at: float


def consume_error(task: asyncio.Future[Any]) -> None:
    """Done-callback of a task nobody may await: it must not log 'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()


class SourceFinder:
    """Source choice for one table's fetches, with the checks started early and the recent failures."""

    def __init__(self, keeper: Keeper, paths: TablePaths) -> None:
        self.keeper = keeper
        self.paths = paths
        #: (part, replica) -> when fetching that part from that replica last failed
        self._failed_sources: dict[tuple[str, str], float] = {}
        #: (part, replica) -> host and checksums read by a check (used by the fetch that follows)
        self._details: dict[tuple[str, str], SourceDetails] = {}
        #: (part, replica) -> check of a GET_PART's source started as the entry was pulled, and when
        self._prechecks: dict[tuple[str, str], tuple[asyncio.Task[bool], float]] = {}
        #: replica -> its ``host`` node as last read
        self._hosts: dict[str, bytes] = {}

    def close(self) -> None:
        for task, _ in self._prechecks.values():
            task.cancel()
        self._prechecks.clear()

    # ------------------------------------------------------------------------------------- failures

    def failed(self, part_name: str, replica: str) -> None:
        self._failed_sources[(part_name, replica)] = time.monotonic()
        if len(self._failed_sources) > 10_000:
            self._failed_sources.clear()

    def succeeded(self, part_name: str, replica: str) -> None:
        self._failed_sources.pop((part_name, replica), None)

    def recently_failed(self, part_name: str, replica: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._failed_sources.get((part_name, replica), -1e18) > now - FAILED_SOURCE_PENALTY_S

    # ------------------------------------------------------------------------------------- details

    def take_details(self, part_name: str, replica: str) -> SourceDetails | None:
        """The host and checksums a recent check read (at most once, and only while fresh)."""
        details = self._details.pop((part_name, replica), None)
        if details is None or time.monotonic() - details.read_at > DETAILS_TTL_S:
            return None
        return details

    def known_host(self, replica: str) -> bytes | None:
        """The replica's ``host`` node as last read by a check or a fetch (None: never read)."""
        return self._hosts.get(replica)

    def remember_host(self, replica: str, host: bytes) -> None:
        if len(self._hosts) > 1000:
            self._hosts.clear()
        self._hosts[replica] = host

    # ------------------------------------------------------------------------------------- checks

    def precheck(self, entries: list[LogEntry]) -> dict[tuple[str, str], asyncio.Task[bool]]:
        """Start checking the source replicas of new GET_PART entries (called as they are read from the log,
        so that the check overlaps with copying them into the queue; :meth:`find` then uses the result).
        Returns the checks started, by (part, replica)."""
        if len(entries) > MAX_PRECHECKS:
            return {}  # a backlog: entries are checked one by one as they run
        now = time.monotonic()
        for key, (task, started) in list(self._prechecks.items()):
            if now - started >= DETAILS_TTL_S:
                task.cancel()
                del self._prechecks[key]
        started_now: dict[tuple[str, str], asyncio.Task[bool]] = {}
        for e in entries:
            hint = e.source_replica
            if e.type is not LogEntryType.GET_PART or not hint or hint == self.paths.replica_name:
                continue
            key = (e.new_part_name, hint)
            if len(self._prechecks) >= MAX_PRECHECKS or key in self._prechecks:
                continue
            task = asyncio.ensure_future(self._check_hint(e.new_part_name, hint, True))
            task.add_done_callback(consume_error)
            self._prechecks[key] = (task, now)
            started_now[key] = task
        return started_now

    async def find(
        self, part_name: str, *, active: bool = True, hint: str | None = None
    ) -> FetchSource | None:
        """The best replica holding ``part_name`` or a part covering it (None: nobody).

        Replicas holding the exact part are found with one ``exists`` each; only when none has it are the
        replicas' part lists read to look for a covering part.  ``hint``: the replica that most likely has
        the part (a GET_PART entry's source replica); it is checked first, in one round with its host and
        its checksums of the part, and taken when it is active and has the part."""
        target = PartInfo.parse(part_name)
        me = self.paths.replica_name
        if hint and hint != me and not self.recently_failed(part_name, hint):
            early = self._prechecks.pop((part_name, hint), None)
            if early is not None and active and time.monotonic() - early[1] < DETAILS_TTL_S:
                task = early[0]
            else:
                if early is not None:
                    early[0].cancel()
                task = asyncio.ensure_future(self._check_hint(part_name, hint, active))
            try:
                if await task:
                    return FetchSource(hint, part_name, 0, 0)
            except KeeperNoNodeError:
                pass
        replicas = [r for r in await self.keeper.get_children(self.paths.replicas) if r != me]
        random.shuffle(replicas)
        # is_active and parts/<part> of every replica in one pipelined round
        probes = [self.paths.replica(r).part(part_name) for r in replicas]
        if active:
            probes += [self.paths.replica(r).is_active for r in replicas]
        stats = await asyncio.gather(*(self.keeper.exists(p) for p in probes))
        exact, alive = stats[: len(replicas)], stats[len(replicas) :]
        if active:
            keep = [i for i, st in enumerate(alive) if st is not None]
            replicas, exact = [replicas[i] for i in keep], [exact[i] for i in keep]
        found = [(r, part_name) for r, st in zip(replicas, exact, strict=True) if st is not None]
        if not found:
            found = await self._covering(replicas, target)
        if not found:
            return None
        if len(found) == 1:  # nothing to choose: no need to read the replica's progress
            return FetchSource(found[0][0], found[0][1], 0, 0)
        progress = await asyncio.gather(*(self._replica_progress(r) for r, _ in found))
        candidates = [FetchSource(r, p, ptr, q) for (r, p), (ptr, q) in zip(found, progress, strict=True)]

        now = time.monotonic()

        def rank(c: FetchSource) -> tuple[bool, int, int, int, int]:
            info = PartInfo.parse(c.part_name)
            failed = self.recently_failed(c.part_name, c.replica, now)
            return (not failed, info.max_block - info.min_block, info.level, c.log_pointer, -c.queue_size)

        return max(candidates, key=rank)

    async def _covering(self, replicas: list[str], target: PartInfo) -> list[tuple[str, str]]:
        """(replica, its largest part covering ``target``) for the replicas that have one."""
        found: list[tuple[str, str]] = []
        for replica in replicas:
            try:
                parts = await self.keeper.get_children(self.paths.replica(replica).parts)
            except KeeperNoNodeError:
                continue
            best: PartInfo | None = None
            for name in parts:
                info = PartInfo.try_parse(name)
                if info is None or not info.contains(target):
                    continue
                if best is None or info.contains(best):
                    best = info
            if best is not None:
                found.append((replica, best.name))
        return found

    async def _check_hint(self, part_name: str, hint: str, active: bool) -> bool:
        """Whether ``hint`` is active (or ``active`` is False) and has the part: one round that also reads its
        host and its checksums of the part, kept for the fetch that follows."""
        rp = self.paths.replica(hint)
        alive, has_part, host, expected = await asyncio.gather(
            self.keeper.exists(rp.is_active),
            self.keeper.exists(rp.part(part_name)),
            self.get_or_none(rp.host),
            self.zk_checksums(hint, part_name),
        )
        if has_part is None or host is None or (alive is None and active):
            return False
        self.remember_host(hint, host[0])
        if len(self._details) > 1000:
            self._details.clear()
        self._details[(part_name, hint)] = SourceDetails(host[0], expected, time.monotonic())
        return True

    async def _replica_progress(self, replica: str) -> tuple[int, int]:
        rp = self.paths.replica(replica)
        node, stat = await asyncio.gather(self.get_or_none(rp.log_pointer), self.keeper.exists(rp.queue))
        raw = node[0].strip() if node is not None else b""
        pointer = int(raw) if raw.isdigit() else 0
        return pointer, (stat.num_children if stat is not None else 1 << 30)

    async def get_or_none(self, path: str) -> tuple[bytes, ZnodeStat] | None:
        try:
            return await self.keeper.get(path)
        except KeeperNoNodeError:
            return None

    async def zk_checksums(self, replica: str, part_name: str) -> MinimalisticChecksums | None:
        """The source's checksums for the part as recorded in ZooKeeper (old child node or new header)."""
        rp = self.paths.replica(replica)
        try:
            data, _ = await self.keeper.get(rp.part_checksums(part_name))
            return MinimalisticChecksums.parse(data)
        except KeeperNoNodeError:
            pass
        try:
            data, _ = await self.keeper.get(rp.part(part_name))
        except KeeperNoNodeError:
            return None
        if data.startswith(b"part header format version:"):
            return PartHeader.parse(data).checksums
        return None
