"""Executing MERGE_PARTS and MUTATE_PART entries on every replica (18.16's tryExecuteMerge /
tryExecutePartMutation, then executeFetch when that is not possible).

For both, first as ``executeLogEntry``: if a local part equal to or covering the result exists and is
registered under ``replicas/<me>/parts``, the entry is done.  Then:

* MERGE_PARTS — merged here when every source is an active local part under exactly its name, the table
  does not say ``always_fetch_merged_part``, the entry is not a DEDUPLICATE merge (not implemented: fetched)
  and it is not an old (``prefer_fetch_merged_part_time_threshold``) big (``…_size_threshold``) merge whose
  result another replica already has.  :func:`~replicad.storage.merge.merge_parts` writes
  ``tmp_merge_<part>`` (the name must be what the sources give);
* MUTATE_PART — mutated here when the source is an active local part (same thresholds), with the commands
  of every loaded mutation between the part's data version and the entry's mutation number
  (:func:`~replicad.storage.mutate.mutate_part` → ``tmp_mut_<part>``).  If that number is not loaded yet
  the mutations are reloaded first; an unknown one means an empty command list, as 18.16 does.

A locally made part is committed like 18.16's ``checkPartChecksumsAndCommit``: its checksums must equal
those other replicas registered (CorruptedDataError → the part is deleted and the result fetched instead,
"not byte-identical"), then ``replicas/<me>/parts/<part>`` is created and the part becomes active.  Its
sources become outdated and are removed later by the cleanup (their ZooKeeper nodes with them), as in 18.16.
Otherwise the result (or a part covering it) is fetched from the best replica that has it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replicad.errors import BadPartNameError, CorruptedDataError, ReplicadError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.logging import get_logger
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_entry import Selected
from replicad.model.queue_state import QueueState
from replicad.replication import background_pool
from replicad.replication.executor import EntryNotReadyError
from replicad.replication.fetcher import NoReplicaHasPartError, PartFetcher
from replicad.replication.mutations import MutationsState, storage_commands
from replicad.replication.part_store import LocalPart, PartState, PartStore
from replicad.storage.layout import TMP_MERGE, TMP_MUTATE
from replicad.storage.merge import TableSchemaLike, merge_parts
from replicad.storage.mutate import MutationCommand, mutate_part
from replicad.storage.writer import WriterSettings, WrittenPart

log = get_logger(__name__)


@dataclass(frozen=True)
class ExecutorSettings:
    always_fetch_merged_part: bool = False
    prefer_fetch_merged_part_time_threshold: int = 3600
    prefer_fetch_merged_part_size_threshold: int = 10 << 30
    #: merges yield the CPU (background_pool.run_yielding) while every partition has fewer active parts than
    #: half this (the insert delay's threshold)
    parts_to_delay_insert: int = 150

    @classmethod
    def from_settings(cls, s: dict[str, Any]) -> ExecutorSettings:
        base = cls()
        return cls(
            always_fetch_merged_part=bool(int(s.get("always_fetch_merged_part", 0))),
            prefer_fetch_merged_part_time_threshold=int(
                s.get("prefer_fetch_merged_part_time_threshold", base.prefer_fetch_merged_part_time_threshold)
            ),
            prefer_fetch_merged_part_size_threshold=int(
                s.get("prefer_fetch_merged_part_size_threshold", base.prefer_fetch_merged_part_size_threshold)
            ),
            parts_to_delay_insert=int(s.get("parts_to_delay_insert", base.parts_to_delay_insert)),
        )


class PartProducer:
    """The MERGE_PARTS / MUTATE_PART handlers of one table (registered in ``QueueExecutor.handlers``)."""

    def __init__(
        self,
        keeper: Keeper,
        paths: TablePaths,
        store: PartStore,
        queue: QueueState,
        fetcher: PartFetcher,
        mutations: MutationsState,
        schema: TableSchemaLike,
        writer_settings: WriterSettings,
        *,
        settings: ExecutorSettings | None = None,
        on_part_made: Callable[[], None] = lambda: None,
        on_broken_part: Callable[[str], None] = lambda _name: None,
    ) -> None:
        self.keeper = keeper
        self.paths = paths
        self.store = store
        self.queue = queue
        self.fetcher = fetcher
        self.mutations = mutations
        self.schema = schema
        self.writer_settings = writer_settings
        self.settings = settings or ExecutorSettings()
        self.on_part_made = on_part_made
        #: told of the source parts of a merge or mutation that failed reading them (ClickHouse's
        #: reportBrokenPart): the part check moves a broken one to detached/ and fetches it again
        self.on_broken_part = on_broken_part
        self.merged_total = 0
        self.mutated_total = 0
        self.fetched_instead_total = 0
        self.zero_copy_postponed_total = 0
        self.mismatches_total = 0

    def handlers(self) -> dict[LogEntryType, Callable[[Selected], Awaitable[None]]]:
        return {LogEntryType.MERGE_PARTS: self.execute_merge, LogEntryType.MUTATE_PART: self.execute_mutation}

    # ------------------------------------------------------------------------------------------ shared

    async def _already_done(self, entry: LogEntry) -> bool:
        existing = self.store.get(entry.new_part_name)
        if existing is None or existing.state is PartState.OUTDATED:
            existing = self.store.active_containing(PartInfo.parse(entry.new_part_name))
        if existing is None:
            return False
        if await self.keeper.exists(self.paths.me.part(existing.name)) is None:
            return False
        log.debug("part_already_exists", part=entry.new_part_name, existing=existing.name)
        return True

    async def _prefer_fetch(self, entry: LogEntry, sources: Sequence[LocalPart]) -> bool:
        """Old and big enough, and someone already has the result: fetch rather than redo the work."""
        s = self.settings
        if entry.create_time + s.prefer_fetch_merged_part_time_threshold > time.time():
            return False
        size = sum(await asyncio.to_thread(lambda: [p.directory.bytes_on_disk for p in sources]))
        if size < s.prefer_fetch_merged_part_size_threshold:
            return False
        source = await self.fetcher.find_source(entry.new_part_name)
        if source is None or source.part_name != entry.new_part_name:
            return False
        log.info("prefer_to_fetch", part=entry.new_part_name, replica=source.replica)
        return True

    async def _reading(self, sources: Sequence[LocalPart], fn: Callable[..., WrittenPart],
                       *args: Any) -> WrittenPart:
        """``fn(*args)`` in the background pool (its own threads: a merge never holds one an INSERT waits
        for); a source that cannot be read (checksum mismatch, truncated or missing
        file) is reported to the part check before the error propagates, so the entry does not fail on the
        same broken part forever (the part check decides which source is broken)."""
        run = background_pool.run_yielding if self._may_yield() else background_pool.run
        try:
            return await run(fn, *args)
        except (CorruptedDataError, FileNotFoundError) as e:
            for p in sources:
                log.warning("merge_source_unreadable_checking", part=p.name, error=str(e))
                self.on_broken_part(p.name)
            raise

    def _may_yield(self) -> bool:
        """True when the merge may run at a lower priority than inserts and fetches: no partition is even
        half-way to the insert delay (a merge falling behind there would soon slow the inserts down)."""
        return self.store.max_active_in_partition() * 2 < self.settings.parts_to_delay_insert

    async def _commit(self, selected: Selected, tmp_dir: Path, written: WrittenPart) -> bool:
        """checkPartChecksumsAndCommit for a part made here; False when another replica registered different
        checksums (the part is gone and the caller fetches)."""
        info = PartInfo.parse(selected.entry.new_part_name)
        try:
            await self.fetcher.commit_new_part(tmp_dir, info, written.checksums)
        except CorruptedDataError as e:
            self.mismatches_total += 1
            log.error(
                "data_differs_from_replica_will_fetch",
                part=info.name,
                error=str(e),
                hint="not byte-identical to another replica's part; the part will be downloaded instead",
            )
            await asyncio.to_thread(shutil.rmtree, tmp_dir, True)
            return False
        self.on_part_made()
        return True

    async def fetch_result(self, selected: Selected) -> None:
        """executeFetch: download the entry's part, or a part covering it, from the best replica."""
        entry, qe = selected.entry, selected.queue_entry
        source = await self.fetcher.find_source(entry.new_part_name)
        if source is None:
            raise NoReplicaHasPartError(f"No active replica has part {entry.new_part_name} or covering part")
        reason = self.queue.add_future_part_if_not_covered(qe.znode_name, source.part_name)
        if reason is not None:
            raise EntryNotReadyError(
                f"Will not fetch part {source.part_name} covering {entry.new_part_name}. {reason}"
            )
        self.fetched_instead_total += 1
        if await self.fetcher.fetch_part(source.part_name, source.replica) is None:
            raise EntryNotReadyError(f"Part {source.part_name} is already being fetched")
        self.on_part_made()

    # ------------------------------------------------------------------------------------------ zero-copy

    async def _zero_copy_exclusive(self, part_name: str) -> bool:
        """On a zero-copy table one replica makes a merged/mutated part and the others fetch it: take
        ``<part>/part_exclusive_lock`` (True: make it here).  Held elsewhere: fetch if the result exists
        already, else wait (EntryNotReadyError, retried).  After taking it, re-check that nobody made the part
        meanwhile (ZooKeeper reads are not linearizable): then fetch."""
        remote = self.store.remote
        if remote is None or remote.locks is None:
            return True
        holder = await remote.locks.try_exclusive(part_name)
        if holder is not None:
            if await self.fetcher.find_source(part_name) is not None:
                return False
            self.zero_copy_postponed_total += 1
            raise EntryNotReadyError(f"Not executing {part_name}: zero-copy exclusive lock is held by "
                                     f"{holder}; waiting for it to execute it and will fetch after")
        if await self.fetcher.find_source(part_name) is not None:
            await self._zero_copy_release(part_name)
            return False
        return True

    async def _zero_copy_release(self, part_name: str) -> None:
        remote = self.store.remote
        if remote is None or remote.locks is None:
            return
        try:
            await remote.locks.release_exclusive(part_name)
        except ReplicadError as e:  # ephemeral: it goes with our session anyway
            log.warning("zero_copy_exclusive_release_failed", part=part_name, error=str(e))

    # ------------------------------------------------------------------------------------------ merges

    async def execute_merge(self, selected: Selected) -> None:
        entry = selected.entry
        if await self._already_done(entry):
            return
        if not await self._try_merge(selected):
            await self.fetch_result(selected)

    def _merge_sources(self, entry: LogEntry) -> list[LocalPart] | None:
        parts: list[LocalPart] = []
        for name in entry.source_parts:
            part = self.store.active_containing(PartInfo.parse(name))
            if part is None or part.state is not PartState.ACTIVE:
                log.debug("merge_source_missing", part=entry.new_part_name, missing=name)
                return None
            if part.name != name:
                log.warning("merge_source_covered", part=name, covering=part.name, merge=entry.new_part_name)
                return None
            parts.append(part)
        return parts

    async def _try_merge(self, selected: Selected) -> bool:
        entry = selected.entry
        if self.settings.always_fetch_merged_part or entry.deduplicate:
            return False
        sources = self._merge_sources(entry)
        if sources is None:
            log.info("dont_have_all_parts_for_merge_will_fetch", part=entry.new_part_name)
            return False
        if await self._prefer_fetch(entry, sources):
            return False
        expected = PartInfo.for_merge([p.info for p in sources]).name
        if expected != entry.new_part_name:
            raise BadPartNameError(
                f"Future merged part name `{expected}` differs from part name in log entry: "
                f"`{entry.new_part_name}`"
            )
        tmp_dir = self.store.layout.tmp_path(TMP_MERGE, entry.new_part_name)
        if not await self._zero_copy_exclusive(entry.new_part_name):
            return False
        started = time.monotonic()
        try:
            written = await self._reading(
                sources, merge_parts, [p.directory for p in sources], tmp_dir, self.schema,
                self.writer_settings)
            if not await self._commit(selected, tmp_dir, written):
                return False
        finally:
            await self._zero_copy_release(entry.new_part_name)
        self.merged_total += 1
        log.info(
            "merged_parts",
            part=entry.new_part_name,
            sources=list(entry.source_parts),
            rows=written.rows,
            seconds=round(time.monotonic() - started, 3),
        )
        return True

    # ------------------------------------------------------------------------------------------ mutations

    async def execute_mutation(self, selected: Selected) -> None:
        entry = selected.entry
        if await self._already_done(entry):
            return
        if not await self._try_mutate(selected):
            await self.fetch_result(selected)

    async def _commands(self, source: PartInfo, version: int) -> list[MutationCommand]:
        texts = self.mutations.commands_for(source, version)
        if texts is None:
            await self.mutations.update()  # the entry may be newer than our last look at /mutations
            texts = self.mutations.commands_for(source, version)
        if texts is None:
            log.error("mutation_not_found", part=source.name, version=version)
            return []
        return [c for text in texts for c in storage_commands(text)]

    async def _try_mutate(self, selected: Selected) -> bool:
        entry = selected.entry
        source_name = entry.source_parts[0]
        source = self.store.active_containing(PartInfo.parse(source_name))
        if source is None or source.state is not PartState.ACTIVE:
            log.info("source_part_not_ready_will_fetch", part=entry.new_part_name, source=source_name)
            return False
        if source.name != source_name:
            log.warning("mutation_source_covered", part=source_name, covering=source.name)
            return False
        if self.settings.always_fetch_merged_part or await self._prefer_fetch(entry, [source]):
            return False
        new_info = PartInfo.parse(entry.new_part_name)
        try:
            commands = await self._commands(source.info, new_info.mutation)
        except ReplicadError as e:
            log.error("cannot_parse_mutation_commands_will_fetch", part=entry.new_part_name, error=str(e))
            return False
        tmp_dir = self.store.layout.tmp_path(TMP_MUTATE, entry.new_part_name)
        if not await self._zero_copy_exclusive(entry.new_part_name):
            return False
        started = time.monotonic()
        try:
            written = await self._reading(
                [source], mutate_part, source.path, tmp_dir, self.schema, commands, self.writer_settings
            )
            if not await self._commit(selected, tmp_dir, written):
                return False
        finally:
            await self._zero_copy_release(entry.new_part_name)
        self.mutated_total += 1
        log.info(
            "mutated_part",
            part=entry.new_part_name,
            source=source_name,
            commands=len(commands),
            rows=written.rows,
            seconds=round(time.monotonic() - started, 3),
        )
        return True

    def status(self) -> dict[str, int]:
        return {
            "merged_parts": self.merged_total,
            "mutated_parts": self.mutated_total,
            "fetched_instead": self.fetched_instead_total,
            "checksum_mismatches": self.mismatches_total,
        }
