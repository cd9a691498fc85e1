"""Merges, mutations and drops in a replica set mixing two ClickHouse 18.16 servers and replicad.

Phase 1 — replicad leads (it created the table): merges it assigns are executed by ClickHouse itself
(``ReplicatedPartMerges``, no ``DataAfterMergeDiffersFromReplica``), its ALTER … DELETE and DROP PARTITION
reach both servers.  Phase 2 — replicad restarts and stands again at the end of the line, so a ClickHouse
server leads: the merges it assigns and a ClickHouse ALTER … DELETE / DROP PARTITION are executed by replicad
locally, byte-identical to ClickHouse's own parts.  Counts and sums agree everywhere after each step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.keeper.client import Keeper
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry, LogEntryType
from replicad.replica import TableReplica
from tests.support.table_cluster import EVENTS_DDL as DDL
from tests.support.table_cluster import LZ4, ZK_PATH, Cluster, ch, part_checksums, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(300)]


def tsv(ids: range, month: int, tag: str) -> bytes:
    return "".join(
        f"{i}\t2026-{month:02d}-{1 + i % 27:02d} 10:00:00\t{tag}{i}\t{i * 10}\n" for i in ids
    ).encode()


async def ch_events(server: ClickHouseServer) -> dict[str, int]:
    text = await ch(server, "SELECT event, value FROM system.events")
    return {k: int(v) for k, v in (line.split("\t") for line in text.splitlines())}


async def totals_ch(server: ClickHouseServer) -> tuple[int, int, int]:
    count, s_id, s_v = (await ch(server, "SELECT count(), sum(id), sum(v) FROM db.events")).split()
    return int(count), int(s_id), int(s_v)


async def totals_rd(replica: TableReplica) -> tuple[int, int, int]:
    t = await replica.read_all(["id", "v"])
    ids = t.column("id").to_pylist()
    vs = t.column("v").to_pylist()
    return len(ids), sum(ids), sum(vs)


async def agree(replica: TableReplica, servers: list[ClickHouseServer]) -> tuple[int, int, int]:
    """Sync everyone, then the same count/sum(id)/sum(v) on every replica."""
    for s in servers:
        await ch(s, "SYSTEM SYNC REPLICA db.events")
    await replica.sync_replica()
    expected = await totals_ch(servers[0])

    async def same() -> bool:
        return await totals_rd(replica) == expected and all([await totals_ch(s) == expected for s in servers])

    await wait_for(same, timeout=60, what=f"every replica at {expected}")
    return expected


async def log_entries(keeper: Keeper) -> list[LogEntry]:
    paths = TablePaths.create(ZK_PATH, "x")
    out = []
    for n in sorted(await keeper.get_children(paths.log)):
        out.append(LogEntry.parse((await keeper.get(paths.log_entry(n)))[0], znode_name=n))
    return out


async def test_mixed_merges_mutations_and_drops(
    clickhouse_factory: Callable[..., ClickHouseServer],
    cluster: Cluster,
    keeper: Keeper,
) -> None:
    # replicad creates the table and leads; two ClickHouse servers join
    rd = await cluster.start("rd", writer=LZ4)
    await wait_for(lambda: cluster.ops["rd"].leader.is_leader, what="replicad to lead")
    with ThreadPoolExecutor(2) as pool:
        ch1, ch2 = pool.map(lambda r: clickhouse_factory(r), ["ch1", "ch2"])
    servers = [ch1, ch2]
    for s in servers:
        await ch(s, "CREATE DATABASE db")
        await ch(s, DDL)
    for s in servers:
        assert (await ch(s, "SELECT is_leader FROM system.replicas")).strip() == "0"

    # ---- phase 1: replicad assigns merges; ClickHouse executes them itself
    before = {s.replica: await ch_events(s) for s in servers}
    for i in range(12):
        month = 10 + i % 2
        ids = range(i * 100, i * 100 + 40)
        if i % 3 == 0:
            await rd.insert_table(_arrow(ids, month, "rd"))
        else:
            await ch(servers[i % 3 - 1], "INSERT INTO db.events FORMAT TSV", tsv(ids, month, "ch"))
    await agree(rd, servers)
    await cluster.execute("rd", "OPTIMIZE TABLE db.events FINAL", replication_alter_partitions_sync=2)
    totals = await agree(rd, servers)
    assert totals[0] == 480
    merges = [e for e in await log_entries(keeper) if e.type is LogEntryType.MERGE_PARTS]
    assert merges and {e.source_replica for e in merges} == {"rd"}
    for s in servers:
        after = await ch_events(s)
        executed = after.get("ReplicatedPartMerges", 0) - before[s.replica].get("ReplicatedPartMerges", 0)
        assert executed >= 1, f"{s.replica} merged nothing itself"
        assert after.get("DataAfterMergeDiffersFromReplica", 0) == 0
        names = (await ch(s, "SELECT name FROM system.parts WHERE active AND table = 'events'")).split()
        assert sorted(names) == sorted(part_checksums(rd))
        for name in names:
            theirs = (s.table_dir("db", "events") / name / "checksums.txt").read_bytes()
            assert theirs == part_checksums(rd)[name]

    # replicad's ALTER … DELETE (its MUTATE_PART entries executed by ClickHouse) and DROP PARTITION
    before = {s.replica: await ch_events(s) for s in servers}
    await cluster.execute("rd", "ALTER TABLE db.events DELETE WHERE id % 7 = 0", mutations_sync=2)
    totals = await agree(rd, servers)
    assert totals[0] == 480 - len([i for i in _all_ids(12) if i % 7 == 0])
    for s in servers:
        assert (await ch(s, "SELECT count() FROM db.events WHERE id % 7 = 0")).strip() == "0"
        assert (await ch(s, "SELECT count() FROM system.mutations WHERE is_done = 0")).strip() == "0"
        after = await ch_events(s)
        key = "ReplicatedPartMutations"
        mutated = after.get(key, 0) - before[s.replica].get(key, 0)
        assert mutated >= 1 and after.get("DataAfterMutationDiffersFromReplica", 0) == 0
    await cluster.execute(
        "rd", "ALTER TABLE db.events DROP PARTITION 202610", replication_alter_partitions_sync=2
    )
    totals = await agree(rd, servers)
    for s in servers:
        assert (await ch(s, "SELECT count() FROM db.events WHERE toYYYYMM(ctime) = 202610")).strip() == "0"
    assert totals[0] == await rd.count("toYYYYMM(ctime) = 202611") > 0

    # ---- phase 2: replicad restarts (its candidacy goes to the end); ClickHouse leads
    await cluster.stop("rd")
    rd = await cluster.start("rd", writer=LZ4)
    leaders: list[str] = []

    async def one_clickhouse_leader() -> bool:
        flags = [(await ch(s, "SELECT is_leader FROM system.replicas")).strip() for s in servers]
        leaders[:] = [s.replica for s, flag in zip(servers, flags, strict=True) if flag == "1"]
        return len(leaders) == 1 and not cluster.ops["rd"].leader.is_leader

    await wait_for(one_clickhouse_leader, what="exactly one leader, a ClickHouse server")
    leader = ch1 if leaders == ["ch1"] else ch2
    other = ch2 if leader is ch1 else ch1
    for i in range(12, 20):
        ids = range(i * 100, i * 100 + 40)
        await ch(other, "INSERT INTO db.events FORMAT TSV", tsv(ids, 12, "ch"))
        await rd.insert_table(_arrow(range(i * 100 + 50, i * 100 + 60), 12, "rd"))
    await agree(rd, servers)
    await ch(leader, "OPTIMIZE TABLE db.events PARTITION 202612 FINAL")
    await agree(rd, servers)
    producer = cluster.ops["rd"].producer
    await wait_for(lambda: producer.merged_total >= 1, what="replicad to execute ClickHouse's merge")
    assert producer.mismatches_total == 0
    rd_parts = part_checksums(rd)
    for name, data in rd_parts.items():
        assert (leader.table_dir("db", "events") / name / "checksums.txt").read_bytes() == data
    assert {e.source_replica for e in await log_entries(keeper) if e.type is LogEntryType.MERGE_PARTS} >= {
        "rd",
        leader.replica,
    }

    # a ClickHouse mutation (issued on the non-leader) and a ClickHouse DROP PARTITION reach replicad
    await ch(other, "ALTER TABLE db.events UPDATE v = v + 1 WHERE id % 2 = 1")
    await ch(other, "ALTER TABLE db.events DELETE WHERE id % 5 = 0")

    async def mutated() -> bool:
        done = await ch(leader, "SELECT count() FROM system.mutations WHERE is_done = 0")
        return done.strip() == "0" and await rd.count("id % 5 = 0") == 0

    await wait_for(mutated, timeout=90, what="ClickHouse's mutations everywhere")
    totals = await agree(rd, servers)
    assert producer.mutated_total >= 1 and producer.mismatches_total == 0
    assert await rd.count("id % 2 = 1 AND v % 10 != 1") == 0
    await ch(leader, "ALTER TABLE db.events DROP PARTITION 202611")
    totals = await agree(rd, servers)
    assert await rd.count("toYYYYMM(ctime) = 202611") == 0
    assert totals[0] == await rd.count("toYYYYMM(ctime) = 202612") > 0
    for s in servers:
        errs = await ch(s, "SELECT count() FROM system.replication_queue WHERE last_exception != ''")
        assert errs.strip() == "0"
        assert (await ch(s, "SELECT total_replicas, active_replicas FROM system.replicas")).split() == [
            "3",
            "3",
        ]


def _all_ids(n: int) -> list[int]:
    return [i for k in range(n) for i in range(k * 100, k * 100 + 40)]


def _arrow(ids: range, month: int, tag: str) -> object:
    import datetime as dt

    import pyarrow as pa

    return pa.table(
        {
            "id": pa.array(list(ids), pa.int32()),
            "ctime": pa.array([dt.datetime(2026, month, 1 + i % 27, 10) for i in ids], pa.timestamp("s")),
            "name": pa.array([f"{tag}{i}".encode() for i in ids], pa.binary()),
            "v": pa.array([i * 10 for i in ids], pa.uint32()),
        }
    )


async def test_clickhouse_leader_keeps_out_of_a_replicad_insert_in_flight(
    clickhouse_factory: Callable[..., ClickHouseServer],
    cluster: Cluster,
) -> None:
    """replicad takes an insert's block number in one multi (ClickHouse 22.11+'s form: an ephemeral ``block-``
    node naming the shared persistent ``temp/abandonable_lock-insert``).  A ClickHouse 18.16 leader must see
    that number as still being inserted: no merge may span it while it is held; once it is abandoned, the
    merge may."""
    ch1 = await asyncio.to_thread(clickhouse_factory, "ch1")
    await ch(ch1, "CREATE DATABASE db")
    await ch(ch1, DDL)  # ClickHouse creates the table and leads
    rd = await cluster.start("rd", writer=LZ4)
    await wait_for(lambda: rd.store.active_names() == [] and not rd.is_readonly, what="replicad up")
    assert (await ch(ch1, "SELECT is_leader FROM system.replicas")).strip() == "1"
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(0, 10), 10, "a"))  # block 0
    keeper = cluster.keepers["rd"]
    lock = await rd.committer.allocator.allocate(keeper, "202610", "202610_1_2")  # an insert still writing
    assert lock is not None and lock.number == 1
    assert lock.holder_path.endswith("/temp/abandonable_lock-insert")
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(10, 20), 10, "b"))  # block 2
    await ch(ch1, "INSERT INTO db.events FORMAT TSV", tsv(range(20, 30), 10, "c"))  # block 3

    async def active() -> list[str]:
        text = await ch(ch1, "SELECT name FROM system.parts WHERE active AND table = 'events' ORDER BY name")
        return text.split()

    # all parts: refused (block 1 in between)
    await ch(ch1, "OPTIMIZE TABLE db.events PARTITION 202610 FINAL")
    await ch(ch1, "OPTIMIZE TABLE db.events")  # what may be merged: 2 and 3
    await wait_for(lambda: _async_eq(active, ["202610_0_0_0", "202610_2_3_1"]), timeout=60,
                   what="2_3 merged, 0 kept apart", poll=0.3)
    await asyncio.sleep(2)
    assert await active() == ["202610_0_0_0", "202610_2_3_1"]
    await lock.unlock(keeper)  # abandoned: the gap stays empty, a merge may span it now
    await ch(ch1, "OPTIMIZE TABLE db.events PARTITION 202610 FINAL")
    await wait_for(lambda: _async_eq(active, ["202610_0_3_2"]), timeout=60,
                   what="merge over the abandoned gap", poll=0.3)
    assert (await ch(ch1, "SELECT count() FROM db.events")).strip() == "30"
    await rd.sync_replica()
    assert await rd.count(None) == 30


async def _async_eq(fn: Callable[[], Any], expected: object) -> bool:
    return bool(await fn() == expected)
