"""PartStore.precommit: a directory that cannot be read once renamed to the part's name is removed, not left
behind under that name (a later fetch or restart would trip over it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.model.part_info import PartInfo
from replicad.replication.part_store import PartState, PartStore
from replicad.storage.layout import TableDataLayout
from replicad.storage.part import PartDirectory


async def test_an_unreadable_part_is_removed_after_the_rename(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(self: PartDirectory) -> PartDirectory:
        raise MemoryError("injected: the part's metadata cannot be read")

    monkeypatch.setattr(PartDirectory, "preload", unreadable)
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.path.mkdir(parents=True)
    store = PartStore(layout, 480.0)
    tmp_dir = layout.tmp_path("tmp-fetch_", "202611_1_1_0")
    tmp_dir.mkdir()
    (tmp_dir / "checksums.txt").write_bytes(b"not a checksums file")
    with pytest.raises(MemoryError):
        await store.precommit(tmp_dir, PartInfo.parse("202611_1_1_0"))
    assert sorted(p.name for p in layout.path.iterdir()) == []
    assert store.get("202611_1_1_0") is None


async def test_a_part_an_active_part_covers_is_added_outdated(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (the chaos suite's S3 run, seed 103): the fetch of 1_21_21_0 ended after the fetch of the
    merged 1_0_22_3_26 covering it.  Both became active and the part's rows were read twice; 18.16 adds such
    a part outdated ("Tried to add obsolete part"), and the next cleanup removes it."""
    monkeypatch.setattr(PartDirectory, "preload", lambda self: self)
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.path.mkdir(parents=True)
    store = PartStore(layout, 480.0)

    async def add(name: str) -> list[str]:
        tmp_dir = layout.tmp_path("tmp-fetch_", name)
        tmp_dir.mkdir()
        (tmp_dir / "checksums.txt").write_bytes(b"x")
        await store.precommit(tmp_dir, PartInfo.parse(name))
        return [p.name for p in store.activate(name)]

    assert await add("1_17_17_0") == []
    assert await add("1_0_22_3_26") == ["1_17_17_0"]
    assert await add("1_21_21_0") == []
    assert store.active_names() == ["1_0_22_3_26"]
    late = store.get("1_21_21_0")
    assert late is not None and late.state is PartState.OUTDATED
    assert await store.clear_old_parts() == ["1_21_21_0"]  # at once, not old_parts_lifetime later
    assert sorted(p.name for p in layout.path.iterdir() if p.name.startswith("1_")) == ["1_0_22_3_26",
                                                                                       "1_17_17_0"]
