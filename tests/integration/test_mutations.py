"""ALTER TABLE … DELETE / UPDATE in a replicad-only replica set on a real ZooKeeper."""

from __future__ import annotations

from typing import Any

import pytest

from replicad.errors import BadInputError
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.model.mutation_entry import MutationEntry
from tests.support.table_cluster import (
    ZK_PATH,
    Cluster,
    converged,
    part_checksums,
    rows,
    sorted_rows,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def reference(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What DELETE WHERE v % 3 = 0 then UPDATE name = concat(name, '!'), v = v + 1 WHERE id < 150 leave."""
    out = []
    for r in data:
        if r["v"] % 3 == 0:
            continue
        r = dict(r)
        if r["id"] < 150:
            r["name"] = r["name"] + b"!"
            r["v"] = r["v"] + 1
        out.append(r)
    return sorted(out, key=lambda r: (r["id"], r["name"]))


async def test_delete_and_update_on_all_replicas(cluster: Cluster, keeper: Keeper) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    r3 = await cluster.start("r3")
    for i, month in enumerate((10, 11, 10, 11, 12)):
        await (r1, r2, r3)[i % 3].insert_table(rows(range(i * 50, i * 50 + 50), month=month))
    await wait_for(lambda: converged([r1, r2, r3]), what="inserts everywhere")
    before = await sorted_rows(r1)

    # DELETE issued on a non-leader; mutations_sync = 2 waits until every replica applied it
    await cluster.execute("r2", "ALTER TABLE db.events DELETE WHERE v % 3 = 0", mutations_sync=2)
    await cluster.execute(
        "r3",
        "ALTER TABLE db.events UPDATE name = concat(name, '!'), v = v + 1 WHERE id < 150",
        mutations_sync=2,
    )
    expected = reference(before)
    for r in (r1, r2, r3):
        assert await sorted_rows(r) == expected
    await wait_for(lambda: converged([r1, r2, r3]), what="identical parts")

    paths = TablePaths.create(ZK_PATH, "r1")
    names = sorted(await keeper.get_children(paths.mutations))
    assert names == ["0000000000", "0000000001"]
    first = MutationEntry.parse((await keeper.get(f"{paths.mutations}/{names[0]}"))[0], znode_name=names[0])
    assert first.source_replica == "r2"
    assert dict(first.block_numbers) == {"202610": 2, "202611": 2, "202612": 1}
    assert first.commands == "DELETE WHERE (v % 3) = 0 " or first.commands.startswith("DELETE WHERE")
    assert first.to_text().count("\n") == 7 and not first.to_text().endswith("\n")
    for name in ("r1", "r2", "r3"):
        assert (await keeper.get(paths.replica(name).mutation_pointer))[0] == b"0000000001"
    # parts carry the second mutation's number in their partition
    assert sorted(part_checksums(r1)) == [
        "202610_0_0_0_3",
        "202610_1_1_0_3",
        "202611_0_0_0_3",
        "202611_1_1_0_3",
        "202612_0_0_0_2",
    ]
    mutate_entries = []
    for n in sorted(await keeper.get_children(paths.log)):
        e = LogEntry.parse((await keeper.get(paths.log_entry(n)))[0])
        if e.type is LogEntryType.MUTATE_PART:
            mutate_entries.append(e)
            assert e.readable_by_18_16 and e.source_replica == "r1"
    assert mutate_entries
    # system.mutations
    rows_ = cluster.ops["r1"].mutation_rows()
    assert [(x["mutation_id"], x["is_done"], x["parts_to_do"]) for x in rows_] == [
        ("0000000000", 1, 0),
        ("0000000001", 1, 0),
    ]
    assert rows_[1]["command"].startswith("UPDATE name = concat(name, '!'), v = v + 1 WHERE")

    # later inserts are not mutated; their parts merge with the mutated ones
    await r1.insert_table(rows(range(1000, 1003), month=10))
    await r1.sync_replica()
    assert await r1.count("id >= 1000 AND v % 3 = 0") == 1  # 1020 is divisible by 3 and stays
    await cluster.execute(
        "r1", "OPTIMIZE TABLE db.events PARTITION 202610 FINAL", replication_alter_partitions_sync=2
    )
    assert [n for n in part_checksums(r2) if n.startswith("202610")] == ["202610_0_4_1_3"]
    assert await r3.count(None) == len(expected) + 3


async def test_mutation_waits_for_replica_and_bad_commands_are_refused(
    cluster: Cluster, keeper: Keeper
) -> None:
    r1 = await cluster.start("r1")
    r2 = await cluster.start("r2")
    await r1.insert_table(rows(range(0, 20), month=10))
    await wait_for(lambda: converged([r1, r2]), what="insert everywhere")
    with pytest.raises(BadInputError):
        await cluster.execute("r1", "ALTER TABLE db.events UPDATE id = 1 WHERE 1")  # a sorting-key column
    with pytest.raises(BadInputError):
        await cluster.execute("r1", "ALTER TABLE db.events DELETE WHERE nosuchcolumn = 1")
    assert await keeper.get_children(f"{ZK_PATH}/mutations") == []
    # r2 is down: the mutation is done on r1 (mutations_sync = 1); r2 applies it when it is back
    await cluster.stop("r2")
    await cluster.execute("r1", "ALTER TABLE db.events DELETE WHERE id >= 10", mutations_sync=1)
    assert await r1.count(None) == 10
    r2 = await cluster.start("r2")
    await wait_for(lambda: converged([r1, r2]), timeout=60, what="r2 to catch up")
    assert await r2.count(None) == 10
    await wait_for(
        lambda: cluster.ops["r2"].mutations.mutation_pointer == "0000000000", what="r2's mutation_pointer"
    )


async def test_leader_removes_old_finished_mutations(cluster: Cluster, keeper: Keeper) -> None:
    keep = {"finished_mutations_to_keep": 1}
    r1 = await cluster.start("r1", settings=keep)
    r2 = await cluster.start("r2", settings=keep)
    await r1.insert_table(rows(range(0, 30), month=10))
    for n in (25, 20, 15):
        await cluster.execute("r2", f"ALTER TABLE db.events DELETE WHERE id >= {n}", mutations_sync=2)
    assert await r2.count(None) == 15

    async def trimmed() -> bool:
        return await keeper.get_children(f"{ZK_PATH}/mutations") == ["0000000002"]

    await wait_for(trimmed, timeout=30, what="old mutation records removed by the leader")
    assert [x["mutation_id"] for x in cluster.ops["r2"].mutation_rows()] == ["0000000002"]
