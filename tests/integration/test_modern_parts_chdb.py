"""Parts as current ClickHouse (chdb, 26.x) writes them, read by replicad's PartReader.

Every case creates a MergeTree table in chdb with some settings, inserts rows, and reads the single
part chdb wrote (``verify=True`` re-hashes every file against checksums.txt).  The rows are checked
twice: against the generated values, and against chdb's own answer: the rows replicad read are written
as an 18.16-layout Wide part (PartWriter), ATTACHed to a second chdb table, and both tables must give
the same ``SELECT * ORDER BY k``.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import UnsupportedPartFormatError
from replicad.replication.part_store import PartStore
from replicad.server.status import part_sizes
from replicad.storage.compression import iter_blocks
from replicad.storage.layout import TableDataLayout
from replicad.storage.merge import PartSchema, merge_parts
from replicad.storage.mutate import mutate_part, rewrite_part
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader, incompatibilities_with_18_16
from replicad.storage.writer import PartWriter, WriterSettings
from replicad.table_reader import TableReader
from tests.support.chdb_session import chs, q
from tests.support.part_rows import ALL_TYPES, ddl_columns, make_rows

pytest.importorskip("chdb.session")

__all__ = ["chs"]  # the chdb session fixture
pytestmark = pytest.mark.integration

_names = itertools.count()

#: current ClickHouse writing the 18.16 layout (FACTS §1.6): the table replicad's rows are attached to
COMPAT = (
    "index_granularity_bytes = 0, min_bytes_for_wide_part = 0, min_rows_for_wide_part = 0, "
    "compress_marks = 0, compress_primary_key = 0, string_serialization_version = 'single_stream', "
    "serialization_info_version = 'basic', ratio_of_defaults_for_sparse_serialization = 1, "
    "replace_long_file_name_to_hash = 0"
)
WIDE = "min_bytes_for_wide_part = 0, min_rows_for_wide_part = 0"


def data_path(chs: Any, table: str) -> Path:
    db, name = table.split(".")
    text = q(chs, "SELECT arrayJoin(data_paths) FROM system.tables "
                  f"WHERE database = '{db}' AND name = '{name}'")
    return Path(text.strip())


def only_part(chs: Any, table: str) -> Path:
    names = q(chs, f"SELECT name FROM system.parts WHERE database = 'db' AND table = '{table.split('.')[1]}' "
                   "AND active").split()
    assert len(names) == 1, names
    return data_path(chs, table) / names[0]


def create(chs: Any, columns: list[tuple[str, str]], settings: str) -> str:
    name = f"db.m{next(_names)}"
    q(chs, f"CREATE TABLE {name} ({ddl_columns(columns)}) ENGINE = MergeTree ORDER BY k"
           + (f" SETTINGS {settings}" if settings else "") + " SETTINGS allow_suspicious_codecs = 1")
    return name


def check_against_chdb(chs: Any, source: str, columns: list[tuple[str, str]], got: pa.Table) -> None:
    """``got`` (read by replicad from ``source``'s part) as an 18.16 part in chdb answers like ``source``."""
    target = create(chs, columns, "index_granularity = 8192, " + COMPAT)
    part = "all_1_1_0"
    types = [(n, parse_type(t)) for n, t in columns]
    with PartWriter(data_path(chs, target) / "detached" / part, types,
                    WriterSettings(index_granularity=8192, fsync=False), primary_key=["k"]) as w:
        w.write(got)
        w.finish()
    q(chs, f"ALTER TABLE {target} ATTACH PART '{part}'")
    assert q(chs, f"SELECT * FROM {target} ORDER BY k") == q(chs, f"SELECT * FROM {source} ORDER BY k")
    q(chs, f"DROP TABLE {target} SYNC")


def read_part(part: Path, columns: list[tuple[str, str]]) -> pa.Table:
    with PartReader(part, {n: parse_type(t) for n, t in columns}, verify=True) as reader:
        got = reader.read()
        if reader.granules > 2:  # batch reading (granule ranges inside the part) gives the same rows
            batches = pa.concat_tables(list(reader.iter_batches(granules_per_batch=2))).combine_chunks()
            assert batches.equals(got)
    return got


def run_case(chs: Any, columns: list[tuple[str, str]], settings: str, n: int, seed: int) -> Path:
    table, tsv = make_rows(columns, n, seed)
    t = create(chs, columns, settings)
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    part = only_part(chs, t)
    got = read_part(part, columns)
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name
    check_against_chdb(chs, t, columns, got)
    return part


def files(part: Path) -> set[str]:
    return {p.name for p in part.iterdir()}


def test_compact_default_settings(chs: Any) -> None:
    """chdb's defaults: a Compact part, data.cmrk4 (marks per substream), string size streams."""
    part = run_case(chs, ALL_TYPES, "index_granularity = 100", 1000, seed=1)
    f = files(part)
    assert {"data.bin", "data.cmrk4", "columns_substreams.txt", "primary.cidx", "serialization.json",
            "metadata_version.txt", "default_compression_codec.txt"} <= f
    assert "Compact part (data.bin)" in incompatibilities_with_18_16(PartDirectory.at(part))


@pytest.mark.parametrize("settings, marks", [
    ("write_marks_for_substreams_in_compact_parts = 0", "data.cmrk3"),
    ("write_marks_for_substreams_in_compact_parts = 0, compress_marks = 0", "data.mrk3"),
    ("compress_marks = 0", "data.mrk4"),
])
def test_compact_marks_variants(chs: Any, settings: str, marks: str) -> None:
    part = run_case(chs, ALL_TYPES, "index_granularity = 64, " + settings, 700, seed=2)
    assert marks in files(part)


def test_compact_single_stream_strings_and_adaptive_granules(chs: Any) -> None:
    """Strings with length prefixes (pre-25.x layout) and granules cut by bytes, not rows."""
    run_case(chs, ALL_TYPES, "index_granularity = 8192, index_granularity_bytes = 4096, "
                             "string_serialization_version = 'single_stream'", 3000, seed=3)


@pytest.mark.parametrize("layout", ["wide", "compact"])
def test_size_streams_for_top_level_strings_only(chs: Any, layout: str) -> None:
    """Before 26.3 (propagate_types_serialization_versions_to_nested_types = 0) only top-level String
    columns have a size stream; Nullable(String) and Array(String) keep length prefixes."""
    settings = "index_granularity = 100, propagate_types_serialization_versions_to_nested_types = 0"
    part = run_case(chs, ALL_TYPES, settings + (", " + WIDE if layout == "wide" else ""), 500, seed=8)
    if layout == "wide":
        assert "s.size.bin" in files(part) and "ns.size.bin" not in files(part)


def test_compact_one_granule(chs: Any) -> None:
    run_case(chs, ALL_TYPES, "", 1, seed=4)


def test_wide_default_settings(chs: Any) -> None:
    """Wide with 26.x defaults: .cmrk2 marks with the final mark, primary.cidx, String size streams."""
    part = run_case(chs, ALL_TYPES, "index_granularity = 100, " + WIDE, 1000, seed=5)
    f = files(part)
    assert {"s.size.bin", "s.size.cmrk2", "as_.size.bin", "ns.size.bin", "primary.cidx"} <= f
    reasons = incompatibilities_with_18_16(PartDirectory.at(part))
    assert any("size stream" in r for r in reasons) and any(".cmrk2" in r for r in reasons)
    marks = q(chs, f"SELECT marks FROM system.parts WHERE active AND name = '{part.name}' "
                   f"AND path LIKE '%{part.parent.name}%'")
    assert part_sizes(PartDirectory.at(part).checksums)["marks"] == int(marks)


def test_wide_adaptive_granularity_uncompressed_marks(chs: Any) -> None:
    part = run_case(chs, ALL_TYPES, f"index_granularity = 8192, index_granularity_bytes = 2048, {WIDE}, "
                                    "compress_marks = 0, compress_primary_key = 0", 2000, seed=6)
    assert "k.mrk2" in files(part) and "primary.idx" in files(part)


SPARSE_COLUMNS = [("k", "UInt64"), ("u", "UInt32"), ("i", "Int64"), ("f", "Float64"), ("s", "String"),
                  ("ts", "DateTime"), ("dec", "Decimal(18, 4)"), ("fs", "FixedString(3)"),
                  ("a", "Array(UInt8)"), ("ni", "Nullable(Int32)"), ("lc", "LowCardinality(String)"),
                  ("e", "Enum8('neg' = -5, 'z' = 0, 'p' = 3)"), ("uid", "UUID")]
SPARSE_SELECT = (
    "SELECT number, if(number % 17 = 3, number, 0), if(number % 50 = 0, -number, 0), "
    "if(number % 9 = 1, number / 4, 0), if(number % 13 = 0, toString(number), ''), "
    "if(number % 20 = 7, toDateTime(number), toDateTime(0)), if(number % 11 = 0, number / 8, 0), "
    "if(number % 7 = 0, 'abc', ''), if(number % 10 = 0, [1, 2], []), "
    "if(number % 3 = 0, toInt32(number % 2), NULL), "
    "if(number % 4 = 0, 'x', ''), if(number % 6 = 0, 'neg', if(number % 6 = 1, 'p', 'z')), "
    "if(number % 8 = 0, generateUUIDv4(), toUUID('00000000-0000-0000-0000-000000000000')) FROM numbers({n})"
)


@pytest.mark.parametrize("layout, nullable", [("wide", False), ("compact", False), ("wide", True),
                                              ("compact", True)])
def test_sparse_columns(chs: Any, layout: str, nullable: bool) -> None:
    """Sparse columns; with nullable_serialization_version = 'allow_sparse' Nullable ones too."""
    settings = "index_granularity = 128, ratio_of_defaults_for_sparse_serialization = 0.5"
    if nullable:
        settings += ", nullable_serialization_version = 'allow_sparse'"
    if layout == "wide":
        settings += ", " + WIDE
    t = create(chs, SPARSE_COLUMNS, settings)
    q(chs, f"INSERT INTO {t} " + SPARSE_SELECT.format(n=5000))
    part = only_part(chs, t)
    info = json.loads((part / "serialization.json").read_bytes())
    sparse = {c["name"] for c in info["columns"] if c["kind"] == "Sparse"}
    assert {"u", "i", "s", "ts", "dec", "e", "uid"} | ({"ni"} if nullable else set()) <= sparse, sparse
    if layout == "wide":
        assert "u.sparse.idx.bin" in files(part)
    assert any("sparse" in r for r in incompatibilities_with_18_16(PartDirectory.at(part)))
    check_against_chdb(chs, t, SPARSE_COLUMNS, read_part(part, SPARSE_COLUMNS))


def test_merged_and_column_subset(chs: Any) -> None:
    """A part merged by chdb from three inserts; reading a subset of columns of a Compact part."""
    columns = ALL_TYPES
    t = create(chs, columns, "index_granularity = 50")
    for seed in (0, 1, 2):
        _table, tsv = make_rows(columns, 300, seed)
        lines = [line.split("\t", 1) for line in tsv.decode().splitlines()]
        text = "".join(f"{int(k) + 300 * seed}\t{rest}\n" for k, rest in lines)
        chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + text)
    q(chs, f"OPTIMIZE TABLE {t} FINAL")
    part = only_part(chs, t)
    check_against_chdb(chs, t, columns, read_part(part, columns))
    subset = [c for c in columns if c[0] in ("k", "ns", "lc", "dec38")]
    with PartReader(part, {n: parse_type(ty) for n, ty in subset}) as reader:
        got = reader.read()
    assert got.column_names == [n for n, _t in subset] and got.num_rows == 900


