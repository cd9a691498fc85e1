"""The fault suite's checker judging hand-made histories and row sets (no processes)."""

from __future__ import annotations

from tests.chaos.checker import Verdict, _check_intersections, _check_rows
from tests.chaos.disk import covers, maximal
from tests.chaos.workload import InsertOp


def op(k: int, status: str = "acked", partition: int = 0, dedup: bool = False) -> InsertOp:
    ids = [k * 10 + j for j in range(3)]
    o = InsertOp(0, k, partition, 1, ids, f"t{k}", status=status, deduplicated=dedup)
    o.acked_by = "r1"
    return o


def rows(*ids: int, partition: int = 0) -> list[tuple[int, int, int, int]]:
    return sorted((partition, i, 0, i) for i in ids)


def test_covers_and_maximal() -> None:
    assert covers("0_1_5_1", "0_2_2_0") and not covers("0_2_2_0", "0_1_5_1")
    assert covers("0_2_2_0_9", "0_2_2_0") and not covers("0_2_2_0", "0_2_2_0_9")
    assert not covers("1_1_5_1", "0_2_2_0")
    names = ["0_1_1_0", "0_2_2_0", "0_1_2_1", "0_3_3_0", "0_3_3_0_7", "tmp_x"]
    assert maximal(names) == {"0_1_2_1", "0_3_3_0_7"}


def test_intersecting_ranges_are_reported() -> None:
    v = Verdict()
    _check_intersections(v, "r1", ["0_1_3_1", "0_1_1_0", "0_4_4_0", "1_2_5_1"])
    assert v.violations == []
    _check_intersections(v, "r1", ["0_1_3_1", "0_2_5_1"])
    assert v.kinds() == {"intersect"}


def test_rows_lost_duplicated_partial_phantom() -> None:
    ops = [op(1), op(2), op(3, "indeterminate"), op(4, partition=9)]
    v = Verdict()
    _check_rows(v, {"r1": rows(10, 11, 12, 20, 21, 22), "r2": rows(10, 11, 12, 20, 21, 22)}, ops)
    assert v.violations == []  # indeterminate absent, partition 9 dropped: fine

    v = Verdict()
    _check_rows(v, {"r1": rows(10, 11, 12, 20, 21, 22), "r2": rows(10, 11, 12)}, ops)
    assert v.kinds() == {"lost", "diverged"}

    v = Verdict()
    _check_rows(v, {"r1": rows(10, 11, 12, 12, 20, 21, 22, 30, 31, 99)}, ops)
    assert v.kinds() == {"duplicate", "partial", "phantom"}


def test_a_deduplicated_answer_needs_the_rows() -> None:
    v = Verdict()
    _check_rows(v, {"r1": rows(10, 11, 12)}, [op(1), op(2, dedup=True)])
    assert v.kinds() == {"dedup_absent"}


def test_unreadable_replica_is_reported() -> None:
    v = Verdict()
    _check_rows(v, {"r1": "HTTP 500: Checksum doesn't match"}, [op(1)])
    assert v.kinds() == {"unreadable"}
