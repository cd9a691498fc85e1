"""Part directories made ahead of the small inserts: each holds, created and empty, the files a table's next
small part will write.

Making a part's ~18 files is most of a small insert's write, and none of it depends on the rows: on ext4,
mkdir and 18 file creations took 0.6–0.75 ms p50, and 8–18 ms while the file system was busy with blocks
freed by deletions, where writing the same bytes into 18 existing empty files took 0.41–0.44 ms at any
time (measured on the project's 2-core machine).  So the creations are moved off the insert's path:

* the small-part writer (:class:`replicad.storage.small_part.SmallPartWriter`) asks :meth:`PreparedDirs.take`
  for a directory holding exactly its file names.  It gets one, or ``None`` and makes its own as before;
  either way the names are remembered;
* one daemon thread (``prepared-dirs``) then makes directories for the names it was asked for, up to
  :data:`PER_SET` ready per set of names, each in one native call (``write_files``, empty files);
* the writer writes into the taken directory with ``write_files(prepared=True)`` (no ``O_TRUNC``, and a
  file holding more than what was written is cut to it), so the part's bytes are those of a fresh
  directory; the commit's rename moves it into the table's directory, as a ``tmp_insert_`` one;
* a fetch (:class:`replicad.storage.part_sink.PartSink`) does not know its files before they come: it takes
  a directory of the set the table's last part had (:meth:`PreparedDirs.take_for`), renamed to its
  ``tmp-fetch_`` directory, opens the files it receives that are there, creates the others, removes those
  it did not receive, and notes the set it got (:meth:`PreparedDirs.note`).

The directories live under ``<data_path>/tmp/prepared/`` (not in the table's directory: they are no part's
leftovers), only where that is the file system of the table's directory (a rename across file systems fails).
A directory that is taken is never given back: a failed write removes it as its own.  The first refill of a
root empties it (an earlier process's directories).  Nothing here runs on the event loop: :meth:`take` is a
lookup under a lock, called from the writer's thread.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from replicad.native._files import write_files

__all__ = ["MAX_SETS", "PER_SET", "PREPARED_DIR", "PreparedDirs", "prepared_for"]

log = logging.getLogger(__name__)

#: ``<data_path>/tmp/<this>``
PREPARED_DIR = "prepared"
#: ready directories per set of file names: a second insert of the same table right after the first finds
#: one too
PER_SET = 2
#: sets of file names remembered per root (the least recently used forgotten and its directories removed):
#: a set per table structure in use
MAX_SETS = 16

_refiller: ThreadPoolExecutor | None = None
_refiller_lock = threading.Lock()


def _submit(pool: PreparedDirs) -> None:
    global _refiller
    with _refiller_lock:
        if _refiller is None:
            _refiller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepared-dirs")
        refiller = _refiller
    refiller.submit(pool.refill)


class PreparedDirs:
    """The ready directories under one root, by set of file names."""

    def __init__(self, root: Path, per_set: int = PER_SET, max_sets: int = MAX_SETS) -> None:
        self.root = root
        self.per_set = per_set
        self.max_sets = max_sets
        self._lock = threading.Lock()
        #: file names -> ready directories; least recently used first
        self._ready: OrderedDict[frozenset[str], list[Path]] = OrderedDict()
        #: directories of forgotten sets, removed by the refill
        self._dead: list[Path] = []
        #: table directory -> the set of file names its last part had
        self._last: dict[Path, frozenset[str]] = {}
        self._names = itertools.count()
        self._emptied = False
        self._queued = False
        self._failed = False
        #: how many takes found a directory, and how many did not (``/status``-style counters for tests)
        self.hits = 0
        self.misses = 0

    def take(self, names: Iterable[str], table_dir: Path | None = None) -> Path | None:
        """A ready directory holding exactly ``names`` (empty files), or ``None``; either way a refill of
        that set is queued (and the set noted as ``table_dir``'s last).  Any thread."""
        key = frozenset(names)
        with self._lock:
            got = self._pop(key, table_dir)
        self._queue()
        return got

    def take_for(self, table_dir: Path) -> tuple[Path, frozenset[str]] | None:
        """A ready directory of the set last taken or noted for ``table_dir``, and that set (a fetch, which
        does not know its part's files before they come).  Any thread."""
        with self._lock:
            key = self._last.get(table_dir)
            got = None if key is None else self._pop(key, table_dir)
        if key is not None:
            self._queue()
        return None if got is None or key is None else (got, key)

    def note(self, names: Iterable[str], table_dir: Path) -> None:
        """Remember ``names`` as ``table_dir``'s last set, to be made ready.  Any thread."""
        key = frozenset(names)
        with self._lock:
            if self._last.get(table_dir) == key and key in self._ready:
                return
            self._last[table_dir] = key
            self._remember(key)
        self._queue()

    def _pop(self, key: frozenset[str], table_dir: Path | None) -> Path | None:
        if table_dir is not None:
            self._last[table_dir] = key
        dirs = self._remember(key)
        got = dirs.pop() if dirs else None
        if got is None:
            self.misses += 1
        else:
            self.hits += 1
        return got

    def _remember(self, key: frozenset[str]) -> list[Path]:
        dirs = self._ready.get(key)
        if dirs is None:
            self._ready[key] = dirs = []
            while len(self._ready) > self.max_sets:
                _old, gone = self._ready.popitem(last=False)
                self._dead += gone
        else:
            self._ready.move_to_end(key)
        return dirs

    def _queue(self) -> None:
        with self._lock:
            queue = not self._queued
            self._queued = True
        if queue:
            _submit(self)

    def ready(self) -> int:
        """How many directories are ready (all sets)."""
        with self._lock:
            return sum(len(d) for d in self._ready.values())

    def refill(self) -> None:
        """(blocking: the refill thread) Make the missing directories of every remembered set."""
        with self._lock:
            self._queued = False
            dead, self._dead = self._dead, []
        for d in dead:
            shutil.rmtree(d, ignore_errors=True)
        try:
            if not self._emptied:
                shutil.rmtree(self.root, ignore_errors=True)
                self._emptied = True
            self.root.mkdir(exist_ok=True)  # not its parents: a data path removed meanwhile is not made again
            while (want := self._wanted()) is not None:
                path = self.root / str(next(self._names))
                write_files(path, [(n, b"") for n in sorted(want)], False, True)
                with self._lock:
                    dirs = self._ready.get(want, [])
                    kept = want in self._ready and len(dirs) < self.per_set
                    if kept:
                        dirs.append(path)
                if not kept:  # forgotten or filled meanwhile
                    shutil.rmtree(path, ignore_errors=True)
        except OSError as e:  # a full disk, a read-only one: the writers make their own directories
            if not self._failed:
                log.warning("prepared_dirs_failed: %s (small inserts make their directories as they go)", e)
            self._failed = True

    def _wanted(self) -> frozenset[str] | None:
        with self._lock:
            for key, dirs in self._ready.items():
                if len(dirs) < self.per_set:
                    return key
        return None


_pools: dict[Path, PreparedDirs | None] = {}
_pools_lock = threading.Lock()


def prepared_for(data_path: Path, table_dir: Path) -> PreparedDirs | None:
    """(blocking, first call per table directory) The pool of ``<data_path>/tmp/prepared`` for a table whose
    directory is ``table_dir``; ``None`` where the two are not on one file system (or cannot be told)."""
    with _pools_lock:
        if table_dir in _pools:
            return _pools[table_dir]
    root = Path(data_path) / "tmp" / PREPARED_DIR
    try:
        device = os.stat(table_dir).st_dev  # first: a removed data path is not made again
        root.parent.mkdir(exist_ok=True)
        same = os.stat(root.parent).st_dev == device
    except OSError:
        same = False
    with _pools_lock:
        if table_dir not in _pools:
            pool = next((p for p in _pools.values() if p is not None and p.root == root), None)
            _pools[table_dir] = (pool or PreparedDirs(root)) if same else None
        return _pools[table_dir]