CODEC_COLUMNS = [
    ("k", "UInt64 CODEC(Delta, LZ4)"),
    ("d8", "Int8 CODEC(Delta)"), ("d16", "UInt16 CODEC(Delta(2), ZSTD(3))"), ("d32", "Int32 CODEC(Delta(4))"),
    ("d64", "DateTime CODEC(Delta, ZSTD)"),
    ("dd8", "UInt8 CODEC(DoubleDelta)"), ("dd16", "Int16 CODEC(DoubleDelta)"),
    ("dd32", "DateTime CODEC(DoubleDelta, LZ4)"), ("dd64", "Int64 CODEC(DoubleDelta)"),
    ("g32", "Float32 CODEC(Gorilla)"), ("g64", "Float64 CODEC(Gorilla, ZSTD(1))"),
    ("gi", "UInt64 CODEC(Gorilla)"),
    ("t8", "Int8 CODEC(T64)"), ("tu16", "UInt16 CODEC(T64, LZ4)"), ("t32", "Int32 CODEC(T64('bit'))"),
    ("t64", "Int64 CODEC(T64)"), ("tu64", "UInt64 CODEC(T64('bit'), ZSTD)"), ("tdate", "Date CODEC(T64)"),
    ("tdec", "Decimal(18, 3) CODEC(T64)"),
    ("z", "String CODEC(ZSTD(9))"), ("hc", "String CODEC(LZ4HC(9))"), ("none", "Array(UInt32) CODEC(NONE)"),
    ("ns", "Nullable(Int32) CODEC(Delta, LZ4)"),
    ("gcd", "UInt32 CODEC(GCD, LZ4)"), ("gcd8", "Int64 CODEC(GCD)"), ("gcdd", "Decimal(38, 2) CODEC(GCD)"),
    ("gcdt", "DateTime CODEC(GCD, Delta, ZSTD)"),
]
CODEC_SELECT = (
    "SELECT number, toInt8(number * 7 % 256 - 128), toUInt16(number * 3), toInt32(number * number) - 5000, "
    "toDateTime(1700000000 + number * 60), toUInt8(number % 200), toInt16(number * 5 - 20000), "
    "toDateTime(1700000000 + number * number % 1000), toInt64(number * 1000003) * if(number % 3 = 0, -1, 1), "
    "toFloat32(sin(number / 10)), 1.5 + number / 100, number * 1000, toInt8(number % 100 - 50), "
    "toUInt16(number * 13 % 65536), toInt32(number % 1000 - 500), "
    "if(number % 5 = 0, -9223372036854775807, number * 12345), "
    "if(number % 7 = 0, 18446744073709551615, number), toDate('2024-02-01') + number % 30, "
    "toDecimal64(number / 8, 3) - 100, repeat(toString(number % 10), number % 20), toString(number), "
    "range(number % 4), if(number % 4 = 0, NULL, toInt32(number)), number * 12, -7 * toInt64(number), "
    "toDecimal128(number * 3, 2), toDateTime(1700000000 + number * 3600) FROM numbers({n})"
)


