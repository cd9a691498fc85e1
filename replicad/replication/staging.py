"""Two-phase writes: staged inserts, and the task that publishes (or drops) them once their run is decided.

Stage: an INSERT with ``replicad_stage_run/task/batch`` writes ordinary parts (as any insert) but moves them
into the local staging area (:mod:`replicad.storage.staging_area`) instead of committing them: no block
number, no log entry, nothing in ZooKeeper, invisible to SELECT and to other replicas.

Publish: :class:`StagingTask` (one per table) looks at each local run's decision
(:mod:`replicad.replication.staging_records`).  Commit → every batch this replica staged for a winning task is
published through the normal commit path (block number, GET_PART entry, ``parts/`` nodes, ``blocks/<id>``),
each part in a multi that also creates its ``parts/<marker>`` — so a part is published exactly once however
often publishing restarts — then ``done/<task>`` is created and the local copy removed.  Tasks that did not
win are dropped.  Abort → the run is dropped.  No decision and no staged batch for ``replicad_staging_ttl``
→ the task writes an abort decision itself (if a commit got there first, it publishes instead).
Roll-forward only: a replica that crashes half-way finishes after restart; nothing is published without a
commit decision.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from replicad.errors import KeeperError, KeeperNodeExistsError, KeeperNoNodeError, ReplicadError
from replicad.keeper.client import Keeper
from replicad.logging import get_logger
from replicad.model.block_id import block_id_from_token, block_token
from replicad.model.staged_job import RunDecision, StagedTask, StageId
from replicad.replication.commit import PartCommitter, TempPart
from replicad.replication.sink import InsertContext, TableSchema, write_block
from replicad.replication.staging_records import StagingRecords, done_name
from replicad.storage.layout import TMP_INSERT, TableDataLayout
from replicad.storage.merge import merge_parts
from replicad.storage.part import PartDirectory
from replicad.storage.staging_area import StagedPart, StagingArea, link_part
from replicad.storage.writer import WriterSettings
from replicad.tasks import IDLE_RECHECK_S, BackgroundTask, Outcome

log = get_logger(__name__)
_link_counter = itertools.count(1)
MAX_PARALLEL_PUBLISH = 4
#: staged parts of one partition smaller than this are combined (merged) into published parts of up to
#: ``COMBINE_MAX_ROWS`` rows; larger ones are published as they are (as the one-phase writer's inserts would
#: be: merging them would only delay the job, background merges do it later)
COMBINE_BELOW_ROWS = 16_384
COMBINE_MAX_ROWS = 1_048_576
#: test-only (with REPLICAD_FAULT_INJECTION=1): SIGKILL this process after publishing this many parts
KILL_AFTER_ENV = "REPLICAD_FAULT_KILL_AFTER_PUBLISHED_PARTS"


@dataclass(frozen=True)
class StagedBatch:
    rows: int
    parts: int
    deduplicated: bool


@dataclass(frozen=True)
class StagingSettings:
    ttl_s: float = 86400.0
    run_record_lifetime_s: float = 259200.0
    job_record_lifetime_s: float = 2592000.0

    @classmethod
    def from_settings(cls, s: dict[str, Any]) -> StagingSettings:
        return cls(float(s.get("replicad_staging_ttl", cls.ttl_s)),
                   float(s.get("replicad_staging_record_lifetime", cls.run_record_lifetime_s)),
                   float(s.get("replicad_job_record_lifetime", cls.job_record_lifetime_s)))


@dataclass
class StagingContext:
    """What staging needs of a table (not the table itself)."""

    keeper: Keeper
    zk_path: str
    replica_name: str
    area: StagingArea
    layout: TableDataLayout
    schema: TableSchema
    writer_settings: WriterSettings
    committer: PartCommitter
    settings: StagingSettings
    is_readonly: Callable[[], bool]
    is_leader: Callable[[], bool]


async def stage_insert(
    ctx: StagingContext, stage: StageId, batches: AsyncIterator[pa.RecordBatch], columns: list[str] | None
) -> StagedBatch:
    """Write the request's rows as parts into the staging area, as batch ``stage.batch`` of the task."""
    tmp = await asyncio.to_thread(ctx.area.new_batch_dir, stage.run, stage.task, stage.batch)
    insert = InsertContext(deduplicate=False)
    rows = parts = 0
    try:
        async for batch in batches:
            table = pa.Table.from_batches([batch])
            if columns is not None and list(table.column_names) != list(columns):
                table = table.rename_columns(list(columns))
            for tp in await write_block(table, ctx.schema, ctx.layout, ctx.writer_settings, insert):
                await asyncio.to_thread(StagingArea.add_part, tmp, tp.path, parts, tp.partition_id)
                parts += 1
                rows += tp.rows
        fresh = await asyncio.to_thread(ctx.area.finish_batch, tmp, stage.run, stage.task, stage.batch)
    except BaseException:
        await asyncio.to_thread(StagingArea.remove_batch, tmp)
        for tp in insert.parts:  # a part written but not yet moved into the batch
            await asyncio.to_thread(StagingArea.remove_batch, tp.path)
        raise
    log.info("batch_staged", table=f"{ctx.layout.database}.{ctx.layout.table}", run=stage.run,
             task=stage.task, batch=stage.batch, rows=rows, parts=parts, deduplicated=not fresh)
    return StagedBatch(rows if fresh else 0, parts if fresh else 0, not fresh)


