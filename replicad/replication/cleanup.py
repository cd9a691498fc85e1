"""The cleanup thread (ClickHouse's ``ReplicatedMergeTreeCleanupThread``).

Every ``cleanup_delay_period`` (+ up to ``cleanup_delay_period_random_add``) seconds, or when woken:

* **old parts** (every replica): outdated parts whose ``remove_time`` is older than ``old_parts_lifetime``
  lose their ``replicas/<me>/parts/<p>`` node first and their directory only afterwards (18.16's
  ``clearOldPartsAndRemoveFromZK``): a part ZooKeeper still lists for us is never removed from disk;
* **temporary directories** (every replica): ``tmp*`` directories untouched for
  ``temporary_directories_lifetime`` seconds are removed (an interrupted insert, fetch or merge);
* **the log** (the leader only, as 18.16): entries below the smallest ``log_pointer`` of the replicas that
  still need them are removed, always keeping the newest ``min_replicated_logs_to_keep`` (and doing nothing
  below 1.1 times that many).  An inactive replica whose pointer is older than the newest
  ``max_replicated_logs_to_keep`` entries no longer holds the log: it is marked lost (``is_lost`` = "1",
  guarded by the version of its ``host``, so a replica that came back meanwhile is not marked) and clones a
  healthy replica when it returns.  A replica without ``is_lost`` (a pre-2018 server) always holds the log;
  a lost replica that is active again (recovering) holds it from its pointer.  The removal multis check the
  ``replicas`` version (no replica was added meanwhile) and the ``host`` versions of the replicas treated as
  lost.  Never are all replicas marked lost.  These are modern ClickHouse's rules; 18.16 wrote the same nodes.
* **deduplication blocks** (the leader only): ``blocks/`` keeps the newest ``replicated_deduplication_window``
  block ids (by creation time) and none older than ``replicated_deduplication_window_seconds`` before the
  newest one.

Why the leader only: the log and ``blocks/`` are shared, and 18.16 replicas in the same set do exactly this;
one replica trimming is enough, and a short overlap when leadership moves is harmless (both compute the same
bounds; a removal that races another just finds the node gone).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from replicad import settings as settings_table
from replicad.errors import (
    KeeperBadVersionError,
    KeeperError,
    KeeperMultiError,
    KeeperNoNodeError,
    KeeperNotEmptyError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Check, Delete, Op, Set
from replicad.keeper.paths import TablePaths, pad_index, sequence_number
from replicad.logging import get_logger
from replicad.replication.executor import remove_parts_from_zookeeper
from replicad.replication.part_store import PartState, PartStore
from replicad.tasks import BackgroundTask, Outcome

log = get_logger(__name__)

#: deletes per multi when trimming the log (ClickHouse: 4 * MULTI_BATCH_SIZE) or ``blocks/``
LOG_REMOVE_BATCH = 400
#: concurrent requests when reading block stats / removing blocks
PIPELINE = 500


def table_setting(settings: Mapping[str, Any], name: str) -> Any:
    """A MergeTree setting of a table: its SETTINGS value (coerced) or ClickHouse's default."""
    raw = settings.get(name)
    if raw is not None:
        value, problem = settings_table.coerce(name, raw)
        if problem is None and value is not None:
            return value
        log.warning("bad_table_setting_ignored", setting=name, value=str(raw), problem=problem)
    return settings_table.SETTINGS[name].default


@dataclass(frozen=True)
class CleanupSettings:
    cleanup_delay_period: float = 30.0
    cleanup_delay_period_random_add: float = 10.0
    old_parts_lifetime: float = 480.0
    temporary_directories_lifetime: float = 86400.0
    min_replicated_logs_to_keep: int = 100
    max_replicated_logs_to_keep: int = 10000
    replicated_deduplication_window: int = 100
    replicated_deduplication_window_seconds: int = 604800

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> CleanupSettings:
        return cls(
            **{f: table_setting(settings, f) for f in cls.__dataclass_fields__}
        )


@dataclass(frozen=True)
class LogCleanupResult:
    removed: int = 0
    first: str = ""
    last: str = ""
    marked_lost: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------------- the log