def _plain(columns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(n, t.split(" CODEC")[0]) for n, t in columns]


@pytest.mark.parametrize("layout", ["wide", "compact"])
def test_codecs(chs: Any, layout: str) -> None:
    """Every codec a column can have, read from chdb's part and compared with chdb's own answer."""
    settings = "index_granularity = 1000" + (", " + WIDE if layout == "wide" else "")
    t = create(chs, CODEC_COLUMNS, settings)
    q(chs, f"INSERT INTO {t} " + CODEC_SELECT.format(n=3000))
    part = only_part(chs, t)
    check_against_chdb(chs, t, _plain(CODEC_COLUMNS), read_part(part, _plain(CODEC_COLUMNS)))


def test_merge_and_mutate_modern_parts_give_18_16_parts(chs: Any, tmp_path: Path) -> None:
    """Merging chdb's Compact and Wide parts, and mutating one (even untouched), writes 18.16 Wide parts
    (``.mrk``, no serialization.json ...) with the rows chdb answers."""
    columns = [c for c in ALL_TYPES if c[0] != "d"]
    schema = PartSchema(columns=tuple((n, parse_type(t)) for n, t in columns), order_by="k")
    compact = create(chs, columns, "index_granularity = 64")
    wide = create(chs, columns, "index_granularity = 64, ratio_of_defaults_for_sparse_serialization = 0.5, "
                                + WIDE)
    table, tsv = make_rows(columns, 600, seed=21)
    for t in (compact, wide):
        chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    sources = [only_part(chs, compact), only_part(chs, wide)]
    merged = tmp_path / "merged"
    merge_parts(sources, merged, schema, WriterSettings(index_granularity=8192, fsync=False))
    assert incompatibilities_with_18_16(PartDirectory.at(merged)) == []
    assert "k.mrk" in files(merged) and "serialization.json" not in files(merged)
    got = PartReader(merged, verify=True).read()
    doubled = pa.concat_tables([table, table]).sort_by([("k", "ascending")])
    assert got.column("k").combine_chunks().equals(doubled.column("k").combine_chunks())
    both = create(chs, columns, "")
    for _ in range(2):  # the same rows twice: ties in ORDER BY k are identical rows
        chs.query(f"INSERT INTO {both} FORMAT TabSeparated\n" + tsv.decode())
    check_against_chdb(chs, both, columns, got)

    untouched = tmp_path / "untouched"
    mutate_part(sources[0], untouched, schema, [("DELETE", "k > 1000000")],
                WriterSettings(index_granularity=8192, fsync=False))
    assert incompatibilities_with_18_16(PartDirectory.at(untouched)) == []
    updated = tmp_path / "updated"
    mutate_part(sources[1], updated, schema, [("UPDATE", "k % 2 = 0", {"i32": "i32 + 1"})],
                WriterSettings(index_granularity=8192, fsync=False))
    assert incompatibilities_with_18_16(PartDirectory.at(updated)) == []
    q(chs, f"ALTER TABLE {wide} UPDATE i32 = i32 + 1 WHERE k % 2 = 0 SETTINGS mutations_sync = 2")
    check_against_chdb(chs, compact, columns, PartReader(untouched, verify=True).read())
    check_against_chdb(chs, wide, columns, PartReader(updated, verify=True).read())


