"""OwnInserts: which of this replica's own log entries are done when pulled back, and what marking them done
does to the queue's part sets (replicad.replication.own_inserts)."""

from __future__ import annotations

import pytest

from replicad.model.log_entry import LogEntry
from replicad.model.queue_state import QueueState
from replicad.replication import own_inserts
from replicad.replication.own_inserts import OwnInserts

PART = "202611_5_5_0"


def make(active: tuple[str, ...] = (PART,)) -> OwnInserts:
    return OwnInserts("r1", QueueState(), lambda name: name in active)


def mine(part: str = PART, quorum: int = 0, node: str = "log-0000000005") -> LogEntry:
    """The entry as the puller reads it (named as its log node)."""
    entry = LogEntry.get_part(part, source_replica="r1", create_time=1_700_000_000, quorum=quorum)
    return entry.with_znode(node)


def commit(own: OwnInserts, entry: LogEntry) -> None:
    own.committed(entry.znode_name, entry.with_znode(""), entry.to_bytes())


def test_a_part_committed_here_and_still_active_is_done_when_its_entry_is_read_back() -> None:
    own = make()
    commit(own, mine())
    known = own.known("log-0000000005")
    assert known is not None and known[0] == mine() and known[0].znode_name == "log-0000000005"
    assert known[1] == mine().to_bytes() and own.known("log-0000000006") is None
    assert own.take(mine(), [])
    assert not own.take(mine(), [])  # taken once: a second copy of the entry goes to the queue
    assert own.known("log-0000000005") is None


def test_anything_not_known_to_be_done_goes_to_the_queue() -> None:
    own = make()
    assert not own.take(mine(), [])  # not committed by this process (a restart, a lost answer)
    commit(own, mine())
    assert not own.take(LogEntry.get_part(PART, source_replica="r2").with_znode("log-0000000005"), [])
    assert not own.take(mine(quorum=2), [])  # a quorum insert counts this replica by its execution
    commit(own, mine())
    assert not own.take(mine(), [LogEntry.drop_range("202611_0_9_999999999", source_replica="r2")])
    gone = make(active=())
    commit(gone, mine())
    assert not gone.take(mine(), [])  # merged or dropped meanwhile: not active any more


def test_entries_that_cannot_remove_parts_may_come_before_it_in_the_batch() -> None:
    own = make()
    commit(own, mine())
    before = [LogEntry.get_part("202611_4_4_0", source_replica="r2"),
              LogEntry.merge_parts(["202611_1_1_0", "202611_2_2_0"], "202611_1_2_1", source_replica="r2")]
    assert own.take(mine(), before)


def test_a_part_covered_in_the_queue_is_left_to_the_queue() -> None:
    own = make()
    own.queue.insert("queue-0000000001", LogEntry.drop_range("202611_0_9_999999999", source_replica="r2"))
    commit(own, mine())
    assert not own.take(mine(), [])


def test_apply_makes_the_part_virtual_and_current_as_its_execution_would() -> None:
    own = make()
    woken: list[int] = []
    own.on_done.append(lambda: woken.append(1))
    own.apply([mine()])
    queue = own.queue
    assert queue.virtual_parts.parts() == [PART] and queue.current_parts.parts() == [PART]
    assert len(queue) == 0 and queue.max_processed_insert_time == 1_700_000_000
    assert queue.min_unprocessed_insert_time == 0
    assert own.done_total == 1 and woken == [1]


def test_the_memory_of_commits_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    own = make(active=tuple(f"202611_{i}_{i}_0" for i in range(5)))
    monkeypatch.setattr(own_inserts, "MAX_REMEMBERED", 3)
    for i in range(5):
        commit(own, mine(f"202611_{i}_{i}_0", node=f"log-000000000{i}"))
    assert len(own._entries) == 3
    assert not own.take(mine("202611_0_0_0", node="log-0000000000"), [])  # the oldest was forgotten
    assert own.take(mine("202611_4_4_0", node="log-0000000004"), [])
