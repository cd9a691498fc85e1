"""The ZooKeeper side of two-phase writes: one durable decision per run, job ids remembered.

Layout, under the table's ZooKeeper path (18.16 and current ClickHouse ignore the subtree)::

    replicad_staging/
      runs/<run>                  RunDecision text, created exactly once: the commit point (or the abort)
      runs/<run>/parts/<marker>   created in the multi that publishes one staged part (exactly once)
      runs/<run>/done/<task>.<h>  a replica finished publishing one task (h: hash of the replica name)
      jobs/<job key>              the run that committed the job (created in the same multi as runs/<run>)

Commit: ``multi[create runs/<run> (commit), create runs/<run>/parts, create runs/<run>/done,
create jobs/<job>]``.  If ``jobs/<job>`` exists the job was committed by an earlier run: this run is aborted
instead (a re-run adds nothing).  If ``runs/<run>`` exists the run was decided already: the same commit is a
no-op (a retried request), an abort is final.  Abort, and the staging TTL, create ``runs/<run>`` with an
abort decision: whoever creates the node first decides.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replicad.errors import (
    BadInputError,
    KeeperMultiError,
    KeeperNodeExistsError,
    KeeperNoNodeError,
    ReplicadError,
)
from replicad.keeper.client import Keeper
from replicad.keeper.ops import Create, Op
from replicad.logging import get_logger
from replicad.model.staged_job import ABORT, COMMIT, RunDecision, StagedTask, check_run, job_key

log = get_logger(__name__)


class RunConflictError(ReplicadError):
    """The run was decided the other way already (a commit after an abort, or the reverse)."""

    code = 341  # UNFINISHED (closest ClickHouse code: the operation cannot proceed in this state)
    http_status = 409


@dataclass(frozen=True)
class StagingPaths:
    table_zk_path: str

    @property
    def root(self) -> str:
        return f"{self.table_zk_path}/replicad_staging"

    @property
    def runs(self) -> str:
        return f"{self.root}/runs"

    @property
    def jobs(self) -> str:
        return f"{self.root}/jobs"

    def run(self, run: str) -> str:
        return f"{self.runs}/{check_run(run)}"

    def parts(self, run: str) -> str:
        return f"{self.run(run)}/parts"

    def part_marker(self, run: str, task: str, batch: int, ordinal: int) -> str:
        return f"{self.parts(run)}/{task}-b{batch}-{ordinal}"

    def done(self, run: str) -> str:
        return f"{self.run(run)}/done"

    def done_marker(self, run: str, task: str, replica: str) -> str:
        return f"{self.done(run)}/{done_name(task, replica)}"

    def job(self, job_id: str) -> str:
        return f"{self.jobs}/{job_key(job_id)}"


def done_name(task: str, replica: str) -> str:
    return f"{task}.{hashlib.sha1(replica.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class CommitAnswer:
    state: str  # "committed" | "already_committed"
    decision: RunDecision
    committed_run: str  # the run whose data the job holds

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "run": self.decision.run, "job_id": self.decision.job_id,
                "committed_run": self.committed_run, "tasks": len(self.decision.tasks),
                "rows": self.decision.rows}


class StagingRecords:
    """Reads and writes the decision records of one table."""

    def __init__(self, keeper: Keeper, table_zk_path: str) -> None:
        self.keeper = keeper
        self.paths = StagingPaths(table_zk_path)

    async def _ensure_roots(self) -> None:
        for p in (self.paths.root, self.paths.runs, self.paths.jobs):
            try:
                await self.keeper.create(p, b"")
            except KeeperNodeExistsError:
                pass

    async def decision(self, run: str) -> RunDecision | None:
        try:
            data, _stat = await self.keeper.get(self.paths.run(run))
        except KeeperNoNodeError:
            return None
        return RunDecision.parse(data)

    async def commit(self, job_id: str, run: str, tasks: Sequence[StagedTask]) -> CommitAnswer:
        """Decide that ``run`` commits exactly ``tasks`` (the one durable commit point of the job)."""
        decision = RunDecision(run, job_id, COMMIT, tuple(tasks), int(time.time()))
        data = decision.to_bytes()
        if len(data) > 900_000:
            raise BadInputError(f"Commit record of {len(data)} bytes is larger than ZooKeeper takes "
                                f"(900 kB); use fewer, larger tasks (e.g. coalesce before writing)", code=27)
        await self._ensure_roots()
        p = self.paths
        ops: list[Op] = [Create(p.run(run), data), Create(p.parts(run), b""), Create(p.done(run), b""),
                         Create(p.job(job_id), run.encode())]
        try:
            await self.keeper.multi(ops)
        except KeeperMultiError as e:
            if not isinstance(e.cause, KeeperNodeExistsError):
                raise
            if e.index == 0:  # the run was decided before
                existing = await self.decision(run)
                if existing is not None and existing.committed:
                    return CommitAnswer("committed", existing, run)
                why = existing.reason if existing else "gone"
                raise RunConflictError(f"Run {run} of job {job_id!r} was aborted ({why}): it cannot commit"
                                       ) from e
            winner = await self._job_run(job_id)
            log.info("staged_job_already_committed", job_id=job_id, run=run, committed_run=winner)
            aborted = await self.abort(run, job_id, reason=f"job already committed by run {winner}")
            if aborted.committed:  # cannot happen: the multi above failed as a whole
                return CommitAnswer("committed", aborted, run)
            return CommitAnswer("already_committed", aborted, winner)
        log.info("staged_job_committed", job_id=job_id, run=run, tasks=len(tasks), rows=decision.rows)
        return CommitAnswer("committed", decision, run)

    async def _job_run(self, job_id: str) -> str:
        try:
            data, _stat = await self.keeper.get(self.paths.job(job_id))
        except KeeperNoNodeError:
            return ""
        return data.decode("ascii", "replace")

    async def abort(self, run: str, job_id: str, reason: str) -> RunDecision:
        """Decide that ``run`` publishes nothing, unless it was decided already; the decision in force."""
        decision = RunDecision(run, job_id, ABORT, (), int(time.time()), reason)
        await self._ensure_roots()
        try:
            await self.keeper.create(self.paths.run(run), decision.to_bytes())
        except KeeperNodeExistsError:
            existing = await self.decision(run)
            if existing is None:  # removed in between (record lifetime): nothing left to abort
                return decision
            return existing
        log.info("staged_run_aborted", job_id=job_id, run=run, reason=reason)
        return decision

    async def status(self, run: str) -> dict[str, Any]:
        """The decision and how far publishing got: for the driver waiting after its commit."""
        decision = await self.decision(run)
        if decision is None:
            return {"run": run, "decision": None}
        out: dict[str, Any] = {"run": run, "job_id": decision.job_id, "decision": decision.decision,
                               "reason": decision.reason, "tasks": len(decision.tasks), "rows": decision.rows}
        if decision.committed:
            try:
                done = set(await self.keeper.get_children(self.paths.done(run)))
            except KeeperNoNodeError:
                done = set()
            pending = [t for t in decision.tasks if done_name(t.task, t.replica) not in done]
            out["published_tasks"] = len(decision.tasks) - len(pending)
            out["pending"] = [{"replica": t.replica, "task": t.task} for t in pending[:100]]
            out["pending_replicas"] = sorted({t.replica for t in pending})
        return out

    async def zookeeper_now_ms(self) -> int:
        """ZooKeeper's clock (ms): the modification time of a write made now (the root's empty data)."""
        return (await self.keeper.set(self.paths.root, b"")).mtime_ms

    async def cleanup(self, run_lifetime_s: float, job_lifetime_s: float) -> int:
        """Remove decision records older than their lifetime (runs: only once fully published or aborted).
        Returns how many records were removed.

        Ages are ZooKeeper's: a record's creation time (its znode's ctime) against the time of a write made
        now, both from ZooKeeper's clock.  The local clock and a decision's ``time`` (the deciding replica's
        clock) are not used: a leader whose clock is ahead would forget job ids early, and a re-run of a
        committed job would then commit again (duplicated rows)."""
        removed = 0
        p = self.paths
        try:
            runs = await self.keeper.get_children(p.runs)
        except KeeperNoNodeError:
            return 0
        now_ms = await self.zookeeper_now_ms()
        for run in runs:
            try:
                data, stat = await self.keeper.get(p.run(run))
                decision: RunDecision | None = RunDecision.parse(data)
            except KeeperNoNodeError:
                continue
            except (BadInputError, ValueError):
                decision = None
            if decision is None or now_ms - stat.ctime_ms < run_lifetime_s * 1000:
                continue
            if decision.committed:
                status = await self.status(run)
                if status.get("pending"):
                    continue
            await self.keeper.delete(p.run(run), recursive=True)
            removed += 1
        try:
            jobs = await self.keeper.get_children(p.jobs)
        except KeeperNoNodeError:
            return removed
        for job in jobs:
            try:
                _data, stat = await self.keeper.get(f"{p.jobs}/{job}")
            except KeeperNoNodeError:
                continue
            if now_ms - stat.ctime_ms >= job_lifetime_s * 1000:
                await self.keeper.delete(f"{p.jobs}/{job}")
                removed += 1
        return removed
