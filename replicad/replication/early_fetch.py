"""A download started as its GET_PART entry was read from the log (an *early* download), before the queue
executor runs the entry: its record, kept by :class:`replicad.replication.fetcher.PartFetcher` until the
entry's fetch takes it, or until it is stale."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from replicad.replication.checksum_compare import ReplicaState
from replicad.storage.part_receive import ReceivedPart

#: early downloads running at once (each beyond the executor's fetch limits)
MAX_EARLY_FETCHES = 2
#: a downloaded part is taken only this soon after its download started (else removed: the source may have
#: gone since, and the queue executor no longer runs into that as it would have)
EARLY_TTL_S = 3.0


@dataclass
class EarlyDownload:
    """A download from ``source`` into the part's tmp-fetch_ directory."""

    source: str
    task: asyncio.Task[tuple[ReceivedPart, ReplicaState | None] | None]
    started: float
    finished: float | None = None  # when the download ended

    def stale(self) -> bool:
        """Downloaded ``EARLY_TTL_S`` ago and not taken.  A download still running is never stale: a big
        part may take longer than the TTL to arrive, and dropping it would start the same download again."""
        return self.finished is not None and time.monotonic() - self.finished > EARLY_TTL_S
