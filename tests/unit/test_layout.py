"""TableDataLayout: directory names, atomic commit, start-up listing and cleanup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from replicad.datatypes import parse_type
from replicad.errors import InsecurePathError
from replicad.storage.layout import (
    TMP_FETCH,
    TMP_INSERT,
    TMP_MERGE,
    PartDirectoryExistsError,
    TableDataLayout,
)
from replicad.storage.part import PartDirectory
from replicad.storage.writer import PartWriter, WriterSettings


def make_part(layout: TableDataLayout, name: str) -> Path:
    tmp = layout.new_tmp_dir(TMP_INSERT, name)
    with PartWriter(tmp, [("x", parse_type("UInt8"))], WriterSettings(fsync=False)) as w:
        w.write(pa.table({"x": pa.array([1, 2], pa.uint8())}))
        w.finish()
    return layout.commit(tmp, name)


def test_paths_and_create(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "my db", "t.1")
    assert layout.path == tmp_path / "data" / "my%20db" / "t%2E1"
    layout.create()
    assert (layout.path / "format_version.txt").read_bytes() == b"1"
    assert layout.detached_path.is_dir()
    assert layout.format_version() == 1
    assert layout.tmp_path(TMP_FETCH, "all_1_1_0").name == "tmp-fetch_all_1_1_0"
    assert layout.tmp_path(TMP_MERGE, "all_1_2_1").name == "tmp_merge_all_1_2_1"
    with pytest.raises(InsecurePathError):
        layout.part_path("../x")


def test_commit_and_listing(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    p = make_part(layout, "all_1_1_0")
    assert p == layout.path / "all_1_1_0"
    PartDirectory.at(p).verify()
    make_part(layout, "all_2_2_0")
    make_part(layout, "all_1_2_1")  # a merge result covering both
    make_part(layout, "202401_3_3_0")
    layout.new_tmp_dir(TMP_INSERT, "all_5_5_0")  # an interrupted insert
    (layout.path / "not_a_part").mkdir()
    assert layout.list_part_names() == ["202401_3_3_0", "all_1_1_0", "all_1_2_1", "all_2_2_0"]
    assert [p.name for p in layout.active_parts()] == ["202401_3_3_0", "all_1_2_1"]
    assert layout.covered_parts() == ["all_1_1_0", "all_2_2_0"]
    with pytest.raises(PartDirectoryExistsError):
        make_part(layout, "all_1_1_0")


def test_startup_removes_tmp_dirs(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    make_part(layout, "all_1_1_0")
    layout.new_tmp_dir(TMP_INSERT, "all_2_2_0")
    layout.new_tmp_dir(TMP_FETCH, "all_3_3_0")
    (layout.path / "tmp_delete_all_0_0_0").mkdir()
    active, removed = layout.startup()
    assert [p.name for p in active] == ["all_1_1_0"]
    assert removed == ["tmp-fetch_all_3_3_0", "tmp_delete_all_0_0_0", "tmp_insert_all_2_2_0"]
    assert layout.tmp_dirs() == []


def test_clear_tmp_dirs_respects_age(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    layout.new_tmp_dir(TMP_MERGE, "all_1_2_1")
    assert layout.clear_tmp_dirs(max_age_s=3600) == []
    assert layout.clear_tmp_dirs() == ["tmp_merge_all_1_2_1"]


def test_tmp_dir_being_written_survives_a_wall_clock_a_day_ahead(tmp_path: Path) -> None:
    """Regression (the chaos suite's clock_skew, a replica 26 h ahead): the cleanup compared file times with
    the wall clock and removed temporary directories still being written (inserts failed, a part committed
    while its files were being deleted turned up broken).  Files dated two days back are what a clock two
    days ahead sees of a directory written just now."""
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    d = layout.new_tmp_dir(TMP_INSERT, "all_1_1_0")
    (d / "id.bin").write_bytes(b"x")
    back = time.time() - 2 * 86400
    for p in (d / "id.bin", d):
        os.utime(p, (back, back))
    assert layout.clear_tmp_dirs(max_age_s=86400) == []
    assert layout.clear_tmp_dirs(max_age_s=86400) == []
    assert (d / "id.bin").exists()


def test_tmp_dir_goes_once_untouched_for_the_lifetime(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    stale = layout.new_tmp_dir(TMP_MERGE, "all_1_2_1")
    busy = layout.new_tmp_dir(TMP_FETCH, "all_3_3_0")
    assert layout.clear_tmp_dirs(max_age_s=0.3) == []  # first seen: the count starts
    for k in range(4):
        time.sleep(0.1)
        (busy / f"c{k}.bin").write_bytes(b"x")  # a download still writing
        assert layout.clear_tmp_dirs(max_age_s=0.3) in ([], ["tmp_merge_all_1_2_1"])
    assert not stale.exists()
    assert busy.exists()


def test_detach_and_remove(tmp_path: Path) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    make_part(layout, "all_1_1_0")
    assert layout.detach("all_1_1_0", "broken").name == "broken_all_1_1_0"
    make_part(layout, "all_1_1_0")
    assert layout.detach("all_1_1_0", "broken_").name == "broken_all_1_1_0_try1"
    assert layout.list_detached() == ["broken_all_1_1_0", "broken_all_1_1_0_try1"]
    make_part(layout, "all_2_2_0")
    layout.remove_part("all_2_2_0")
    assert layout.list_part_names() == [] and layout.tmp_dirs() == []
    layout.remove_part("all_9_9_0")  # already gone: no error
