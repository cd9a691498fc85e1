"""PartFetcher's source checks: a GET_PART's source replica is checked as the entry is pulled, and
find_source uses that check instead of asking ZooKeeper again (a fake keeper counts the requests)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from replicad.errors import KeeperNoNodeError
from replicad.keeper.paths import TablePaths
from replicad.model.log_entry import LogEntry
from replicad.replication.fetcher import MAX_PRECHECKS, PartFetcher
from replicad.replication.part_store import PartStore
from replicad.storage.layout import TableDataLayout

ZK = "/clickhouse/tables/t"


class FakeKeeper:
    """Nodes in a dict; every request is counted."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = nodes
        self.requests: list[tuple[str, str]] = []

    async def exists(self, path: str, watch: Any = None) -> object | None:
        self.requests.append(("exists", path))
        await asyncio.sleep(0)
        return object() if path in self.nodes else None

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
    assert before >= 4
    source = await fetcher.find_source("all_1_1_0", hint="a")
    assert source is not None and (source.replica, source.part_name) == ("a", "all_1_1_0")
    assert len(keeper.requests) == before  # answered from the check made at pull time
    assert ("all_1_1_0", "a") in fetcher.sources._details  # host and checksums for the fetch
    # without a precheck the same answer costs one round of requests
    fetcher.sources._details.clear()
    source = await fetcher.find_source("all_1_1_0", hint="a")
    assert source is not None and source.replica == "a" and len(keeper.requests) > before
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
