"""Which parts the leader should merge next: a size-aware selector in the spirit of ClickHouse's
SimpleMergeSelector, plus OPTIMIZE … FINAL's "everything in the partition".

Inputs are the active parts (name, bytes on disk, age) and a predicate ``can_merge(left, right)`` telling
whether two *neighbouring* parts of a partition may end up in one merge (the caller checks that no block
number between them is still held by an in-flight insert, that both have the same mutation version and that
the queue has not already assigned them — see ``QueueState.merge_blocker``).  Parts are split into ranges of
mergeable neighbours; a merge never crosses a range boundary, hence never a partition.

Within a range every window of 2..max_parts_to_merge_at_once consecutive parts is a candidate.  A window is
*allowed* when its parts are balanced enough: ``(sum + n*fixed_cost) / (max + fixed_cost) >= base`` where
``base`` (5) is lowered towards 2 as the parts get older and as the range gets longer (so merging gets more
eager when parts pile up).  Among allowed windows the lowest ``(sum + n*fixed_cost) / (n - 1.9)`` wins: cheap
merges that remove many parts.  Windows are scored for all lengths at once with numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from replicad.model.part_info import PartInfo

GiB = 1 << 30
MiB = 1 << 20

CanMerge = Callable[[PartInfo, PartInfo], bool]
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class MergeSelectorSettings:
    """MergeTree settings (ClickHouse names and defaults) and the selector's own tuning constants."""

    max_bytes_to_merge_at_max_space_in_pool: int = 150 * GiB
    max_parts_to_merge_at_once: int = 100
    base: float = 5.0
    min_size_to_lower_base: int = 1 * MiB
    max_size_to_lower_base: int = 100 * GiB
    min_age_to_lower_base_at_min_size: float = 10.0
    min_age_to_lower_base_at_max_size: float = 10.0
    max_age_to_lower_base_at_min_size: float = 3600.0
    max_age_to_lower_base_at_max_size: float = 30 * 86400.0
    min_parts_to_lower_base: int = 10
    max_parts_to_lower_base: int = 50
    size_fixed_cost_to_add: int = 5 * MiB
    #: Prefer a window whose total is close to the size of the part just left of it.
    align_parts: bool = True
    align_min_ratio_of_sum_to_prev: float = 0.9
    align_max_log2_difference: float = 0.5
    align_max_score_adjustment: float = 0.75
    #: Drop tiny parts (< ratio * window total) from the right end of the chosen window.
    trim_small_parts_at_right_ratio: float = 0.01
    #: Only windows starting among the first N parts of a range are considered (bounds the work).
    max_window_starts: int = 1000


@dataclass(frozen=True)
class MergeCandidate:
    name: str
    size_bytes: int
    #: Seconds since the part was written.
    age_s: float
    #: the name already parsed (a part the store holds), else parsed from ``name`` when first needed
    parsed: PartInfo | None = field(default=None, compare=False, repr=False)

    @functools.cached_property
    def info(self) -> PartInfo:  # parsed once per candidate (ranges, the choice, the mutation scan)
        return self.parsed if self.parsed is not None else PartInfo.parse(self.name)


@dataclass(frozen=True)
class MergeChoice:
    parts: tuple[str, ...]
    new_part_name: str
    total_bytes: int


@dataclass(frozen=True)
class NoMerge:
    reason: str


def split_into_ranges(parts: Iterable[MergeCandidate], can_merge: CanMerge) -> list[list[MergeCandidate]]:
    """Parts grouped by partition, sorted, and cut wherever two neighbours may not be merged together."""
    decorated = sorted(((p.info, p) for p in parts), key=lambda ip: ip[0])
    ranges: list[list[MergeCandidate]] = []
    prev: PartInfo | None = None
    for info, part in decorated:
        if prev is None or prev.partition_id != info.partition_id or not can_merge(prev, info):
            ranges.append([])
        ranges[-1].append(part)
        prev = info
    return ranges


