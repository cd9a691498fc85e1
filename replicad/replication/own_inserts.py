"""The log entries of this replica's own inserts: done already when the log puller reads them back.

18.16 copies every log entry into the replica's ``queue/``, its own inserts' ``GET_PART`` entries too;
executing one finds the part here (an ``exists`` of ``parts/<part>``) and removes the queue node.  On the
inserting replica that is a queue node created and removed, two more requests and a queue pass per insert,
to learn what the replica knew when it committed the part.

:class:`OwnInserts` remembers the log entries of the parts this process committed itself (:meth:`committed`,
called by the committer once the commit's multi succeeded, with the ``log-`` node it created and its bytes):
the puller takes them from here instead of reading them back (:meth:`known`).  Such an entry is *done here*
(:meth:`take`) if its part is still active on this replica, the entry is a plain insert (no
quorum: a quorum entry counts this replica through its execution) and nothing pulled before it in the same
batch can remove or replace parts (a drop or replace range executes first and could take the part away).
A done entry gets no queue node: its part joins the queue's virtual and current parts as the entry's
execution would have made them (:meth:`apply`, once the puller's multi has moved ``log_pointer`` past it).

Anything else (a commit whose answer was lost, a restart, a part merged or dropped meanwhile) leaves the
entry to the queue as in 18.16: the set only ever skips an execution whose outcome is known.
"""

from __future__ import annotations

from collections.abc import Callable

from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.queue_state import QueueState

#: entries remembered at most (one never pulled back, e.g. after a clone moved the pointer, is forgotten)
MAX_REMEMBERED = 10_000

#: entries a batch may hold before an own entry that is still taken as done (they cannot remove parts)
_HARMLESS = frozenset({LogEntryType.GET_PART, LogEntryType.MERGE_PARTS, LogEntryType.MUTATE_PART})


class OwnInserts:
    def __init__(self, replica_name: str, queue: QueueState, is_active: Callable[[str], bool]) -> None:
        self.replica_name = replica_name
        self.queue = queue
        self.is_active = is_active
        #: ``log-`` node -> the entry (named so) and its bytes, committed here and not pulled back yet
        #: (insertion-ordered: the oldest is dropped first)
        self._entries: dict[str, tuple[LogEntry, bytes]] = {}
        #: entries taken as done (tests)
        self.done_total = 0
        #: called after :meth:`apply` (new parts: the leader's merge selection looks again)
        self.on_done: list[Callable[[], None]] = []

    def committed(self, log_znode: str, entry: LogEntry, data: bytes) -> None:
        """(committer) ``entry`` (``data``) is in the log as ``log_znode``, its part under ``parts/``."""
        entries = self._entries
        entries[log_znode] = (entry.with_znode(log_znode), data)
        if len(entries) > MAX_REMEMBERED:
            del entries[next(iter(entries))]

    def known(self, log_znode: str) -> tuple[LogEntry, bytes] | None:
        """The entry and bytes of ``log_znode`` if this process created it (the puller need not read it)."""
        return self._entries.get(log_znode)

    def take(self, entry: LogEntry, after: list[LogEntry]) -> bool:
        """Is ``entry`` (named as its ``log-`` node; read after the entries ``after`` of its batch) done
        here?  Forgets it either way."""
        if entry.type is not LogEntryType.GET_PART or entry.source_replica != self.replica_name:
            return False
        if self._entries.pop(entry.znode_name, None) is None:
            return False
        if entry.quorum or not self.is_active(entry.new_part_name):
            return False
        if any(e.type not in _HARMLESS for e in after):
            return False
        containing = self.queue.virtual_parts.get_containing_part(entry.new_part_name)
        return containing is None or containing == entry.new_part_name

    def apply(self, entries: list[LogEntry]) -> None:
        """The entries taken as done are past ``log_pointer``: their parts are the queue's as if executed."""
        for entry in entries:
            self.queue.mark_done(entry)
        self.done_total += len(entries)
        for listener in self.on_done:
            listener()