class StagingTask(BackgroundTask):
    """Publishes or drops this replica's staged runs as their decisions say (see the module doc)."""

    def __init__(self, name: str, ctx: StagingContext, period_s: float = 0.5) -> None:
        super().__init__(name, period_s)
        self.ctx = ctx
        self.records = StagingRecords(ctx.keeper, ctx.zk_path)
        self._cleaned_at = 0.0
        self.published_parts = 0
        self.problems: dict[str, str] = {}  # run/task -> what keeps it from being published
        self._kill_after = _kill_after()

    async def run_once(self) -> Outcome:
        ctx = self.ctx
        runs = await asyncio.to_thread(ctx.area.runs)
        if ctx.is_readonly():
            return Outcome("readonly", delay_s=1.0) if runs else Outcome("idle", delay_s=IDLE_RECHECK_S)
        cleaned = await self._cleanup_records()
        if not runs:  # stage() wakes the task; the leader's record cleanup runs at most once a minute anyway
            return Outcome("idle" if not cleaned else "cleaned_records", delay_s=IDLE_RECHECK_S,
                           fields={"removed": cleaned} if cleaned else {})
        published = dropped = 0
        now = time.time()
        for run in runs:
            decision = await self.records.decision(run)
            if decision is None:
                if now - await asyncio.to_thread(ctx.area.run_last_active, run) < ctx.settings.ttl_s:
                    continue
                decision = await self.records.abort(run, "-", reason="staging ttl expired")
            if not decision.committed:
                await asyncio.to_thread(ctx.area.remove_run, run)
                log.info("staged_run_dropped", run=run, reason=decision.reason)
                dropped += 1
                continue
            p, d = await self._publish_run(decision)
            published += p
            dropped += d
        if published or dropped:
            return Outcome("published", did_work=True, fields={"parts": published, "dropped_tasks": dropped})
        return Outcome("waiting", fields={"runs": len(runs), "problems": dict(self.problems)})

    async def _publish_run(self, decision: RunDecision) -> tuple[int, int]:
        """Publish this replica's winning batches of a committed run; returns (parts, tasks dropped).

        Staged parts of one partition are combined (merged) into parts of up to ``COMBINE_MAX_ROWS`` rows, so
        a job of many small tasks publishes a few parts rather than one per task and batch; every staged part
        keeps its own marker, created in the multi of the part that carries its rows."""
        ctx, run = self.ctx, decision.run
        mine = decision.tasks_on(ctx.replica_name)
        dropped = 0
        for task in await asyncio.to_thread(ctx.area.tasks, run):
            if task not in mine:
                await asyncio.to_thread(ctx.area.remove_task, run, task)
                log.info("staged_task_dropped", run=run, task=task, reason="not a winning attempt")
                dropped += 1
        paths = self.records.paths
        try:
            done = set(await ctx.keeper.get_children(paths.done(run)))
            published_markers = set(await ctx.keeper.get_children(paths.parts(run)))
        except KeeperNoNodeError:
            done, published_markers = set(), set()
        todo = {t: st for t, st in mine.items() if done_name(t, ctx.replica_name) not in done}
        pending: list[tuple[StageId, StagedPart, str]] = []
        for task, st in sorted(todo.items()):
            batches = await asyncio.to_thread(ctx.area.batches, run, task)
            missing = [b for b in st.batches if b not in batches]
            if missing:
                self.problems[f"{run}/{task}"] = f"staged batches {missing[:10]} are missing on this replica"
                log.error("staged_data_missing", run=run, task=task, batches=missing[:10])
                continue
            for b in st.batches:
                for part in await asyncio.to_thread(StagingArea.parts, batches[b]):
                    marker = paths.part_marker(run, task, b, part.ordinal)
                    if marker.rsplit("/", 1)[1] not in published_markers:
                        pending.append((StageId(run, task, b), part, marker))
        complete = [t for t in todo if f"{run}/{t}" not in self.problems]
        groups = await asyncio.to_thread(_groups, pending)
        sem = asyncio.Semaphore(MAX_PARALLEL_PUBLISH)

        async def one(group: list[tuple[StageId, StagedPart, str]]) -> None:
            async with sem:
                await self._publish_group(run, group)

        await asyncio.gather(*(one(g) for g in groups))
        await asyncio.gather(*(self._create_quietly(paths.done_marker(run, t, ctx.replica_name))
                               for t in complete))
        await asyncio.to_thread(ctx.area.remove_tasks, run, complete)
        if len(complete) == len(todo):
            await asyncio.to_thread(ctx.area.remove_run, run)
        if groups:
            log.info("staged_run_published", run=run, tasks=len(complete), staged_parts=len(pending),
                     parts=len(groups))
        return len(groups), dropped

    async def _create_quietly(self, path: str) -> None:
        try:
            await self.ctx.keeper.create(path, b"")
        except KeeperNodeExistsError:
            pass

    async def _publish_group(self, run: str, group: list[tuple[StageId, StagedPart, str]]) -> None:
        """One part made of ``group``'s staged parts (all of one partition), committed with their markers."""
        ctx = self.ctx
        dest = ctx.layout.tmp_path(TMP_INSERT, f"stage_{os.getpid()}_{next(_link_counter)}")
        sources = [p.path for _s, p, _m in group]

        def build() -> PartDirectory:
            if len(sources) == 1:
                link_part(sources[0], dest)
            else:
                dest.mkdir()
                merge_parts(sources, dest, ctx.schema, ctx.writer_settings)
            return PartDirectory.at(dest).preload()

        try:
            directory = await asyncio.to_thread(build)
        except BaseException:
            await asyncio.to_thread(StagingArea.remove_batch, dest)
            raise
        markers = [m for _s, _p, m in group]
        partition_id = group[0][1].partition_id
        if len(group) == 1:
            stage, part, _m = group[0]
            token = block_token(stage.block_token(), part.ordinal)
        else:  # the markers name the staged parts it holds: the same group always gets the same id
            token = "replicad-stage-" + hashlib.sha256("\n".join(markers).encode()).hexdigest()
        temp = TempPart(path=dest, partition_id=partition_id, rows=directory.rows,
                        checksums=directory.checksums, columns_text=directory.columns_text,
                        block_id=block_id_from_token(partition_id, token))
        try:
            result = await ctx.committer.commit(temp, markers=markers)
        except BaseException:
            await asyncio.to_thread(StagingArea.remove_batch, dest)  # gone already when it was committed
            raise
        self.published_parts += 1
        log.info("staged_part_published", run=run, part=result.part_name, staged_parts=len(group),
                 rows=directory.rows, duplicate=result.deduplicated)
        if self._kill_after and self.published_parts >= self._kill_after:
            log.warning("fault_kill_after_published_parts", parts=self.published_parts)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _cleanup_records(self) -> int:
        """The leader removes old decision records, at most once a minute."""
        now = time.time()
        if not self.ctx.is_leader() or now - self._cleaned_at < 60.0:
            return 0
        self._cleaned_at = now
        s = self.ctx.settings
        try:
            return await self.records.cleanup(s.run_record_lifetime_s, s.job_record_lifetime_s)
        except (KeeperError, ReplicadError) as e:
            log.warning("staging_cleanup_failed", error=str(e))
            return 0

    def health(self) -> dict[str, Any]:
        runs, batches = self.ctx.area.size()
        return {"staged_runs": runs, "staged_batches": batches, "published_parts": self.published_parts,
                "problems": dict(self.problems)}


