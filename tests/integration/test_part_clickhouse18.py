"""Part format against a real ClickHouse 18.16 server.

* 18.16 inserts rows (TSV over HTTP); PartReader reads its part -> exactly those rows.
* replicad writes the same rows; 18.16 ATTACHes the part -> same SELECT answer, also after a merge.
* The same rows written by 18.16 and by replicad (LZ4 and ZSTD servers) give byte-identical files:
  .bin/.mrk/primary.idx/minmax/partition.dat/count.txt/columns.txt/checksums.txt.  This proves the
  block-cutting rule (min_compress_block_size before each granule, 1 MiB cuts inside granules).
"""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from replicad.datatypes import parse_type
from replicad.devtools.clickhouse import ClickHouseServer
from replicad.storage.compression import compress_block, iter_blocks
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader
from replicad.storage.writer import PartWriter, WriterSettings
from tests.support.part_rows import ALL_TYPES, LOW_CARDINALITY, ddl_columns, make_rows

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse]

PARTITION = 202402  # make_rows puts every Date in February 2024
PROFILE = {"allow_experimental_low_cardinality_type": 1}
ZSTD_CONFIG = (
    "<compression><case><min_part_size>0</min_part_size><min_part_size_ratio>0</min_part_size_ratio>"
    "<method>zstd</method></case></compression>"
)
BYTE_COLUMNS = ALL_TYPES
BIG_STRINGS = [("k", "UInt64"), ("d", "Date"), ("big", "String")]
#: a realistic LowCardinality column: a few hundred distinct values
LOW_CARD = [("k", "UInt64"), ("d", "Date"), ("lc", "LowCardinality(String)")]
#: Nested columns share one array-sizes stream, n.size0
NESTED = [("k", "UInt64"), ("d", "Date"), ("n.a", "Array(UInt16)"), ("n.b", "Array(String)"), ("x", "UInt8")]


def _server(base: Path, extra: str = "") -> ClickHouseServer:
    return ClickHouseServer(base, profile_settings=PROFILE, extra_config=extra)


@pytest.fixture(scope="module")
def ch_lz4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    with _server(tmp_path_factory.mktemp("ch18_lz4")) as ch:
        yield ch


@pytest.fixture(scope="module")
def ch_zstd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    with _server(tmp_path_factory.mktemp("ch18_zstd"), ZSTD_CONFIG) as ch:
        yield ch


def create_table(ch: ClickHouseServer, name: str, columns: list[tuple[str, str]]) -> None:
    ch.query(f"DROP TABLE IF EXISTS {name}")
    ch.query(
        f"CREATE TABLE {name} ({ddl_columns(columns)}) ENGINE = MergeTree "
        "PARTITION BY toYYYYMM(d) ORDER BY k SETTINGS index_granularity = 8192"
    )


def only_part(ch: ClickHouseServer, table: str) -> Path:
    rows = ch.query_rows(f"SELECT name FROM system.parts WHERE table = '{table}' AND active")
    assert len(rows) == 1, rows
    return ch.table_dir("default", table) / rows[0][0]


def write_part(
    path: Path, columns: list[tuple[str, str]], table: pa.Table, method: str, one_batch: bool = False
) -> Path:
    """Write ``table`` in odd batch sizes (granules carry across write() calls) or, with ``one_batch``,
    in one call like 18.16's single insert block: LowCardinality starts a new index header for every
    piece of a granule that a write() call (an 18.16 block) delivers."""
    types = [(n, parse_type(t)) for n, t in columns]
    settings = WriterSettings(method=method, fsync=False)  # type: ignore[arg-type]
    with PartWriter(path, types, settings, primary_key=["k"], minmax_columns=["d"],
                    partition_value=[(parse_type("UInt32"), PARTITION)]) as w:
        pos, step = 0, table.num_rows if one_batch else 3001
        while pos < table.num_rows:
            w.write(table.slice(pos, step))
            pos += step
            step = 5000 if step == 3001 else 3001
        w.finish()
    return path


def _zstd_like_18_16() -> bool:
    """Does compress_block('zstd') produce what 18.16's libzstd (the system libzstd.so.1) produces?"""
    try:
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        return True  # nothing to compare with
    lib.ZSTD_compress.restype = ctypes.c_size_t
    lib.ZSTD_compressBound.restype = ctypes.c_size_t
    data = b"".join(bytes([97 + i % 26]) * (150 + i % 101) for i in range(8000))[:1048576]
    cap = lib.ZSTD_compressBound(ctypes.c_size_t(len(data)))
    dst = ctypes.create_string_buffer(cap)
    n = lib.ZSTD_compress(dst, ctypes.c_size_t(cap), data, ctypes.c_size_t(len(data)), ctypes.c_int(1))
    return compress_block(data, "zstd")[25:] == dst.raw[:n]