def _unit(value: Floats, lo: Floats | float, hi: Floats | float) -> Floats:
    """Piecewise-linear map: 0 at or below ``lo``, 1 at or above ``hi``, linear in between."""
    if isinstance(lo, float) and isinstance(hi, float):  # the same float64 arithmetic, no broadcast arrays
        span_s = hi - lo
        mid_s: Floats | float = (value - lo) / span_s if span_s > 0 else 1.0
        return np.where(value <= lo, 0.0, np.where(value >= hi, 1.0, mid_s))
    lo_a = lo if _same_shape(lo, value) else np.broadcast_to(np.asarray(lo, dtype=np.float64), value.shape)
    hi_a = hi if _same_shape(hi, value) else np.broadcast_to(np.asarray(hi, dtype=np.float64), value.shape)
    span = hi_a - lo_a
    with np.errstate(divide="ignore", invalid="ignore"):
        mid = np.where(span > 0, (value - lo_a) / np.where(span > 0, span, 1.0), 1.0)
    return np.where(value <= lo_a, 0.0, np.where(value >= hi_a, 1.0, mid))


def _same_shape(x: Floats | float, value: Floats) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == value.shape


def _lerp(a: float, b: float, t: Floats) -> Floats:
    return a + (b - a) * t


@dataclass
class _Best:
    score: float = math.inf
    range_index: int = -1
    begin: int = 0
    length: int = 0
    total: float = 0.0