def _groups(pending: list[tuple[StageId, StagedPart, str]]) -> list[list[tuple[StageId, StagedPart, str]]]:
    """Small staged parts grouped by partition (in stage order), each group up to ``COMBINE_MAX_ROWS`` rows;
    each larger part is a group of its own."""
    out: list[list[tuple[StageId, StagedPart, str]]] = []
    open_group: dict[str, tuple[int, int]] = {}  # partition -> (index in out, rows so far)
    for item in pending:
        rows = PartDirectory.at(item[1].path).rows
        if rows >= COMBINE_BELOW_ROWS:
            out.append([item])
            continue
        pid = item[1].partition_id
        index, total = open_group.get(pid, (-1, 0))
        if index < 0 or total + rows > COMBINE_MAX_ROWS:
            out.append([])
            index, total = len(out) - 1, 0
        out[index].append(item)
        open_group[pid] = (index, total + rows)
    return out


def _kill_after() -> int:
    if os.environ.get("REPLICAD_FAULT_INJECTION", "").strip().lower() not in ("1", "true", "yes", "on"):
        return 0
    raw = os.environ.get(KILL_AFTER_ENV, "")
    return int(raw) if raw.isdigit() else 0




class TableStaging:
    """The staging side of one table: staged inserts, the decision records and the publishing task."""

    def __init__(self, task_name: str, ctx: StagingContext) -> None:
        self.ctx = ctx
        self.task = StagingTask(task_name, ctx)
        self.records = self.task.records

    async def start(self) -> None:
        removed = await asyncio.to_thread(self.ctx.area.clear_tmp)
        if removed:
            log.info("staging_leftovers_removed", count=removed)

    async def stage(
        self, stage: StageId, batches: AsyncIterator[pa.RecordBatch], columns: list[str] | None
    ) -> StagedBatch:
        staged = await stage_insert(self.ctx, stage, batches, columns)
        self.task.wakeup()  # the task polls for the run's decision while runs are staged
        return staged

    async def commit(self, job_id: str, run: str, tasks: list[StagedTask]) -> dict[str, Any]:
        answer = await self.records.commit(job_id, run, tasks)
        self.task.wakeup()
        return answer.to_dict()

    async def abort(self, run: str, job_id: str) -> dict[str, Any]:
        decision = await self.records.abort(run, job_id, reason="aborted by the writer")
        self.task.wakeup()
        return {"run": run, "decision": decision.decision, "reason": decision.reason}

    async def status(self, run: str) -> dict[str, Any]:
        return await self.records.status(run)
