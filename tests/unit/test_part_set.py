"""ActivePartSet: ClickHouse's ActiveDataPartSet semantics under the 18.16 and modern containment rules."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.model.part_info import PartInfo
from replicad.model.part_set import ActivePartSet, AddOutcome


def test_add_replaces_covered_parts() -> None:
    s = ActivePartSet(["all_1_1_0", "all_2_2_0", "all_3_3_0", "all_5_5_0", "x_1_1_0"])
    res = s.add("all_1_3_1")
    assert res.outcome is AddOutcome.ADDED
    assert res.replaced == ("all_1_1_0", "all_2_2_0", "all_3_3_0")
    assert s.parts() == ["all_1_3_1", "all_5_5_0", "x_1_1_0"]
    assert len(s) == 3


def test_covered_part_is_not_added() -> None:
    s = ActivePartSet(["all_1_3_1"])
    res = s.add("all_2_2_0")
    assert (res.outcome, res.conflict) == (AddOutcome.COVERED, "all_1_3_1")
    assert s.add("all_1_3_1").outcome is AddOutcome.COVERED
    assert s.parts() == ["all_1_3_1"]


def test_intersecting_part_is_refused() -> None:
    s = ActivePartSet(["all_1_3_1", "all_4_4_0"])
    res = s.add("all_3_4_1")
    assert (res.outcome, res.conflict) == (AddOutcome.INTERSECTS, "all_1_3_1")
    res = s.add("all_2_5_1")  # covers all_4_4_0 but cuts all_1_3_1
    assert res.outcome is AddOutcome.INTERSECTS
    assert s.parts() == ["all_1_3_1", "all_4_4_0"]


def test_mutations_and_drop_ranges() -> None:
    s = ActivePartSet(["all_0_0_0", "all_1_1_0", "all_2_2_0"])
    assert s.add("all_0_0_0_3").replaced == ("all_0_0_0",)
    assert s.get_containing_part("all_0_0_0") == "all_0_0_0_3"
    assert s.get_containing_part("all_0_0_0_4") is None  # a newer mutation is not contained
    assert s.get_parts_covered_by(PartInfo.drop_range("all", 2)) == ["all_1_1_0"]  # mutation 0 < 3
    drop = PartInfo.drop_range("all", 2, mutation=3)  # all_0_1_999999999_3
    assert s.get_parts_covered_by(drop) == ["all_0_0_0_3", "all_1_1_0"]
    assert s.remove_covered_by(drop) == ["all_0_0_0_3", "all_1_1_0"]
    assert s.parts() == ["all_2_2_0"]


def test_old_and_new_contains_rules() -> None:
    # all_0_5_2 vs all_0_4_2: 18.16 says "contains", modern does not (equal level, different range).
    old = ActivePartSet(["all_0_4_2"])
    assert old.add("all_0_5_2").replaced == ("all_0_4_2",)
    new = ActivePartSet(["all_0_4_2"], new_contains=True)
    assert new.add("all_0_5_2").outcome is AddOutcome.INTERSECTS
    assert new.add("all_0_5_3").replaced == ("all_0_4_2",)
    # fake drop-range levels contain anything in range under both rules
    assert new.add("all_0_9_999999999").replaced == ("all_0_5_3",)


def test_queries() -> None:
    s = ActivePartSet(["b_1_1_0", "a_5_9_1", "a_1_4_1", "a_10_10_0"])
    assert s.parts() == ["a_1_4_1", "a_5_9_1", "a_10_10_0", "b_1_1_0"]
    assert s.parts_in_partition("a") == ["a_1_4_1", "a_5_9_1", "a_10_10_0"]
    assert s.partition_ids() == ["a", "b"]
    assert s.get_overlapping_parts("a_4_5_2") == ["a_1_4_1", "a_5_9_1"]
    assert s.get_parts_covered_by("a_6_6_0") == []  # inside a_5_9_1
    assert s.get_parts_covered_by("a_0_20_5") == ["a_1_4_1", "a_5_9_1", "a_10_10_0"]
    assert "a_5_9_1" in s and "a_5_9_0" not in s and 42 not in s
    assert s.remove("a_5_9_1") and not s.remove("a_5_9_1")
    assert s.get_containing_part("a_6_6_0") is None
    assert list(s) == ["a_1_4_1", "a_10_10_0", "b_1_1_0"]
    assert not s.remove("zzz_1_1_0")


@st.composite
def part_infos(draw: st.DrawFn) -> PartInfo:
    lo = draw(st.integers(0, 30))
    hi = draw(st.integers(lo, min(lo + 10, 40)))
    level = draw(st.integers(0, 4)) if lo != hi else draw(st.integers(0, 2))
    return PartInfo(draw(st.sampled_from(["a", "b"])), lo, hi, level, draw(st.sampled_from([0, 0, 0, 7])))


@settings(max_examples=300, deadline=None)
@given(st.lists(part_infos(), max_size=40), st.booleans())
def test_invariants_against_brute_force(infos: list[PartInfo], new_rules: bool) -> None:
    s = ActivePartSet(new_contains=new_rules)
    model: list[PartInfo] = []
    for info in infos:
        res = s.add(info)
        covering = [m for m in model if m.contains(info, strict=new_rules)]
        if covering:
            assert res.outcome is AddOutcome.COVERED and res.conflict == covering[0].name
            continue
        clashing = [m for m in model if not m.is_disjoint(info) and not info.contains(m, strict=new_rules)]
        if clashing:
            assert res.outcome is AddOutcome.INTERSECTS
            continue
        replaced = [m for m in model if info.contains(m, strict=new_rules)]
        assert res.outcome is AddOutcome.ADDED
        assert sorted(res.replaced) == sorted(m.name for m in replaced)
        model = [m for m in model if m not in replaced] + [info]
        # the set stays pairwise disjoint and sorted
        assert s.infos() == sorted(model)
        for probe in infos:
            expect = [m.name for m in model if m.contains(probe, strict=new_rules)]
            assert s.get_containing_part(probe) == (expect[0] if expect else None)
    assert len(s) == len(model)


@pytest.mark.parametrize("bad", ["", "all", "all_2_1_0", "20261122_20261122_1_1_0"])
def test_bad_names(bad: str) -> None:
    from replicad.errors import BadPartNameError

    with pytest.raises(BadPartNameError):
        ActivePartSet().add(bad)
