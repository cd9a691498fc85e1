"""Records of two-phase (staged) writes: stage ids, the ZooKeeper decision record of a run, job keys.

A *job* is what a user names (Spark's ``job_id`` option, or a fresh id); a *run* is one attempt of the driver
at writing the job (a fresh hex id per run); a *task* is one Spark task attempt of a run; a *batch* is one
staged INSERT request of a task.  Staged inserts land in a replica's local staging area, unpublished, under
``<run>/<task>/b<batch>``.  The run's fate is decided once, in ZooKeeper, by creating
``<table>/replicad_staging/runs/<run>`` with a :class:`RunDecision` (commit: exactly these tasks' batches,
on these replicas; or abort).  Every id that becomes a directory or znode name is checked here, strictly.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from replicad.errors import BadInputError

RUN_RE = re.compile(r"[0-9a-f]{8,64}")
TASK_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
JOB_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
REPLICA_RE = re.compile(r"[^/\x00]{1,255}")
MAX_JOB_ID = 1024
MAX_BATCH = 10_000_000

COMMIT = "commit"
ABORT = "abort"


def check_run(run: str) -> str:
    if not RUN_RE.fullmatch(run):
        raise BadInputError(f"Bad staging run id {run[:80]!r}: expected 8-64 lowercase hex digits", code=36)
    return run


def check_task(task: str) -> str:
    if not TASK_RE.fullmatch(task):
        raise BadInputError(f"Bad staging task id {task[:80]!r}: expected 1-64 of [A-Za-z0-9_-]", code=36)
    return task


def check_batch(batch: int) -> int:
    if not 0 <= batch <= MAX_BATCH:
        raise BadInputError(f"Bad staging batch number {batch}: expected 0..{MAX_BATCH}", code=36)
    return batch


def check_job_id(job_id: str) -> str:
    if not job_id or len(job_id) > MAX_JOB_ID or "\x00" in job_id:
        raise BadInputError(f"Bad job id: 1-{MAX_JOB_ID} characters, no NUL", code=36)
    return job_id


def job_key(job_id: str) -> str:
    """The znode name of a job: the id itself when it is a safe name, else ``sha256-<hex>`` of it."""
    check_job_id(job_id)
    if JOB_KEY_RE.fullmatch(job_id) and job_id not in (".", "..") and not job_id.startswith("sha256-"):
        return job_id
    return "sha256-" + hashlib.sha256(job_id.encode()).hexdigest()


@dataclass(frozen=True)
class StageId:
    """Where one staged insert request goes: ``<run>/<task>/b<batch>``."""

    run: str
    task: str
    batch: int

    def __post_init__(self) -> None:
        check_run(self.run)
        check_task(self.task)
        check_batch(self.batch)

    @property
    def batch_dir(self) -> str:
        return f"b{self.batch}"

    def block_token(self) -> str:
        """The deduplication token its parts are published under (unique per run, task and batch)."""
        return f"replicad-stage-{self.run}-{self.task}-{self.batch}"


@dataclass(frozen=True)
class StagedTask:
    """One winning task attempt's batches staged on one replica."""

    replica: str
    task: str
    batches: tuple[int, ...]
    rows: int = 0

    def __post_init__(self) -> None:
        if not REPLICA_RE.fullmatch(self.replica):
            raise BadInputError(f"Bad replica name {self.replica[:80]!r}", code=36)
        check_task(self.task)
        for b in self.batches:
            check_batch(b)
        if len(set(self.batches)) != len(self.batches):
            raise BadInputError(f"Task {self.task}: a batch is listed twice", code=36)
        if self.rows < 0:
            raise BadInputError(f"Task {self.task}: negative row count", code=36)

    def to_json(self) -> dict[str, Any]:
        return {"r": self.replica, "t": self.task, "b": list(self.batches), "n": self.rows}

    @classmethod
    def from_json(cls, obj: Any) -> StagedTask:
        if not isinstance(obj, dict) or set(obj) - {"r", "t", "b", "n"}:
            raise BadInputError("Bad staged task record", code=27)
        replica, task, batches, rows = obj.get("r"), obj.get("t"), obj.get("b"), obj.get("n", 0)
        if not (isinstance(replica, str) and isinstance(task, str) and isinstance(batches, list)
                and all(type(b) is int for b in batches) and type(rows) is int):
            raise BadInputError("Bad staged task record", code=27)
        return cls(replica, task, tuple(batches), rows)


@dataclass(frozen=True)
class RunDecision:
    """The once-written fate of a run (the znode ``runs/<run>``): commit exactly ``tasks``, or abort."""

    run: str
    job_id: str
    decision: str
    tasks: tuple[StagedTask, ...] = ()
    time: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        check_run(self.run)
        check_job_id(self.job_id)
        if self.decision not in (COMMIT, ABORT):
            raise BadInputError(f"Bad decision {self.decision[:20]!r}", code=27)
        if self.decision == ABORT and self.tasks:
            raise BadInputError("An abort decision lists no tasks", code=27)
        seen = set()
        for t in self.tasks:
            if (t.replica, t.task) in seen:
                raise BadInputError(f"Task {t.task} on {t.replica} is listed twice", code=36)
            seen.add((t.replica, t.task))

    @property
    def committed(self) -> bool:
        return self.decision == COMMIT

    def tasks_on(self, replica: str) -> dict[str, StagedTask]:
        return {t.task: t for t in self.tasks if t.replica == replica}

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tasks)

    def to_text(self) -> str:
        obj = {"version": 1, "run": self.run, "job": self.job_id, "decision": self.decision,
               "time": self.time, "reason": self.reason, "tasks": [t.to_json() for t in self.tasks]}
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)

    def to_bytes(self) -> bytes:
        return self.to_text().encode()

    @classmethod
    def parse(cls, text: str | bytes) -> RunDecision:
        try:
            obj = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadInputError(f"Bad run decision record: {e}", code=27) from None
        if not isinstance(obj, dict) or obj.get("version") != 1:
            raise BadInputError("Bad run decision record: unknown version", code=27)
        run, job, decision, when, reason, tasks = (obj.get(k) for k in
                                                   ("run", "job", "decision", "time", "reason", "tasks"))
        if not (isinstance(run, str) and isinstance(job, str) and isinstance(decision, str)
                and type(when) is int and isinstance(reason, str) and isinstance(tasks, list)):
            raise BadInputError("Bad run decision record: missing or mistyped fields", code=27)
        return cls(run, job, decision, tuple(StagedTask.from_json(t) for t in tasks), when, reason)
