"""PartWriter / PartReader / PartDirectory: bytes on disk, block cutting, round trips, failures."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import DataType, parse_type
from replicad.errors import BadInputError, CorruptedDataError, UnsupportedPartFormatError
from replicad.model.cityhash import file_hash
from replicad.storage.checksums import Checksums
from replicad.storage.compression import compress_block, iter_blocks
from replicad.storage.part import PartDirectory, back_quote, columns_text, parse_columns_text
from replicad.storage.reader import PartReader, fixed_width, incompatibilities_with_18_16
from replicad.storage.writer import PartWriter, WriterSettings, prepare_block, sort_indices, sort_table
from tests.support.part_rows import ALL_TYPES, make_rows

U32 = parse_type("UInt32")


def T(text: str) -> DataType:
    return parse_type(text)


def write_part(
    path: Path,
    columns: list[tuple[str, DataType]],
    batches: list[pa.Table],
    settings: WriterSettings | None = None,
    **kw: object,
) -> Path:
    with PartWriter(path, columns, settings or WriterSettings(fsync=False), **kw) as w:  # type: ignore[arg-type]
        for b in batches:
            w.write(b)
        w.finish()
    return path


def blocks(path: Path) -> list[tuple[int, int]]:
    """(offset, decompressed size) of every block of a .bin file."""
    return [(off, len(p)) for off, p in iter_blocks(path.read_bytes())]


def marks(path: Path) -> list[tuple[int, int]]:
    raw = path.read_bytes()
    return [struct.unpack_from("<QQ", raw, i) for i in range(0, len(raw), 16)]


# ---- metadata files ------------------------------------------------------------------------------------


def test_columns_text_exact() -> None:
    cols = [("id", T("Int8")), ("ctime", T("DateTime")), ("name", T("String"))]
    assert columns_text(cols) == (
        "columns format version: 1\n3 columns:\n`id` Int8\n`ctime` DateTime\n`name` String\n"
    )


def test_columns_text_matches_18_16_fixture() -> None:
    part = PartDirectory.at(Path(__file__).parent.parent / "fixtures/ch18_part_basic/202611_1_1_0")
    assert columns_text(part.column_types) == part.columns_text


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=5, unique=True))
def test_columns_text_roundtrip(names: list[str]) -> None:
    cols = [(n, "UInt8") for n in names]
    assert parse_columns_text(columns_text(cols)) == cols


def test_back_quote_escapes() -> None:
    assert back_quote("a`b\\c\nd\te") == "`a\\`b\\\\c\\nd\\te`"
    assert parse_columns_text("columns format version: 1\n1 columns:\n`a``b` UInt8\n") == [("a`b", "UInt8")]


def test_small_part_files(tmp_path: Path) -> None:
    cols = [("id", T("Int8")), ("ctime", T("DateTime")), ("name", T("String"))]
    t = pa.table({
        "id": pa.array([-3, 1, 5], pa.int8()),
        "ctime": pa.array([1795309013, 1795309323, 1795996799], pa.timestamp("s")),
        "name": pa.array([b"hello", b"", b"x"]),
    })
    p = write_part(tmp_path / "p", cols, [t], WriterSettings(method="lz4", fsync=False), primary_key=["id"],
                   minmax_columns=["ctime"], partition_value=[(U32, 202611)])
    files = sorted(f.name for f in p.iterdir())
    assert files == ["checksums.txt", "columns.txt", "count.txt", "ctime.bin", "ctime.mrk", "id.bin",
                     "id.mrk",
                     "minmax_ctime.idx", "name.bin", "name.mrk", "partition.dat", "primary.idx"]
    assert (p / "count.txt").read_bytes() == b"3"
    assert (p / "partition.dat").read_bytes() == struct.pack("<I", 202611)
    assert (p / "primary.idx").read_bytes() == b"\xfd"  # first row of the only granule: Int8 -3
    assert (p / "minmax_ctime.idx").read_bytes() == struct.pack("<II", 1795309013, 1795996799)
    assert marks(p / "id.mrk") == [(0, 0)]
    # compressed block: checksum, method LZ4, sizes, payload
    raw = (p / "id.bin").read_bytes()
    assert raw[16] == 0x82 and struct.unpack_from("<II", raw, 17)[1] == 3
    sums = Checksums.parse((p / "checksums.txt").read_bytes())
    assert set(sums.files) == set(files) - {"checksums.txt", "columns.txt"}
    assert sums.files["count.txt"].file_hash == file_hash(b"3")
    assert (p / "checksums.txt").read_bytes().startswith(b"checksums format version: 4\n")
    PartDirectory.at(p).verify(require_all_files_listed=True)


def test_no_partition_key_no_primary_key(tmp_path: Path) -> None:
    p = write_part(tmp_path / "p", [("x", T("UInt16"))], [pa.table({"x": pa.array([1, 2], pa.uint16())})])
    files = sorted(f.name for f in p.iterdir())
    assert files == ["checksums.txt", "columns.txt", "count.txt", "x.bin", "x.mrk"]


def test_default_method_is_zstd(tmp_path: Path) -> None:
    p = write_part(tmp_path / "p", [("x", T("UInt16"))], [pa.table({"x": pa.array([1, 2], pa.uint16())})])
    assert (p / "x.bin").read_bytes()[16] == 0x90


# ---- block cutting rule -----------------------------------------------------------------------------


def test_fixed_width_granule_blocks(tmp_path: Path) -> None:
    """UInt64: every 8192-row granule is 64 KiB, so each granule gets its own block (FACTS §5.1)."""
    n = 8192 * 3 + 100
    t = pa.table({"k": pa.array(np.arange(n, dtype=np.uint64))})
    p = write_part(tmp_path / "p", [("k", T("UInt64"))], [t])
    b = blocks(p / "k.bin")
    assert [s for _, s in b] == [65536, 65536, 65536, 800]
    assert marks(p / "k.mrk") == [(off, 0) for off, _ in b]


def test_small_granules_share_a_block(tmp_path: Path) -> None:
    """UInt32: 32 KiB granules; a block is cut before a granule once >= 64 KiB are buffered."""
    n = 8192 * 5
    t = pa.table({"v": pa.array(np.arange(n, dtype=np.uint32))})
    p = write_part(tmp_path / "p", [("v", T("UInt32"))], [t])
    b = blocks(p / "v.bin")
    assert [s for _, s in b] == [65536, 65536, 32768]
    assert marks(p / "v.mrk") == [(0, 0), (0, 32768), (b[1][0], 0), (b[1][0], 32768), (b[2][0], 0)]


def test_max_block_size_cut_mid_granule(tmp_path: Path) -> None:
    """1000-byte strings, 2 MB granules: blocks of exactly 1 MiB cut inside a granule, the rest flushed
    before the next granule's mark."""
    n = 3000
    t = pa.table({"s": pa.array([b"%04d" % i * 250 for i in range(n)])})
    settings = WriterSettings(index_granularity=2048, fsync=False)
    p = write_part(tmp_path / "p", [("s", T("String"))], [t], settings)
    b = blocks(p / "s.bin")
    g0 = 2048 * 1002  # VarUInt(1000) is two bytes
    assert [s for _, s in b] == [1048576, g0 - 1048576, (n - 2048) * 1002]
    assert marks(p / "s.mrk") == [(0, 0), (b[2][0], 0)]


