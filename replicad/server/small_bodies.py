"""The DataPartsExchange bodies of small parts, built once for the replicas that fetch the same part together.

A new part is fetched by every other replica within milliseconds of its commit, all from the replica that
made it: with five replicas, four requests for the same part arrive together, and each used to read and
hash the part's files again in a worker thread (about twenty small files for a narrow table).
:class:`SmallBodies` builds a small part's body once (:func:`replicad.storage.part_transfer.build_part_body`,
with its checks of every file against checksums.txt), shares it with the requests that arrive while it is
being built, and keeps it ``ttl_s`` seconds for those that come a little later.

A body is taken only for the same part directory, the same protocol version and the same ``Checksums``
object: the part store keeps one per part directory for the part's lifetime, so a part removed and made
again under the same name is read afresh.  The server looks the part up (it must still be active) before
each send, whatever is kept here.  A build that fails is not kept: each request waiting for it gets the
error, the next one reads the files again.  At most ``max_bytes`` of bodies are kept (oldest dropped first).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replicad.storage.checksums import Checksums
from replicad.storage.part_transfer import body_from_files, build_part_body

#: how long a built body is served again (the replicas of a set fetch a new part within this)
TTL_S = 3.0
#: bodies kept at most (small parts are at most part_transfer.SMALL_PART_BYTES each); a clone or a drain,
#: which fetch each part once, keeps no more than this either
MAX_BYTES = 4 << 20


@dataclass
class _Body:
    checksums: Checksums  # held: its identity tells the same part
    task: asyncio.Future[bytes]
    built: float | None = None  # monotonic time the build ended (None: still building)
    size: int = 0


class SmallBodies:
    """Small-part bodies being built or built lately, by (part directory, protocol version)."""

    def __init__(self, ttl_s: float = TTL_S, max_bytes: int = MAX_BYTES) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._bodies: OrderedDict[tuple[str, int], _Body] = OrderedDict()
        self._bytes = 0
        self.builds = 0  # bodies read from disk
        self.from_memory = 0  # bodies made from the files of a part written here lately
        self.shared = 0  # sends that took a body built for another one

    async def body(self, path: Path, checksums: Checksums, version: int,
                   files: Sequence[tuple[str, bytes]] = ()) -> bytes:
        """The body of the part at ``path``; OSError or CorruptedDataError as ``build_part_body`` raises
        them.  The build goes on when the caller is cancelled (others may wait for it).  ``files``: the
        part's files held in memory (a part written here lately): the body is made from them, on the loop,
        instead of reading the directory."""
        self._expire()
        key = (os.fspath(path), version)
        body = self._bodies.get(key)
        if body is not None and body.checksums is checksums:
            self.shared += 1
            return await asyncio.shield(body.task)
        if body is not None:
            self._drop(key)
        made = body_from_files(checksums, version, files) if files else None
        if made is not None:  # kept for the other replicas' requests, as a body read from disk
            self.from_memory += 1
            done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            done.set_result(made)
            body = self._bodies[key] = _Body(checksums, done)
            self._built(body, key)
            return made
        task = asyncio.ensure_future(asyncio.to_thread(build_part_body, path, checksums, version))
        self.builds += 1
        body = self._bodies[key] = _Body(checksums, task)
        task.add_done_callback(lambda _t: self._built(body, key))
        return await asyncio.shield(task)

    def _built(self, body: _Body, key: tuple[str, int]) -> None:
        """A build ended: a success is kept (and counted against ``max_bytes``), a failure dropped."""
        kept = self._bodies.get(key) is body
        if body.task.cancelled() or body.task.exception() is not None:
            if kept:  # a failure is not kept
                del self._bodies[key]
            return
        if kept:
            body.built = time.monotonic()
            body.size = len(body.task.result())
            self._bytes += body.size
            self._trim()

    def __len__(self) -> int:
        return len(self._bodies)

    def _drop(self, key: tuple[str, int]) -> None:
        body = self._bodies.pop(key)
        self._bytes -= body.size

    def _expire(self) -> None:
        """Drop the expired bodies at the front (oldest first; a body still building stops the walk)."""
        now = time.monotonic()
        while self._bodies:
            key, body = next(iter(self._bodies.items()))
            if body.built is None or now - body.built <= self.ttl_s:
                return
            self._drop(key)

    def _trim(self) -> None:
        """Drop the oldest built bodies while more than ``max_bytes`` are kept."""
        while self._bytes > self.max_bytes:
            key = next((k for k, b in self._bodies.items() if b.built is not None), None)
            if key is None:
                return
            self._drop(key)
