"""Where to fetch a part from: the source choice of executeFetch.

Among the *active* replicas (``is_active`` exists) other than us that hold the part or a part covering it in
``replicas/<r>/parts``, the largest covering part wins; ties are broken by the largest ``log_pointer`` (the
replica that has executed most of the log) and then the shortest ``queue``.  A replica that failed to deliver
the part recently (truncated or corrupt body, HTTP error) is tried last.

A GET_PART entry names the replica that made the part: that hint is checked first, in one round (its
``is_active`` and its ``parts/<part>``).  For live replication the check starts as the entry is read from the
log (:meth:`SourceFinder.precheck`), overlapping with the copy of the entry into our queue.

A replica's ``host`` is read once and kept with the ``czxid`` of the ``is_active`` node it was read beside:
``host`` is written only in the multi that creates ``is_active`` (18.16's activateReplica, and ours), so
while the ``is_active`` a check sees has that ``czxid`` the kept address is current (a new activation makes
a new node, with a new ``czxid``, and the address is read again).  A failed fetch forgets the address.
The source's checksums of the part are not read here: the fetch reads them beside the download and the
commit compares the part with them (:mod:`replicad.replication.checksum_compare`).

The reads every fetch makes of the same node (the replica list, a replica's ``is_active``) are shared by the
fetches asking while one is under way (never kept once answered): as if each had read it then.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from replicad.errors import KeeperNoNodeError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import ZnodeStat
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo

T = TypeVar("T")

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
    """What a source check learnt for the fetch that follows: the source's ``host`` (None: not known, the
    fetch reads it) and the ``czxid`` of its ``is_active`` (-1: not seen)."""

    host: bytes | None
    read_at: float
    active_czxid: int = -1


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
        #: replica -> its ``host`` node as last read, and the czxid of the ``is_active`` seen with it
        self._hosts: dict[str, tuple[bytes, int]] = {}
        #: replica -> the read of its ``host`` under way, or done and not yet kept in ``_hosts`` (the fetches
        #: starting together share it)
        self._host_reads: dict[str, asyncio.Future[tuple[bytes, ZnodeStat] | None]] = {}
        self._host_read_at: dict[str, float] = {}
        #: node path -> the read of it under way, shared (see replica_names / is_active)
        self._reads: dict[str, asyncio.Future[Any]] = {}

    def close(self) -> None:
        for task, _ in self._prechecks.values():
            task.cancel()
        self._prechecks.clear()

    # ------------------------------------------------------------------------------------- failures

    def failed(self, part_name: str, replica: str) -> None:
        self._failed_sources[(part_name, replica)] = time.monotonic()
        self._hosts.pop(replica, None)  # read again next time: it may have moved
        read = self._host_reads.get(replica)
        if read is not None and read.done():
            del self._host_reads[replica]
        if len(self._failed_sources) > 10_000:
            self._failed_sources.clear()

    def succeeded(self, part_name: str, replica: str) -> None:
        self._failed_sources.pop((part_name, replica), None)

    def recently_failed(self, part_name: str, replica: str, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._failed_sources.get((part_name, replica), -1e18) > now - FAILED_SOURCE_PENALTY_S

    # ------------------------------------------------------------------------------------- details

    def take_details(self, part_name: str, replica: str) -> SourceDetails | None:
        """What a recent check learnt (at most once, and only while fresh)."""
        details = self._details.pop((part_name, replica), None)
        if details is None or time.monotonic() - details.read_at > DETAILS_TTL_S:
            return None
        return details

    def known_host(self, replica: str) -> bytes | None:
        """The replica's ``host`` node as last read by a check or a fetch (None: never read)."""
        known = self._hosts.get(replica)
        return known[0] if known is not None else None

    def current_host(self, replica: str, active: ZnodeStat | int | None) -> bytes | None:
        """The kept ``host`` of ``replica`` when it was read beside the ``is_active`` node ``active`` (its
        stat or its czxid)."""
        known = self._hosts.get(replica)
        czxid = active.czxid if isinstance(active, ZnodeStat) else active
        if known is None or czxid is None or known[1] < 0 or known[1] != czxid:
            return None
        return known[0]

    def remember_host(self, replica: str, host: bytes, active_czxid: int = -1) -> None:
        if len(self._hosts) > 1000:
            self._hosts.clear()
        self._hosts[replica] = (host, active_czxid)
        read = self._host_reads.get(replica)
        if read is not None and read.done():
            del self._host_reads[replica]

    def replica_names(self) -> Awaitable[list[str]]:
        """The table's replicas (a new list for each caller; the read is shared while under way)."""
        return self._shared(self.paths.replicas, lambda: self.keeper.get_children(self.paths.replicas), list)

    def is_active(self, replica: str) -> Awaitable[ZnodeStat | None]:
        """The stat of the replica's ``is_active`` node (None: not active); shared while under way."""
        path = self.paths.replica(replica).is_active
        return self._shared(path, lambda: self.keeper.exists(path), None)

    def _shared(
        self, key: str, read: Callable[[], Awaitable[T]], copy: Callable[[T], T] | None
    ) -> Awaitable[T]:
        fut = self._reads.get(key)
        if fut is None:
            fut = self._reads[key] = asyncio.ensure_future(read())
            fut.add_done_callback(lambda f: self._reads.pop(key, None) if self._reads.get(key) is f else None)
            fut.add_done_callback(consume_error)
        return _answer(fut, copy)

    async def read_host(self, replica: str) -> tuple[bytes, ZnodeStat] | None:
        """The replica's ``host`` node (None: absent), read once for every caller asking meanwhile."""
        fut = self._host_reads.get(replica)
        if fut is not None and fut.done() and time.monotonic() - self._host_read_at.get(replica, 0.0) > 1.0:
            fut = None  # read a while ago and kept by nobody (its callers gave up): not to be trusted
        if fut is None:
            fut = self._host_reads[replica] = asyncio.ensure_future(
                self.get_or_none(self.paths.replica(replica).host))
            self._host_read_at[replica] = time.monotonic()

            def done(f: asyncio.Future[tuple[bytes, ZnodeStat] | None]) -> None:
                # an address stays shared until a caller keeps it (remember_host); nothing to keep: read again
                if (f.cancelled() or f.exception() is not None or f.result() is None) and \
                        self._host_reads.get(replica) is f:
                    del self._host_reads[replica]

            fut.add_done_callback(done)
        return await asyncio.shield(fut)

    def _remember_details(self, part_name: str, replica: str, details: SourceDetails) -> None:
        if len(self._details) > 1000:
            self._details.clear()
        self._details[(part_name, replica)] = details

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
        listed = await self.replica_names()
        replicas = [r for r in listed if r != me]
        random.shuffle(replicas)
        # is_active and parts/<part> of every replica in one pipelined round
        probes: list[Awaitable[ZnodeStat | None]] = [
            self.keeper.exists(self.paths.replica(r).part(part_name)) for r in replicas]
        if active:
            probes += [self.is_active(r) for r in replicas]
        stats = await asyncio.gather(*probes)
        exact, alive = stats[: len(replicas)], stats[len(replicas) :]
        active_stats: dict[str, ZnodeStat] = {}
        if active:
            keep = [i for i, st in enumerate(alive) if st is not None]
            active_stats = {replicas[i]: st for i, st in enumerate(alive) if st is not None}
            replicas, exact = [replicas[i] for i in keep], [exact[i] for i in keep]
        found = [(r, part_name) for r, st in zip(replicas, exact, strict=True) if st is not None]
        if not found:
            found = await self._covering(replicas, target)
        if not found:
            return None
        if len(found) == 1:  # nothing to choose: no need to read the replica's progress
            return self._chosen(FetchSource(found[0][0], found[0][1], 0, 0), active_stats)
        progress = await asyncio.gather(*(self._replica_progress(r) for r, _ in found))
        candidates = [FetchSource(r, p, ptr, q) for (r, p), (ptr, q) in zip(found, progress, strict=True)]

        now = time.monotonic()

        def rank(c: FetchSource) -> tuple[bool, int, int, int, int]:
            info = PartInfo.parse(c.part_name)
            failed = self.recently_failed(c.part_name, c.replica, now)
            return (not failed, info.max_block - info.min_block, info.level, c.log_pointer, -c.queue_size)

        return self._chosen(max(candidates, key=rank), active_stats)

    def _chosen(
        self, source: FetchSource, active_stats: dict[str, ZnodeStat]
    ) -> FetchSource:
        """Keep what the choice learnt for the fetch of ``source``: its address when the ``is_active`` just
        seen proves the kept one current."""
        alive = active_stats.get(source.replica)
        self._remember_details(source.part_name, source.replica, SourceDetails(
            self.current_host(source.replica, alive), time.monotonic(),
            alive.czxid if alive is not None else -1))
        return source

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
        """Whether ``hint`` is active (or ``active`` is False) and has the part: one round, which also reads
        its address unless one is kept (checked against the ``is_active`` seen; read again when it differs).
        The address is kept for the fetch that follows."""
        rp = self.paths.replica(hint)
        reads: list[Awaitable[Any]] = [self.is_active(hint), self.keeper.exists(rp.part(part_name))]
        if hint not in self._hosts:
            reads.append(self.read_host(hint))
        alive, has_part, *read = await asyncio.gather(*reads)
        czxid = alive.czxid if alive is not None else -1
        if read and read[0] is not None:
            self.remember_host(hint, read[0][0], czxid)
        if has_part is None or (alive is None and active):
            return False
        host = self.current_host(hint, alive)
        if host is None:
            node = await self.read_host(hint)
            if node is None:
                return False
            host = node[0]
            self.remember_host(hint, host, czxid)
        self._remember_details(part_name, hint, SourceDetails(host, time.monotonic(), czxid))
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


async def _answer(fut: asyncio.Future[T], copy: Callable[[T], T] | None) -> T:
    value = await asyncio.shield(fut)
    return copy(value) if copy is not None else value
