"""PartFetcher's source checks: a GET_PART's source replica is checked as the entry is pulled, and
find_source uses that check instead of asking ZooKeeper again; a source's ``host`` is read once and kept while
its ``is_active`` node is the same one (a fake keeper counts the requests)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from replicad.errors import KeeperConnectionLossError, KeeperNoNodeError
from replicad.keeper.ops import ZnodeStat
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.replication import fetcher as fetcher_mod
from replicad.replication.fetcher import MAX_PRECHECKS, PartFetcher
from replicad.replication.part_store import PartStore
from replicad.storage.layout import TableDataLayout

ZK = "/clickhouse/tables/t"


class FakeKeeper:
    """Nodes in a dict; every request is counted."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[str, str]] = []
        self.czxid: dict[str, int] = {}  # a node's czxid (1 unless set): a re-created node has another

    async def exists(self, path: str, watch: Any = None) -> ZnodeStat | None:
        self.requests.append(("exists", path))
        await asyncio.sleep(0)
        if path not in self.nodes:
            return None
        return ZnodeStat(self.czxid.get(path, 1), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    async def get(self, path: str, watch: Any = None) -> tuple[bytes, object]:
        self.requests.append(("get", path))
        await asyncio.sleep(0)
        if path not in self.nodes:
            raise KeeperNoNodeError(path)
        return self.nodes[path], object()

    async def get_children(self, path: str, watch: Any = None) -> list[str]:
        self.requests.append(("get_children", path))
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self.nodes if p.startswith(prefix)})


def make(tmp_path: Path) -> tuple[PartFetcher, FakeKeeper]:
    paths = TablePaths.create(ZK, "b")
    a = paths.replica("a")
    keeper = FakeKeeper({
        a.root: b"", a.is_active: b"", a.host: b"host: 127.0.0.1\nport: 9009\n", a.part("all_1_1_0"): b"",
        paths.me.root: b"",
    })
    store = PartStore(TableDataLayout(tmp_path, "db", "t"))
    fetcher = PartFetcher(keeper, paths, store, table_columns_text="")  # type: ignore[arg-type]
    fetcher.max_early_fetches = 0  # checks only: no downloads (there is no replica "a" to download from)
    return fetcher, keeper


async def test_precheck_is_used_by_find_source(tmp_path: Path) -> None:
    fetcher, keeper = make(tmp_path)
    mine = LogEntry.get_part("all_2_2_0", source_replica="b")  # our own insert: nothing to check
    theirs = LogEntry.get_part("all_1_1_0", source_replica="a")
    fetcher.precheck_sources([mine, theirs])
    assert list(fetcher.sources._prechecks) == [("all_1_1_0", "a")]
    await asyncio.sleep(0.01)
    before = len(keeper.requests)
    a = fetcher.paths.replica("a")
    # one round: is_active, the part, the host (the first time); the source's checksums are not read (the
    # commit compares the part with every replica that registered it)
    assert sorted(keeper.requests) == sorted([("exists", a.is_active), ("exists", a.part("all_1_1_0")),
                                              ("get", a.host)])
    source = await fetcher.find_source("all_1_1_0", hint="a")
    assert source is not None and (source.replica, source.part_name) == ("a", "all_1_1_0")
    assert len(keeper.requests) == before  # answered from the check made at pull time
    details = fetcher.sources._details[("all_1_1_0", "a")]  # the host for the fetch
    assert details.host == keeper.nodes[a.host]
    # without a precheck the same answer costs one round of requests, without the host: kept
    fetcher.sources._details.clear()
    source = await fetcher.find_source("all_1_1_0", hint="a")
    assert source is not None and source.replica == "a"
    assert keeper.requests[before:] == [("exists", a.is_active), ("exists", a.part("all_1_1_0"))]
    assert fetcher.sources._details[("all_1_1_0", "a")].host == keeper.nodes[a.host]
    await fetcher.close()


async def test_a_kept_host_is_read_again_after_a_reactivation_or_a_failure(tmp_path: Path) -> None:
    fetcher, keeper = make(tmp_path)
    a = fetcher.paths.replica("a")
    assert await fetcher.find_source("all_1_1_0", hint="a") is not None
    assert keeper.requests.count(("get", a.host)) == 1
    # "a" restarted elsewhere: a new is_active (another czxid), written with its new host in one multi
    keeper.czxid[a.is_active] = 7
    keeper.nodes[a.host] = b"host: 127.0.0.2\nport: 9010\n"
    assert await fetcher.find_source("all_1_1_0", hint="a") is not None
    assert keeper.requests.count(("get", a.host)) == 2
    assert fetcher.sources._details[("all_1_1_0", "a")].host == keeper.nodes[a.host]
    assert await fetcher.find_source("all_1_1_0", hint="a") is not None
    assert keeper.requests.count(("get", a.host)) == 2  # the same is_active: kept
    # a failed fetch from "a" forgets its address
    fetcher.sources.failed("all_9_9_0", "a")
    assert await fetcher.find_source("all_1_1_0", hint="a") is not None
    assert keeper.requests.count(("get", a.host)) == 3
    # the source choice without a hint keeps the host for the fetch
    fetcher.sources._details.clear()
    assert await fetcher.find_source("all_1_1_0") is not None
    details = fetcher.sources._details[("all_1_1_0", "a")]
    assert details.host == keeper.nodes[a.host]
    assert keeper.requests.count(("get", a.host)) == 3
    await fetcher.close()


