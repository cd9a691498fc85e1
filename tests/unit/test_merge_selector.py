"""Merge selection: bounded part counts under a stream of small inserts, partitions never crossed, gaps
(blocks still held by in-flight inserts) respected, OPTIMIZE FINAL."""

from __future__ import annotations

import dataclasses
import math
import random
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.part_info import PartInfo
from replicad.replication import merge_selector
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


def _scan_range_loop(  # the selector's former loop over the window lengths: the reference
    sizes: merge_selector.Floats, ages: merge_selector.Floats, range_index: int, max_total: float,
    s: MergeSelectorSettings, best: merge_selector._Best,
) -> None:
    n = len(sizes)
    if n < 2:
        return
    starts = min(n, s.max_window_starts + 1)
    cum = np.concatenate(([0.0], np.cumsum(sizes)))
    fixed = float(s.size_fixed_cost_to_add)
    parts_norm = float(merge_selector._unit(np.array([float(n)]), float(s.min_parts_to_lower_base),
                             float(s.max_parts_to_lower_base))[0])
    log_min, log_max = math.log1p(s.min_size_to_lower_base), math.log1p(s.max_size_to_lower_base)
    run_max = sizes.copy()
    run_min_age = ages.copy()
    max_len = n if s.max_parts_to_merge_at_once <= 0 else min(n, s.max_parts_to_merge_at_once)
    for length in range(2, max_len + 1):
        count = n - length + 1  # windows [b, b + length)
        run_max = np.maximum(run_max[:count], sizes[length - 1 : length - 1 + count])
        run_min_age = np.minimum(run_min_age[:count], ages[length - 1 : length - 1 + count])
        m = min(count, starts)
        total = cum[length : length + m] - cum[:m]
        wmax, wage = run_max[:m], run_min_age[:m]
        size_norm = merge_selector._unit(np.log1p(total), log_min, log_max)
        min_age_lo = merge_selector._lerp(
            s.min_age_to_lower_base_at_min_size, s.min_age_to_lower_base_at_max_size, size_norm
        )
        max_age_lo = merge_selector._lerp(
            s.max_age_to_lower_base_at_min_size, s.max_age_to_lower_base_at_max_size, size_norm
        )
        age_norm = merge_selector._unit(wage, min_age_lo, max_age_lo)
        lowered_base = merge_selector._lerp(s.base, 2.0, np.minimum(1.0, age_norm + parts_norm))
        allowed = (total + length * fixed) / (wmax + fixed) >= lowered_base
        if max_total > 0:
            allowed &= total <= max_total
        if not allowed.any():
            continue
        score = (total + fixed * length) / (length - 1.9)
        if s.align_parts:
            prev = np.concatenate(([0.0], sizes[: m - 1]))
            with np.errstate(divide="ignore", invalid="ignore"):
                diff = np.abs(np.log2(np.where(prev > 0, total / np.where(prev > 0, prev, 1.0), 1.0)))
            use = (prev > total * s.align_min_ratio_of_sum_to_prev) & (diff < s.align_max_log2_difference)
            factor = merge_selector._lerp(s.align_max_score_adjustment, 1.0,
                                          diff / s.align_max_log2_difference)
            score = np.where(use, score * factor, score)
        score = np.where(allowed, score, np.inf)
        b = int(np.argmin(score))  # first minimum = smallest begin for this length
        cand = float(score[b])
        better = cand < best.score or (
            cand == best.score and (range_index, b, length) < (best.range_index, best.begin, best.length)
        )
        if better:
            best.score, best.range_index, best.begin, best.length = cand, range_index, b, length
            best.total = float(total[b])


def _both(cands: list[MergeCandidate], can_merge: merge_selector.CanMerge, s: MergeSelectorSettings,
          limit: int | None, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    fast = select_merge(cands, can_merge, s, limit)
    with monkeypatch.context() as m:
        m.setattr(merge_selector, "_scan_range", _scan_range_loop)
        slow = select_merge(cands, can_merge, s, limit)
    return fast, slow


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from([1, 7, 1000, 271_821, 5 * MiB, 10**9]),
                       st.integers(1, 10**9), st.booleans(), st.floats(0, 10**7)), min_size=2, max_size=140),
    st.sets(st.integers(0, 140), max_size=4),
    st.sampled_from([0, 2, 5, 100]),
    st.sampled_from([0, 3, 1000]),
    st.booleans(),
    st.sampled_from([None, 0, 50 * MiB]),
)
def test_the_windows_scored_at_once_choose_as_the_loop_over_lengths(
    spec: list[tuple[str, int, int, bool, float]], gaps: set[int], max_at_once: int, starts: int, align: bool,
    limit: int | None,
) -> None:
    """Sizes from a small set (ties between windows) or any; ages any; gaps, window limits, alignment."""
    cands = [MergeCandidate(f"{pid}_{i}_{i}_0", fixed if tie else size, age)
             for i, (pid, fixed, size, tie, age) in enumerate(spec)]

    def can_merge(left: PartInfo, right: PartInfo) -> bool:
        return not any(left.max_block < g <= right.min_block for g in gaps)

    s = dataclasses.replace(MergeSelectorSettings(), max_parts_to_merge_at_once=max_at_once,
                            max_window_starts=starts, align_parts=align)
    with pytest.MonkeyPatch.context() as mp:
        fast, slow = _both(cands, can_merge, s, limit, mp)
    assert fast == slow


def test_a_stream_chooses_as_the_loop_over_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's stream: one big part, merged parts, many young 10k-row parts of equal size."""
    rng = random.Random(3)
    for n in (2, 3, 10, 60, 150):
        cands = [MergeCandidate("202401_0_99_5", 60_000_000, 20.0)]
        cands += [MergeCandidate(f"202401_{100 + i}_{100 + i}_0",
                                 271_821 if rng.random() < 0.8 else 1_900_000, max(0.0, 10.0 - 0.1 * i))
                  for i in range(n)]
        fast, slow = _both(cands, always, MergeSelectorSettings(), None, monkeypatch)
        assert fast == slow, n
        assert fast is not None or n < 5


@pytest.mark.parametrize("max_at_once", [0, 5, 100])
@pytest.mark.parametrize("align", [True, False])
def test_equal_windows_choose_as_the_loop_over_lengths(max_at_once: int, align: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal parts: many windows score the same; the first begin, then the shortest window, wins."""
    s = dataclasses.replace(MergeSelectorSettings(), max_parts_to_merge_at_once=max_at_once,
                            align_parts=align)
    for n in (5, 20, 120):
        cands = parts("202401", [271_821] * n, age=5.0)
        fast, slow = _both(cands, always, s, None, monkeypatch)
        assert fast == slow and fast is not None, (n, fast, slow)
