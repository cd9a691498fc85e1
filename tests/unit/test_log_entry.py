"""Log entry texts: 18.16 golden bytes (CLICKHOUSE_FACTS §2, seen on a live 18.16 server), modern texts,
round trips and rejection of garbage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.errors import ZnodeFormatError
from replicad.model.log_entry import LogEntry, LogEntryType, ReplaceRangeEntry

T = "2026-11-22 01:16:53"
T_UNIX = 1795310213  # 2026-11-22 01:16:53 UTC
V4 = f"format version: 4\ncreate_time: {T}\n"

GOLDEN_18_16 = [
    V4 + "source replica: ch1\n"
    "block_id: 202611_9379380059107496000_15770403400277312188\nget\n202611_0_0_0\n",
    V4 + "source replica: ch1\n"
    "block_id: all_989266131286904663_2386282192846635508\nget\nall_2_2_0\nquorum: 2\n",
    V4 + "source replica: ch1\nblock_id: \nmerge\n202611_6_16_2\n"
    "202611_17_17_0\n202611_18_21_1\ninto\n202611_6_21_3\ndeduplicate: 0\n",
    V4 + "source replica: ch1\nblock_id: \nmutate\nall_0_0_0\nto\nall_0_0_0_3\n",
    V4 + "source replica: ch1\nblock_id: \ndrop\n202610-5_0_0_999999999\n",
    V4 + "source replica: ch1\nblock_id: \ndetach\n202611-5_0_0_999999999\n",
    V4 + "source replica: \nblock_id: \nclear_column\nc\nfrom\nall_0_0_999999999\n",
    V4 + "source replica: ch1\nblock_id: \nREPLACE_RANGE\n"
    "drop_range_name: 20261122_0_1_4294967295\nfrom_database: research\nfrom_table: t_pdate_src\n"
    "source_parts: ['20261122_1_1_0']\nnew_parts: ['20261122_2_2_0']\n"
    "part_checksums: ['CECD47710F1073EDAA0FABE373EE52DD']\ncolumns_version: 0\n",
]


@pytest.mark.parametrize("text", GOLDEN_18_16)
def test_golden_18_16_round_trip_byte_exact(text: str) -> None:
    entry = LogEntry.parse(text.encode())
    assert entry.create_time == T_UNIX
    assert entry.readable_by_18_16
    assert entry.to_bytes() == text.encode()


def test_golden_fields() -> None:
    get = LogEntry.parse(GOLDEN_18_16[0])
    assert get.type is LogEntryType.GET_PART
    assert get.new_part_name == "202611_0_0_0"
    assert get.source_replica == "ch1"
    assert get.block_id == "202611_9379380059107496000_15770403400277312188"
    assert get.quorum == 0
    assert LogEntry.parse(GOLDEN_18_16[1]).quorum == 2
    merge = LogEntry.parse(GOLDEN_18_16[2])
    assert merge.type is LogEntryType.MERGE_PARTS
    assert merge.source_parts == ("202611_6_16_2", "202611_17_17_0", "202611_18_21_1")
    assert merge.new_part_name == "202611_6_21_3"
    assert merge.deduplicate is False
    mutate = LogEntry.parse(GOLDEN_18_16[3])
    assert (mutate.type, mutate.source_parts, mutate.new_part_name) == (
        LogEntryType.MUTATE_PART,
        ("all_0_0_0",),
        "all_0_0_0_3",
    )
    drop, detach = LogEntry.parse(GOLDEN_18_16[4]), LogEntry.parse(GOLDEN_18_16[5])
    assert drop.type is LogEntryType.DROP_RANGE and not drop.detach
    assert detach.type is LogEntryType.DROP_RANGE and detach.detach
    clear = LogEntry.parse(GOLDEN_18_16[6])
    assert (clear.type, clear.column_name, clear.new_part_name) == (
        LogEntryType.CLEAR_COLUMN,
        "c",
        "all_0_0_999999999",
    )
    rr = LogEntry.parse(GOLDEN_18_16[7]).replace_range
    assert rr == ReplaceRangeEntry(
        "20261122_0_1_4294967295",
        "research",
        "t_pdate_src",
        ("20261122_1_1_0",),
        ("20261122_2_2_0",),
        ("CECD47710F1073EDAA0FABE373EE52DD",),
        0,
    )


def test_constructors_print_like_18_16() -> None:
    e = LogEntry.get_part(
        "202611_0_0_0",
        source_replica="ch1",
        block_id="202611_9379380059107496000_15770403400277312188",
        create_time=T_UNIX,
    )
    assert e.to_text() == GOLDEN_18_16[0]
    m = LogEntry.merge_parts(
        ["202611_6_16_2", "202611_17_17_0", "202611_18_21_1"],
        "202611_6_21_3",
        source_replica="ch1",
        create_time=T_UNIX,
    )
    assert m.to_text() == GOLDEN_18_16[2]
    assert (
        LogEntry.drop_range("202610-5_0_0_999999999", source_replica="ch1", create_time=T_UNIX).to_text()
        == (GOLDEN_18_16[4])
    )
    assert LogEntry.clear_column("c", "all_0_0_999999999", create_time=T_UNIX).to_text() == GOLDEN_18_16[6]


def test_timezone_rendering() -> None:
    e = LogEntry.get_part("all_1_1_0", source_replica="r", create_time=T_UNIX)
    text = e.to_text(tz="Europe/Moscow")
    assert "create_time: 2026-11-22 04:16:53\n" in text
    assert LogEntry.parse(text, tz="Europe/Moscow").create_time == T_UNIX
    assert LogEntry.parse(text).create_time == T_UNIX + 3 * 3600


def test_old_format_versions() -> None:
    v1 = LogEntry.parse("format version: 1\nsource replica: r1\nget\nall_1_1_0\n", ctime=123)
    assert (v1.create_time, v1.block_id, v1.new_part_name, v1.format_version) == (123, "", "all_1_1_0", 1)
    v2 = LogEntry.parse(
        f"format version: 2\ncreate_time: {T}\nsource replica: r1\nmerge\na_1_1_0\na_2_2_0\ninto\na_1_2_1\n"
    )
    assert v2.source_parts == ("a_1_1_0", "a_2_2_0") and v2.deduplicate is False
    v3 = LogEntry.parse(
        f"format version: 3\ncreate_time: {T}\nsource replica: r1\nblock_id: x\\ty\nget\nall_1_1_0\n"
    )
    assert v3.block_id == "x\ty"
    assert v3.to_text().startswith("format version: 4\n")
    assert "block_id: x\\ty\n" in v3.to_text()


MODERN = [
    # 21.x+ insert of a Compact part
    (
        V4 + "source replica: replic1\n"
        "block_id: 202201_5253379567567382390_63093905895384417\nget\n202201_0_0_0\npart_type: Compact\n"
    ),
    # merge with every optional line, uuid -> format 5, deduplicate_by_columns -> 6, log_entry_id -> 7
    (
        f"format version: 7\ncreate_time: {T}\nsource replica: r2\nblock_id: \nlog_entry_id: r2_123\nmerge\n"
        "all_1_1_0\nall_2_2_0\ninto\nall_1_2_1\ndeduplicate: 1\nmerge_type: 2\n"
        "into_uuid: 0123e456-89ab-cdef-0123-456789abcdef\ndeduplicate_by_columns: 'a','b\\'c'\ncleanup: 1\n"
        "apply_patches: 2\npatch-all_1_1_0\npatch-all_2_2_0\n"
        "part_type: Compact\nstorage_type: Packed\nquorum: 3\n"
    ),
    (
        f"format version: 5\ncreate_time: {T}\nsource replica: r2\nblock_id: \n"
        "mutate\nall_0_0_0\nto\nall_0_0_0_3\n"
        "to_uuid\n0123e456-89ab-cdef-0123-456789abcdef\nalter_version\n5\n"
    ),
    (
        V4 + "source replica: r2\nblock_id: b1,b2\nattach\nall_5_5_0\n"
        "part_checksum: CECD47710F1073EDAA0FABE373EE52DD\n"
    ),
    (
        V4 + "source replica: r2\nblock_id: \nalter\nalter_version\n3\n"
        "have_mutation\n1\ncolumns_str_size:\n15\ncolumns ä\nline\nmetadata_str_size:\n9\nmeta\ndata\n"
    ),
    V4 + "source replica: r2\nblock_id: \nsync_pinned_part_uuids\n\n",
    (
        V4 + "source replica: r2\nblock_id: \nclone_part_from_shard\nall_1_1_0\n"
        "source_shard: /clickhouse/tables/s2\n"
    ),
    V4 + "source replica: r2\nblock_id: \ndrop\nall_3_3_0\n",
    V4 + "source replica: \nblock_id: \nclear_index\nidx\nfrom\nall_0_9_999999999\n",
    (
        V4 + "source replica: ch1\nblock_id: \nREPLACE_RANGE\n"
        "drop_range_name: all_0_1_999999999\nfrom_database: db\nfrom_table: t\ncommands: DELETE WHERE 1 \n"
        "source_parts: []\nnew_parts: []\npart_checksums: []\ncolumns_version: -1\n"
    ),
]


@pytest.mark.parametrize("text", MODERN)
def test_modern_texts_parse_and_print_back(text: str) -> None:
    entry = LogEntry.parse(text)
    assert entry.readable_by_18_16 == (entry.type is LogEntryType.DROP_PART)
    assert entry.to_text() == text


def test_modern_fields() -> None:
    merge = LogEntry.parse(MODERN[1])
    assert merge.log_entry_id == "r2_123"
    assert merge.merge_type == 2
    assert merge.new_part_uuid == "0123e456-89ab-cdef-0123-456789abcdef"
    assert merge.deduplicate_by_columns == ("a", "b'c")
    assert merge.cleanup and merge.deduplicate
    assert merge.patch_parts == ("patch-all_1_1_0", "patch-all_2_2_0")
    assert (merge.part_type, merge.storage_type, merge.quorum) == ("Compact", "Packed", 3)
    assert LogEntry.parse(MODERN[0]).part_type == "Compact"
    mutate = LogEntry.parse(MODERN[2])
    assert mutate.alter_version == 5 and mutate.is_alter_mutation
    attach = LogEntry.parse(MODERN[3])
    assert attach.type is LogEntryType.ATTACH_PART and attach.block_ids == ("b1", "b2")
    alter = LogEntry.parse(MODERN[4])
    assert alter.columns_str == "columns ä\nline" and alter.metadata_str == "meta\ndata"
    assert alter.virtual_part_names() == ()
    assert LogEntry.parse(MODERN[5]).type is LogEntryType.SYNC_PINNED_PART_UUIDS
    assert LogEntry.parse(MODERN[6]).source_shard == "/clickhouse/tables/s2"
    drop_part = LogEntry.parse(MODERN[7])
    assert drop_part.type is LogEntryType.DROP_PART and drop_part.readable_by_18_16 is True
    assert LogEntry.parse(MODERN[9]).replace_range.commands == "DELETE WHERE 1 "  # type: ignore[union-attr]


def test_unknown_harmless_lines_are_kept() -> None:
    text = (
        V4 + "source replica: r\nblock_id: \nmerge\na_1_1_0\na_2_2_0\ninto\n"
        "a_1_2_1\ndeduplicate: 0\nsome_future_option: 42\npart_type: Compact\nquorum: 2\n"
    )
    e = LogEntry.parse(text)
    assert e.extra_lines == ("some_future_option: 42",)
    assert e.quorum == 2
    assert LogEntry.parse(e.to_text()) == e


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "format version: 9\ncreate_time: 2026-11-22 01:16:53\nsource replica: r\nblock_id: \nget\na_1_1_0\n",
        "format version: 0\nsource replica: r\nget\na_1_1_0\n",
        "format version: 4\ncreate_time: yesterday\nsource replica: r\nblock_id: \nget\na_1_1_0\n",
        V4 + "source replica: r\nblock_id: \nfrobnicate\na_1_1_0\n",
        V4 + "source replica: r\nblock_id: \nget\na_1_1_0",
        V4 + "source replica: r\nblock_id: \nget\na_1_1_0\n!!garbage!!\n",
        V4 + "source replica: r\nblock_id: \nget\na_1_1_0\nquorum: x\n",
        V4 + "source replica: r\nblock_id: \nget\na_1_1_0\nquorum: 2\nmore\n",
        V4 + "source replica: r\nblock_id: \nmerge\na_1_1_0\n",
        V4 + "source replica: r\nblock_id: \ndrop\nnot-a-part\n",
        V4 + "source replica: r\nblock_id: \nalter\nalter_version\n1\n"
        "have_mutation\n0\ncolumns_str_size:\n99\nshort\n",
        V4 + "source replica: r\nblock_id: bad\\",
    ],
)
def test_garbage_is_rejected(text: str) -> None:
    with pytest.raises(ZnodeFormatError, match=r"Cannot parse|Unexpected part name"):
        LogEntry.parse(text)


def test_raw_fields_with_newlines_cannot_be_written() -> None:
    with pytest.raises(ZnodeFormatError):
        LogEntry.get_part("all_1_1_0\n", source_replica="r", create_time=1).to_text()


def test_virtual_and_blocking_parts() -> None:
    rr = LogEntry.parse(GOLDEN_18_16[7])
    assert rr.virtual_part_names() == ("20261122_2_2_0", "20261122_0_1_4294967295")
    assert rr.drop_range_name == "20261122_0_1_4294967295"
    clear = LogEntry.parse(GOLDEN_18_16[6])
    assert clear.virtual_part_names() == () and clear.blocking_part_names() == ("all_0_0_999999999",)
    assert LogEntry.parse(GOLDEN_18_16[2]).virtual_part_names() == ("202611_6_21_3",)


# -- property tests ------------------------------------------------------------------------------------------

_pid = st.sampled_from(["all", "202611", "20261122", "202611-5", "21818ffeee1ae033898614f81c7c3c75"])
_num = st.integers(min_value=0, max_value=2**40)


@st.composite
def part_names(draw: st.DrawFn) -> str:
    a, b = sorted((draw(_num), draw(_num)))
    level = draw(st.integers(0, 1000))
    mutation = draw(st.sampled_from([0, 0, 3, 2**33]))
    return f"{draw(_pid)}_{a}_{b}_{level}" + (f"_{mutation}" if mutation else "")


@st.composite
def range_names(draw: st.DrawFn) -> str:
    return f"{draw(_pid)}_0_{draw(_num)}_{draw(st.sampled_from([999999999, 4294967295]))}"


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_raw = _text.filter(lambda s: "\n" not in s and "\t" not in s)
_time = st.integers(min_value=1, max_value=4_000_000_000)


@st.composite
def entries_18_16(draw: st.DrawFn) -> LogEntry:
    kind = draw(st.sampled_from(["get", "merge", "mutate", "drop", "clear", "replace"]))
    common = {"source_replica": draw(_raw), "create_time": draw(_time)}
    if kind == "get":
        return LogEntry(
            LogEntryType.GET_PART,
            new_part_name=draw(part_names()),
            block_id=draw(_text),
            quorum=draw(st.sampled_from([0, 0, 2, 3])),
            **common,  # type: ignore[arg-type]
        )
    if kind == "merge":
        return LogEntry(
            LogEntryType.MERGE_PARTS,
            new_part_name=draw(part_names()),
            source_parts=tuple(draw(st.lists(part_names(), min_size=1, max_size=5))),
            deduplicate=draw(st.booleans()),
            **common,  # type: ignore[arg-type]
        )
    if kind == "mutate":
        return LogEntry(
            LogEntryType.MUTATE_PART,
            new_part_name=draw(part_names()),
            source_parts=(draw(part_names()),),
            **common,  # type: ignore[arg-type]
        )
    if kind == "drop":
        return LogEntry(
            LogEntryType.DROP_RANGE,
            new_part_name=draw(range_names()),
            detach=draw(st.booleans()),
            **common,  # type: ignore[arg-type]
        )
    if kind == "clear":
        return LogEntry(
            LogEntryType.CLEAR_COLUMN,
            new_part_name=draw(range_names()),
            column_name=draw(_text),
            **common,  # type: ignore[arg-type]
        )
    rr = ReplaceRangeEntry(
        draw(range_names()),
        draw(_text),
        draw(_text),
        tuple(draw(st.lists(part_names(), max_size=3))),
        tuple(draw(st.lists(part_names(), max_size=3))),
        tuple(draw(st.lists(st.text("0123456789ABCDEF", min_size=32, max_size=32), max_size=3))),
        draw(st.integers(-5, 10**6)),
    )
    return LogEntry(LogEntryType.REPLACE_RANGE, replace_range=rr, **common)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(entries_18_16(), st.sampled_from(["UTC", "Europe/Moscow", "America/New_York"]))
def test_round_trip_18_16_types(entry: LogEntry, tz: str) -> None:
    text = entry.to_bytes(tz)
    assert text.startswith(b"format version: 4\n")
    assert entry.readable_by_18_16
    parsed = LogEntry.parse(text, tz=tz)
    # Local times in a DST fold are ambiguous in text, exactly as in ClickHouse.
    if tz == "UTC":
        assert parsed == entry
    else:
        assert parsed.to_bytes(tz) == text


@settings(max_examples=200, deadline=None)
@given(
    entries_18_16(),
    st.sampled_from(["", "Compact"]),
    st.sampled_from(["", "0123e456-89ab-cdef-0123-456789abcdef"]),
    st.lists(st.text("abc_'\\", min_size=1, max_size=4), max_size=3),
    st.sampled_from(["", "some-id"]),
)
def test_round_trip_modern_fields(
    entry: LogEntry, part_type: str, uuid: str, cols: list[str], log_id: str
) -> None:
    from dataclasses import replace

    extra: dict[str, object] = {"part_type": part_type or "Wide", "log_entry_id": log_id}
    if entry.type is LogEntryType.MERGE_PARTS:
        extra.update(new_part_uuid=uuid, deduplicate_by_columns=tuple(cols))
    if entry.type is LogEntryType.MUTATE_PART:
        extra.update(new_part_uuid=uuid)
    modern = replace(entry, **extra)  # type: ignore[arg-type]
    assert LogEntry.parse(modern.to_bytes()) == modern


def test_with_znode_is_replace() -> None:
    """with_znode (no constructor call) gives what dataclasses.replace gives, and leaves the entry alone."""
    import dataclasses

    e = LogEntry.get_part("202401_3_3_0", source_replica="r1", create_time=1_700_000_000,
                          block_id="202401_1_2")
    moved = e.with_znode("queue-0000000042")
    assert moved == dataclasses.replace(e, znode_name="queue-0000000042")
    assert moved.znode_name == "queue-0000000042" and e.znode_name != moved.znode_name
    assert dataclasses.fields(moved) == dataclasses.fields(e) and type(moved) is type(e)
