"""Replication znodes written by two real ClickHouse 18.16 replicas (tests/fixtures/ch18_replication.json,
made by tests/fixtures/gen_ch18_replication.py) read and printed back byte-exactly by the model codecs;
block ids recomputed from the inserted parts' checksums.txt; the queue core replaying the whole log ends
with exactly the parts the 18.16 replicas ended with.  The fixture also records that 18.16 executed a
MERGE_PARTS and a DROP_RANGE entry printed by ``LogEntry.to_text``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replicad.model.address import ActiveMarker, ReplicaAddress
from replicad.model.block_id import block_id_from_checksums
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.mutation_entry import MutationEntry
from replicad.model.queue_state import QueueState
from replicad.model.quorum import QuorumEntry, QuorumLastPart
from replicad.storage.checksums import Checksums

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ch18_replication.json"
DATA: dict[str, Any] = json.loads(FIXTURE.read_text())
LOG: dict[str, str] = DATA["log"]


@pytest.mark.parametrize("znode", sorted(LOG))
def test_log_entries_round_trip(znode: str) -> None:
    text = LOG[znode]
    entry = LogEntry.parse(text.encode(), tz=DATA["timezone"], znode_name=znode)
    assert entry.readable_by_18_16
    assert entry.to_text(tz=DATA["timezone"]) == text


def test_log_entry_types() -> None:
    types = [LogEntry.parse(t).type for _, t in sorted(LOG.items())]
    for expected in (
        LogEntryType.GET_PART,
        LogEntryType.MERGE_PARTS,
        LogEntryType.MUTATE_PART,
        LogEntryType.CLEAR_COLUMN,
        LogEntryType.REPLACE_RANGE,
        LogEntryType.DROP_RANGE,
    ):
        assert expected in types
    quorum = [e for e in (LogEntry.parse(t) for t in LOG.values()) if e.quorum]
    assert len(quorum) == 1 and quorum[0].quorum == 2
    assert any(LogEntry.parse(t).detach for t in LOG.values())


@pytest.mark.parametrize("block", DATA["blocks"], ids=[b["part"] for b in DATA["blocks"]])
def test_block_ids_from_checksums(block: dict[str, str]) -> None:
    checksums = Checksums.parse(bytes.fromhex(block["checksums_txt"]))
    files = [
        (n, c.uncompressed_size, c.uncompressed_hash) for n, c in checksums.files.items() if c.is_compressed
    ]
    partition_id = block["part"].split("_")[0]
    assert block_id_from_checksums(partition_id, files) == block["block_id"]


def test_mutation_znodes() -> None:
    for znode, text in DATA["mutations"].items():
        entry = MutationEntry.parse(text, znode_name=znode)
        assert entry.to_text() == text


def test_quorum_znodes() -> None:
    status = QuorumEntry.parse(DATA["quorum_status"])
    assert status.to_text() == DATA["quorum_status"]
    assert (status.required_number_of_replicas, status.replicas, status.is_reached) == (2, ("r1",), False)
    last = QuorumLastPart.parse(DATA["quorum_last_part"])
    assert last.to_text() == DATA["quorum_last_part"]
    assert last.parts == {status.part_name.split("_")[0]: status.part_name}


def test_host_and_is_active() -> None:
    for text in DATA["host"].values():
        address = ReplicaAddress.parse(text)
        assert address.to_text() == text
        assert (address.database, address.table, address.scheme) == ("g", "t", "http")
    for text in DATA["is_active"].values():
        marker = ActiveMarker.parse(text)
        assert marker.pid is not None and marker.to_text() == text


def test_replicad_entries_were_executed_by_18_16() -> None:
    result = DATA["replicad_entries_result"]
    merge = LogEntry.parse(DATA["replicad_entries"]["merge"])
    assert merge.new_part_name == result["merged_part"]
    for replica in ("r1", "r2"):
        assert not any(p.startswith("202608_") for p in result[replica])


def test_queue_replay_ends_with_the_parts_18_16_has() -> None:
    q = QueueState()
    entries = [*LOG.items()]
    entries += [(f"log-9{i:09d}", t) for i, t in enumerate(DATA["replicad_entries"].values())]
    # GET_PART entries of the replicad-entry phase are not in the fixture: add them as 18.16 would have logged
    merged = LogEntry.parse(DATA["replicad_entries"]["merge"])
    for i, part in enumerate(merged.source_parts):
        entries.insert(
            len(LOG) + i, (f"log-8{i:09d}", LogEntry.get_part(part, source_replica="r1").to_text())
        )
    for i, (znode, text) in enumerate(entries):
        q.insert(f"queue-{i:010d}", LogEntry.parse(text, znode_name=znode))
        while (sel := q.select_entry_to_process(now=float(i))) is not None:
            q.finish(sel.queue_entry.znode_name, success=True, now=float(i))
    assert len(q) == 0
    assert q.current_parts.parts() == DATA["replicad_entries_result"]["r2"]
    assert sorted(q.virtual_parts.parts()) == sorted(DATA["replicad_entries_result"]["r2"])
