"""mutations/NNNNNNNNNN texts: golden znodes written by a real 18.16 server
(tests/fixtures/ch18_metadata.json), the modern ``alter version`` suffix, round trips and garbage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import ZnodeFormatError
from replicad.model.mutation_entry import MutationEntry, format_commands

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ch18_metadata.json"


def _golden_znodes() -> list[tuple[str, str]]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    return [(m["alter"], m["znode"]) for c in cases for m in c.get("mutations") or []]


GOLDEN = _golden_znodes()


def test_fixture_has_mutations() -> None:
    assert len(GOLDEN) >= 3


@pytest.mark.parametrize(("alter", "znode"), GOLDEN, ids=[a[:40] for a, _ in GOLDEN])
def test_18_16_golden_round_trip(alter: str, znode: str) -> None:
    entry = MutationEntry.parse(znode.encode(), znode_name="0000000001")
    assert entry.alter_version is None
    assert entry.commands.endswith(" ")
    assert entry.to_text() == znode  # the fixture server ran with timezone UTC


def test_golden_fields() -> None:
    entry = MutationEntry.parse(GOLDEN[1][1], znode_name="0000000002")
    assert entry.source_replica == "r1"
    assert entry.block_numbers_map == {"202610": 2, "202611": 2}
    assert entry.commands == "UPDATE name = 'x' WHERE id = 1 "
    assert entry.version == 2
    assert entry.block_number_for("202611") == 2 and entry.block_number_for("nope") is None


def test_create_matches_18_16_layout() -> None:
    golden = MutationEntry.parse(GOLDEN[0][1].encode(), znode_name="0000000001")
    e = MutationEntry.create(
        source_replica="r1",
        block_numbers={"202611": 1, "202610": 1},
        commands=["DELETE WHERE id = 2"],
        create_time=golden.create_time,  # the fixture is regenerated from time to time
    )
    assert e.to_text() == GOLDEN[0][1]
    assert (
        format_commands(["DELETE WHERE a = 1", "UPDATE b = 2 WHERE 1"])
        == "DELETE WHERE a = 1, UPDATE b = 2 WHERE 1 "
    )


def test_modern_alter_version_suffix() -> None:
    text = GOLDEN[0][1] + "\nalter version: -1"
    e = MutationEntry.parse(text)
    assert e.alter_version == -1
    assert e.to_text() == text
    assert MutationEntry.parse(GOLDEN[0][1] + "\nalter version: 7").alter_version == 7


@pytest.mark.parametrize(
    "text",
    [
        "",
        "format version: 2\n",
        "format version: 1\ncreate time: 2026-11-22 02:20:41\nsource replica: r1\nblock numbers count: 2\n"
        "202610\t1\ncommands: DELETE WHERE 1 ",
        "format version: 1\ncreate time: 2026-11-22 02:20:41\nsource replica: r1\nblock numbers count: 0\n"
        "commands: DELETE WHERE 1 \nextra",
        "format version: 1\ncreate time: 2026-11-22 02:20:41\nsource replica: r1\nblock numbers count: 0\n"
        "commands: ",
        "format version: 1\ncreate time: 2026-11-22\nsource replica: r1\nblock numbers count: 0\n"
        "commands: X ",
    ],
)
def test_garbage_rejected(text: str) -> None:
    with pytest.raises(ZnodeFormatError):
        MutationEntry.parse(text)


_raw = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\t\n"), max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    _raw,
    st.dictionaries(st.from_regex(r"[0-9a-f\-]{1,12}", fullmatch=True), st.integers(-5, 2**62), max_size=5),
    st.lists(
        st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30).filter(str.strip),
        min_size=1,
        max_size=3,
    ),
    st.integers(1, 4_000_000_000),
    st.none() | st.integers(-1, 10**6),
)
def test_round_trip(
    replica: str, numbers: dict[str, int], commands: list[str], create_time: int, alter_version: int | None
) -> None:
    e = MutationEntry(replica, tuple(numbers.items()), format_commands(commands), create_time, alter_version)
    assert MutationEntry.parse(e.to_bytes()) == e
