"""The replication queue's pure core: selection rules, outcomes, back-off, counters."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.part_info import PartInfo
from replicad.model.queue_entry import BackoffSettings
from replicad.model.queue_state import QueueState


def get(part: str, t: int = 100) -> LogEntry:
    return LogEntry.get_part(part, source_replica="r1", create_time=t)


def merge(sources: list[str], new: str, t: int = 200) -> LogEntry:
    return LogEntry.merge_parts(sources, new, source_replica="r1", create_time=t)


def drop(range_name: str, t: int = 300) -> LogEntry:
    return LogEntry.drop_range(range_name, source_replica="r1", create_time=t)


def q_with(*entries: LogEntry) -> QueueState:
    q = QueueState()
    for i, e in enumerate(entries):
        q.insert(f"queue-{i:010d}", e)
    return q


def test_merge_waits_for_its_sources() -> None:
    q = q_with(get("all_1_1_0"), get("all_2_2_0"), merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1"))
    assert q.virtual_parts.parts() == ["all_1_2_1"]
    s1 = q.select_entry_to_process(now=10)
    assert s1 is not None and s1.entry.new_part_name == "all_1_1_0"
    assert q.future_parts == {"all_1_1_0": "queue-0000000000"}
    s2 = q.select_entry_to_process(now=10)
    assert s2 is not None and s2.entry.new_part_name == "all_2_2_0"
    assert q.select_entry_to_process(now=10) is None
    m = q.get("queue-0000000002")
    assert m is not None and "Not merging into part all_1_2_1 because part all_1_1_0 is not ready yet" in (
        m.postpone_reason
    )
    assert m.num_postponed == 1
    q.finish("queue-0000000000", success=True, now=11)
    q.finish("queue-0000000001", success=True, now=11)
    assert q.current_parts.parts() == ["all_1_1_0", "all_2_2_0"]
    s3 = q.select_entry_to_process(now=12)
    assert s3 is not None and s3.entry.type is LogEntryType.MERGE_PARTS and s3.covering_part is None
    res = q.finish("queue-0000000002", success=True, now=13)
    assert res.replaced_parts == ("all_1_1_0", "all_2_2_0")
    assert q.current_parts.parts() == ["all_1_2_1"] and len(q) == 0 and q.future_parts == {}


def test_entry_covered_by_executing_part_waits() -> None:
    q = q_with(merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1"), get("all_2_2_0"))
    q.initialize(["all_1_1_0"])
    # the merge's source all_2_2_0 is not being produced, so the merge may start (it would fetch instead)
    s = q.select_entry_to_process(now=1)
    assert s is not None and s.entry.type is LogEntryType.MERGE_PARTS
    assert q.select_entry_to_process(now=1) is None
    g = q.get("queue-0000000001")
    assert g is not None and "covered by part all_1_2_1 that is currently executing" in g.postpone_reason


def test_intersecting_future_part_blocks() -> None:
    q = q_with(merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1"), merge(["all_2_2_0", "all_3_3_0"], "all_2_3_1"))
    assert q.select_entry_to_process(now=1) is not None
    assert q.select_entry_to_process(now=1) is None
    m2 = q.get("queue-0000000001")
    assert m2 is not None and "intersects part all_1_2_1" in m2.postpone_reason


def test_drop_range_goes_first_and_waits_for_conflicts() -> None:
    q = q_with(get("all_1_1_0"), get("all_5_5_0"))
    s = q.select_entry_to_process(now=1)
    assert s is not None and s.entry.new_part_name == "all_1_1_0"
    q.insert("queue-0000000009", drop("all_0_3_999999999"))
    assert q.entries[0].znode_name == "queue-0000000009"
    nxt = q.select_entry_to_process(now=2)
    assert nxt is not None and nxt.entry.new_part_name == "all_5_5_0"  # the drop is blocked by all_1_1_0
    d = q.get("queue-0000000009")
    assert d is not None
    assert d.postpone_reason.startswith(
        "Can't execute command for range all_0_3_999999999 (entry queue-0000000009)."
    )
    assert "1 currently executing entries blocking it: GET_PART part all_1_1_0, " in d.postpone_reason
    q.finish("queue-0000000000", success=True, now=3)
    ds = q.select_entry_to_process(now=4)
    assert ds is not None and ds.entry.type is LogEntryType.DROP_RANGE
    # while the drop runs, nothing inside its range may start
    q.insert("queue-0000000010", get("all_2_2_0"))
    assert q.select_entry_to_process(now=5) is None
    g = q.get("queue-0000000010")
    assert g is not None and "covered by part all_0_3_999999999" in g.postpone_reason
    removed, waiting = q.remove_part_producing_ops_in_range("all_0_3_999999999", "queue-0000000009")
    assert removed == [] and waiting == []  # queue-10 was logged after the drop (see below)
    q.finish("queue-0000000009", success=True, now=6)
    q.finish("queue-0000000001", success=True, now=6)
    assert q.current_parts.parts() == ["all_5_5_0"]
    later = q.select_entry_to_process(now=7)
    assert later is not None and later.entry.new_part_name == "all_2_2_0"


def test_drop_range_keeps_entries_logged_after_it() -> None:
    """Regression (the chaos suite's S3 runs): an insert took block 6, DROP PARTITION took block 7 and logged
    the range ..._0_6_999999999, then the insert committed and logged GET_PART ..._6_6_0 (and a mutation of
    it).  Replicas that ran the drop before those entries were logged keep the part; a replica that pulled
    all three at once (it was down) must keep it too, or the replicas diverge.  Entries logged before the
    drop are still removed."""
    q = q_with(get("all_1_1_0"), get("all_2_2_0"))  # queue-0, queue-1: before the drop
    q.insert("queue-0000000002", drop("all_0_6_999999999"))
    q.insert("queue-0000000003", get("all_6_6_0"))  # logged after the drop
    first = q.select_entry_to_process(now=1)
    assert first is not None and first.entry.type is LogEntryType.DROP_RANGE
    removed, waiting = q.remove_part_producing_ops_in_range("all_0_6_999999999", "queue-0000000002")
    assert removed == ["queue-0000000000", "queue-0000000001"] and waiting == []
    q.finish("queue-0000000002", success=True, now=2)
    nxt = q.select_entry_to_process(now=3)
    assert nxt is not None and nxt.entry.new_part_name == "all_6_6_0"
    assert [e.znode_name for e in q.entries] == ["queue-0000000003"]


def test_removed_executing_entry_is_forgotten_on_finish() -> None:
    q = q_with(get("all_1_1_0"), drop("all_0_3_999999999"))
    # the drop sits first; select it, then the GET is covered by it and waits
    first = q.select_entry_to_process(now=1)
    assert first is not None and first.entry.type is LogEntryType.DROP_RANGE
    q2 = q_with(get("all_1_1_0"))
    s = q2.select_entry_to_process(now=1)
    assert s is not None
    q2.insert("queue-0000000005", drop("all_0_3_999999999"))
    removed, waiting = q2.remove_part_producing_ops_in_range("all_0_3_999999999", "queue-0000000005")
    assert removed == waiting == ["queue-0000000000"]
    assert q2.finish("queue-0000000000", success=True, now=2).replaced_parts == ()
    assert q2.current_parts.parts() == [] and "queue-0000000000" not in q2


def test_backoff_after_failures() -> None:
    q = QueueState(backoff=BackoffSettings(initial_s=2.0, max_fetch_s=5.0))
    q.insert("queue-0000000000", get("all_1_1_0"))
    now = 100.0
    for failures, delay in ((1, 2.0), (2, 4.0), (3, 5.0), (4, 5.0)):
        assert q.select_entry_to_process(now) is not None
        q.finish(
            "queue-0000000000", success=False, now=now, error="Code: 86. Received error from remote server"
        )
        qe = q.get("queue-0000000000")
        assert qe is not None and qe.num_failures == failures and qe.retry_not_before == now + delay
        assert q.select_entry_to_process(now + delay - 0.5) is None
        assert f"failed {failures} times recently" in qe.postpone_reason
        assert "Received error from remote server" in qe.postpone_reason
        now += delay
    assert q.select_entry_to_process(now) is not None
    q.finish("queue-0000000000", success=True, now=now)
    assert len(q) == 0
    assert BackoffSettings().delay(LogEntryType.MUTATE_PART, 30) == 300.0
    assert BackoffSettings().delay(LogEntryType.MERGE_PARTS, 0) == 0.0


def test_covering_part_is_reported() -> None:
    q = q_with(get("all_2_2_0"))
    q.initialize(["all_1_3_1"])
    s = q.select_entry_to_process(now=1)
    assert s is not None and s.covering_part == "all_1_3_1"


def test_actual_part_name_tagging() -> None:
    q = q_with(get("all_2_2_0"), get("all_4_4_0"))
    s = q.select_entry_to_process(now=1)
    assert s is not None
    assert q.add_future_part_if_not_covered(s.queue_entry.znode_name, "all_1_3_1") is None
    assert q.future_parts["all_1_3_1"] == "queue-0000000000"
    s2 = q.select_entry_to_process(now=1)
    assert s2 is not None and s2.entry.new_part_name == "all_4_4_0"
    reason = q.add_future_part_if_not_covered("queue-0000000001", "all_2_3_1")
    assert reason is not None and "covered by part all_1_3_1 that is currently executing" in reason
    assert q.add_future_part_if_not_covered("queue-0000000001", "all_4_4_0") is None
    q.finish("queue-0000000000", success=True, now=2)
    assert "all_1_3_1" not in q.future_parts


def test_status_and_insert_times() -> None:
    q = q_with(
        get("all_1_1_0", t=50),
        get("all_2_2_0", t=40),
        merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1", t=60),
        LogEntry.mutate_part("all_3_3_0", "all_3_3_0_7", source_replica="r1", create_time=30),
    )
    st_ = q.status()
    assert (st_.queue_size, st_.inserts_in_queue, st_.merges_in_queue, st_.part_mutations_in_queue) == (
        4,
        2,
        1,
        1,
    )
    assert (st_.queue_oldest_time, st_.inserts_oldest_time, st_.oldest_part_to_get) == (30, 40, "all_2_2_0")
    assert (st_.oldest_part_to_merge_to, st_.oldest_part_to_mutate_to) == ("all_1_2_1", "all_3_3_0_7")
    assert q.min_unprocessed_insert_time == 40 and q.max_processed_insert_time == 0
    s = q.select_entry_to_process(now=1)
    assert s is not None
    assert q.status().future_parts == 1
    q.finish(s.queue_entry.znode_name, success=True, now=2)
    assert q.max_processed_insert_time == 50 and q.min_unprocessed_insert_time == 40
    rows = q.replication_queue_rows()
    assert [r["type"] for r in rows] == ["GET_PART", "MERGE_PARTS", "MUTATE_PART"]
    assert rows[1]["parts_to_merge"] == ["all_1_1_0", "all_2_2_0"]


def test_merge_blocker_and_extra_check() -> None:
    q = q_with(merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1"), get("all_1_1_0"))
    q.initialize(["all_2_2_0", "all_3_3_0"])
    assert q.merge_blocker("all_3_3_0") is None
    assert q.merge_blocker("all_2_2_0") == "Part all_2_2_0 has already been assigned a merge into all_1_2_1"
    assert "hasn't been read" in (q.merge_blocker("all_9_9_0") or "")
    s = q.select_entry_to_process(
        now=1, extra_check=lambda e: "merges are cancelled" if e.source_parts else None
    )
    assert s is not None and s.entry.type is LogEntryType.GET_PART
    assert q.get("queue-0000000000").postpone_reason == "merges are cancelled"  # type: ignore[union-attr]


def test_alter_ordering() -> None:
    alter1 = LogEntry(LogEntryType.ALTER_METADATA, alter_version=1, columns_str="c", metadata_str="m")
    alter2 = LogEntry(LogEntryType.ALTER_METADATA, alter_version=2, columns_str="c", metadata_str="m")
    mut = LogEntry(
        LogEntryType.MUTATE_PART, new_part_name="all_1_1_0_5", source_parts=("all_1_1_0",), alter_version=2
    )
    q = q_with(alter2, mut, alter1)
    s = q.select_entry_to_process(now=1)
    assert s is not None and s.entry.alter_version == 1
    assert "another alter 1 must be executed before" in q.entries[0].postpone_reason
    q.finish(s.queue_entry.znode_name, success=True, now=2)
    s = q.select_entry_to_process(now=3)
    assert s is not None and s.entry.type is LogEntryType.ALTER_METADATA and s.entry.alter_version == 2
    assert q.select_entry_to_process(now=3) is None
    mut_qe = q.get("queue-0000000001")
    assert mut_qe is not None and "metadata still not altered" in mut_qe.postpone_reason
    q.finish(s.queue_entry.znode_name, success=True, now=4)
    s = q.select_entry_to_process(now=5)
    assert s is not None and s.entry.type is LogEntryType.MUTATE_PART


def test_move_sibling_parts_for_merge_to_end() -> None:
    q = q_with(
        get("all_1_1_0"), get("all_2_2_0"), get("all_7_7_0"), merge(["all_1_1_0", "all_2_2_0"], "all_1_2_1")
    )
    assert q.move_sibling_parts_for_merge_to_end_of_queue("all_1_1_0") == {"all_1_1_0", "all_2_2_0"}
    assert [qe.entry.new_part_name for qe in q.entries] == [
        "all_7_7_0",
        "all_1_2_1",
        "all_1_1_0",
        "all_2_2_0",
    ]
    assert q.move_sibling_parts_for_merge_to_end_of_queue("all_9_9_0") == set()


def test_duplicate_insert_and_load_order() -> None:
    q = QueueState()
    q.load([("queue-0000000002", get("all_2_2_0")), ("queue-0000000001", get("all_1_1_0"))], now=5.0)
    assert [qe.znode_name for qe in q.entries] == ["queue-0000000001", "queue-0000000002"]
    assert q.insert("queue-0000000001", get("all_9_9_0")).entry.new_part_name == "all_1_1_0"
    assert q.last_queue_update == 5.0 and q.znode_names() == {"queue-0000000001", "queue-0000000002"}


# -- a random walk: the selection rules never let conflicting work run at the same time ----------------


@st.composite
def workloads(draw: st.DrawFn) -> list[LogEntry]:
    n = draw(st.integers(2, 12))
    entries: list[LogEntry] = [get(f"all_{i}_{i}_0") for i in range(n)]
    for _ in range(draw(st.integers(0, 4))):
        lo = draw(st.integers(0, n - 2))
        hi = draw(st.integers(lo + 1, min(n - 1, lo + 4)))
        sources = [f"all_{i}_{i}_0" for i in range(lo, hi + 1)]
        entries.append(merge(sources, f"all_{lo}_{hi}_1"))
    if draw(st.booleans()):
        entries.append(drop(f"all_0_{draw(st.integers(0, n - 1))}_999999999"))
    return entries


@settings(max_examples=300, deadline=None)
@given(workloads(), st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.booleans()), max_size=60))
def test_random_walk_no_conflicting_execution(
    entries: list[LogEntry], steps: list[tuple[bool, int, bool]]
) -> None:
    q = QueueState(backoff=BackoffSettings(initial_s=0.0))
    for i, e in enumerate(entries):
        q.insert(f"queue-{i:010d}", e)
    executing: list[str] = []
    now = 0.0
    for select, pick, ok in steps:
        now += 1
        if select:
            s = q.select_entry_to_process(now)
            if s is not None:
                executing.append(s.queue_entry.znode_name)
        elif executing:
            z = executing.pop(pick % len(executing))
            q.finish(z, success=ok, now=now)
        running = [q.get(z) for z in executing]
        running_entries = [qe.entry for qe in running if qe is not None]
        produced = [(PartInfo.parse(n), e) for e in running_entries for n in e.blocking_part_names()]
        for i, (a, ea) in enumerate(produced):
            for b, eb in produced[i + 1 :]:
                assert a.is_disjoint(b), (ea, eb)
        names = {n for e in running_entries for n in e.blocking_part_names()}
        for e in running_entries:
            assert not (set(e.source_parts) & names), e
        assert set(q.future_parts.values()) <= set(executing)


def test_skipped_types_end_the_selection_and_the_bookkeeping_follows_every_path() -> None:
    """The executor skips fetches while its fetch pool is full: a selection finds a waiting DROP_RANGE behind
    them, returns None at once when only skipped types wait, and the counts survive failures, retries, removal
    and success (a count gone wrong would make the executor stop starting entries)."""
    G = LogEntryType.GET_PART
    q = q_with(get("1_1_1_0", t=100), get("2_2_2_0", t=101), get("3_3_3_0", t=101))
    assert q.select_entry_to_process(now=1, skip={G}) is None
    assert all(qe.num_postponed == 0 for qe in q.entries)  # not even looked at
    q.insert("queue-0000000009", drop("4_0_9_999999999"))
    s = q.select_entry_to_process(now=1, skip={G})
    assert s is not None and s.entry.type is LogEntryType.DROP_RANGE
    assert q.select_entry_to_process(now=1, skip={G}) is None
    q.finish("queue-0000000009", success=True, now=2)
    first = q.select_entry_to_process(now=2)
    assert first is not None and first.entry.new_part_name == "1_1_1_0"
    q.finish(first.queue_entry.znode_name, success=False, now=2, error="boom")  # back-off: 1 s
    assert q.next_retry_delay(2.0) == 1.0  # BackoffSettings' initial_s
    assert q.select_entry_to_process(now=2, skip={G}) is None
    second = q.select_entry_to_process(now=2)
    assert second is not None and second.entry.new_part_name == "2_2_2_0"
    assert q.min_unprocessed_insert_time == 100
    q.remove_entry("queue-0000000002")  # removed without execution (its node was deleted)
    q.finish(second.queue_entry.znode_name, success=True, now=3)
    assert q.min_unprocessed_insert_time == 100 and q.max_processed_insert_time == 101
    assert q.select_entry_to_process(now=2.5) is None  # the failed one still backs off
    again = q.select_entry_to_process(now=3.5, skip={LogEntryType.MERGE_PARTS})
    assert again is not None and again.entry.new_part_name == "1_1_1_0" and q.next_retry_delay(3.5) is None
    q.finish(again.queue_entry.znode_name, success=True, now=4)
    assert len(q) == 0 and q.min_unprocessed_insert_time == 0
    assert q.select_entry_to_process(now=5, skip={G}) is None and q.select_entry_to_process(now=5) is None
    q.insert("queue-0000000010", get("5_5_5_0", t=50))
    assert q.min_unprocessed_insert_time == 50
    s5 = q.select_entry_to_process(now=6, skip={LogEntryType.DROP_RANGE})
    assert s5 is not None and s5.entry.new_part_name == "5_5_5_0"


def test_back_off_is_judged_on_the_monotonic_clock_when_given() -> None:
    """The daemon passes the monotonic clock as ``mono``: a wall clock stepped back an hour after a failure
    must not hold the retry for an hour (nor one stepped forward skip the back-off); the wall clock still
    stamps the entry's times."""
    q = q_with(get("1_1_1_0", t=100))
    wall, mono = 2_000_000_000.0, 50.0
    first = q.select_entry_to_process(now=wall, mono=mono)
    assert first is not None
    q.finish(first.queue_entry.znode_name, success=False, now=wall, error="boom", mono=mono)  # back-off 1 s
    qe = first.queue_entry
    assert qe.last_exception_time == wall and q.next_retry_delay(mono) == 1.0
    assert q.select_entry_to_process(now=wall + 86400, mono=mono + 0.5) is None  # wall jumped a day ahead
    again = q.select_entry_to_process(now=wall - 3600, mono=mono + 1.1)  # wall stepped back an hour
    assert again is not None and again.queue_entry.last_attempt_time == wall - 3600


def test_initialize_rebuilds_the_part_sets_without_parts_of_removed_entries() -> None:
    """At each start of replication the part sets are rebuilt (ClickHouse clears them): the part of an entry
    removed unexecuted (a clone cleared the queue, another replica's node gone) must not stay in
    ``virtual_parts``, where it kept merges and mutations of the parts it covers from being assigned."""
    q = q_with(get("1_1_1_0", t=100), get("1_2_2_0", t=101))
    q.insert("queue-0000000009", merge(["1_1_1_0", "1_2_2_0"], "1_1_2_1"))
    assert q.virtual_parts.parts() == ["1_1_2_1"]
    q.remove_entry("queue-0000000009")
    assert q.virtual_parts.parts() == ["1_1_2_1"]  # what lingered
    q.initialize(["1_1_1_0"])  # 1_2_2_0 still queued
    assert q.virtual_parts.parts() == ["1_1_1_0", "1_2_2_0"]
    assert q.current_parts.parts() == ["1_1_1_0"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=12), st.integers(0, 3))
