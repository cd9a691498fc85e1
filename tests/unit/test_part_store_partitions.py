"""PartStore's covering queries look at the part's own partition only (a part covers only parts of its
partition): with one part in each of many partitions, a fetch's checks must not walk every live part (a new
replica of a table of 10,000 one-part partitions spent most of its CPU there, quadratic in the parts).  The
per-partition index must also agree with the whole set after every kind of change."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from replicad.model.part_info import PartInfo
from replicad.replication.part_store import PartState, PartStore
from replicad.storage.layout import TableDataLayout
from replicad.storage.part import PartDirectory


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PartStore:
    monkeypatch.setattr(PartDirectory, "preload", lambda self: self)
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.path.mkdir(parents=True)
    return PartStore(layout, 480.0)


async def add(store: PartStore, name: str) -> list[str]:
    tmp_dir = store.layout.tmp_path("tmp-fetch_", name)
    tmp_dir.mkdir()
    (tmp_dir / "checksums.txt").write_bytes(b"x")
    (tmp_dir / "count.txt").write_bytes(str(PartInfo.parse(name).max_block * 10 + len(name)).encode())
    await store.precommit(tmp_dir, PartInfo.parse(name))
    return [p.name for p in store.activate(name)]


async def test_covering_queries_compare_with_one_partition_only(store: PartStore,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for p in range(300):
        await add(store, f"{p}_0_0_0")
    compared = 0
    real = PartInfo.contains

    def counting(self: PartInfo, other: PartInfo, *, strict: bool = False) -> bool:
        nonlocal compared
        compared += 1
        return real(self, other, strict=strict)

    monkeypatch.setattr(PartInfo, "contains", counting)
    assert store.active_containing(PartInfo.parse("7_0_0_0")) is store.get("7_0_0_0")
    assert store.covered_by(PartInfo.parse("7_0_3_1")) == [store.get("7_0_0_0")]
    assert await add(store, "9_1_1_0") == []
    assert compared <= 6, compared  # was one comparison per live part of the table, for each query


async def test_index_agrees_with_the_whole_set_after_every_change(store: PartStore) -> None:
    rng = random.Random(18)
    blocks = {p: 0 for p in ("a", "b", "c")}
    for _step in range(300):
        partition = rng.choice(list(blocks))
        live = [p for p in store._live.values() if p.info.partition_id == partition]
        action = rng.random()
        if action < 0.5 or not live:
            n = blocks[partition] = blocks[partition] + 1
            await add(store, f"{partition}_{n}_{n}_0")
        elif action < 0.7:  # a merge of everything active in the partition
            infos = sorted(p.info for p in live if p.state is PartState.ACTIVE)
            if len(infos) >= 2:
                merged = PartInfo(partition, infos[0].min_block, infos[-1].max_block,
                                  max(i.level for i in infos) + 1)
                assert sorted(await add(store, merged.name)) == sorted(i.name for i in infos)
        elif action < 0.8:
            store.make_outdated(rng.choice(live).name)
        elif action < 0.9:
            await store.detach(rng.choice(live).name, "test")
        else:
            for p in [p for p in store.all_parts() if p.state is PartState.OUTDATED]:
                assert await store.remove_outdated(p.name)
        by_partition = {k: set(v) for k, v in store._live_by_partition.items()}
        whole: dict[str, set[str]] = {}
        for name, p in store._live.items():
            whole.setdefault(p.info.partition_id, set()).add(name)
        assert by_partition == whole
        # count() without a WHERE: the active parts' rows, counted without ordering them
        assert store.active_rows() == sum(p.directory.rows for p in store.active())
        # the insert's too-many-parts check: the most active parts of one partition, counted without sorting
        per: dict[str, int] = {}
        for p in store.active():
            per[p.info.partition_id] = per.get(p.info.partition_id, 0) + 1
        assert store.max_active_in_partition() == max(per.values(), default=0)
        for p in store._live.values():
            target = PartInfo(p.info.partition_id, p.info.min_block, p.info.min_block, 0)
            brute = [q for q in store._live.values() if q.info == target or q.info.contains(target)]
            found = store.active_containing(target)
            assert (found is None) == (not brute)


async def test_max_active_in_partition_counts_active_parts_only(store: PartStore) -> None:
    assert store.max_active_in_partition() == 0
    for n in range(1, 4):
        await add(store, f"a_{n}_{n}_0")
    await add(store, "b_1_1_0")
    tmp_dir = store.layout.tmp_path("tmp-fetch_", "b_2_2_0")
    tmp_dir.mkdir()
    (tmp_dir / "checksums.txt").write_bytes(b"x")
    (tmp_dir / "count.txt").write_bytes(b"1")
    await store.precommit(tmp_dir, PartInfo.parse("b_2_2_0"))  # pre-committed, not active: not counted
    assert store.max_active_in_partition() == 3
    store.make_outdated("a_1_1_0")
    assert store.max_active_in_partition() == 2