@pytest.mark.parametrize("layout", ["wide", "compact"])
def test_projection_and_hashed_long_file_names(chs: Any, layout: str) -> None:
    """A projection sub-part (verified through checksums.txt, not read), skip indices, and a column whose
    stream names exceed max_file_name_length (files named by the SipHash-128 of the stream name)."""
    long_name = "a_rather_long_column_name_" * 6
    columns = [("k", "UInt64"), ("v", "String"), (long_name, "Array(String)")]
    settings = "index_granularity = 16" + (", " + WIDE if layout == "wide" else "")
    name = f"db.m{next(_names)}"
    q(chs, f"CREATE TABLE {name} ({ddl_columns(columns)}, PROJECTION pr (SELECT v, count() GROUP BY v), "
           "INDEX iv v TYPE bloom_filter GRANULARITY 2, INDEX ik k TYPE minmax GRANULARITY 1) "
           f"ENGINE = MergeTree ORDER BY k SETTINGS {settings}")
    q(chs, f"INSERT INTO {name} SELECT number, toString(number % 3), [toString(number)] FROM numbers(100)")
    part = only_part(chs, name)
    assert (part / "pr.proj" / "checksums.txt").exists()
    assert any(f.startswith("skp_idx") for f in files(part))  # skip indices: verified, not read
    if layout == "wide":
        assert not any(f.startswith(long_name) for f in files(part))
    assert "projections (*.proj)" in incompatibilities_with_18_16(PartDirectory.at(part))
    check_against_chdb(chs, name, columns, read_part(part, columns))