def nested_rows(n: int) -> tuple[pa.Table, bytes]:
    base, _ = make_rows([("k", "UInt64"), ("d", "Date"), ("x", "UInt8")], n, seed=4)
    lens = [i % 4 for i in range(n)]
    a = [[(i * 7 + j) % 65536 for j in range(ln)] for i, ln in enumerate(lens)]
    b = [[b"s%d" % (i + j) for j in range(ln)] for i, ln in enumerate(lens)]
    table = pa.table({
        "k": base.column("k"), "d": base.column("d"), "n.a": pa.array(a, pa.list_(pa.uint16())),
        "n.b": pa.array(b, pa.list_(pa.binary())), "x": base.column("x"),
    })
    lines = []
    for k, d, xa, xb, x in zip(range(n), base.column("d").to_pylist(), a, b, base.column("x").to_pylist(),
                               strict=True):
        sa = "[" + ",".join(map(str, xa)) + "]"
        sb = "[" + ",".join("'" + v.decode() + "'" for v in xb) + "]"
        lines.append(f"{k}\t{d}\t{sa}\t{sb}\t{x}\n")
    return table, "".join(lines).encode()


def select_all(ch: ClickHouseServer, table: str) -> str:
    return ch.query(f"SELECT * FROM {table} ORDER BY k FORMAT TabSeparated")


def test_read_part_written_by_18_16(ch_lz4: ClickHouseServer) -> None:
    table, tsv = make_rows(ALL_TYPES, 20000, seed=1)
    create_table(ch_lz4, "t_read", ALL_TYPES)
    ch_lz4.query("INSERT INTO t_read FORMAT TabSeparated", data=tsv)
    part_dir = only_part(ch_lz4, "t_read")
    PartDirectory.at(part_dir).verify(require_all_files_listed=True)
    reader = PartReader(part_dir, verify=True)
    assert reader.rows == 20000 and reader.granules == 3
    got = reader.read()
    assert got.schema.names == [n for n, _ in ALL_TYPES]
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name
    batches = list(reader.iter_batches(granules_per_batch=1))
    assert [b.num_rows for b in batches] == [8192, 8192, 3616]
    assert pa.concat_tables(batches).equals(got)


def test_18_16_attaches_replicad_part(ch_lz4: ClickHouseServer) -> None:
    table, tsv = make_rows(ALL_TYPES, 20000, seed=2)
    create_table(ch_lz4, "t_ins", ALL_TYPES)
    ch_lz4.query("INSERT INTO t_ins FORMAT TabSeparated", data=tsv)
    create_table(ch_lz4, "t_att", ALL_TYPES)
    name = f"{PARTITION}_1_1_0"
    write_part(ch_lz4.table_dir("default", "t_att") / "detached" / name, ALL_TYPES, table, "zstd")
    ch_lz4.query(f"ALTER TABLE t_att ATTACH PART '{name}'")
    assert ch_lz4.query("SELECT count() FROM t_att") == "20000\n"
    assert select_all(ch_lz4, "t_att") == select_all(ch_lz4, "t_ins")
    # (18.16 has no CHECK TABLE for MergeTree.)  A merge re-reads and re-writes every column.
    ch_lz4.query("OPTIMIZE TABLE t_att FINAL")
    assert ch_lz4.query_rows("SELECT name FROM system.parts WHERE table = 't_att' AND active") == [
        [f"{PARTITION}_1_1_1"]]
    assert select_all(ch_lz4, "t_att") == select_all(ch_lz4, "t_ins")
    # primary key and minmax index are usable: a point query hits the right granule
    assert ch_lz4.query("SELECT count() FROM t_att WHERE k = 12345 AND d >= '2024-02-01'") == "1\n"


