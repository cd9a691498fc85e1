"""The merge predicate, mutation versions and drop-range helpers (pure: no ZooKeeper)."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.model.mutation_entry import MutationEntry
from replicad.model.part_info import PartInfo
from replicad.model.part_set import ActivePartSet
from replicad.model.queue_state import QueueState
from replicad.replication.drop_range import _block_in_range, inside_range
from replicad.replication.leader import leader_of
from replicad.replication.merge_assigner import AssignerSettings
from replicad.replication.merge_predicate import MergePredicate, is_committing
from replicad.replication.mutations import MutationsState, count_parts_to_mutate

PATHS = TablePaths.create("/t", "r1")
P = PartInfo.parse


def mutations(queue: QueueState, *entries: tuple[str, dict[str, int], str]) -> MutationsState:
    state = MutationsState(cast(Keeper, None), PATHS, queue)
    for znode, numbers, commands in entries:
        state._add(MutationEntry("r1", tuple(numbers.items()), commands, 0, None, znode))
    return state


def predicate(parts: list[str], **kw: object) -> MergePredicate:
    queue = QueueState()
    queue.initialize(parts)
    muts = kw.pop("mutations", None) or mutations(queue)
    prev = ActivePartSet(queue.virtual_parts.infos())
    return MergePredicate(queue, muts, prev, **kw)  # type: ignore[arg-type]


def test_neighbours_with_nothing_in_between_may_merge() -> None:
    pred = predicate(["p_0_0_0", "p_1_1_0", "q_0_0_0"])
    assert pred.merge_blocker(P("p_0_0_0"), P("p_1_1_0")) is None
    assert "different partitions" in (pred.merge_blocker(P("p_1_1_0"), P("q_0_0_0")) or "")


def test_committing_block_in_the_gap_blocks() -> None:
    pred = predicate(["p_0_0_0", "p_2_2_0", "p_5_5_0"], committing_blocks={"p": [1, 7]})
    assert "Block number 1 is still being inserted" in (pred.merge_blocker(P("p_0_0_0"), P("p_2_2_0")) or "")
    assert pred.merge_blocker(P("p_2_2_0"), P("p_5_5_0")) is None  # 3 and 4 were abandoned
    assert predicate(["q_0_0_0", "q_2_2_0"], committing_blocks={"p": [1]}).can_merge(
        P("q_0_0_0"), P("q_2_2_0")
    )


def test_parts_already_assigned_or_unknown_or_with_missing_neighbours() -> None:
    pred = predicate(["p_0_0_0", "p_1_1_0", "p_2_2_0"])
    pred.queue.insert("queue-1", LogEntry.merge_parts(["p_0_0_0", "p_1_1_0"], "p_0_1_1", source_replica="r"))
    assert "already been assigned a merge into p_0_1_1" in (
        pred.merge_blocker(P("p_1_1_0"), P("p_2_2_0")) or ""
    )
    # a part inserted after the snapshot is not known yet
    pred.queue.insert("queue-2", LogEntry.get_part("p_3_3_0", source_replica="r"))
    assert "hasn't been read" in (pred.merge_blocker(P("p_2_2_0"), P("p_3_3_0")) or "")
    # a part still to be fetched lies between two parts that are here
    pred2 = predicate(["p_0_0_0", "p_2_2_0"])
    pred2.queue.insert("queue-3", LogEntry.get_part("p_1_1_0", source_replica="r"))
    assert "still not present" in (pred2.merge_blocker(P("p_0_0_0"), P("p_2_2_0")) or "")


def test_quorum_parts_are_not_merged() -> None:
    pred = predicate(["p_0_0_0", "p_1_1_0"], inprogress_quorum_part="p_1_1_0")
    assert "Quorum insert" in (pred.merge_blocker(P("p_0_0_0"), P("p_1_1_0")) or "")
    pred = predicate(["p_0_0_0", "p_1_1_0"], last_quorum_parts=frozenset({"p_0_0_0"}))
    assert "satisfied quorum" in (pred.merge_blocker(P("p_0_0_0"), P("p_1_1_0")) or "")


def test_mutation_versions_must_match_and_desired_version() -> None:
    queue = QueueState()
    parts = ["p_0_0_0", "p_1_1_0", "p_3_3_0", "p_4_4_0_3"]
    queue.initialize(parts)
    muts = mutations(queue, ("0000000000", {"p": 2, "q": 1}, "DELETE WHERE x = 1 "))
    pred = predicate(parts, mutations=muts)
    pred.queue = queue
    assert pred.merge_blocker(P("p_0_0_0"), P("p_1_1_0")) is None
    assert "mutation versions" in (pred.merge_blocker(P("p_1_1_0"), P("p_3_3_0")) or "")
    assert pred.merge_blocker(P("p_3_3_0"), P("p_4_4_0_3")) is None
    assert pred.desired_mutation_version(P("p_0_0_0")) == 2
    assert pred.desired_mutation_version(P("p_3_3_0")) is None  # newer than the mutation
    muts._add(MutationEntry("r1", (("p", 5),), "DELETE WHERE x = 2 ", 0, None, "0000000001"))
    assert pred.desired_mutation_version(P("p_3_3_0")) == 5
    assert pred.desired_mutation_version(P("p_0_0_0")) == 5  # all mutations at once
    assert muts.commands_for(P("p_0_0_0"), 5) == ["DELETE WHERE x = 1 ", "DELETE WHERE x = 2 "]
    assert muts.commands_for(P("p_4_4_0_3"), 5) == ["DELETE WHERE x = 2 "]
    assert muts.commands_for(P("p_0_0_0"), 4) is None  # no such mutation (yet)


def test_mutation_progress_and_finish() -> None:
    queue = QueueState()
    queue.initialize(["p_0_0_0", "p_1_1_0", "p_5_5_0"])
    entry = MutationEntry("r1", (("p", 3),), "DELETE WHERE 1 ", 0, None, "0000000000")
    muts = mutations(queue, ("0000000000", {"p": 3}, "DELETE WHERE 1 "))
    assert count_parts_to_mutate(entry, queue.current_parts) == 2
    queue.insert("queue-1", LogEntry.mutate_part("p_0_0_0", "p_0_0_0_3", source_replica="r"))
    assert muts.parts_to_do(entry) == 2  # p_0_0_0 still here, p_1_1_0 not assigned yet
    pred = predicate(["p_0_0_0_3", "p_1_1_0_3", "p_5_5_0"], committing_blocks={"p": [2]})
    assert not pred.is_mutation_finished(entry)  # an insert below 3 is still committing
    pred.committing_blocks = {"p": [4]}
    assert pred.is_mutation_finished(entry)


@given(st.lists(st.integers(0, 50), unique=True, max_size=8), st.integers(0, 60))
def test_current_version_is_the_newest_mutation_not_above_the_data(
    versions: list[int], data_version: int
) -> None:
    queue = QueueState()
    muts = mutations(
        queue, *((f"{i:010d}", {"p": v}, "DELETE WHERE 1 ") for i, v in enumerate(sorted(versions)))
    )
    expected = max((v for v in versions if v <= data_version), default=0)
    assert muts.current_version("p", data_version) == expected
    assert muts.current_version("other", data_version) == 0


def test_max_source_parts_size_shrinks_as_the_queue_fills() -> None:
    s = AssignerSettings()
    free = 1 << 50
    assert s.max_source_parts_size(0, free) == 150 << 30
    assert s.max_source_parts_size(8, free) == 150 << 30
    assert s.max_source_parts_size(16, free) == 1 << 20
    sizes = [s.max_source_parts_size(q, free) for q in range(8, 17)]
    assert sizes == sorted(sizes, reverse=True)
    assert s.max_source_parts_size(0, 10 << 20) == 5 << 20  # half the free disk


def test_committing_lock_data_forms() -> None:
    holders = {"/t/temp/abandonable_lock-0000000003", "/t/temp/abandonable_lock-insert"}
    assert is_committing(b"/t/temp/abandonable_lock-0000000003", holders)  # 18.16
    assert not is_committing(b"/t/temp/abandonable_lock-0000000002", holders)  # holder gone: abandoned
    assert is_committing(b"/t/temp/abandonable_lock-insert", holders)  # 22.11+
    assert is_committing(b"operation: 1\n", holders)  # newest


def test_drop_range_helpers() -> None:
    drop = P("p_0_9_999999999_5")
    assert inside_range(drop, P("p_3_4_1")) and inside_range(drop, P("p_3_4_1_7"))  # 18.16: blocks only
    assert not inside_range(drop, P("p_8_10_1")) and not inside_range(drop, P("q_1_1_0"))
    assert _block_in_range(b"p_3_3_0", "p", 0, 9) and not _block_in_range(b"p_10_10_0", "p", 0, 9)
    assert _block_in_range(b"4", "p", 0, 9) and _block_in_range(b"garbage", "p", 0, 9)


def test_leader_is_the_smallest_node() -> None:
    assert (
        leader_of(["leader_election-0000000004", "leader_election-0000000002"])
        == "leader_election-0000000002"
    )
    # a modern persistent node sorts first: an 18.16 replica (and replicad) never leads beside it
    assert leader_of(["leader_election-0000000001", "leader_election-0"]) == "leader_election-0"
    assert leader_of([]) is None