@dataclass
class _ReplicaState:
    name: str
    host_version: int
    log_pointer: int
    is_lost: str | None  # None: no is_lost node
    active: bool


async def _read_replica(keeper: Keeper, paths: TablePaths, name: str) -> _ReplicaState | None:
    rp = paths.replica(name)
    try:
        _, host_stat = await keeper.get(rp.host)
        raw_pointer, _ = await keeper.get(rp.log_pointer)
    except KeeperNoNodeError:
        return None  # being created or removed: look again next time
    try:
        lost: str | None = (await keeper.get(rp.is_lost))[0].decode()
    except KeeperNoNodeError:
        lost = None
    active = await keeper.exists(rp.is_active) is not None
    pointer = int(raw_pointer) if raw_pointer.strip().isdigit() else 0
    return _ReplicaState(name, host_stat.version, pointer, lost, active)


async def clear_old_logs(
    keeper: Keeper, paths: TablePaths, min_to_keep: int, max_to_keep: int
) -> LogCleanupResult:
    """Trim ``log/`` (see the module docstring); returns what was removed and who was marked lost."""
    log_stat = await keeper.exists(paths.log)
    if log_stat is None:
        raise ReplicadError(f"{paths.log} doesn't exist", code=999)
    if log_stat.num_children < min_to_keep * 1.1:
        return LogCleanupResult()
    replicas_stat = await keeper.exists(paths.replicas)
    if replicas_stat is None:
        return LogCleanupResult()
    replicas = sorted(await keeper.get_children(paths.replicas))
    entries = sorted(c for c in await keeper.get_children(paths.log) if c.startswith("log-"))
    if not entries:
        return LogCleanupResult()
    min_saved_record = entries[len(entries) - max_to_keep if len(entries) > max_to_keep else 0]
    min_saved_record_index = sequence_number(min_saved_record)

    infinity = 1 << 64
    min_saved_pointer = infinity
    min_lost_candidate_pointer = infinity
    recovering: list[str] = []
    lost_host_versions: dict[str, int] = {}
    candidates: list[str] = []
    already_lost = 0
    for name in replicas:
        st = await _read_replica(keeper, paths, name)
        if st is None:
            return LogCleanupResult()
        if st.active:
            if st.is_lost == "1":
                recovering.append(name)  # lost but active: it is cloning; its pointer may move back
                already_lost += 1
            else:
                min_saved_pointer = min(min_saved_pointer, st.log_pointer)
        elif st.is_lost is None:
            min_saved_pointer = min(min_saved_pointer, st.log_pointer)  # a server without lost replicas
        elif st.is_lost == "0":
            if st.log_pointer >= min_saved_record_index:
                min_saved_pointer = min(min_saved_pointer, st.log_pointer)
            else:
                lost_host_versions[name] = st.host_version
                candidates.append(name)
                min_lost_candidate_pointer = min(min_lost_candidate_pointer, st.log_pointer)
        else:
            already_lost += 1
            lost_host_versions[name] = st.host_version
    for name in recovering:
        try:
            raw, _ = await keeper.get(paths.replica(name).log_pointer)
        except KeeperNoNodeError:
            return LogCleanupResult()
        min_saved_pointer = min(min_saved_pointer, int(raw) if raw.strip().isdigit() else 0)
    if recovering:
        min_saved_pointer = min(min_saved_pointer, min_lost_candidate_pointer)

    removable = entries[: max(len(entries) - min_to_keep, 0)]
    if min_saved_pointer < infinity:
        bound = f"log-{pad_index(min_saved_pointer)}"
        removable = [e for e in removable if e < bound]
    if not removable:
        return LogCleanupResult()

    marked = await mark_lost_replicas(
        keeper, paths, candidates, lost_host_versions, len(replicas) - already_lost
    )
    guard: list[Op] = [Check(paths.replica(r).host, v) for r, v in sorted(lost_host_versions.items())]
    guard.append(Check(paths.replicas, replicas_stat.version))
    for start in range(0, len(removable), LOG_REMOVE_BATCH):
        batch = removable[start : start + LOG_REMOVE_BATCH]
        ops: list[Op] = [Delete(paths.log_entry(e)) for e in batch]
        await keeper.multi([*ops, *guard])
    log.info("removed_old_log_entries", count=len(removable), first=removable[0], last=removable[-1])
    return LogCleanupResult(len(removable), removable[0], removable[-1], tuple(marked))


