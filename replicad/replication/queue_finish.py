"""An executed queue entry's removal, written by the multi that commits its part.

18.16 removes an executed entry's ``queue/`` node and writes the replica's insert times in a multi of their
own (``removeProcessedEntry``).  When the entry's success is the commit of a fetched part, the same ops go
into that commit's multi instead (:func:`replicad.replication.checksum_compare.commit_registration`'s
optional ops): one ZooKeeper request less per fetch, and the node is gone exactly when the part is there.

The times written are those the queue will have once the entry is gone
(:meth:`replicad.model.queue_state.QueueState.times_if_done`), as the multi is made; once the queue has let
the entry go, the executor writes whatever differs then (another entry finished meanwhile).  A commit whose
optional ops failed, or whose answer was lost, leaves :attr:`QueueFinish.applied` False: the executor
removes the node and writes the times as for any other entry (a node already gone is fine).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from replicad.keeper.ops import Delete, Op, Set
from replicad.keeper.paths import ReplicaPaths


@dataclass
class QueueFinish:
    me: ReplicaPaths
    #: the entry's ``queue-`` node name
    znode: str
    #: (min_unprocessed_insert_time, max_processed_insert_time) once the entry is done
    times_if_done: Callable[[], tuple[int, int]]
    #: the same times now (what ZooKeeper holds)
    times_now: Callable[[], tuple[int, int]]
    #: the times the last ops made write (None: none made yet)
    written: tuple[int, int] | None = None
    #: the commit's multi applied the ops
    applied: bool = False

    def ops(self) -> list[Op]:
        """The node's removal and the times that change (made again for each try of the commit)."""
        low, high = self.written = self.times_if_done()
        now_low, now_high = self.times_now()
        ops: list[Op] = [Delete(self.me.queue_entry(self.znode))]
        if low != now_low:
            ops.append(Set(self.me.min_unprocessed_insert_time, str(low).encode()))
        if high != now_high:
            ops.append(Set(self.me.max_processed_insert_time, str(high).encode()))
        return ops