def test_times_if_done_are_the_times_after_the_entry_finished(times: list[int], running: int) -> None:
    q = q_with(*(get(f"all_{i}_{i}_0", t=t) for i, t in enumerate(times)))
    executing: list[str] = []
    while True:
        while len(executing) <= running:  # a few executing at once, finished oldest first
            s = q.select_entry_to_process(now=1)
            if s is None:
                break
            executing.append(s.queue_entry.znode_name)
        if not executing:
            break
        znode = executing.pop(0)
        predicted = q.times_if_done(znode)
        q.finish(znode, success=True, now=2)
        assert (q.min_unprocessed_insert_time, q.max_processed_insert_time) == predicted
    assert (q.min_unprocessed_insert_time, q.max_processed_insert_time) == (0, max(times))



@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=16), st.data())
def test_min_unprocessed_insert_time_is_the_least_queued(times: list[int], data: st.DataObject) -> None:
    q = q_with(*(get(f"all_{i}_{i}_0", t=t) for i, t in enumerate(times)))
    queued = {f"queue-{i:010d}": t for i, t in enumerate(times)}
    while queued:  # each entry leaves, executed (in the selection's order) or removed unexecuted
        if data.draw(st.booleans()):
            s = q.select_entry_to_process(now=1)
            assert s is not None
            znode = s.queue_entry.znode_name
            q.finish(znode, success=True, now=2)
        else:
            znode = data.draw(st.sampled_from(sorted(queued)))
            q.remove_entry(znode)
        del queued[znode]
        assert q.min_unprocessed_insert_time == min(queued.values(), default=0)