def _scan_range(
    sizes: Floats, ages: Floats, range_index: int, max_total: float, s: MergeSelectorSettings, best: _Best
) -> None:
    """Every window of the range scored at once: rows are the window lengths (2..max), columns the first
    part.  One numpy call per step for the whole range (a loop over the lengths made ~25 calls per length:
    ~10 ms a round for 100 parts, ~10 % of the leader's GIL time under a stream of inserts); the same
    float64 operations per window, so the same choice (tests/unit/test_merge_selector.py holds the loop)."""
    n = len(sizes)
    max_len = n if s.max_parts_to_merge_at_once <= 0 else min(n, s.max_parts_to_merge_at_once)
    if n < 2 or max_len < 2:
        return
    starts = min(n, s.max_window_starts + 1)
    cols = min(n - 1, starts)  # first parts of windows of two parts or more
    lengths = np.arange(2, max_len + 1)
    begins = np.arange(cols)
    ends = begins[None, :] + lengths[:, None]  # (lengths, begins): window [b, b + length)
    valid = ends <= n
    cum = np.concatenate(([0.0], np.cumsum(sizes)))
    total = cum[np.minimum(ends, n)] - cum[begins][None, :]
    pad = max_len - 1
    windows = np.lib.stride_tricks.sliding_window_view
    size_rows = windows(np.concatenate((sizes, np.full(pad, -np.inf))), max_len)[:cols]
    age_rows = windows(np.concatenate((ages, np.full(pad, np.inf))), max_len)[:cols]
    wmax = np.ascontiguousarray(np.maximum.accumulate(size_rows, axis=1)[:, 1:].T)
    wage = np.ascontiguousarray(np.minimum.accumulate(age_rows, axis=1)[:, 1:].T)
    fixed = float(s.size_fixed_cost_to_add)
    length_f = lengths[:, None].astype(np.float64)
    parts_norm = float(_unit(np.array([float(n)]), float(s.min_parts_to_lower_base),
                             float(s.max_parts_to_lower_base))[0])
    log_min, log_max = math.log1p(s.min_size_to_lower_base), math.log1p(s.max_size_to_lower_base)
    size_norm = _unit(np.log1p(total), log_min, log_max)
    min_age_lo = _lerp(s.min_age_to_lower_base_at_min_size, s.min_age_to_lower_base_at_max_size, size_norm)
    max_age_lo = _lerp(s.max_age_to_lower_base_at_min_size, s.max_age_to_lower_base_at_max_size, size_norm)
    age_norm = _unit(wage, min_age_lo, max_age_lo)
    lowered_base = _lerp(s.base, 2.0, np.minimum(1.0, age_norm + parts_norm))
    allowed = valid & ((total + length_f * fixed) / (wmax + fixed) >= lowered_base)
    if max_total > 0:
        allowed &= total <= max_total
    if not allowed.any():
        return
    score = (total + fixed * length_f) / (length_f - 1.9)
    if s.align_parts:
        prev = np.concatenate(([0.0], sizes[: cols - 1]))[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            diff = np.abs(np.log2(np.where(prev > 0, total / np.where(prev > 0, prev, 1.0), 1.0)))
        use = (prev > total * s.align_min_ratio_of_sum_to_prev) & (diff < s.align_max_log2_difference)
        factor = _lerp(s.align_max_score_adjustment, 1.0, diff / s.align_max_log2_difference)
        score = np.where(use, score * factor, score)
    score = np.where(allowed, score, np.inf)
    cand = float(score.min())
    ties = np.argwhere(score == cand)  # (length row, begin) pairs
    b = int(ties[:, 1].min())  # the smallest begin, then the shortest window (the loop's order)
    length = int(lengths[int(ties[ties[:, 1] == b, 0].min())])
    better = cand < best.score or (
        cand == best.score and (range_index, b, length) < (best.range_index, best.begin, best.length)
    )
    if better:
        best.score, best.range_index, best.begin, best.length = cand, range_index, b, length
        best.total = float(total[length - 2, b])


def select_merge(
    parts: Iterable[MergeCandidate],
    can_merge: CanMerge,
    settings: MergeSelectorSettings | None = None,
    max_total_size: int | None = None,
) -> MergeChoice | None:
    """The best merge among ``parts`` (any partitions), or None when nothing is worth merging yet.
    ``max_total_size`` (default: max_bytes_to_merge_at_max_space_in_pool) reflects free pool capacity."""
    s = settings or MergeSelectorSettings()
    limit = float(s.max_bytes_to_merge_at_max_space_in_pool if max_total_size is None else max_total_size)
    ranges = split_into_ranges(parts, can_merge)
    best = _Best()
    for i, rng in enumerate(ranges):
        sizes = np.fromiter((p.size_bytes for p in rng), dtype=np.float64, count=len(rng))
        ages = np.fromiter((p.age_s for p in rng), dtype=np.float64, count=len(rng))
        _scan_range(sizes, ages, i, limit, s, best)
    if best.range_index < 0:
        return None
    window = ranges[best.range_index][best.begin : best.begin + best.length]
    while len(window) >= 3 and window[-1].size_bytes < s.trim_small_parts_at_right_ratio * best.total:
        window = window[:-1]
    return _choice(window)


def select_all_in_partition(
    parts: Iterable[MergeCandidate],
    partition_id: str,
    can_merge: CanMerge,
    *,
    final: bool = True,
    max_total_size: int | None = None,
) -> MergeChoice | NoMerge:
    """OPTIMIZE [PARTITION p] [FINAL]: all parts of the partition in one merge.  With ``final`` a lone part
    is merged again (rewritten one level up); without it a lone part is left alone."""
    mine = sorted((p for p in parts if p.info.partition_id == partition_id), key=lambda p: p.info)
    if not mine:
        return NoMerge(f"There are no parts inside partition {partition_id}")
    if len(mine) == 1 and not final:
        return NoMerge("There is only one part inside partition")
    for left, right in pairwise(mine):
        if not can_merge(left.info, right.info):
            return NoMerge(f"Parts {left.name} and {right.name} cannot be merged (yet)")
    total = sum(p.size_bytes for p in mine)
    if max_total_size is not None and total > max_total_size:
        return NoMerge(
            f"Total size of parts ({total} bytes) is greater than the available space ({max_total_size})"
        )
    return _choice(mine)


def _choice(window: Sequence[MergeCandidate]) -> MergeChoice:
    infos = [p.info for p in window]
    return MergeChoice(
        parts=tuple(p.name for p in window),
        new_part_name=PartInfo.for_merge(infos).name,
        total_bytes=sum(p.size_bytes for p in window),
    )