def test_exactly_full_block_is_flushed_at_granule_end(tmp_path: Path) -> None:
    settings = WriterSettings(index_granularity=4, min_compress_block_size=64, max_compress_block_size=64,
                              fsync=False)
    t = pa.table({"x": pa.array(np.arange(16, dtype=np.uint64))})  # 32 bytes per granule
    p = write_part(tmp_path / "p", [("x", T("UInt64"))], [t], settings)
    b = blocks(p / "x.bin")
    assert [s for _, s in b] == [64, 64]
    assert marks(p / "x.mrk") == [(0, 0), (0, 32), (b[1][0], 0), (b[1][0], 32)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 3000),
    cuts=st.lists(st.integers(0, 3000), max_size=6),
    granularity=st.sampled_from([1, 7, 64, 333]),
)
def test_batch_boundaries_do_not_change_bytes(
    tmp_path_factory: pytest.TempPathFactory, n: int, cuts: list[int], granularity: int
) -> None:
    rng = np.random.default_rng(n)
    strings = [bytes(rng.integers(97, 123, int(rng.integers(0, 50))).astype(np.uint8)) for _ in range(n)]
    t = pa.table({"k": pa.array(np.arange(n, dtype=np.uint64)), "s": pa.array(strings, pa.binary())})
    cols = [("k", T("UInt64")), ("s", T("String"))]
    settings = WriterSettings(index_granularity=granularity, min_compress_block_size=512,
                              max_compress_block_size=2048, fsync=False)
    base = tmp_path_factory.mktemp("w")
    one = write_part(base / "one", cols, [t], settings, primary_key=["k", "s"])
    points = sorted({c for c in cuts if 0 < c < n})
    pieces = [t.slice(a, b - a) for a, b in zip([0, *points], [*points, n], strict=True)]
    many = write_part(base / "many", cols, pieces, settings, primary_key=["k", "s"])
    for f in sorted(x.name for x in one.iterdir()):
        assert (one / f).read_bytes() == (many / f).read_bytes(), f
    assert len(marks(one / "k.mrk")) == -(-n // granularity)
    r = PartReader(many, index_granularity=granularity)
    assert r.read().equals(t)
    assert pa.concat_tables(list(r.iter_batches(granules_per_batch=3))).equals(t)


def test_bin_files_the_same_held_or_spilled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's ``.bin`` is held in memory up to SPILL_BYTES, then written through: the bytes do not
    depend on where (or whether) it spills, and a writer aborted after a spill leaves no open file."""
    import os

    from replicad.storage import column_writer

    rng = np.random.default_rng(5)
    n = 5000
    t = pa.table({"k": pa.array(rng.integers(0, 1 << 60, n).astype(np.uint64)),
                  "s": pa.array([b"v%d" % v for v in rng.integers(0, 10**9, n)])})
    cols = [("k", T("UInt64")), ("s", T("String"))]
    settings = WriterSettings(index_granularity=512, min_compress_block_size=1024,
                              max_compress_block_size=4096, fsync=True)
    parts = {}
    for spill in (0, 1, 5000, 1 << 30):
        monkeypatch.setattr(column_writer, "SPILL_BYTES", spill)
        parts[spill] = write_part(tmp_path / f"p{spill}", cols, [t], settings, primary_key=["k"])
    files = sorted(f.name for f in parts[0].iterdir())
    assert len(blocks(parts[0] / "k.bin")) > 3
    for spill, p in parts.items():
        assert sorted(f.name for f in p.iterdir()) == files
        for f in files:
            assert (p / f).read_bytes() == (parts[0] / f).read_bytes(), (spill, f)
    monkeypatch.setattr(column_writer, "SPILL_BYTES", 5000)
    fds = len(os.listdir("/proc/self/fd"))
    w = PartWriter(tmp_path / "aborted", cols, settings, primary_key=["k"])
    w.write(t)  # more than 5000 compressed bytes per stream: both files are open now
    assert len(os.listdir("/proc/self/fd")) > fds
    w.abort()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert not (tmp_path / "aborted").exists()


# ---- reading -------------------------------------------------------------------------------------------


def test_read_18_16_fixture_part() -> None:
    fixture = Path(__file__).parent.parent / "fixtures/ch18_part_basic/202611_1_1_0"
    part = PartDirectory.at(fixture)
    part.verify(require_all_files_listed=True)
    names = [n for n, _ in part.column_types]
    assert names == ["id", "ctime", "name", "n", "tags"]
    cols = {n: T(t) for n, t in part.column_types if n in ("id", "ctime", "name")}
    t = PartReader(fixture, cols).read()
    assert t.column("id").to_pylist() == [-3, 1, 5]
    assert [len(x) for x in t.column("name").to_pylist()] == [3000, 5, 0]
    assert [str(x) for x in t.column("ctime").to_pylist()] == [
        "2026-11-23 10:00:00", "2026-11-22 01:16:53", "2026-11-30 23:59:59"]


def test_infer_granularity_and_granule_ranges(tmp_path: Path) -> None:
    n = 1000
    t = pa.table({"s": pa.array([b"x" * (i % 7) for i in range(n)]),
                  "v": pa.array(np.arange(n, dtype=np.int16))})
    cols = [("s", T("String")), ("v", T("Int16"))]
    s = WriterSettings(index_granularity=37, min_compress_block_size=100, fsync=False)
    p = write_part(tmp_path / "p", cols, [t], s)
    r = PartReader(p)  # granularity inferred from the Int16 stream
    assert r.granules == -(-n // 37)
    assert r.granule_rows(0) == 37 and r.granule_rows(r.granules - 1) == n - 37 * (r.granules - 1)
    assert r.read_granules(3, 5).equals(t.slice(3 * 37, 2 * 37))
    assert r.read(["v"]).column("v").equals(t.column("v"))


def test_missing_column_read_as_defaults(tmp_path: Path) -> None:
    p = write_part(tmp_path / "p", [("x", T("UInt8"))], [pa.table({"x": pa.array([1, 2], pa.uint8())})])
    r = PartReader(p, {"x": T("UInt8"), "added": T("String")})
    assert r.read().column("added").to_pylist() == [b"", b""]


def test_adaptive_marks_mrk2(tmp_path: Path) -> None:
    """A .mrk2 part (3 UInt64 per mark + final mark, as modern ClickHouse writes) reads the same."""
    n = 100
    t = pa.table({"x": pa.array(np.arange(n, dtype=np.uint32)), "s": pa.array([b"ab"] * n)})
    cols = [("x", T("UInt32")), ("s", T("String"))]
    p = write_part(tmp_path / "p", cols, [t], WriterSettings(index_granularity=30, min_compress_block_size=64,
                                                             fsync=False))
    for stem in ("x", "s"):
        m = marks(p / f"{stem}.mrk")
        rows = [30, 30, 30, 10]
        size = (p / f"{stem}.bin").stat().st_size
        raw = b"".join(struct.pack("<QQQ", a, b, r) for (a, b), r in zip(m, rows, strict=True))
        (p / f"{stem}.mrk2").write_bytes(raw + struct.pack("<QQQ", size, 0, 0))
        (p / f"{stem}.mrk").unlink()
    r = PartReader(p)
    assert r.layout.adaptive and r.granules == 4
    assert r.read().equals(t)


def test_a_column_named_data_is_not_a_compact_part(tmp_path: Path) -> None:
    """A Wide part with a column ``data`` has ``data.bin`` too; Compact parts are told by data.mrk3 ..."""
    t = pa.table({"data": pa.array([1, 2], pa.uint8())})
    p = write_part(tmp_path / "p", [("data", T("UInt8"))], [t])
    assert PartReader(p, verify=True).read().equals(t)
    assert incompatibilities_with_18_16(PartDirectory.at(p)) == []


def test_compressed_marks_and_primary_cidx(tmp_path: Path) -> None:
    """Modern defaults compress_marks=1 / compress_primary_key=1: .cmrk = marks in compressed blocks."""
    t = pa.table({"x": pa.array(np.arange(50, dtype=np.uint32))})
    s = WriterSettings(index_granularity=8, fsync=False)
    p = write_part(tmp_path / "p", [("x", T("UInt32"))], [t], s, primary_key=["x"])
    (p / "x.cmrk").write_bytes(compress_block((p / "x.mrk").read_bytes(), "zstd", 3))
    (p / "x.mrk").unlink()
    (p / "primary.cidx").write_bytes(compress_block((p / "primary.idx").read_bytes(), "zstd", 3))
    (p / "primary.idx").unlink()
    r = PartReader(p)
    assert r.layout.compressed and r.granules == 7
    assert r.read().equals(t)
    assert incompatibilities_with_18_16(PartDirectory.at(p)) == [
        "compressed primary index (primary.cidx)", "marks files .cmrk"]


def test_unknown_serialization_kind_refused(tmp_path: Path) -> None:
    p = write_part(tmp_path / "p", [("x", T("UInt8"))], [pa.table({"x": pa.array([1], pa.uint8())})])
    (p / "serialization.json").write_text('{"columns":[{"name":"x","kind":"Detached"}],"version":1}')
    with pytest.raises(UnsupportedPartFormatError, match="Detached serialization"):
        PartReader(p)


def test_unknown_string_serialization_version_refused(tmp_path: Path) -> None:
    p = write_part(tmp_path / "p", [("x", T("UInt8")), ("s", T("String"))],
                   [pa.table({"x": pa.array([1], pa.uint8()), "s": pa.array([b"a"])})])
    (p / "serialization.json").write_text(
        '{"columns":[],"types_serialization_versions":{"string":7},"version":1}')
    with pytest.raises(UnsupportedPartFormatError, match="String serialization version 7"):
        PartReader(p)


def test_verify_detects_corruption(tmp_path: Path) -> None:
    t = pa.table({"x": pa.array(np.arange(100, dtype=np.uint64))})
    p = write_part(tmp_path / "p", [("x", T("UInt64"))], [t])
    PartDirectory.at(p).verify()
    data = bytearray((p / "x.bin").read_bytes())
    data[-1] ^= 1
    (p / "x.bin").write_bytes(bytes(data))
    with pytest.raises(CorruptedDataError, match=r"x\.bin"):
        PartDirectory.at(p).verify()
    with pytest.raises(CorruptedDataError):
        PartReader(p).read()


def test_fixed_width() -> None:
    assert fixed_width("Date") == 2 and fixed_width("DateTime('Europe/Moscow')") == 4
    assert fixed_width("Decimal(20, 3)") == 16 and fixed_width("FixedString(5)") == 5
    assert fixed_width("Nullable(Int16)") == 2 and fixed_width("String") is None
    assert fixed_width("Enum8('a' = 1)") == 1 and fixed_width("Array(UInt8)") is None


# ---- random round trips ------------------------------------------------------------------------------

_ROUNDTRIP_TYPES = ["Int8", "UInt16", "Int32", "UInt64", "Float32", "Float64", "Date", "DateTime", "String",
                    "FixedString(3)"]


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[tuple[str, DataType]], pa.Table]:
    names = draw(st.lists(st.sampled_from(_ROUNDTRIP_TYPES), min_size=1, max_size=4))
    n = draw(st.integers(0, 400))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    cols, arrays = [], []
    for i, tn in enumerate(names):
        dt = T(tn)
        at = dt.arrow_type
        if pa.types.is_integer(at):
            info = np.iinfo(at.to_pandas_dtype())
            arr = pa.array(rng.integers(info.min, info.max, n, endpoint=True, dtype=info.dtype), at)
        elif pa.types.is_floating(at):
            arr = pa.array(rng.normal(0, 1e6, n).astype(at.to_pandas_dtype()), at)
        elif pa.types.is_date32(at):
            arr = pa.array(rng.integers(0, 65535, n).astype(np.int32), pa.date32())
        elif pa.types.is_timestamp(at):
            arr = pa.array(rng.integers(0, 2**32 - 1, n), pa.timestamp("s"))
        elif pa.types.is_fixed_size_binary(at):
            arr = pa.array([bytes(rng.integers(0, 256, 3).astype(np.uint8)) for _ in range(n)], at)
        else:
            arr = pa.array([bytes(rng.integers(0, 256, int(rng.integers(0, 300))).astype(np.uint8))
                            for _ in range(n)], pa.binary())
        cols.append((f"c{i}", dt))
        arrays.append(arr)
    return cols, pa.Table.from_arrays(arrays, names=[c for c, _ in cols])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=tables(), granularity=st.sampled_from([1, 3, 50, 8192]),
       method=st.sampled_from(["zstd", "lz4", "none"]))
def test_roundtrip(
    tmp_path_factory: pytest.TempPathFactory,
    data: tuple[list[tuple[str, DataType]], pa.Table],
    granularity: int,
    method: str,
) -> None:
    cols, t = data
    s = WriterSettings(index_granularity=granularity, method=method, min_compress_block_size=1024,  # type: ignore[arg-type]
                       max_compress_block_size=4096, fsync=False)
    p = write_part(tmp_path_factory.mktemp("rt") / "p", cols, [t], s)
    PartDirectory.at(p).verify(require_all_files_listed=True)
    r = PartReader(p, index_granularity=granularity)
    assert r.rows == t.num_rows
    assert r.read().equals(t)


# ---- failures ------------------------------------------------------------------------------------------


def test_failure_removes_tmp_dir(tmp_path: Path) -> None:
    w = PartWriter(tmp_path / "tmp_insert_x", [("x", T("UInt8"))], WriterSettings(fsync=False))
    with pytest.raises(BadInputError, match="column x"):
        w.write(pa.table({"x": pa.array([1], pa.int64())}))
    assert not (tmp_path / "tmp_insert_x").exists()


def test_context_manager_cleans_up_without_finish(tmp_path: Path) -> None:
    with PartWriter(tmp_path / "t", [("x", T("UInt8"))], WriterSettings(fsync=False)) as w:
        w.write(pa.table({"x": pa.array([1], pa.uint8())}))
    assert not (tmp_path / "t").exists()


def test_leftover_tmp_dir_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "junk.bin").write_bytes(b"junk")
    p = write_part(tmp_path / "t", [("x", T("UInt8"))], [pa.table({"x": pa.array([1], pa.uint8())})])
    assert not (p / "junk.bin").exists()


def test_primary_key_expression_arrays(tmp_path: Path) -> None:
    n = 10
    t = pa.table({"x": pa.array(np.arange(n, dtype=np.uint32))})
    key = pa.array(np.arange(n, dtype=np.uint32) // 3, pa.uint32())
    with PartWriter(tmp_path / "p", [("x", T("UInt32"))], WriterSettings(index_granularity=4, fsync=False),
                    primary_key=["intDiv(x, 3)", "x"], key_types={"intDiv(x, 3)": U32}) as w:
        w.write(t.slice(0, 5), key_arrays={"intDiv(x, 3)": key.slice(0, 5)})
        w.write(t.slice(5), key_arrays={"intDiv(x, 3)": key.slice(5)})
        w.finish()
    # granules start at rows 0, 4, 8: (0,0) (1,4) (2,8)
    assert (tmp_path / "p" / "primary.idx").read_bytes() == struct.pack("<6I", 0, 0, 1, 4, 2, 8)


# ---- prepare_block / sort_table ------------------------------------------------------------------------

COLS = [("a", T("UInt8")), ("s", T("String"))]


def test_prepare_block_maps_and_fills_defaults() -> None:
    out = prepare_block(pa.table({"a": pa.array([1, 2])}), COLS)
    assert out.schema.names == ["a", "s"]
    assert out.column("a").type == pa.uint8()
    assert out.column("s").to_pylist() == [b"", b""]


def test_prepare_block_unknown_column() -> None:
    with pytest.raises(BadInputError, match="column zz"):
        prepare_block(pa.table({"a": [1], "zz": [2]}), COLS)


def test_prepare_block_missing_column_strict() -> None:
    with pytest.raises(BadInputError, match="column s"):
        prepare_block(pa.table({"a": [1]}), COLS, fill_missing=False)


def test_prepare_block_out_of_range_names_column_and_row() -> None:
    with pytest.raises(BadInputError, match=r"column a.*row 2"):
        prepare_block(pa.table({"a": [1, 2, 300], "s": ["x", "y", "z"]}), COLS)


def test_prepare_block_wrong_type() -> None:
    with pytest.raises(BadInputError, match="column a"):
        prepare_block(pa.table({"a": pa.array([[1], [2]]), "s": ["x", "y"]}), COLS)


def test_sort_table() -> None:
    t = pa.table({"a": [3, 1, 2, 1], "b": ["x", "z", "y", "a"]})
    out = sort_table(t, [t.column("a"), t.column("b")])
    assert out.column("b").to_pylist() == ["a", "z", "y", "x"]
    assert sort_table(out, [out.column("a")]) is out  # already sorted: no copy


def test_granule_carry_matches_single_write(tmp_path: Path) -> None:
    t = pa.table({"x": pa.array(np.arange(20000, dtype=np.uint64))})
    one = write_part(tmp_path / "a", [("x", T("UInt64"))], [t])
    pieces = [t.slice(0, 5000), t.slice(5000, 9000), t.slice(14000)]
    two = write_part(tmp_path / "b", [("x", T("UInt64"))], pieces)
    assert (one / "x.bin").read_bytes() == (two / "x.bin").read_bytes()
    assert (one / "x.mrk").read_bytes() == (two / "x.mrk").read_bytes()
    shutil.rmtree(one)


class _DictLike:
    """A fake stateful type: a '.dict' stream with a prefix and a suffix, like LowCardinality."""

    name = "UInt8"
    arrow_type = pa.uint8()

    def substreams(self) -> list[str]:
        return [".dict", ""]

    def bulk_serializer(self) -> _DictLike:
        self.rows = 0
        return self

    def prefix(self) -> dict[str, bytes]:
        return {".dict": b"VERSION1"}

    def serialize(self, arr: pa.Array) -> dict[str, bytes]:
        self.rows += len(arr)
        return {"": arr.to_numpy().tobytes()}

    def suffix(self) -> dict[str, bytes]:
        return {".dict": b"DICT%d" % self.rows}

    def deserialize(self, bufs: dict[str, bytes], n: int) -> pa.Array:
        assert bufs[".dict"] == b"DICT10"  # from the granule's mark to the end of the stream
        return pa.array(np.frombuffer(bufs[""], np.uint8))


def test_stateful_type_prefix_and_suffix(tmp_path: Path) -> None:
    t = pa.table({"x": pa.array(np.arange(10, dtype=np.uint8))})
    fake: Any = _DictLike()
    p = write_part(tmp_path / "p", [("x", fake)], [t], WriterSettings(index_granularity=4, fsync=False))
    assert [x for _, x in iter_blocks((p / "x.dict.bin").read_bytes())] == [b"VERSION1DICT10"]
    assert marks(p / "x.dict.mrk") == [(0, 8)] * 3
    assert marks(p / "x.mrk") == [(0, 0), (0, 4), (0, 8)]
    r = PartReader(p, {"x": fake}, index_granularity=4)
    assert r.read_granules(1, 3).column("x").to_pylist() == list(range(4, 10))


def test_empty_part(tmp_path: Path) -> None:
    cols = [("d", T("Date")), ("s", T("String"))]
    empty = pa.table({"d": pa.array([], pa.date32()), "s": pa.array([], pa.binary())})
    p = write_part(tmp_path / "p", cols, [empty], primary_key=["d"], minmax_columns=["d"],
                   partition_value=[(U32, 202401)])
    assert (p / "count.txt").read_bytes() == b"0" and (p / "d.mrk").read_bytes() == b""
    assert not (p / "minmax_d.idx").exists()  # as 18.16: no min/max for an empty part
    PartDirectory.at(p).verify(require_all_files_listed=True)
    r = PartReader(p)
    assert r.rows == 0 and r.read().equals(empty)


class _Exploding(_DictLike):
    def serialize(self, arr: pa.Array) -> dict[str, bytes]:
        raise ValueError("boom")


@pytest.mark.parametrize("threads", [1, 2])
def test_failure_in_column_task_removes_tmp_dir(tmp_path: Path, threads: int) -> None:
    fake: Any = _Exploding()
    cols = [("a", T("UInt8")), ("x", fake)]
    t = pa.table({"a": pa.array([1, 2], pa.uint8()), "x": pa.array([1, 2], pa.uint8())})
    w = PartWriter(tmp_path / "tmp_insert_y", cols, WriterSettings(fsync=False, threads=threads))
    with pytest.raises(ValueError, match="boom"):
        w.write(t)
    assert not (tmp_path / "tmp_insert_y").exists()


def test_prepare_block_missing_nullable_is_null() -> None:
    cols = [("a", T("UInt8")), ("n", T("Nullable(Int32)"))]
    out = prepare_block(pa.table({"a": [1, 2]}), cols, fill_missing=False)
    assert out.column("n").to_pylist() == [None, None]
    with pytest.raises(BadInputError, match=r"column n.*row 1"):
        prepare_block(pa.table({"a": [1, 2], "n": [1, 2**40]}), cols)
    with pytest.raises(BadInputError, match=r"column a.*row 1"):
        prepare_block(pa.table({"a": [1, None], "n": [1, 2]}), cols)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(st.sampled_from(ALL_TYPES[2:]), min_size=1, max_size=5, unique=True),
    n=st.integers(0, 700),
    granularity=st.sampled_from([1, 4, 100, 8192]),
    seed=st.integers(0, 2**31),
)
def test_roundtrip_every_type(
    tmp_path_factory: pytest.TempPathFactory,
    chosen: list[tuple[str, str]],
    n: int,
    granularity: int,
    seed: int,
) -> None:
    columns = [ALL_TYPES[0], *chosen]
    table, _tsv = make_rows(columns, n, seed)
    types = [(c, T(t)) for c, t in columns]
    s = WriterSettings(index_granularity=granularity, min_compress_block_size=256,
                       max_compress_block_size=1024, fsync=False)
    pieces = [table.slice(0, n // 3), table.slice(n // 3)]
    p = write_part(tmp_path_factory.mktemp("rt") / "p", types, pieces, s, primary_key=["k"])
    PartDirectory.at(p).verify(require_all_files_listed=True)
    r = PartReader(p, index_granularity=granularity)
    assert r.read().equals(table)
    assert pa.concat_tables([table.slice(0, 0), *r.iter_batches(granules_per_batch=2)]).equals(table)


@given(
    a=st.lists(st.integers(-3, 3), min_size=1, max_size=60),
    fl=st.lists(st.sampled_from([0.0, -0.0, 1.5, float("nan"), float("inf"), -2.0]),
                min_size=60, max_size=60),
    with_null=st.booleans(),
)
def test_sort_indices_numpy_matches_arrow(a: list[int], fl: list[float], with_null: bool) -> None:
    n = len(a)
    ints = pa.array(a, pa.int16())
    floats = pa.array(fl[:n], pa.float64())
    dates = pa.array([abs(x) for x in a], pa.int32()).cast(pa.date32())
    for keys in ([ints], [floats], [ints, floats], [dates, ints]):
        if with_null:
            keys = [*keys, pa.array([None if x == 0 else x for x in a], pa.int8())]
        table = pa.table({f"k{i}": k for i, k in enumerate(keys)})
        want = pc.sort_indices(table, sort_keys=[(f"k{i}", "ascending", "at_end") for i in range(len(keys))])
        assert sort_indices(keys).tolist() == want.to_pylist()


@pytest.mark.parametrize("threads", [1, 2])
def test_write_with_permutation(tmp_path: Path, threads: int) -> None:
    """write(batch, order=...) == write(sorted batch); also streamed as slices of the permutation."""
    n = 5000
    rng = np.random.default_rng(5)
    t = pa.table({"k": pa.array(rng.integers(0, 100, n).astype(np.uint32)),
                  "d": pa.array(rng.integers(19000, 19020, n).astype(np.int32), pa.date32()),
                  "s": pa.array([b"v%d" % i for i in range(n)]),
                  # strings of 0..299 bytes (one- and two-byte lengths), a slice: its offsets start past 0
                  "l": pa.array([b"x" * int(x) for x in rng.integers(0, 300, n + 3)]).slice(3),
                  # Nullable(String): NULL rows storing nothing (as inserts make them), and a NULL row
                  # storing bytes (what a take drops: the permuted write must agree with it)
                  "ns": pa.array([None if i % 3 == 0 else b"y" * (i % 200) for i in range(n + 1)]).slice(1),
                  "nv": pa.Array.from_buffers(pa.binary(), n, [
                      pa.py_buffer(np.packbits(np.arange(n) % 4 != 0, bitorder="little")),
                      pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(b"a" * n)])})
    key = pa.array(rng.integers(0, 7, n).astype(np.uint32), pa.uint32())
    cols = [("k", T("UInt32")), ("d", T("Date")), ("s", T("String")), ("l", T("String")),
            ("ns", T("Nullable(String)")), ("nv", T("Nullable(String)"))]
    kw: dict[str, Any] = dict(primary_key=["k", "e"], key_types={"e": U32}, minmax_columns=["d"],
                              partition_value=[(U32, 202201)])
    s = WriterSettings(index_granularity=64, min_compress_block_size=1000, fsync=False, threads=threads)
    order = sort_indices([t.column("k"), t.column("s")])
    with PartWriter(tmp_path / "a", cols, s, **kw) as w:
        w.write(t.take(order), {"e": key.take(order)})
        w.finish()
    with PartWriter(tmp_path / "b", cols, s, **kw) as w:
        w.write(t, {"e": key}, order=order)
        w.finish()
    with PartWriter(tmp_path / "c", cols, s, **kw) as w:
        for i in range(0, n, 777):
            w.write(t, {"e": key}, order=order[i:i + 777])
        w.finish()
    for f in sorted(x.name for x in (tmp_path / "a").iterdir()):
        a = (tmp_path / "a" / f).read_bytes()
        assert a == (tmp_path / "b" / f).read_bytes() == (tmp_path / "c" / f).read_bytes(), f


def test_sealed_first_same_bytes_and_bin_checksums(tmp_path: Path) -> None:
    """PartWriter.seal (the ``.bin`` checksums known before the files exist, for the early block-number
    lock) changes no byte: the files and the checksums are those of a writer finished without it, the
    sealed checksums are the finished ones' ``.bin`` entries, and a small part has no file but its
    directory when sealed."""
    from replicad.replication.early_lock import block_id_of

    rng = np.random.default_rng(7)
    n = 300
    t = pa.table({"k": pa.array(rng.integers(0, 1 << 40, n).astype(np.uint64)),
                  "s": pa.array([b"v%d" % v for v in rng.integers(0, 10**6, n)]),
                  "ls": pa.array([b"a", b"bb", b"ccc"] * 100)})
    cols = [("k", T("UInt64")), ("s", T("Nullable(String)")), ("ls", T("LowCardinality(String)"))]
    t = prepare_block(t, cols, "UTC")
    settings = WriterSettings(index_granularity=64, fsync=False, threads=1)
    plain = write_part(tmp_path / "plain", cols, [t], settings, primary_key=["k"])
    with PartWriter(tmp_path / "sealed", cols, settings, primary_key=["k"]) as w:
        w.write(t)
        sealed = w.seal()
        assert list((tmp_path / "sealed").iterdir()) == []  # nothing made yet but the directory
        assert w.seal() == sealed  # idempotent
        done = w.finish()
    files = sorted(f.name for f in plain.iterdir())
    assert sorted(f.name for f in (tmp_path / "sealed").iterdir()) == files
    for f in files:
        assert (plain / f).read_bytes() == (tmp_path / "sealed" / f).read_bytes(), f
    assert sealed == {k: v for k, v in done.checksums.files.items() if k.endswith(".bin")}
    assert len(sealed) == 5  # k, s.null, s, ls.dict, ls
    on_disk = Checksums.parse((plain / "checksums.txt").read_bytes())
    assert block_id_of("all", sealed, True, None, 0) == block_id_of("all", on_disk.files, True, None, 0)


def test_column_threads_are_the_process_pool_and_write_the_same_bytes(tmp_path: Path) -> None:
    """A part of PARALLEL_MIN_ROWS rows or more is written by the process's column threads (no pool
    started per part): the same files, byte for byte, as one thread writes; repeated parts reuse the
    threads; a failing column job leaves no job running and no directory behind."""
    import threading

    from replicad.storage import writer as writer_mod

    n = writer_mod.PARALLEL_MIN_ROWS + 100
    rng = np.random.default_rng(11)
    t = pa.table({"k": pa.array(rng.integers(0, 1000, n).astype(np.uint64)),
                  "s": pa.array([b"r%d" % (i % 97) for i in range(n)])})
    cols = [("k", T("UInt64")), ("s", T("String"))]
    order = sort_indices([t.column("k")])

    def write(name: str, threads: int) -> dict[str, bytes]:
        s = WriterSettings(fsync=False, threads=threads)
        with PartWriter(tmp_path / name, cols, s, primary_key=["k"]) as w:
            w.write(t, order=order)
            w.finish()
        return {p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())}

    one = write("one", 1)
    assert write("two", 2) == one
    pool = writer_mod.column_pool(2)
    workers = {th.ident for th in threading.enumerate() if th.name.startswith("part-writer")}
    for i in range(3):
        assert write(f"again{i}", 2) == one
    assert writer_mod.column_pool(2) is pool
    assert {th.ident for th in threading.enumerate() if th.name.startswith("part-writer")} == workers
    assert 0 < len(workers) <= 2

    fake: Any = _Exploding()
    bad = pa.table({"a": pa.array(np.ones(n, np.uint8)), "x": pa.array(np.ones(n, np.uint8))})
    w = PartWriter(tmp_path / "tmp_insert_bad", [("a", T("UInt8")), ("x", fake)],
                   WriterSettings(fsync=False, threads=2))
    with pytest.raises(ValueError, match="boom"):
        w.write(bad)
    assert not (tmp_path / "tmp_insert_bad").exists()
    assert pool.submit(lambda: 7).result(timeout=10) == 7  # the shared threads still serve
