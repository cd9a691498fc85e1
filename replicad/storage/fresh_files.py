"""The files of parts just written whole, kept in memory a few seconds for the replicas that fetch them.

Every other replica fetches a new part within milliseconds of its commit.  For a small part the server used
to read its ~20 files back from disk and hash them again
(:func:`replicad.storage.part_transfer.build_part_body`: ~0.2-0.5 ms of system calls and hashing per part,
more in a busy daemon, on the fetch's path).  The insert's
writer holds every file's bytes when it finishes a part written whole (:class:`SmallPartWriter`), with the
hashes it computed from them: the part store keeps them here from the commit on, and the server builds the
body from them (:func:`replicad.storage.part_transfer.body_from_files`).

A part's files are handed out only with the same ``Checksums`` object they were kept with (the part store
keeps one per part directory for its lifetime: a part removed and written again under the same name is not
served from here), for ``ttl_s`` seconds, and at most ``max_bytes`` of them are kept (oldest dropped
first).  Only the event loop uses it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from replicad.storage.checksums import Checksums

#: the files one written part holds: (name, bytes), every file of its directory
PartFiles = tuple[tuple[str, bytes], ...]

#: how long a part's files are kept (its replicas fetch it within this, unless they are behind)
TTL_S = 5.0
#: files kept at most: about 25 parts of 10,000 narrow rows, hundreds of small inserts' parts
MAX_BYTES = 8 << 20
#: a part whose files add up to more is not kept (as part_transfer.SMALL_PART_BYTES: it is streamed)
MAX_PART_BYTES = 1 << 20


@dataclass
class _Kept:
    checksums: Checksums  # held: its identity tells the same part
    files: PartFiles
    size: int
    at: float


class FreshFiles:
    """Recently written parts' files by part name."""

    def __init__(self, ttl_s: float = TTL_S, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # parts served from here (tests, metrics)

    def keep(self, name: str, checksums: Checksums, files: Sequence[tuple[str, bytes]]) -> bool:
        """Keep the files of part ``name`` (described by ``checksums``); False when they are too big to."""
        size = sum(len(data) for _n, data in files)
        if not files or size > MAX_PART_BYTES or size > self.max_bytes:
            return False
        self.forget(name)
        self._kept[name] = _Kept(checksums, tuple(files), size, self._clock())
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._kept)))
        return True

    def get(self, name: str, checksums: Checksums) -> PartFiles | None:
        """The kept files of part ``name``, if kept with this very ``checksums`` object, and lately."""
        self._expire()
        kept = self._kept.get(name)
        if kept is None or kept.checksums is not checksums:
            return None
        self.hits += 1
        return kept.files

    def forget(self, name: str) -> None:
        if name in self._kept:
            self._drop(name)

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes(self) -> int:
        return self._bytes

    def _drop(self, name: str) -> None:
        self._bytes -= self._kept.pop(name).size

    def _expire(self) -> None:
        now = self._clock()
        while self._kept:
            name, kept = next(iter(self._kept.items()))
            if now - kept.at <= self.ttl_s:
                return
            self._drop(name)