async def test_no_prechecks_for_a_backlog_and_fallback(tmp_path: Path) -> None:
    fetcher, keeper = make(tmp_path)
    backlog = [LogEntry.get_part(f"all_{i}_{i}_0", source_replica="a") for i in range(1, MAX_PRECHECKS + 2)]
    fetcher.precheck_sources(backlog)
    assert not fetcher.sources._prechecks and not keeper.requests
    # a hint that does not have the part: the replicas are searched as usual (and nobody has it)
    fetcher.precheck_sources([LogEntry.get_part("all_5_5_0", source_replica="a")])
    assert await fetcher.find_source("all_5_5_0", hint="a") is None
    assert ("get_children", f"{ZK}/replicas") in keeper.requests
    await fetcher.close()


async def test_fetches_asking_together_share_the_replica_list_and_is_active(tmp_path: Path) -> None:
    fetcher, keeper = make(tmp_path)
    a = fetcher.paths.replica("a")
    found = await asyncio.gather(*(fetcher.find_source("all_1_1_0") for _ in range(8)))
    assert all(s is not None and s.replica == "a" for s in found)
    assert keeper.requests.count(("get_children", f"{ZK}/replicas")) == 1
    assert keeper.requests.count(("exists", a.is_active)) == 1
    assert keeper.requests.count(("exists", a.part("all_1_1_0"))) == 8  # each its own part
    # once answered, nothing is kept: the next one reads again
    assert await fetcher.find_source("all_1_1_0") is not None
    assert keeper.requests.count(("get_children", f"{ZK}/replicas")) == 2
    await fetcher.close()


async def test_a_commit_of_unknown_outcome_is_resolved_by_asking_zookeeper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a connection loss on its commit multi, the fetcher asks whether its registration exists until the
    session answers: registered (the multi was applied) keeps the part; absent, or no answer in time, not."""
    fetcher, keeper = make(tmp_path)
    me_part = fetcher.paths.me.part("all_1_1_0")
    losses = [2]
    real_exists = keeper.exists

    async def flaky_exists(path: str, watch: Any = None) -> ZnodeStat | None:
        if losses[0]:
            losses[0] -= 1
            raise KeeperConnectionLossError("exists: connection loss")
        return await real_exists(path, watch)

    monkeypatch.setattr(keeper, "exists", flaky_exists)
    keeper.nodes[me_part] = b""
    assert await fetcher._registered_after_loss("all_1_1_0") is True
    del keeper.nodes[me_part]
    losses[0] = 1
    assert await fetcher._registered_after_loss("all_1_1_0") is False
    monkeypatch.setattr(fetcher_mod, "COMMIT_OUTCOME_WAIT_S", 0.6)
    losses[0] = 1000  # the session never answers in time: not known, so not kept
    keeper.nodes[me_part] = b""
    assert await fetcher._registered_after_loss("all_1_1_0") is False


@pytest.mark.parametrize("applied", [True, False])
async def test_a_commit_multi_lost_on_the_wire_keeps_the_part_only_if_it_was_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, applied: bool) -> None:
    """commit_new_part itself through a commit multi whose answer is lost: applied by ZooKeeper (the part
    node exists once the session answers again) the part stays active on disk, as ZooKeeper lists it; not
    applied, it is rolled back and the connection loss reaches the caller (the entry is retried)."""
    from replicad.model.part_info import PartInfo
    from replicad.replication.checksum_compare import ReplicaState
    from replicad.storage.checksums import Checksums
    from replicad.storage.part import PartDirectory

    monkeypatch.setattr(PartDirectory, "preload", lambda self: self)
    fetcher, keeper = make(tmp_path)
    layout = fetcher.store.layout
    layout.path.mkdir(parents=True, exist_ok=True)
    name = "all_3_3_0"
    me_part = fetcher.paths.me.part(name)
    answers = [0]
    real_exists = keeper.exists

    async def commit(part_name: str, *args: Any, **kwargs: Any) -> None:
        if applied:
            keeper.nodes[fetcher.paths.me.part(part_name)] = b""  # the multi took effect ...
        raise KeeperConnectionLossError("multi: connection loss")  # ... its answer did not arrive

    async def exists(path: str, watch: Any = None) -> ZnodeStat | None:
        if path == me_part and answers[0] < 1:  # the session answers only on the second ask
            answers[0] += 1
            raise KeeperConnectionLossError("exists: connection loss")
        return await real_exists(path, watch)

    monkeypatch.setattr(fetcher, "_commit_to_zookeeper", commit)
    monkeypatch.setattr(keeper, "exists", exists)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)  # the waits between the asks
    tmp_dir = layout.tmp_path("tmp-fetch_", name)
    tmp_dir.mkdir()
    (tmp_dir / "checksums.txt").write_bytes(b"x")
    state: asyncio.Future[ReplicaState] = asyncio.get_running_loop().create_future()
    state.set_result(ReplicaState(replicas=(), columns=(), answers=(), columns_version=0, self_read=False))
    if applied:
        part, _covered = await fetcher.commit_new_part(tmp_dir, PartInfo.parse(name), Checksums(),
                                                       columns_text="", state=state)
        assert part.name == name and fetcher.store.active_names() == [name]
        assert (layout.path / name).is_dir()
    else:
        with pytest.raises(KeeperConnectionLossError):
            await fetcher.commit_new_part(tmp_dir, PartInfo.parse(name), Checksums(), columns_text="",
                                          state=state)
        assert fetcher.store.active_names() == [] and not (layout.path / name).exists()
    assert answers[0] == 1  # asked again after the lost answer
    await fetcher.close()


_real_sleep = asyncio.sleep


async def _no_sleep(delay: float, result: Any = None) -> Any:
    return await _real_sleep(0, result)