async def mark_lost_replicas(
    keeper: Keeper,
    paths: TablePaths,
    candidates: list[str],
    host_versions: Mapping[str, int],
    replicas_count: int,
) -> list[str]:
    """Set ``is_lost`` = "1" on each candidate unless its ``host`` changed (it came back)."""
    if not candidates:
        return []
    if len(candidates) >= replicas_count:
        raise ReplicadError("All replicas are stale: we won't mark any replica as lost", code=415)
    marked: list[str] = []
    for name in candidates:
        rp = paths.replica(name)
        try:
            await keeper.multi([Check(rp.host, host_versions[name]), Set(rp.is_lost, b"1")])
        except KeeperMultiError as e:
            if isinstance(e.cause, KeeperBadVersionError):
                raise ReplicadError(
                    f"{name} became active when we marked lost replicas.", code=416, retriable=True
                ) from e
            raise
        marked.append(name)
        log.warning("replica_marked_lost", replica=name)
    return marked


# ------------------------------------------------------------------------------------------------- blocks


async def clear_old_blocks(
    keeper: Keeper, paths: TablePaths, window: int, window_seconds: int, ctime_cache: dict[str, int]
) -> int:
    """Trim ``blocks/`` to the deduplication window; ``ctime_cache`` (block -> ctime ms) persists between
    calls so that only new blocks are stat-ed.  Returns the number of removed blocks."""
    blocks = await keeper.get_children(paths.blocks)
    present = set(blocks)
    for name in [n for n in ctime_cache if n not in present]:
        del ctime_cache[name]
    unknown = [b for b in blocks if b not in ctime_cache]
    for start in range(0, len(unknown), PIPELINE):
        chunk = unknown[start : start + PIPELINE]
        stats = await asyncio.gather(*(keeper.exists(paths.block(b)) for b in chunk))
        for b, st in zip(chunk, stats, strict=True):
            if st is not None:
                ctime_cache[b] = st.ctime_ms
    timed = sorted(((ctime_cache[b], b) for b in blocks if b in ctime_cache), reverse=True)
    if not timed:
        return 0
    newest = timed[0][0]
    threshold = max(0, newest - 1000 * window_seconds)
    first_old = min(window, len(timed))
    for i, (ctime, _) in enumerate(timed):
        if ctime < threshold:
            first_old = min(first_old, i)
            break
    doomed = [b for _, b in timed[first_old:]]

    async def remove(block: str) -> None:
        try:
            await keeper.delete(paths.block(block))
        except KeeperNoNodeError:
            pass
        except KeeperNotEmptyError:  # leftovers with children from ancient servers
            await keeper.delete(paths.block(block), recursive=True)
        ctime_cache.pop(block, None)

    for start in range(0, len(doomed), LOG_REMOVE_BATCH):  # 18.16 removes each in a request of its own
        batch = doomed[start : start + LOG_REMOVE_BATCH]
        try:
            await keeper.multi([Delete(paths.block(b)) for b in batch])
        except KeeperMultiError:  # one gone meanwhile, or one with children: each on its own
            await asyncio.gather(*(remove(b) for b in batch))
        else:
            for b in batch:
                ctime_cache.pop(b, None)
    if doomed:
        log.debug("cleared_old_blocks", count=len(doomed))
    return len(doomed)


# ------------------------------------------------------------------------------------------------- thread


@dataclass
class CleanupStats:
    runs: int = 0
    removed_parts_total: int = 0
    removed_tmp_dirs_total: int = 0
    removed_log_entries_total: int = 0
    removed_blocks_total: int = 0
    marked_lost_total: int = 0
    last_error: str = ""
    marked_lost: list[str] = field(default_factory=list)


