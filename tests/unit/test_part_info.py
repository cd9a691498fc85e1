"""Part names: strict parsing, round trip, containment."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from replicad.errors import BadPartNameError
from replicad.model.part_info import LEGACY_MAX_LEVEL, MAX_INT64, MAX_LEVEL, MAX_UINT32, PartInfo


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("202611_0_0_0", ("202611", 0, 0, 0, 0)),
        ("all_2_2_0", ("all", 2, 2, 0, 0)),
        ("all_0_0_0_3", ("all", 0, 0, 0, 3)),
        ("202611_6_21_3", ("202611", 6, 21, 3, 0)),
        ("202610-5_0_0_999999999", ("202610-5", 0, 0, MAX_LEVEL, 0)),
        ("202611--3_1_4_2", ("202611--3", 1, 4, 2, 0)),
        ("20261122_0_1_4294967295", ("20261122", 0, 1, LEGACY_MAX_LEVEL, 0)),
        ("21818ffeee1ae033898614f81c7c3c75_1_1_0", ("21818ffeee1ae033898614f81c7c3c75", 1, 1, 0, 0)),
        (f"all_0_{MAX_INT64}_{MAX_UINT32}_{MAX_INT64}", ("all", 0, MAX_INT64, MAX_UINT32, MAX_INT64)),
        ("-7_3_3_0", ("-7", 3, 3, 0, 0)),
    ],
)
def test_parse_valid(name: str, fields: tuple[str, int, int, int, int]) -> None:
    p = PartInfo.parse(name)
    assert (p.partition_id, p.min_block, p.max_block, p.level, p.mutation) == fields
    assert p.name == str(p) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "all",
        "all_1_1",
        "all_1_1_0_",
        "all_1_1_0_1_2",
        "all_1_1_0x",
        "all_1_1_0 ",
        " all_1_1_0",
        "all_1_1_0\n",
        "all_-1_1_0",
        "all_1_-1_0",
        "all_1_1_-1",
        "all_1_1_0_-2",
        "all_+1_1_0",
        "all_01_1_0",
        "all_1_1_0_0",
        "all_2_1_0",
        f"all_0_{MAX_INT64 + 1}_0",
        f"all_0_0_{MAX_UINT32 + 1}",
        f"all_0_0_0_{MAX_INT64 + 1}",
        "_1_1_0",
        "a/b_1_1_0",
        "../x_1_1_0",
        "a.b_1_1_0",
        "a\x00_1_1_0",
        "x" * 129 + "_1_1_0",
        "all_1_1_0/..",
        "tmp_fetch_all_1_1_0",
        "all_1_1_١",  # non-ASCII digit
    ],
)
def test_parse_rejects(name: str) -> None:
    with pytest.raises(BadPartNameError, match="Unexpected part name"):
        PartInfo.parse(name)
    assert PartInfo.try_parse(name) is None


def test_old_syntax_rejected_clearly() -> None:
    for name in ("20140317_20140323_2_2_0", "20140301_20140331_1_5_1_7"):
        with pytest.raises(BadPartNameError, match="old-syntax"):
            PartInfo.parse(name)


def test_constructor_validates() -> None:
    with pytest.raises(BadPartNameError):
        PartInfo("all", 2, 1, 0)
    with pytest.raises(BadPartNameError):
        PartInfo("a_b", 1, 1, 0)
    with pytest.raises(BadPartNameError):
        PartInfo("all", 1, 1, -1)
    with pytest.raises(BadPartNameError):
        PartInfo("all", True, 1, 0)


def test_relations_and_helpers() -> None:
    p = PartInfo.parse
    assert p("all_0_5_1").contains(p("all_2_3_0"))
    assert p("all_0_5_1").contains(p("all_0_5_1"))
    assert not p("all_0_5_1").contains(p("all_2_6_0"))
    assert not p("all_0_5_0").contains(p("all_2_3_1"))
    assert not p("x_0_5_1").contains(p("all_2_3_0"))
    assert p("all_0_0_0_3").contains(p("all_0_0_0"))
    assert not p("all_0_0_0").contains(p("all_0_0_0_3"))
    # OLD vs NEW rule for equal levels with a smaller range
    assert p("all_0_5_1").contains(p("all_2_3_1"))
    assert not p("all_0_5_1").contains(p("all_2_3_1"), strict=True)
    assert p("all_0_9_999999999").contains(p("all_2_3_999999999"), strict=True)
    assert p("all_0_9_999999999").is_fake_drop_range and p("a_0_1_4294967295").is_fake_drop_range
    assert not p("all_0_9_3").is_fake_drop_range
    assert p("all_0_1_1").is_disjoint(p("all_2_2_0")) and p("a_0_1_1").is_disjoint(p("b_0_1_1"))
    assert not p("all_0_2_1").is_disjoint(p("all_2_2_0"))
    assert PartInfo.for_merge([p("202611_6_16_2"), p("202611_17_17_0")]).name == "202611_6_17_3"
    assert PartInfo.for_merge([p("all_1_1_0_5"), p("all_2_2_0")]).name == "all_1_2_1_5"
    assert PartInfo.drop_range("202610-5", 1).name == "202610-5_0_0_999999999"
    assert PartInfo.for_insert("all", 7).name == "all_7_7_0"
    assert p("all_0_0_0").with_mutation(3).name == "all_0_0_0_3"
    assert p("all_4_4_0").data_version == 4 and p("all_4_4_0_9").data_version == 9
    assert sorted([p("b_0_0_0"), p("a_1_1_0"), p("a_0_3_1"), p("a_0_3_1_2"), p("a_0_0_0")]) == [
        p("a_0_0_0"),
        p("a_0_3_1"),
        p("a_0_3_1_2"),
        p("a_1_1_0"),
        p("b_0_0_0"),
    ]
    with pytest.raises(ValueError):
        PartInfo.for_merge([p("a_0_0_0"), p("b_1_1_0")])
    with pytest.raises(ValueError):
        PartInfo.drop_range("all", 0)


PIDS = st.sampled_from(["all", "202611", "202611-5", "1795309323", "21818ffeee1ae033898614f81c7c3c75", "-3"])
BLOCK = st.integers(min_value=0, max_value=MAX_INT64)
SMALL = st.integers(min_value=0, max_value=20)


@st.composite
def part_infos(draw: st.DrawFn, small: bool = False) -> PartInfo:
    num = SMALL if small else BLOCK
    a, b = draw(num), draw(num)
    level = draw(SMALL if small else st.integers(min_value=0, max_value=MAX_UINT32))
    mutation = draw(st.one_of(st.just(0), SMALL if small else BLOCK))
    pid = draw(PIDS if not small else st.sampled_from(["a", "b"]))
    return PartInfo(pid, min(a, b), max(a, b), level, mutation)


@settings(max_examples=300, deadline=None)
@given(part_infos())
def test_roundtrip(p: PartInfo) -> None:
    assert PartInfo.parse(p.name) == p
    assert p.contains(p) and p.contains(p, strict=True)
    assert not p.is_disjoint(p)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="al0123456789_-x/.", max_size=30))
def test_parse_is_canonical_or_rejects(text: str) -> None:
    p = PartInfo.try_parse(text)
    if p is not None:
        assert p.name == text


@settings(max_examples=300, deadline=None)
@given(part_infos(small=True), part_infos(small=True), part_infos(small=True))
def test_containment_properties(a: PartInfo, b: PartInfo, c: PartInfo) -> None:
    if a.contains(b) and b.contains(c):
        assert a.contains(c)
    if a.contains(b, strict=True) and b.contains(c, strict=True):
        assert a.contains(c) and (a.contains(c, strict=True) or a.level == b.level == c.level)
    if a.contains(b, strict=True):
        assert a.contains(b)
    if a.contains(b):
        assert not a.is_disjoint(b)
        assert a.min_block <= b.min_block <= b.max_block <= a.max_block
    assert a.is_disjoint(b) == b.is_disjoint(a)
    if a.contains(b) and b.contains(a):
        assert a == b


@settings(max_examples=200, deadline=None)
@given(st.lists(part_infos(small=True), min_size=1, max_size=5))
def test_merge_covers_sources(parts: list[PartInfo]) -> None:
    assume(len({p.partition_id for p in parts}) == 1)
    merged = PartInfo.for_merge(parts)
    assert all(merged.contains(p) and merged.contains(p, strict=True) for p in parts)


def test_parse_cache_answers_the_same_and_still_refuses() -> None:
    """Names parsed before come from a bounded cache: the same value, a bad name refused every time, the
    cache emptied when full."""
    from replicad.model import part_info

    a = PartInfo.parse("202401_5_9_2_11")
    assert PartInfo.parse("202401_5_9_2_11") == a == PartInfo("202401", 5, 9, 2, 11)
    for _ in range(2):
        with pytest.raises(BadPartNameError):
            PartInfo.parse("202401_9_5_0")
    assert "202401_9_5_0" not in part_info._PARSED
    for i in range(part_info._PARSED_MAX + 5):
        assert PartInfo.parse(f"p_{i}_{i}_0").max_block == i
    assert len(part_info._PARSED) <= part_info._PARSED_MAX
