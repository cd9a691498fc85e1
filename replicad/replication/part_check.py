"""The part check thread (ClickHouse's ``ReplicatedMergeTreePartCheckThread``) and the start-up part check.

Suspect parts are queued with a delay (``enqueue``): after a failed fetch (no replica has the part), a
checksum error while reading or sending it, an insert whose commit outcome is unknown, a part picked for a
merge that ZooKeeper does not list.  Each is then judged against ZooKeeper:

* **missing locally** (no active part equal to or covering it):
  - ZooKeeper lists it for us → remove our ``replicas/<me>/parts/<p>`` node and put a ``get`` entry (empty
    ``source replica:``) into our queue, in one multi (18.16's ``removePartAndEnqueueFetch``);
  - some replica, active or not, has it or a covering part → nothing to do: it will be fetched;
  - replicas have parts inside it starting at its min block and ending at its max block → nothing to do: it
    should appear as the result of a merge;
  - otherwise the part is **lost forever**: it is counted, a quorum insert waiting for it is marked failed
    (``quorum/failed_parts``), and the queue entries producing it are removed so they do not block the queue.
* **present locally** (the exact part, active):
  - ZooKeeper lists it for us → its ``columns`` and ``checksums`` must match the local ``columns.txt`` /
    ``checksums.txt`` and every file must verify (sizes, hashes, compressed blocks); a broken part is moved to
    ``detached/broken_<name>`` after its node was replaced by a ``get`` entry (refetched from a peer);
  - ZooKeeper does not list it → the part is unexpected (e.g. an insert whose commit did not happen): moved to
    ``detached/unexpected_<name>``.  An insert whose commit did happen is listed, so it is kept.
* a part being committed right now (pre-committed) is checked again a moment later; a part covered by an
  active part is fine.

Parts are moved aside, never deleted.  The thread pauses while the table is read-only (no ZooKeeper).

``check_parts_at_startup`` is 18.16's ``checkParts``: local parts ZooKeeper does not list move to
``detached/ignored_<name>``; parts ZooKeeper lists but that are missing locally are either replaced in
ZooKeeper by a local part covering them or re-fetched through a ``get`` queue entry.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicad.errors import CorruptedDataError, KeeperNoNodeError, ReplicadError, ZnodeFormatError
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Delete, Op
from replicad.keeper.paths import TablePaths, basename
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_state import QueueState
from replicad.replication.commit import part_commit_ops
from replicad.replication.executor import remove_parts_from_zookeeper
from replicad.replication.part_store import LocalPart, PartState, PartStore
from replicad.replication.quorum import fail_quorum_for_part
from replicad.storage.checksums import Checksums, MinimalisticChecksums, PartHeader
from replicad.storage.part import PartDirectory
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)

T = LogEntryType
_PRODUCING = frozenset((T.GET_PART, T.ATTACH_PART, T.MERGE_PARTS, T.MUTATE_PART))
#: a part being committed is looked at again after this delay
PRECOMMITTED_RECHECK_S = 1.0
#: results kept for /status
RECENT_RESULTS = 20


@dataclass(frozen=True)
class PartCheckResult:
    part: str
    #: ok | covered | postponed | fetch_enqueued | found_elsewhere | waiting_for_merge | lost_forever |
    #: detached_broken | detached_unexpected | bad_name
    outcome: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"part": self.part, "outcome": self.outcome, "detail": self.detail}


# --------------------------------------------------------------------------------------- ZooKeeper helpers


async def part_node_ops(keeper: Keeper, paths: TablePaths, part_name: str) -> list[Op]:
    """Deletes of our ``parts/<p>`` node and whatever children it has (18.16: columns, checksums)."""
    path = paths.me.part(part_name)
    try:
        children = await keeper.get_children(path)
    except KeeperNoNodeError:
        return []
    ops: list[Op] = [Delete(f"{path}/{c}") for c in sorted(children)]
    return [*ops, Delete(path)]


async def remove_part_and_enqueue_fetch(
    keeper: Keeper, paths: TablePaths, part_name: str, tz: str = "UTC"
) -> LogEntry:
    """One multi: a ``get`` entry into our queue, our ``parts/<p>`` node gone.  Returns the queued entry (with
    its ``queue-`` znode name)."""
    me = paths.me
    stat = await keeper.exists(me.part(part_name))
    create_time = 0 if stat is None else stat.ctime_ms // 1000
    entry = LogEntry.get_part(part_name, source_replica="", create_time=create_time)
    ops: list[Op] = [Create(me.queue_prefix, entry.to_bytes(tz), sequence=True)]
    ops += await part_node_ops(keeper, paths, part_name)
    results = await keeper.multi(ops)
    return entry.with_znode(basename(str(results[0])))


async def _zk_checksums(keeper: Keeper, paths: TablePaths, part_name: str) -> tuple[str | None, Any]:
    """(columns text or None, checksums as ZooKeeper holds them for us: Minimalistic/Checksums/PartHeader)."""
    me = paths.me
    try:
        raw, _ = await keeper.get(me.part_checksums(part_name))
        columns, _ = await keeper.get(me.part_columns(part_name))
    except KeeperNoNodeError:
        data, _ = await keeper.get(me.part(part_name))
        if data.startswith(b"part header format version:"):
            return None, PartHeader.parse(data)
        raise CorruptedDataError(f"part {part_name}: no checksums in ZooKeeper") from None
    return columns.decode(), MinimalisticChecksums.parse(raw)


# ------------------------------------------------------------------------------------------- the thread


class PartCheckThread(BackgroundTask):
    """Checks suspect parts one at a time, each no earlier than its due time."""

    def __init__(
        self,
        name: str,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        queue_state: QueueState,
        *,
        tz: str = "UTC",
        is_readonly: Callable[[], bool] = lambda: False,
        on_queue_changed: Callable[[], None] = lambda: None,
        period_s: float = 5.0,
    ) -> None:
        super().__init__(name, period_s)
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.queue_state = queue_state
        self.tz = tz
        self.is_readonly = is_readonly
        self.on_queue_changed = on_queue_changed
        #: part name -> monotonic time at which to check it
        self.pending: dict[str, float] = {}
        self.checked_total = 0
        self.broken_total = 0
        self.unexpected_total = 0
        self.fetches_enqueued_total = 0
        self.lost_forever_total = 0
        self.lost_parts: list[str] = []
        self.recent: deque[PartCheckResult] = deque(maxlen=RECENT_RESULTS)

    # ------------------------------------------------------------------------------------------ queueing

    def enqueue(self, part_name: str, delay_s: float = 0.0) -> None:
        """Check ``part_name`` in ``delay_s`` seconds (an earlier pending check of it wins)."""
        due = time.monotonic() + max(delay_s, 0.0)
        current = self.pending.get(part_name)
        if current is None or due < current:
            self.pending[part_name] = due
        self.wakeup()

    def __len__(self) -> int:
        return len(self.pending)

    def status(self) -> dict[str, Any]:
        return {
            "parts_to_check": len(self.pending),
            "checked_total": self.checked_total,
            "broken_total": self.broken_total,
            "unexpected_total": self.unexpected_total,
            "fetches_enqueued_total": self.fetches_enqueued_total,
            "lost_forever_total": self.lost_forever_total,
            "lost_parts": list(self.lost_parts[-RECENT_RESULTS:]),
            "recent": [r.to_dict() for r in self.recent],
        }

    async def run_once(self) -> Outcome:
        if not self.pending:
            return Outcome("idle", delay_s=IDLE_RECHECK_S)  # enqueue() wakes the task
        if self.is_readonly():
            return Outcome("readonly", delay_s=1.0, fields={"pending": len(self.pending)})
        now = time.monotonic()
        due = sorted((t, name) for name, t in self.pending.items() if t <= now)
        if not due:
            return Outcome("waiting", delay_s=min(self.pending.values()) - now)
        _, name = due[0]
        del self.pending[name]
        try:
            result = await self.check_part(name)
        except ReplicadError as e:
            # ZooKeeper trouble and the like: look again later
            log.warning("part_check_failed", part=name, error=str(e))
            self.enqueue(name, delay_s=2.0)
            return Outcome("check_failed", fields={"part": name, "error": str(e)})
        self.checked_total += 1
        self.recent.append(result)
        if result.outcome == "postponed":
            self.enqueue(name, delay_s=PRECOMMITTED_RECHECK_S)
        return Outcome("checked_part", did_work=bool(self.pending), fields=result.to_dict())

    # ------------------------------------------------------------------------------------------ checking

    async def check_part(self, part_name: str) -> PartCheckResult:
        info = PartInfo.try_parse(part_name)
        if info is None:
            return PartCheckResult(part_name, "bad_name")
        part = self.store.get(part_name)
        if part is not None and part.state is PartState.PRECOMMITTED:
            return PartCheckResult(part_name, "postponed", "the part is being committed")
        if part is not None and part.state is PartState.ACTIVE:
            return await self._check_local_part(part)
        containing = self.store.active_containing(info)
        if containing is not None:
            if containing.state is PartState.PRECOMMITTED:
                return PartCheckResult(part_name, "postponed", f"covering part {containing.name} committing")
            log.info("part_check_covered", part=part_name, covering=containing.name)
            return PartCheckResult(part_name, "covered", containing.name)
        return await self._search_for_missing_part(part_name, info)

    async def _check_local_part(self, part: LocalPart) -> PartCheckResult:
        name = part.name
        me = self.paths.me
        if await self.keeper.exists(me.part(name)) is None:
            log.error("unexpected_part_detaching", part=name)
            await self._detach(name, "unexpected")
            self.unexpected_total += 1
            return PartCheckResult(name, "detached_unexpected", "ZooKeeper does not list the part for us")
        try:
            await self._verify(part)
        except (CorruptedDataError, ZnodeFormatError, OSError) as e:
            log.error("broken_part_detaching", part=name, error=str(e))
            # set aside first: the queue entry must not find the broken part still active
            await self._detach(name, "broken")
            self.broken_total += 1
            entry = await remove_part_and_enqueue_fetch(self.keeper, self.paths, name, self.tz)
            self._insert_entry(entry)
            self.fetches_enqueued_total += 1
            return PartCheckResult(name, "detached_broken", str(e))
        log.info("part_check_ok", part=name)
        return PartCheckResult(name, "ok")

    async def _verify(self, part: LocalPart) -> None:
        columns_text, zk = await _zk_checksums(self.keeper, self.paths, part.name)
        path = part.path

        def read_local() -> tuple[str, Checksums]:
            fresh = PartDirectory.at(path)  # not the cached one: the files may have changed under us
            text = fresh.read_bytes("columns.txt").decode()
            checksums = Checksums.parse(fresh.read_bytes("checksums.txt"))
            fresh.verify(check_uncompressed=True)
            return text, checksums

        local_columns, local_checksums = await asyncio.to_thread(read_local)
        mine = MinimalisticChecksums.from_checksums(local_checksums)
        if isinstance(zk, PartHeader):
            zk.checksums.check_equal(mine, True)
        else:
            if columns_text is not None and columns_text != local_columns:
                raise CorruptedDataError(f"part {part.name}: columns in ZooKeeper differ from columns.txt")
            zk.check_equal(mine, True)

    async def _detach(self, name: str, prefix: str) -> None:
        part = self.store.get(name)
        if part is None:
            return
        if not await asyncio.to_thread(part.path.exists):
            # the directory vanished (deleted under us): forget the part, nothing to move
            try:
                await self.store.detach(name, prefix)
            except FileNotFoundError:
                pass
            log.warning("part_directory_missing_forgotten", part=name)
            return
        await self.store.detach(name, prefix)

    def _insert_entry(self, entry: LogEntry) -> None:
        self.queue_state.insert(entry.znode_name, entry, time.time())
        self.on_queue_changed()

    async def _search_for_missing_part(self, part_name: str, info: PartInfo) -> PartCheckResult:
        me = self.paths.me
        if await self.keeper.exists(me.part(part_name)) is not None:
            log.warning("missing_part_in_zookeeper_refetching", part=part_name)
            entry = await remove_part_and_enqueue_fetch(self.keeper, self.paths, part_name, self.tz)
            self._insert_entry(entry)
            self.fetches_enqueued_total += 1
            return PartCheckResult(part_name, "fetch_enqueued", entry.znode_name)

        me_name = self.paths.replica_name
        replicas = [r for r in await self.keeper.get_children(self.paths.replicas) if r != me_name]
        lists = await self.keeper.get_children_many([self.paths.replica(r).parts for r in replicas])
        same_min = same_max = False
        for replica, parts in zip(replicas, lists, strict=True):
            for other_name in parts or ():
                other = PartInfo.try_parse(other_name)
                if other is None or other.partition_id != info.partition_id:
                    continue
                if other.contains(info):
                    log.info(
                        "missing_part_found_elsewhere", part=part_name, replica=replica, found=other_name
                    )
                    return PartCheckResult(part_name, "found_elsewhere", f"{other_name} on {replica}")
                if info.contains(other):
                    same_min = same_min or other.min_block == info.min_block
                    same_max = same_max or other.max_block == info.max_block
                    if same_min and same_max:
                        log.warning("missing_part_may_appear_by_merge", part=part_name)
                        return PartCheckResult(part_name, "waiting_for_merge")
        return await self._lost_forever(part_name)

    async def _lost_forever(self, part_name: str) -> PartCheckResult:
        producing = [
            qe
            for qe in self.queue_state.entries
            if qe.type in _PRODUCING and qe.entry.new_part_name == part_name
        ]
        block_id = next((qe.entry.block_id for qe in producing if qe.entry.block_id), "")
        quorum_failed = await fail_quorum_for_part(self.keeper, self.paths, part_name, block_id)
        removed = []
        for qe in producing:
            try:
                await self.keeper.delete(self.paths.me.queue_entry(qe.znode_name))
            except KeeperNoNodeError:
                pass
            self.queue_state.remove_entry(qe.znode_name)
            removed.append(qe.znode_name)
        self.queue_state.virtual_parts.remove(part_name)
        self.lost_forever_total += 1
        self.lost_parts.append(part_name)
        log.error(
            "part_lost_forever",
            part=part_name,
            removed_queue_entries=removed,
            quorum_marked_failed=quorum_failed,
        )
        if removed:
            self.on_queue_changed()
        return PartCheckResult(part_name, "lost_forever", f"queue entries removed: {removed}")


# ------------------------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class StartupCheckResult:
    fetch: tuple[str, ...] = ()  # listed for us but missing locally: re-fetched
    replaced: tuple[tuple[str, str], ...] = ()  # (listed part, local covering part now registered instead)
    ignored: tuple[str, ...] = ()  # local parts ZooKeeper does not list: detached/ignored_<name>


async def check_parts_at_startup(
    keeper: Keeper,
    paths: TablePaths,
    store: PartStore,
    *,
    columns_version: int,
    tz: str = "UTC",
) -> StartupCheckResult:
    """18.16's checkParts: reconcile the local active parts with ``replicas/<me>/parts`` (queue nodes only;
    the caller loads the queue afterwards)."""
    me = paths.me
    expected = set(await keeper.get_children(me.parts))
    local = {p.name for p in store.active()}
    fetch: list[str] = []
    replaced: list[tuple[str, str]] = []
    ignored: list[str] = []
    zero_copy = store.remote is not None and store.remote.zero_copy
    for name in sorted(expected - local):
        info = PartInfo.try_parse(name)
        containing = store.active_containing(info) if info is not None else None
        if containing is not None and zero_copy and containing.name not in expected:
            # On a zero-copy disk a local part nobody registered is a merge or mutation of ours killed before
            # its commit: its objects have no lock leaf (another replica's release or the orphan scan may
            # delete them), so it is not claimed as 18.16 claims a local one.  It is set aside and the parts
            # it covered, registered and locked, are active again.
            log.error("setting_aside_uncommitted_zero_copy_part", part=containing.name, covers=name)
            await store.detach(containing.name, "ignored")
            ignored.append(containing.name)
            containing = None
        if containing is None and zero_copy and store.reactivate(name):
            log.warning("covered_part_active_again", part=name)
            continue
        if containing is not None:
            if containing.name not in expected:
                log.error("adding_unexpected_local_part_to_zookeeper", part=containing.name, covers=name)
                await keeper.multi(
                    part_commit_ops(
                        paths,
                        containing.name,
                        containing.directory.columns_text,
                        containing.directory.checksums,
                        columns_version,
                    )
                )
                expected.add(containing.name)
            log.error("removing_unexpectedly_merged_part_from_zookeeper", part=name, covering=containing.name)
            await remove_parts_from_zookeeper(keeper, paths, [name])
            replaced.append((name, containing.name))
            continue
        log.error("fetching_missing_part", part=name)
        await remove_part_and_enqueue_fetch(keeper, paths, name, tz)
        fetch.append(name)
    local = {p.name for p in store.active()}
    for name in sorted(local - expected):
        log.error("renaming_unexpected_part_to_ignored", part=name)
        await store.detach(name, "ignored")
        ignored.append(name)
    return StartupCheckResult(tuple(fetch), tuple(replaced), tuple(ignored))