class CleanupThread(BackgroundTask):
    """One table's cleanup."""

    def __init__(
        self,
        name: str,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        settings: CleanupSettings,
        *,
        is_leader: Callable[[], bool],
        is_readonly: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(name, settings.cleanup_delay_period)
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.settings = settings
        self.is_leader = is_leader
        self.is_readonly = is_readonly
        self.stats = CleanupStats()
        self._block_ctimes: dict[str, int] = {}

    def parts_outdated(self) -> None:
        """Parts just became outdated (a merge, a fetch of a covering part, an executed entry).  They are
        removable only after ``old_parts_lifetime``, so the cleanup is woken only when that comes before its
        next periodic run (ClickHouse wakes it only after dropping parts).  Waking it after every merge cost a
        whole cleanup round (the children of ``blocks/`` and ``log/``, every replica's pointers) per merge,
        that is one per four or five small inserts."""
        s = self.settings
        if s.old_parts_lifetime <= s.cleanup_delay_period:
            self.wakeup()

    def _next_delay(self) -> float:
        s = self.settings
        return s.cleanup_delay_period + random.uniform(0.0, s.cleanup_delay_period_random_add)

    async def run_once(self) -> Outcome:
        if self.is_readonly():
            return Outcome("readonly", delay_s=1.0)
        fields: dict[str, Any] = {}
        try:
            fields["removed_parts"] = await self.clear_old_parts()
            fields["removed_tmp_dirs"] = await self.clear_tmp_dirs()
            if self.is_leader():
                s = self.settings
                res = await clear_old_logs(
                    self.keeper, self.paths, s.min_replicated_logs_to_keep, s.max_replicated_logs_to_keep
                )
                fields["removed_log_entries"] = res.removed
                if res.marked_lost:
                    fields["marked_lost"] = list(res.marked_lost)
                    self.stats.marked_lost_total += len(res.marked_lost)
                    self.stats.marked_lost.extend(res.marked_lost)
                self.stats.removed_log_entries_total += res.removed
                blocks = await clear_old_blocks(
                    self.keeper,
                    self.paths,
                    s.replicated_deduplication_window,
                    s.replicated_deduplication_window_seconds,
                    self._block_ctimes,
                )
                fields["removed_blocks"] = blocks
                self.stats.removed_blocks_total += blocks
        except (KeeperError, ReplicadError) as e:
            self.stats.last_error = str(e)
            log.warning("cleanup_failed", table=self.paths.zk_path, error=str(e))
            return Outcome("cleanup_failed", delay_s=self._next_delay(), fields={"error": str(e), **fields})
        self.stats.runs += 1
        did = any(v for v in fields.values())
        return Outcome("cleaned" if did else "idle", delay_s=self._next_delay(), fields=fields)

    async def clear_old_parts(self) -> list[str]:
        """Outdated parts past ``old_parts_lifetime``: ZooKeeper nodes first, then the directories."""
        deadline = time.time() - self.settings.old_parts_lifetime
        old = [
            p.name
            for p in self.store.all_parts()
            if p.state is PartState.OUTDATED and (p.remove_time or 0.0) <= deadline
        ]
        if not old:
            return []
        await remove_parts_from_zookeeper(self.keeper, self.paths, old)
        removed = []
        for name in old:
            if await self.store.remove_outdated(name):
                removed.append(name)
        if removed:
            self.stats.removed_parts_total += len(removed)
            log.info("removed_old_parts", parts=removed)
        return removed

    async def clear_tmp_dirs(self) -> list[str]:
        lifetime = self.settings.temporary_directories_lifetime
        if lifetime <= 0:
            return []  # 0 would remove directories still being written
        removed = await asyncio.to_thread(self.store.layout.clear_tmp_dirs, lifetime)
        if removed:
            self.stats.removed_tmp_dirs_total += len(removed)
            log.info("removed_old_temporary_directories", dirs=removed)
        return removed

    def status(self) -> dict[str, Any]:
        s = self.stats
        return {
            "runs": s.runs,
            "removed_parts_total": s.removed_parts_total,
            "removed_tmp_dirs_total": s.removed_tmp_dirs_total,
            "removed_log_entries_total": s.removed_log_entries_total,
            "removed_blocks_total": s.removed_blocks_total,
            "marked_lost_total": s.marked_lost_total,
            "marked_lost": list(s.marked_lost[-10:]),
            "last_error": s.last_error,
        }
