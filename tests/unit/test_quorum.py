"""quorum/status, quorum/parallel/<part> and quorum/last_part texts (CLICKHOUSE_FACTS §3.2, seen live on
18.16)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import ZnodeFormatError
from replicad.model.quorum import QuorumEntry, QuorumLastPart

STATUS_18_16 = (
    "version: 1\npart_name: all_4_4_0\nrequired_number_of_replicas: 2\nactual_number_of_replicas: 1\n"
    "replicas:\nch1\n"
)
LAST_PART_18_16 = "version: 2\nparts count: 1\nall\tall_4_4_0\n"


def test_status_golden() -> None:
    q = QuorumEntry.parse(STATUS_18_16.encode())
    assert q == QuorumEntry("all_4_4_0", 2, ("ch1",))
    assert not q.is_reached
    assert q.to_text() == STATUS_18_16
    reached = q.with_replica("ch2")
    assert reached.is_reached and reached.replicas == ("ch1", "ch2")
    assert reached.with_replica("ch1") == reached
    assert QuorumEntry("all_4_4_0", 2, ("ch1",)).to_bytes() == STATUS_18_16.encode()


def test_status_replicas_sorted_and_escaped() -> None:
    q = QuorumEntry("p_1_1_0", 3, ("zz", "a\tb", "m"))
    text = q.to_text()
    assert text.endswith("replicas:\na\\tb\nm\nzz\n")
    assert QuorumEntry.parse(text) == q


def test_last_part_golden_and_versions() -> None:
    lp = QuorumLastPart.parse(LAST_PART_18_16)
    assert lp.parts == {"all": "all_4_4_0"}
    assert lp.to_text() == LAST_PART_18_16
    assert lp.max_inserted_blocks() == {"all": 4}
    assert QuorumLastPart.parse(b"") == QuorumLastPart()
    assert QuorumLastPart.parse("202611_3_3_0").parts == {"202611": "202611_3_3_0"}
    assert QuorumLastPart.parse("20261122_20261122_3_3_0", data_format_version=0).parts == {
        "202611": "20261122_20261122_3_3_0"
    }
    assert QuorumLastPart.parse("version: 3\nwhatever").parts == {}
    both = lp.with_part("202611", "202611_5_5_0").with_part("all", "all_6_6_0")
    assert both.to_text() == "version: 2\nparts count: 2\n202611\t202611_5_5_0\nall\tall_6_6_0\n"
    assert QuorumLastPart.parse(both.to_text()) == both
    assert both.max_inserted_blocks() == {"202611": 5, "all": 6}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "version: 2\npart_name: x\n",
        "version: 1\npart_name: all_1_1_0\nrequired_number_of_replicas: 2\nactual_number_of_replicas: 2\n"
        "replicas:\nr1\n",
        "version: 1\npart_name: all_1_1_0\nrequired_number_of_replicas: -2\nactual_number_of_replicas: 0\n"
        "replicas:\n",
    ],
)
def test_status_garbage(text: str) -> None:
    with pytest.raises(ZnodeFormatError):
        QuorumEntry.parse(text)


def test_last_part_garbage() -> None:
    with pytest.raises(ZnodeFormatError):
        QuorumLastPart.parse("version: 2\nparts count: 2\nall\tall_1_1_0\n")
    with pytest.raises(ZnodeFormatError):
        QuorumLastPart.parse("nounderscore")


_name = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[a-z0-9]{1,6}_[0-9]{1,4}_[0-9]{1,4}_[0-9]{1,2}", fullmatch=True),
    st.integers(1, 10),
    st.lists(_name, max_size=6),
)
def test_status_round_trip(part: str, required: int, replicas: list[str]) -> None:
    q = QuorumEntry(part, required, tuple(replicas))
    assert QuorumEntry.parse(q.to_bytes()) == q


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z0-9\-]{1,8}", fullmatch=True), st.integers(0, 2**40), max_size=6))
def test_last_part_round_trip(parts: dict[str, int]) -> None:
    lp = QuorumLastPart.from_mapping({pid: f"{pid}_{n}_{n}_0" for pid, n in parts.items()})
    assert QuorumLastPart.parse(lp.to_bytes()) == lp
    assert lp.max_inserted_blocks() == parts
