"""Merge selection: bounded part counts under a stream of small inserts, partitions never crossed, gaps
(blocks still held by in-flight inserts) respected, OPTIMIZE FINAL."""

from __future__ import annotations

import random
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.part_info import PartInfo
from replicad.replication.merge_selector import (
    MergeCandidate,
    MergeChoice,
    MergeSelectorSettings,
    NoMerge,
    select_all_in_partition,
    select_merge,
    split_into_ranges,
)

MiB = 1 << 20


def always(_a: PartInfo, _b: PartInfo) -> bool:
    return True


def parts(pid: str, sizes: list[int], age: float = 1000.0, start: int = 1) -> list[MergeCandidate]:
    return [MergeCandidate(f"{pid}_{start + i}_{start + i}_0", s, age) for i, s in enumerate(sizes)]


def test_equal_small_parts_merge() -> None:
    choice = select_merge(parts("all", [MiB] * 6), always)
    assert choice is not None
    assert choice.parts == tuple(f"all_{i}_{i}_0" for i in range(1, 7))
    assert choice.new_part_name == "all_1_6_1"
    assert choice.total_bytes == 6 * MiB


def test_young_unbalanced_parts_wait() -> None:
    # one big part and one small fresh part: not balanced enough for base 5
    assert (
        select_merge(
            [MergeCandidate("all_1_1_0", 1000 * MiB, 1.0), MergeCandidate("all_2_2_0", MiB, 1.0)], always
        )
        is None
    )
    # ... but once they are old enough the base is lowered to 2 and ... still not balanced (ratio ~1.01)
    old = [MergeCandidate("all_1_1_0", 1000 * MiB, 10**8), MergeCandidate("all_2_2_0", MiB, 10**8)]
    assert select_merge(old, always) is None
    # two equal old parts merge
    eq = [MergeCandidate("all_1_1_0", 100 * MiB, 10**8), MergeCandidate("all_2_2_0", 100 * MiB, 10**8)]
    assert select_merge(eq, always) == MergeChoice(("all_1_1_0", "all_2_2_0"), "all_1_2_1", 200 * MiB)


def test_never_crosses_partitions() -> None:
    # interleaved block numbers, as inserts into several partitions produce
    cands = [MergeCandidate(f"{('202611', '202612')[i % 2]}_{i}_{i}_0", MiB, 10**6) for i in range(20)]
    cands.append(MergeCandidate("202610_99_99_0", MiB, 10**6))
    choice = select_merge(cands, always)
    assert choice is not None and len(choice.parts) >= 2
    assert len({PartInfo.parse(p).partition_id for p in choice.parts}) == 1
    assert select_merge(parts("202611", [MiB] * 3), always) is None  # 3 young parts: not worth it yet


def test_gaps_are_respected() -> None:
    cands = parts("all", [MiB] * 10)

    def no_gap_at_5(left: PartInfo, right: PartInfo) -> bool:
        return not (left.max_block < 5 < right.min_block or left.max_block == 5 or right.min_block == 6)

    ranges = split_into_ranges(cands, no_gap_at_5)
    assert [len(r) for r in ranges] == [5, 5]
    choice = select_merge(cands, no_gap_at_5)
    assert choice is not None
    blocks = [PartInfo.parse(p).min_block for p in choice.parts]
    assert max(blocks) <= 5 or min(blocks) >= 6


def test_limits() -> None:
    s = MergeSelectorSettings(max_parts_to_merge_at_once=4)
    choice = select_merge(parts("all", [MiB] * 20, age=10**6), always, s)
    assert choice is not None and len(choice.parts) <= 4
    assert select_merge(parts("all", [MiB] * 6, age=10**8), always, max_total_size=MiB) is None
    capped = select_merge(parts("all", [MiB] * 6, age=10**8), always, max_total_size=3 * MiB)
    assert capped is not None and capped.total_bytes <= 3 * MiB and len(capped.parts) >= 2


def test_small_parts_trimmed_from_the_right() -> None:
    cands = [MergeCandidate(f"all_{i}_{i}_0", 10 * MiB, 1.0) for i in range(1, 6)]
    cands.append(MergeCandidate("all_6_6_0", 1, 1.0))
    choice = select_merge(cands, always)
    assert choice is not None and choice.parts == tuple(f"all_{i}_{i}_0" for i in range(1, 6))
    assert choice.new_part_name == "all_1_5_1"


