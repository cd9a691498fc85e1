"""Converting a part after ALTER (replicad.storage.alter_part) and reading a part not yet converted."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from replicad.datatypes import DataType, parse_type
from replicad.storage import alter_part
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader
from replicad.storage.writer import PartWriter, WriterSettings

S = WriterSettings(fsync=False, method="lz4", threads=1, index_granularity=4)


def T(name: str) -> DataType:
    return parse_type(name)


def part(path: Path, columns: list[tuple[str, str]], data: dict[str, pa.Array]) -> PartDirectory:
    cols = [(n, T(t)) for n, t in columns]
    with PartWriter(path, cols, S) as w:
        w.write(pa.table(data))
        w.finish()
    return PartDirectory.at(path).preload()


def test_drop_and_retype_match_a_part_written_with_the_new_columns(tmp_path: Path) -> None:
    k = pa.array(range(10), pa.uint32())
    old = part(tmp_path / "old", [("k", "UInt32"), ("s", "Nullable(String)"), ("v", "UInt32")],
               {"k": k, "s": pa.array([b"x", None] * 5, pa.binary()),
                "v": pa.array(range(100, 110), pa.uint32())})
    table = [("k", T("UInt32")), ("v", T("String"))]
    conv = alter_part.plan_conversion(old, table)
    assert conv is not None and conv.dropped_columns == ("s",) and [n for n, _ in conv.retyped] == ["v"]
    assert set(conv.removed_files) == {"s.bin", "s.mrk", "s.null.bin", "s.null.mrk", "v.bin", "v.mrk"}
    conv = alter_part.prepare(old.path, conv, S)
    assert (old.path / "s.bin").exists()  # nothing changed yet
    converted = alter_part.finish(old.path, conv)
    # what a part written directly with the new columns holds: same files, same bytes
    fresh = part(tmp_path / "fresh", [("k", "UInt32"), ("v", "String")],
                 {"k": k, "v": pa.array([str(i).encode() for i in range(100, 110)], pa.binary())})
    assert converted.columns_text == fresh.columns_text
    assert converted.checksums.files == fresh.checksums.files
    assert sorted(converted.files()) == sorted(fresh.files())
    assert alter_part.plan_conversion(converted, table) is None
    with PartReader(converted, dict(table)) as r:
        assert r.read_granules(0, r.granules).column("v").to_pylist()[:2] == [b"100", b"101"]


def test_a_part_not_yet_converted_reads_with_cast(tmp_path: Path) -> None:
    p = part(tmp_path / "p", [("k", "UInt32"), ("v", "UInt32")],
             {"k": pa.array(range(6), pa.uint32()), "v": pa.array([1, 2, 3, 4, 5, 300], pa.uint32())})
    with PartReader(p, {"k": T("UInt32"), "v": T("String")}) as r:
        got = r.read_granules(0, r.granules).column("v").to_pylist()
        assert got == [b"1", b"2", b"3", b"4", b"5", b"300"]
    with PartReader(p, {"v": T("UInt8")}) as r:  # CAST wraps as ClickHouse's does
        assert r.read_granules(0, r.granules).column("v").to_pylist() == [1, 2, 3, 4, 5, 44]
