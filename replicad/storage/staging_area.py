"""The local staging area of two-phase writes: written parts that are not published (yet).

``<data_path>/staging/<escaped db>/<escaped table>/<run>/<task>/b<batch>/<ordinal>_<partition_id>/`` holds
ordinary part directories (the files a ``tmp_insert_`` part has), outside the table's data directory, so
they are invisible to SELECT, to the part loader and to other replicas.  A batch appears atomically: its
parts are moved into ``<task>/tmp_b<batch>_<n>/`` and that directory is renamed to ``b<batch>``; a batch
directory that already exists means the request was a retry (deduplicated).  ``<run>/created`` holds the
run's creation time; its mtime is the run's last activity (touched by every staged batch), from which the
staging TTL counts.  Publishing hard-links a staged part's files into a table
``tmp_`` directory, so a crash in the middle leaves the staged copy intact.

Blocking filesystem calls: use from a worker thread.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from replicad.datatypes import escape_for_file_name
from replicad.model.staged_job import RUN_RE, TASK_RE, check_run, check_task

STAGING_DIR = "staging"
CREATED_FILE = "created"
_BATCH_RE = re.compile(r"b(\d{1,8})")
_PART_RE = re.compile(r"(\d{1,6})_([A-Za-z0-9_-]{1,200})")
_tmp_counter = itertools.count(1)
DELETING = ".del."  # a directory being removed (no run, task or batch name has a dot)


@dataclass(frozen=True)
class StagedPart:
    path: Path
    ordinal: int
    partition_id: str


@dataclass(frozen=True)
class StagingArea:
    data_path: Path
    database: str
    table: str

    @property
    def path(self) -> Path:
        db, table = escape_for_file_name(self.database), escape_for_file_name(self.table)
        return Path(self.data_path) / STAGING_DIR / db / table

    def run_path(self, run: str) -> Path:
        return self.path / check_run(run)

    def task_path(self, run: str, task: str) -> Path:
        return self.run_path(run) / check_task(task)

    # ---- staging ---------------------------------------------------------------------------------------

    def new_batch_dir(self, run: str, task: str, batch: int) -> Path:
        """A fresh temporary directory to gather one batch's parts in."""
        task_dir = self.task_path(run, task)
        run_dir = task_dir.parent
        if not run_dir.exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            created = run_dir / CREATED_FILE
            if not created.exists():
                created.write_text(str(int(time.time())))
        _touch(run_dir / CREATED_FILE)
        task_dir.mkdir(exist_ok=True)
        tmp = task_dir / f"tmp_b{batch}_{os.getpid()}_{next(_tmp_counter)}"
        tmp.mkdir()
        return tmp

    @staticmethod
    def add_part(batch_tmp: Path, part_dir: Path, ordinal: int, partition_id: str) -> Path:
        dest = batch_tmp / f"{ordinal}_{partition_id}"
        os.rename(part_dir, dest)
        return dest

    def finish_batch(self, batch_tmp: Path, run: str, task: str, batch: int) -> bool:
        """Publish ``batch_tmp`` as ``b<batch>`` atomically; False (and the copy removed) if it exists."""
        dest = self.task_path(run, task) / f"b{batch}"
        if dest.exists():
            shutil.rmtree(batch_tmp, ignore_errors=True)
            return False
        try:
            os.rename(batch_tmp, dest)  # a concurrent twin: rename onto a non-empty dir fails
        except OSError:
            shutil.rmtree(batch_tmp, ignore_errors=True)
            return False
        _touch(self.run_path(run) / CREATED_FILE)
        return True

    # ---- reading -----------------------------------------------------------------------------------------

    def runs(self) -> list[str]:
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if _is_run(n))

    def run_created(self, run: str) -> float:
        p = self.run_path(run)
        try:
            return float((p / CREATED_FILE).read_text().strip())
        except (OSError, ValueError):
            try:
                return p.stat().st_mtime
            except OSError:
                return time.time()

    def run_last_active(self, run: str) -> float:
        """When a batch of the run was last staged (its ``created`` file's mtime)."""
        try:
            return (self.run_path(run) / CREATED_FILE).stat().st_mtime
        except OSError:
            return self.run_created(run)

    def tasks(self, run: str) -> list[str]:
        try:
            names = os.listdir(self.run_path(run))
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n != CREATED_FILE and _is_task(n))

    def batches(self, run: str, task: str) -> dict[int, Path]:
        d = self.task_path(run, task)
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return {}
        out = {}
        for n in names:
            m = _BATCH_RE.fullmatch(n)
            if m:
                out[int(m.group(1))] = d / n
        return out

    @staticmethod
    def parts(batch_dir: Path) -> list[StagedPart]:
        out = []
        for n in os.listdir(batch_dir):
            m = _PART_RE.fullmatch(n)
            if m:
                out.append(StagedPart(batch_dir / n, int(m.group(1)), m.group(2)))
        return sorted(out, key=lambda p: p.ordinal)

    def size(self) -> tuple[int, int]:
        """(runs, batches) staged here."""
        runs = self.runs()
        return len(runs), sum(len(self.batches(r, t)) for r in runs for t in self.tasks(r))

    # ---- removing ----------------------------------------------------------------------------------------

    def remove_run(self, run: str) -> None:
        _remove(self.run_path(run))

    def remove_tasks(self, run: str, tasks: list[str]) -> None:
        for task in tasks:
            self.remove_task(run, task)

    def remove_task(self, run: str, task: str) -> None:
        _remove(self.task_path(run, task))

    @staticmethod
    def remove_batch(batch_dir: Path) -> None:
        _remove(batch_dir)

    def clear_tmp(self) -> int:
        """Remove half-gathered batches (``tmp_b*``) and half-removed directories left by a crash; start-up
        only.  Returns how many."""
        n = 0
        for parent in [self.path, *(self.run_path(r) for r in self.runs())]:
            try:
                names = os.listdir(parent)
            except FileNotFoundError:
                continue
            for name in names:
                if name.startswith(DELETING):
                    shutil.rmtree(parent / name, ignore_errors=True)
                    n += 1
        for run in self.runs():
            for task in self.tasks(run):
                d = self.task_path(run, task)
                for name in os.listdir(d):
                    if name.startswith(("tmp_b", DELETING)):
                        shutil.rmtree(d / name, ignore_errors=True)
                        n += 1
        return n


def link_part(src: Path, dest: Path) -> None:
    """Hard-link every file of the part directory ``src`` into the new directory ``dest``."""
    dest.mkdir()
    for e in os.scandir(src):
        if e.is_file(follow_symlinks=False):
            os.link(e.path, dest / e.name)


def _remove(path: Path) -> None:
    """Remove a directory tree: renamed aside first, so a crash never leaves it half-deleted in place."""
    if not path.exists():
        return
    aside = path.with_name(f"{DELETING}{path.name}.{os.getpid()}.{next(_tmp_counter)}")
    try:
        os.rename(path, aside)
    except OSError:
        aside = path
    shutil.rmtree(aside, ignore_errors=True)


def _is_run(name: str) -> bool:
    return RUN_RE.fullmatch(name) is not None


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # a run directory made by an older version, or removed meanwhile
        pass


def _is_task(name: str) -> bool:
    return TASK_RE.fullmatch(name) is not None