@st.composite
def codec_cases(draw: st.DrawFn) -> tuple[str, list[int], list[float]]:
    n = draw(st.integers(1, 1500))
    style = draw(st.sampled_from(["random", "smooth", "constant"]))
    if style == "random":
        ints = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
    elif style == "smooth":
        start, step = draw(st.integers(-(2**40), 2**40)), draw(st.integers(-1000, 1000))
        jitter = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
        ints = [start + i * step + j for i, j in enumerate(jitter)]
    else:
        ints = [draw(st.integers(-(2**63), 2**63 - 1))] * n
    floats = [float(v % 100003) / 7 if i % 5 else float(i) for i, v in enumerate(ints)]
    codec = draw(st.sampled_from(["Delta", "DoubleDelta", "Gorilla", "T64", "T64('bit')", "Delta, ZSTD",
                                  "DoubleDelta, LZ4", "T64, ZSTD(3)", "GCD", "GCD, Delta"]))
    return codec, ints, floats


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=codec_cases(), compact=st.booleans())
def test_codecs_random_values(chs: Any, case: tuple[str, list[int], list[float]], compact: bool) -> None:
    """Random and smooth sequences through chdb's own codec encoders, decoded by replicad."""
    codec, ints, floats = case
    float_codec = "Gorilla" if codec.startswith(("T64", "GCD")) else codec
    columns = [("k", "UInt64"), ("i", f"Int64 CODEC({codec})"), ("u", f"UInt16 CODEC({codec})"),
               ("f", f"Float64 CODEC({float_codec})")]
    t = create(chs, columns, "index_granularity = 512" + ("" if compact else ", " + WIDE))
    pairs = enumerate(zip(ints, floats, strict=True))
    rows = "".join(f"{k}\t{v}\t{v % 65536}\t{f!r}\n" for k, (v, f) in pairs)
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + rows)
    got = read_part(only_part(chs, t), _plain(columns))
    assert got.column("i").to_pylist() == ints
    assert got.column("u").to_pylist() == [v % 65536 for v in ints]
    assert got.column("f").to_pylist() == floats
    q(chs, f"DROP TABLE {t} SYNC")


