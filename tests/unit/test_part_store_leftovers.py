"""PartStore.precommit: a directory that cannot be read once renamed to the part's name is removed, not left
behind under that name (a later fetch or restart would trip over it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.model.part_info import PartInfo
from replicad.replication.part_store import PartStore
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
