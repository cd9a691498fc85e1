"""Durability settings: no fsync by default (ClickHouse's defaults), fsync when the MergeTree settings ask."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from replicad import settings
from replicad.datatypes import parse_type
from replicad.storage.layout import TMP_INSERT, TableDataLayout
from replicad.storage.part import PartDirectory, fsync_part_files
from replicad.storage.writer import PartWriter, WriterSettings


def count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def fake(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fake)
    return calls


def write(layout: TableDataLayout, name: str, ws: WriterSettings) -> Path:
    tmp = layout.new_tmp_dir(TMP_INSERT, name)
    with PartWriter(tmp, [("x", parse_type("UInt8"))], ws, primary_key=["x"]) as w:
        w.write(pa.table({"x": pa.array([1, 2, 3], pa.uint8())}))
        w.finish()
    return layout.commit(tmp, name)


def test_defaults_do_not_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.create()
    calls = count_fsyncs(monkeypatch)
    part = write(layout, "all_1_1_0", WriterSettings())
    assert calls == []
    PartDirectory.at(part).verify()
    assert not (layout.path / (TMP_INSERT + "all_1_1_0")).exists()


def test_settings_turn_fsync_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = TableDataLayout(tmp_path, "db", "t", fsync_part_directory=True)
    layout.create()
    calls = count_fsyncs(monkeypatch)
    part = write(layout, "all_1_1_0", WriterSettings(fsync=True))
    files = [e for e in os.scandir(part) if e.is_file()]
    # every file, the part directory (writer), then before and after the rename (layout)
    assert len(calls) == len(files) + 3
    calls.clear()
    fsync_part_files(part)
    assert len(calls) == len(files) + 1


def test_settings_are_known_with_clickhouse_defaults() -> None:
    values, problems = settings.validate({})
    assert problems == []
    assert values["fsync_after_insert"] == 0
    assert values["fsync_part_directory"] == 0
    assert values["min_compressed_bytes_to_fsync_after_fetch"] == 0
    values, problems = settings.validate({"fsync_after_insert": "1", "fsync_part_directory": True,
                                          "min_compressed_bytes_to_fsync_after_fetch": 1 << 20})
    assert problems == []
    assert (values["fsync_after_insert"], values["fsync_part_directory"]) == (1, 1)
    assert settings.validate({"fsync_after_insert": 2})[1]