def test_mutated_and_merged_sources_name() -> None:
    cands = [
        MergeCandidate("all_1_5_2_9", 10 * MiB, 10**6),
        MergeCandidate("all_6_6_0_9", 10 * MiB, 10**6),
        MergeCandidate("all_7_9_1_9", 10 * MiB, 10**6),
    ]
    choice = select_merge(cands, always)
    assert choice is not None and choice.new_part_name == "all_1_9_3_9"


def test_select_all_in_partition() -> None:
    cands = parts("a", [MiB, 50 * MiB, 3]) + parts("b", [MiB])
    res = select_all_in_partition(cands, "a", always)
    assert isinstance(res, MergeChoice)
    assert res.parts == ("a_1_1_0", "a_2_2_0", "a_3_3_0") and res.new_part_name == "a_1_3_1"
    single = select_all_in_partition(cands, "b", always)
    assert isinstance(single, MergeChoice) and single.new_part_name == "b_1_1_1"
    assert select_all_in_partition(cands, "b", always, final=False) == NoMerge(
        "There is only one part inside partition"
    )
    assert isinstance(select_all_in_partition(cands, "zzz", always), NoMerge)
    gap = select_all_in_partition(cands, "a", lambda left, right: left.max_block != 2)
    assert isinstance(gap, NoMerge) and "a_2_2_0 and a_3_3_0" in gap.reason
    too_big = select_all_in_partition(cands, "a", always, max_total_size=MiB)
    assert isinstance(too_big, NoMerge)


def simulate(n_inserts: int, partitions: list[str], seed: int) -> dict[str, int]:
    """Insert small parts one by one (each merge takes no time); return the max part count per partition."""
    rng = random.Random(seed)
    active: dict[str, MergeCandidate] = {}
    written: dict[str, float] = {}
    next_block = 0
    now = 0.0
    worst = dict.fromkeys(partitions, 0)
    for _ in range(n_inserts):
        now += rng.uniform(0.5, 2.0)
        pid = rng.choice(partitions)
        name = f"{pid}_{next_block}_{next_block}_0"
        next_block += 1
        written[name] = now
        active[name] = MergeCandidate(name, rng.randint(50_000, 2 * MiB), 0.0)
        for _round in range(3):
            cands = [MergeCandidate(p.name, p.size_bytes, now - written[p.name]) for p in active.values()]
            choice = select_merge(cands, always)
            if choice is None:
                break
            for p in choice.parts:
                del active[p]
            active[choice.new_part_name] = MergeCandidate(choice.new_part_name, choice.total_bytes, 0.0)
            written[choice.new_part_name] = now
        for pid_ in partitions:
            count = sum(1 for p in active if p.startswith(pid_ + "_"))
            worst[pid_] = max(worst[pid_], count)
    return worst


def test_part_count_stays_bounded_for_a_stream_of_small_inserts() -> None:
    worst = simulate(1500, ["202610", "202611", "202612"], seed=1)
    assert max(worst.values()) <= 25, worst


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 10**9), st.floats(0, 10**7)),
        min_size=2,
        max_size=60,
    ),
    st.sets(st.integers(0, 60), max_size=5),
)
def test_choice_is_always_a_contiguous_mergeable_window(
    spec: list[tuple[str, int, float]], gaps: set[int]
) -> None:
    cands = [MergeCandidate(f"{pid}_{i}_{i}_0", size, age) for i, (pid, size, age) in enumerate(spec)]

    def can_merge(left: PartInfo, right: PartInfo) -> bool:
        return not any(left.max_block < g <= right.min_block for g in gaps)

    choice = select_merge(cands, can_merge)
    if choice is None:
        return
    infos = [PartInfo.parse(p) for p in choice.parts]
    assert len({i.partition_id for i in infos}) == 1
    assert len(infos) >= 2
    same_pid = sorted(PartInfo.parse(c.name) for c in cands if c.name.startswith(infos[0].partition_id + "_"))
    idx = [same_pid.index(i) for i in infos]
    assert idx == list(range(idx[0], idx[0] + len(idx)))  # contiguous within its partition
    for left, right in pairwise(infos):
        assert can_merge(left, right)
    assert choice.new_part_name == PartInfo.for_merge(infos).name