@pytest.mark.parametrize("codec", ["FPC"])
def test_unsupported_codec_refused_by_name(chs: Any, codec: str) -> None:
    columns = [("k", "UInt64"), ("x", f"Float64 CODEC({codec})")]
    t = create(chs, columns, WIDE)
    q(chs, f"INSERT INTO {t} SELECT number, number * 6 FROM numbers(100)")
    part = only_part(chs, t)
    with pytest.raises(UnsupportedPartFormatError, match=f"unsupported compression codec {codec} in x.bin"):
        PartDirectory.at(part).verify()
    with pytest.raises(UnsupportedPartFormatError, match=f"codec {codec}"):
        PartReader(part, {n: parse_type(ty) for n, ty in _plain(columns)}).read()


def test_small_files_of_a_default_part(chs: Any) -> None:
    """What chdb writes besides the data: metadata_version.txt, default_compression_codec.txt,
    columns_substreams.txt and serialization.json are not listed in checksums.txt except the last."""
    t = create(chs, [("k", "UInt64"), ("s", "String")], "")
    q(chs, f"INSERT INTO {t} SELECT number, toString(number) FROM numbers(10)")
    part = PartDirectory.at(only_part(chs, t))
    assert part.read_bytes("metadata_version.txt") == b"0"
    assert part.read_bytes("default_compression_codec.txt") == b"CODEC(LZ4)"
    assert part.read_bytes("checksums.txt").startswith(b"checksums format version: 4\n")
    listed = set(part.checksums.files)
    assert {"data.bin", "data.cmrk4", "count.txt", "primary.cidx", "serialization.json"} == listed
    part.verify(require_all_files_listed=True)


LAYOUT_SETTINGS = {
    "wide": [WIDE, ""],
    "marks": ["", "compress_marks = 0", "write_marks_for_substreams_in_compact_parts = 0"],
    "strings": ["", "string_serialization_version = 'single_stream'",
                "propagate_types_serialization_versions_to_nested_types = 0"],
    "granules": ["", "index_granularity_bytes = 0", "index_granularity_bytes = 1024"],
    "sparse": ["", "ratio_of_defaults_for_sparse_serialization = 0.01"],
    "nullable": ["", "nullable_serialization_version = 'allow_sparse'"],
}


@st.composite
def layout_cases(draw: st.DrawFn) -> tuple[list[tuple[str, str]], int, str, int]:
    others = [c for c in ALL_TYPES if c[0] != "k"]
    chosen = draw(st.lists(st.sampled_from(others), min_size=1, max_size=8, unique=True))
    n = draw(st.integers(1, 2500))
    picked = [draw(st.sampled_from(v)) for v in LAYOUT_SETTINGS.values()]
    granularity = draw(st.sampled_from([1, 3, 64, 8192]))
    settings_ = ", ".join([f"index_granularity = {granularity}", *[p for p in picked if p]])
    return [ALL_TYPES[0], *chosen], n, settings_, draw(st.integers(0, 2**31))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=layout_cases())
def test_random_layouts(chs: Any, case: tuple[list[tuple[str, str]], int, str, int]) -> None:
    """Random columns, row counts and combinations of the layout settings: same rows as generated and
    as chdb answers."""
    columns, n, settings_, seed = case
    run_case(chs, columns, settings_, n, seed)


@pytest.mark.parametrize("n, granularity", [(5, 3), (2, 1), (40, 7)])
def test_sparse_without_adaptive_granularity(chs: Any, n: int, granularity: int) -> None:
    """Fixed granules (.mrk, no row counts) with every column sparse: the granule size comes from the
    sparse offsets (a sparse column's value stream holds only non-default rows)."""
    settings_ = (f"index_granularity = {granularity}, index_granularity_bytes = 0, {WIDE}, "
                 "ratio_of_defaults_for_sparse_serialization = 0.01")
    part = run_case(chs, [("k", "UInt64")], settings_, n, seed=9)
    assert {"k.sparse.idx.bin", "k.sparse.idx.cmrk"} <= files(part)