@pytest.mark.parametrize("method", ["lz4", "zstd"])
@pytest.mark.parametrize(
    "columns",
    [BYTE_COLUMNS, BIG_STRINGS, NESTED, LOW_CARD],
    ids=["all_types", "big_strings", "nested", "low_cardinality"],
)
def test_byte_identical_with_18_16(
    ch_lz4: ClickHouseServer, ch_zstd: ClickHouseServer, tmp_path: Path, method: str,
    columns: list[tuple[str, str]],
) -> None:
    ch = ch_lz4 if method == "lz4" else ch_zstd
    if method == "zstd" and columns is BIG_STRINGS and not _zstd_like_18_16():
        pytest.xfail("compression.compress_block('zstd') (python-zstandard) differs from 18.16's system "
                     "libzstd on large compressible blocks; block cuts and marks are checked by the LZ4 case")
    n = 30000
    table, tsv = make_rows(columns, n, seed=3)
    if columns is BIG_STRINGS:  # 150-250 byte strings: 8192-row granules exceed 1 MiB
        big = [bytes([97 + i % 26]) * (150 + i % 101) for i in range(n)]
        table = table.set_column(2, "big", pa.array(big, pa.binary()))
        tsv = "".join(f"{k}\t{d}\t{b.decode()}\n" for k, d, b in zip(
            range(n), table.column("d").to_pylist(), big, strict=True)).encode()
    if columns is NESTED:  # the arrays of one Nested structure must have equal lengths in every row
        table, tsv = nested_rows(n)
    if columns is LOW_CARD:
        if not LOW_CARDINALITY:
            pytest.skip("LowCardinality(String) is not implemented")
        values = [b"v%d" % ((i * 7919) % 300) for i in range(n)]
        table = table.set_column(2, "lc", pa.array(values, pa.binary()))
        tsv = "".join(f"{k}\t{d}\t{v.decode()}\n" for k, d, v in zip(
            range(n), table.column("d").to_pylist(), values, strict=True)).encode()
    create_table(ch, "t_bytes", columns)
    ch.query("INSERT INTO t_bytes FORMAT TabSeparated", data=tsv)
    theirs = only_part(ch, "t_bytes")
    stateful = any(t.startswith("LowCardinality") for _, t in columns)
    ours = write_part(tmp_path / theirs.name, columns, table, method, one_batch=stateful)
    assert PartReader(theirs).read().equals(table)
    their_files = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == their_files
    different = [f for f in their_files if (theirs / f).read_bytes() != (ours / f).read_bytes()]
    assert different == []
    if columns is BIG_STRINGS:
        blocks = [len(p) for _, p in iter_blocks((ours / "big.bin").read_bytes())]
        assert 1048576 in blocks  # a block was cut inside a granule
    shutil.rmtree(ours)


@pytest.mark.parametrize("method", ["lz4", "zstd"])
@pytest.mark.parametrize(("columns", "n"), [([c for c in BYTE_COLUMNS if c[0] != "lc"], 1000), (NESTED, 1000),
                                            ([c for c in BYTE_COLUMNS if c[0] != "lc"], 20_000)],
                         ids=["all_types", "nested", "all_types_3_granules"])
def test_small_part_byte_identical_with_18_16(
    ch_lz4: ClickHouseServer, ch_zstd: ClickHouseServer, tmp_path: Path, method: str,
    columns: list[tuple[str, str]], n: int,
) -> None:
    """A part as an insert block writes it (SmallPartWriter, rows given out of order with the ORDER BY
    permutation), of one granule or three, is byte for byte the part 18.16 makes of the same insert."""
    from replicad.storage.block import sort_indices
    from replicad.storage.small_part import SmallPartWriter

    ch = ch_lz4 if method == "lz4" else ch_zstd
    table, tsv = make_rows(columns, n, seed=11)
    if columns is NESTED:
        table, tsv = nested_rows(n)
    create_table(ch, "t_small", columns)
    ch.query("INSERT INTO t_small FORMAT TabSeparated", data=tsv)
    theirs = only_part(ch, "t_small")
    shuffled = table.take(pa.array([(i * 7919 + 500) % n for i in range(n)]))  # 7919 is prime to n
    types = [(c, parse_type(t)) for c, t in columns]
    settings = WriterSettings(method=method, fsync=False)  # type: ignore[arg-type]
    ours = tmp_path / theirs.name
    with SmallPartWriter(ours, types, settings, primary_key=["k"], minmax_columns=["d"],
                         partition_value=[(parse_type("UInt32"), PARTITION)]) as w:
        w.write(shuffled, order=sort_indices([shuffled.column("k")]))
        w.finish()
    their_files = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == their_files
    different = [f for f in their_files if (theirs / f).read_bytes() != (ours / f).read_bytes()]
    assert different == []
