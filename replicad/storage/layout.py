"""A table's data directory, laid out as ClickHouse lays it out.

``<data_path>/data/<escaped db>/<escaped table>/`` holds the active part directories, ``detached/``
and ``format_version.txt`` (``1``, no newline: custom partitioning).  Parts are written in a
temporary directory beside them — ``tmp_insert_<part>``, ``tmp_merge_<part>``, ``tmp_mut_<part>``,
``tmp_clone_<part>``, ``tmp-fetch_<part>`` — and become visible by an atomic rename.  Every name that
starts with ``tmp`` is ignored when parts are listed and is removed on start-up (ClickHouse's
``clearOldTemporaryDirectories(0)``).  A part is deleted by renaming it to ``tmp_delete_<part>`` first,
so a crash never leaves a half-deleted part under its real name.

Blocking filesystem calls: use from a worker thread (``asyncio.to_thread``), not from the event loop.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from replicad.datatypes import escape_for_file_name
from replicad.errors import BadPartNameError, CorruptedDataError, InsecurePathError, ReplicadError
from replicad.model.part_info import PartInfo
from replicad.storage.part import fsync_dir

FORMAT_VERSION_FILE = "format_version.txt"
FORMAT_VERSION = 1  # MERGE_TREE_DATA_MIN_FORMAT_VERSION_WITH_CUSTOM_PARTITIONING
DETACHED_DIR = "detached"

TMP_INSERT = "tmp_insert_"
TMP_MERGE = "tmp_merge_"
TMP_MUTATE = "tmp_mut_"
TMP_CLONE = "tmp_clone_"
TMP_FETCH = "tmp-fetch_"  # modern ClickHouse's spelling (18.16 used tmp_fetch_)
TMP_DELETE = "tmp_delete_"
TMP_PREFIX = "tmp"


class PartDirectoryExistsError(ReplicadError):
    """The directory a part should be renamed to already exists."""

    code = 84  # DIRECTORY_ALREADY_EXISTS


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InsecurePathError(f"bad part directory name {name!r}")


def _dir_mtime(path: Path) -> float:
    """Newest modification time of the directory or any file directly inside it."""
    newest = path.stat().st_mtime
    for e in os.scandir(path):
        try:
            newest = max(newest, e.stat(follow_symlinks=False).st_mtime)
        except FileNotFoundError:
            continue
    return newest


@dataclass(frozen=True)
class TableDataLayout:
    """Paths and directory operations of one table's data."""

    data_path: Path
    database: str
    table: str
    #: ``fsync_part_directory``: fsync a part's directory before renaming it into place and the table
    #: directory after (power-loss durability of the rename; the rename is atomic either way)
    fsync_part_directory: bool = False
    #: ``tmp*`` name -> (its newest modification time, monotonic time it was first seen with it): how long
    #: each temporary directory has been left untouched, measured without the wall clock
    _tmp_seen: dict[str, tuple[float, float]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @cached_property
    def path(self) -> Path:
        """``<data_path>/data/<db>/<table>`` (built once: every part written, renamed or removed asks)."""
        db, table = escape_for_file_name(self.database), escape_for_file_name(self.table)
        return Path(self.data_path) / "data" / db / table

    @property
    def detached_path(self) -> Path:
        return self.path / DETACHED_DIR

    def part_path(self, name: str) -> Path:
        _check_name(name)
        return self.path / name

    def tmp_path(self, prefix: str, part_name: str) -> Path:
        """``<table>/<prefix><part_name>`` (e.g. ``tmp_insert_202611_3_3_0``)."""
        if not prefix.startswith(TMP_PREFIX):
            raise ValueError(f"temporary prefix {prefix!r} must start with 'tmp'")
        _check_name(part_name)
        return self.path / (prefix + part_name)

    # ---- table directory -----------------------------------------------------------------------------

    def create(self) -> None:
        """Create the table directory, ``detached/`` and ``format_version.txt`` if missing."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.detached_path.mkdir(exist_ok=True)
        version = self.path / FORMAT_VERSION_FILE
        if not version.exists():
            tmp = self.path / (FORMAT_VERSION_FILE + ".tmp")
            with open(tmp, "wb") as f:
                f.write(str(FORMAT_VERSION).encode())
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, version)
            fsync_dir(self.path)
            fsync_dir(self.path.parent)

    def format_version(self) -> int:
        """The table's on-disk format version (0 if the file is absent, as ClickHouse assumes)."""
        p = self.path / FORMAT_VERSION_FILE
        if not p.exists():
            return 0
        text = p.read_bytes()
        if not text.isdigit():
            raise CorruptedDataError(f"bad {p}: {text[:16]!r}")
        return int(text)

    # ---- parts ---------------------------------------------------------------------------------------

    def new_tmp_dir(self, prefix: str, part_name: str) -> Path:
        """A fresh, empty temporary directory for writing ``part_name`` (a leftover one is removed)."""
        p = self.tmp_path(prefix, part_name)
        if p.exists():
            shutil.rmtree(p)
        p.mkdir(parents=True)
        return p

    def commit(self, tmp_dir: str | os.PathLike[str], part_name: str, *, fsync: bool | None = None) -> Path:
        """Atomically rename a finished temporary directory to ``<table>/<part_name>``.

        With ``fsync`` (default: ``fsync_part_directory``) the part directory, then after the rename the
        table directory, are fsynced.  PartDirectoryExistsError if the part already exists.
        """
        if fsync is None:
            fsync = self.fsync_part_directory
        src = Path(tmp_dir)
        dst = self.part_path(part_name)
        if dst.exists():
            raise PartDirectoryExistsError(f"part directory {dst} already exists")
        if fsync:
            fsync_dir(src)
        os.rename(src, dst)
        if fsync:
            fsync_dir(self.path)
        return dst

    def list_part_names(self) -> list[str]:
        """Names of directories that are parts (parseable names; ``tmp*``, ``detached`` skipped)."""
        out: list[str] = []
        if not self.path.exists():
            return out
        for e in os.scandir(self.path):
            if not e.is_dir(follow_symlinks=False) or e.name.startswith(TMP_PREFIX) or e.name == DETACHED_DIR:
                continue
            try:
                PartInfo.parse(e.name)
            except BadPartNameError:
                continue
            out.append(e.name)
        return sorted(out)

    def active_parts(self) -> list[PartInfo]:
        """The parts to load on start-up: every part not covered by another part on disk, in order.

        Covered parts are what a merge left behind (ClickHouse deletes them later as outdated).
        """
        infos = sorted(
            (PartInfo.parse(n) for n in self.list_part_names()),
            key=lambda p: (p.partition_id, p.min_block, -p.max_block, -p.level, -p.mutation),
        )
        active: list[PartInfo] = []
        for info in infos:
            if active and active[-1].partition_id == info.partition_id and active[-1].contains(info):
                continue
            active.append(info)
        return active

    def covered_parts(self) -> list[str]:
        """Part directories covered by another part (outdated leftovers of merges)."""
        active = {p.name for p in self.active_parts()}
        return [n for n in self.list_part_names() if n not in active]

    def tmp_dirs(self) -> list[str]:
        if not self.path.exists():
            return []
        return sorted(
            e.name for e in os.scandir(self.path)
            if e.is_dir(follow_symlinks=False) and e.name.startswith(TMP_PREFIX)
        )

    def clear_tmp_dirs(self, max_age_s: float = 0.0) -> list[str]:
        """Remove ``tmp*`` directories not modified for ``max_age_s`` seconds (0: all); return their names.

        "Not modified for" is measured on the monotonic clock, across calls: a directory goes once its newest
        modification time has stayed the same for ``max_age_s`` seconds since a call of this object first saw
        it so (the first sighting, or a change, starts the count).  ClickHouse compares file times with the
        wall clock instead; with a wall clock a lifetime ahead of the file times (a clock stepped forward, a
        skewed host) that removed directories still being written: inserts failed, merges lost their output
        and a part committed while its files were being deleted turned up broken.  Leftovers of an earlier
        process do not need the wall clock either: start-up removes them all (``max_age_s`` = 0).
        """
        removed: list[str] = []
        names = self.tmp_dirs()
        now = time.monotonic()
        for name in list(self._tmp_seen):
            if name not in names:
                del self._tmp_seen[name]
        for name in names:
            p = self.path / name
            try:
                if max_age_s > 0:
                    newest = _dir_mtime(p)
                    seen = self._tmp_seen.get(name)
                    if seen is None or seen[0] != newest:
                        self._tmp_seen[name] = (newest, now)
                        continue
                    if now - seen[1] < max_age_s:
                        continue
                shutil.rmtree(p)
            except FileNotFoundError:
                continue
            except OSError:  # written to while being removed ("directory not empty"): in use after all
                continue
            self._tmp_seen.pop(name, None)
            removed.append(name)
        return removed

    def remove_part(self, name: str) -> None:
        """Delete a part directory: rename to ``tmp_delete_<name>``, then remove it recursively."""
        src = self.part_path(name)
        dst = self.tmp_path(TMP_DELETE, name)
        if dst.exists():
            shutil.rmtree(dst)
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return
        shutil.rmtree(dst)

    # ---- detached ------------------------------------------------------------------------------------

    def detached_name(self, name: str, prefix: str = "") -> str:
        """``<prefix>_<name>`` (or ``<name>``), with ``_tryN`` appended while that name is taken."""
        base = f"{prefix.rstrip('_')}_{name}" if prefix else name
        candidate, n = base, 0
        while (self.detached_path / candidate).exists():
            n += 1
            candidate = f"{base}_try{n}"
        return candidate

    def detach(self, name: str, prefix: str = "") -> Path:
        """Move a part to ``detached/`` (prefix e.g. ``broken``, ``ignored``, ``unexpected``)."""
        src = self.part_path(name)
        self.detached_path.mkdir(exist_ok=True)
        dst = self.detached_path / self.detached_name(name, prefix)
        os.rename(src, dst)
        fsync_dir(self.path)
        return dst

    def list_detached(self) -> list[str]:
        if not self.detached_path.exists():
            return []
        return sorted(e.name for e in os.scandir(self.detached_path) if e.is_dir(follow_symlinks=False))

    def startup(self) -> tuple[list[PartInfo], list[str]]:
        """Create missing directories, drop every ``tmp*`` leftover, return (active parts, removed tmp)."""
        self.create()
        removed = self.clear_tmp_dirs(0)
        return self.active_parts(), removed