async def test_table_reader_filters_modern_parts(chs: Any, tmp_path: Path) -> None:
    """SELECT's read path (TableReader over a PartStore) on chdb's Compact and sparse Wide parts."""
    columns = [("k", "UInt64"), ("s", "String"), ("ni", "Nullable(Int32)"), ("a", "Array(String)")]
    layout = TableDataLayout(tmp_path, "db", "t")
    for i, extra in enumerate(["", f", {WIDE}, ratio_of_defaults_for_sparse_serialization = 0.5"]):
        t = create(chs, columns, "index_granularity = 32" + extra)
        q(chs, f"INSERT INTO {t} SELECT number + {i * 1000}, if(number % 3 = 0, toString(number), ''), "
               "if(number % 4 = 0, NULL, toInt32(number)), [toString(number % 5)] FROM numbers(500)")
        shutil.copytree(only_part(chs, t), layout.part_path(f"all_{i + 1}_{i + 1}_0"))
    store = PartStore(layout)
    await store.load()
    assert len(store.active()) == 2
    types = [(n, parse_type(ty)) for n, ty in columns]
    reader = TableReader(types, [n for n, _ in columns], store, "UTC", on_broken_part=lambda _n: None)
    got = await reader.read_all(["k", "s", "ni"], "ni > 100 AND s != ''")
    expected = [(k, str(k % 1000).encode(), k % 1000) for k in [*range(500), *range(1000, 1500)]
                if k % 1000 % 4 and k % 1000 > 100 and k % 1000 % 3 == 0]
    assert list(zip(*(got.column(c).to_pylist() for c in ("k", "s", "ni")), strict=True)) == expected


@pytest.mark.parametrize("layout", ["wide", "compact"])
def test_lightweight_delete(chs: Any, layout: str, tmp_path: Path) -> None:
    """``DELETE FROM`` of current ClickHouse masks rows with ``_row_exists``: they are not read, and a
    merge or rewrite (ATTACH's conversion) drops them."""
    columns = [c for c in ALL_TYPES if c[0] != "d"]
    _table, tsv = make_rows(columns, 700, seed=31)
    t = create(chs, columns, "index_granularity = 64" + (", " + WIDE if layout == "wide" else ""))
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    q(chs, f"DELETE FROM {t} WHERE k % 3 = 0 OR k BETWEEN 100 AND 300")
    part = only_part(chs, t)
    assert "_row_exists" in PartDirectory.at(part).columns_text
    reasons = incompatibilities_with_18_16(PartDirectory.at(part))
    assert "system columns _row_exists (rows deleted by a lightweight DELETE)" in reasons
    got = read_part(part, columns)
    assert got.num_rows == int(q(chs, f"SELECT count() FROM {t}"))
    check_against_chdb(chs, t, columns, got)
    with PartReader(part) as reader:  # all of columns.txt: the mask is applied, not returned
        assert "_row_exists" not in reader.read().column_names
    schema = PartSchema(columns=tuple((n, parse_type(ty)) for n, ty in columns), order_by="k")
    rewritten = tmp_path / "rewritten"
    rewrite_part(part, rewritten, schema, WriterSettings(index_granularity=8192, fsync=False))
    assert incompatibilities_with_18_16(PartDirectory.at(rewritten)) == []
    check_against_chdb(chs, t, columns, PartReader(rewritten, verify=True).read())


def test_compact_granules_over_several_blocks(chs: Any) -> None:
    """A Compact granule whose column data exceeds max_compress_block_size: 1 MiB blocks inside it."""
    columns = [("k", "UInt64"), ("s", "String"), ("a", "Array(String)")]
    t = create(chs, columns, "min_bytes_for_wide_part = 1000000000, min_rows_for_wide_part = 1000000000")
    q(chs, f"INSERT INTO {t} SELECT number, repeat(toString(number % 10), 300), [repeat('z', number % 500)] "
           "FROM numbers(20000)")
    part = only_part(chs, t)
    sizes = [len(b) for _off, b in iter_blocks((part / "data.bin").read_bytes())]
    assert "data.cmrk4" in files(part) and sizes.count(2**20) >= 4
    check_against_chdb(chs, t, columns, read_part(part, columns))
