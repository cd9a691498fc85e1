"""The DDL worker against a real ZooKeeper, with a recording statement runner: statuses, once-per-shard
execution of a replicated ALTER (``shards/<…>/lock`` and ``executed``), 18.16's 48 when the shard lock is
never released, and the cleanup by ``max_tasks_in_queue`` (never a task with active workers)."""

from __future__ import annotations

import asyncio

import pytest

from replicad.ddl import worker as worker_mod
from replicad.ddl.entry import DDLEntry, host_id
from replicad.ddl.worker import DDLSettings, DDLWorker, Shard, StatementRunner
from replicad.keeper.client import Keeper

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Q = "/clickhouse/task_queue/ddl"
A, B = ("127.0.0.1", 9301), ("127.0.0.1", 9302)
CLUSTERS = {"c": [Shard(("127.0.0.1:9301", "127.0.0.1:9302"))]}


class Recorder(StatementRunner):
    def __init__(self, ran: list[str]) -> None:
        self.ran = ran

    def is_replicated_alter(self, sql: str) -> bool:
        return sql.startswith("ALTER")

    async def run(self, sql: str) -> None:
        await asyncio.sleep(0.2)
        self.ran.append(sql)


def worker(keeper: Keeper, who: tuple[str, int], ran: list[str], **kw: int) -> DDLWorker:
    return DDLWorker(keeper, DDLSettings(who[0], who[1], Q, cleanup_delay_period=0, **kw), CLUSTERS,
                     Recorder(ran))


async def task(keeper: Keeper, query: str, hosts: tuple[tuple[str, int], ...] = (A, B)) -> str:
    await keeper.ensure_path(Q)
    return await keeper.create(f"{Q}/query-", DDLEntry(query, tuple(host_id(*h) for h in hosts)).to_bytes(),
                               sequence=True)


async def status(keeper: Keeper, node: str, who: tuple[str, int]) -> bytes:
    return (await keeper.get(f"{node}/finished/{host_id(*who)}"))[0]


async def test_replicated_alter_runs_once_per_shard(keeper: Keeper) -> None:
    ran: list[str] = []
    node = await task(keeper, "ALTER TABLE db.t ON CLUSTER c ADD COLUMN x UInt8")
    create = await task(keeper, "CREATE TABLE db.u ON CLUSTER c (k UInt8) ENGINE = Memory")
    wa, wb = worker(keeper, A, ran), worker(keeper, B, ran)
    await asyncio.gather(wa.run_once(), wb.run_once())
    assert ran.count("ALTER TABLE db.t ADD COLUMN x UInt8") == 1  # one replica of the shard ran it
    assert ran.count("CREATE TABLE db.u (k UInt8) ENGINE = Memory") == 2  # every host runs a CREATE
    for who in (A, B):
        assert await status(keeper, node, who) == b"0\n"
        assert await status(keeper, create, who) == b"0\n"
    shard = f"{node}/shards/127.0.0.1:9301,127.0.0.1:9302"
    assert (await keeper.get(f"{shard}/executed"))[0].decode() in {host_id(*A), host_id(*B)}
    assert await keeper.exists(f"{shard}/lock") is None
    assert await keeper.get_children(f"{node}/active") == []


async def test_a_shard_lock_never_released_gives_48(keeper: Keeper, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_mod, "SHARD_TRIES", 3)
    ran: list[str] = []
    node = await task(keeper, "ALTER TABLE db.t ON CLUSTER c DROP COLUMN x", hosts=(A,))
    shard = f"{node}/shards/127.0.0.1:9301,127.0.0.1:9302"
    await keeper.ensure_path(shard)
    await keeper.create(f"{shard}/lock", b"somebody", ephemeral=True)
    await worker(keeper, A, ran).run_once()
    assert ran == []
    assert await status(keeper, node, A) == b"48\nCannot enqueue replicated DDL query for a replicated shard"


async def test_cleanup_keeps_the_newest_and_tasks_with_active_workers(keeper: Keeper) -> None:
    ran: list[str] = []
    nodes = [await task(keeper, f"DROP TABLE db.t{i} ON CLUSTER c", hosts=(A,)) for i in range(5)]
    w = worker(keeper, A, ran, max_tasks_in_queue=2)
    await w.run_once()  # executes the five, then cleans
    assert len(ran) == 5
    left = sorted(await keeper.get_children(Q))
    assert left == [n.rsplit("/", 1)[1] for n in nodes[3:]]
    # a task with an active worker stays
    more = [await task(keeper, f"DROP TABLE db.v{i} ON CLUSTER c", hosts=(B,)) for i in range(3)]
    await keeper.ensure_path(f"{more[0]}/active")
    await keeper.create(f"{more[0]}/active/{host_id(*B)}", b"")
    w._queue_changed = True
    await w.run_once()
    left = sorted(await keeper.get_children(Q))
    assert more[0].rsplit("/", 1)[1] in left and nodes[3].rsplit("/", 1)[1] not in left
