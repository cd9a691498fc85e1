"""merge_parts: k-way merge of sorted parts (stable by source order), streaming, deterministic bytes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import DataType, parse_type
from replicad.errors import CorruptedDataError
from replicad.storage.merge import PartSchema, TableKeys, merge_parts
from replicad.storage.part import PartDirectory
from replicad.storage.read_ahead import ahead
from replicad.storage.reader import PartReader
from replicad.storage.writer import WriterSettings, sort_table

ROOT = Path(__file__).resolve().parents[2]
U32 = parse_type("UInt32")
COLUMNS = (("d", parse_type("Date")), ("k", parse_type("UInt16")), ("s", parse_type("String")),
           ("f", parse_type("Float64")))
SETTINGS = WriterSettings(index_granularity=8, fsync=False, threads=1)


def schema(
    order_by: str | None, primary_key: str | None = None, columns: Sequence[tuple[str, DataType]] = COLUMNS
) -> PartSchema:
    return PartSchema(tuple(columns), "toYYYYMM(d)", order_by, primary_key)


def write_part(path: Path, sch: PartSchema, table: pa.Table, settings: WriterSettings = SETTINGS) -> Path:
    """Write ``table`` sorted by the schema's key (stable), as the insert path does."""
    keys = TableKeys(sch)
    table = sort_table(table, keys.evaluate(keys.sorting, table)) if keys.sorting else table
    with keys.writer(path, settings, [(U32, 202402)]) as w:
        w.write(table, keys.primary_arrays(table))
        w.finish()
    return path


def rows_table(rows: list[tuple[int, int, bytes, float]]) -> pa.Table:
    return pa.table({
        "d": pa.array([r[0] for r in rows], pa.int32()).cast(pa.date32()),
        "k": pa.array([r[1] for r in rows], pa.uint16()),
        "s": pa.array([r[2] for r in rows], pa.binary()),
        "f": pa.array([r[3] for r in rows], pa.float64()),
    })


def py_key(order_by: str, row: dict[str, object]) -> tuple[object, ...]:
    """The sorting key in ClickHouse order, computed in plain Python (NaN after numbers)."""
    def f(v: object) -> tuple[int, object]:
        return (1, 0) if isinstance(v, float) and math.isnan(v) else (0, v)

    k, s, d, fl = row["k"], row["s"], row["d"], row["f"]
    assert isinstance(k, int)
    keys: dict[str, tuple[object, ...]] = {
        "k": (k,), "(k, s)": (k, s), "(f, k)": (f(fl), k), "s": (s,), "(intDiv(k, 3), d)": (k // 3, d),
        "f": (f(fl),),
    }
    return keys[order_by]


row_strategy = st.tuples(
    st.integers(19754, 19756),                       # three days of February 2024
    st.integers(0, 12),                              # few distinct keys: many ties
    st.binary(max_size=3).map(lambda b: b.replace(b"\x00", b"")),
    st.sampled_from([0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(st.lists(row_strategy, max_size=60), min_size=1, max_size=5),
    order_by=st.sampled_from(["k", "(k, s)", "(f, k)", "s", "(intDiv(k, 3), d)", "f"]),
    granules=st.integers(1, 3),
    prefetch=st.integers(0, 2),
    read_threads=st.integers(0, 2),
    max_round_rows=st.sampled_from([1, 3, 17, 65536]),
)
def test_merge_is_stable_sorted_concatenation(
    tmp_path_factory: pytest.TempPathFactory, parts: list[list[tuple[int, int, bytes, float]]], order_by: str,
    granules: int, prefetch: int, read_threads: int, max_round_rows: int,
) -> None:
    tmp = tmp_path_factory.mktemp("merge")
    sch = schema(order_by)
    sources = [write_part(tmp / f"p{i}", sch, rows_table(rows)) for i, rows in enumerate(parts)]
    merged = merge_parts(sources, tmp / "merged", sch, SETTINGS, granules_per_batch=granules,
                         prefetch=prefetch, read_threads=read_threads, max_round_rows=max_round_rows)

    # expected: every source's rows (as stored), concatenated in source order, stable-sorted by key
    stored = [PartReader(p).read().to_pylist() for p in sources]
    expected = sorted((r for rows in stored for r in rows), key=lambda r: py_key(order_by, r))
    got = PartReader(merged.path).read().to_pylist()
    assert merged.rows == len(expected) == len(got)
    assert [repr(r) for r in got] == [repr(r) for r in expected]  # repr: NaN == NaN, -0.0 != 0.0
    PartDirectory(merged.path).verify(require_all_files_listed=True)

    # the same rows written in one go give the same bytes: batching never shows in the result
    one = tmp / "one"
    keys = TableKeys(sch)
    table = pa.Table.from_pylist(expected, schema=PartReader(merged.path).read().schema) if expected else None
    with keys.writer(one, SETTINGS, [(U32, 202402)]) as w:
        if table is not None:
            w.write(table, keys.primary_arrays(table))
        written = w.finish()
    assert written.checksums == merged.checksums


def test_batching_and_prefetch_do_not_change_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    sch = schema("(k, s)", "k")
    sources = []
    for i in range(4):
        n = int(rng.integers(0, 3000))
        rows = [(19754 + int(rng.integers(0, 3)), int(rng.integers(0, 500)), b"x" * int(rng.integers(0, 30)),
                 float(rng.normal())) for _ in range(n)]
        sources.append(write_part(tmp_path / f"p{i}", sch, rows_table(rows), WriterSettings(fsync=False)))
    results = {
        (g, pf, rt, mr): merge_parts(sources, tmp_path / f"m{g}_{pf}_{rt}_{mr}", sch,
                                     WriterSettings(fsync=False), granules_per_batch=g, prefetch=pf,
                                     read_threads=rt, max_round_rows=mr).checksums
        for g in (1, 2, 8, 100) for pf in (0, 1) for rt in (0, 2) for mr in (100, 65536)
    }
    assert len({c.to_bytes() for c in results.values()}) == 1


def test_partition_files_and_minmax(tmp_path: Path) -> None:
    sch = schema("k")
    a = write_part(tmp_path / "a", sch, rows_table([(19754, 5, b"a", 1.0), (19760, 1, b"b", 2.0)]))
    b = write_part(tmp_path / "b", sch, rows_table([(19780, 3, b"c", 3.0)]))
    merged = merge_parts([a, b], tmp_path / "m", sch, SETTINGS)
    part = PartDirectory(merged.path)
    assert part.partition_dat == PartDirectory(a).partition_dat == (202402).to_bytes(4, "little")
    lo, hi = part.minmax("d", parse_type("Date"))  # type: ignore[misc]
    assert (str(lo), str(hi)) == ("2024-02-01", "2024-02-27")
    assert part.rows == 3 and PartReader(merged.path).read().column("k").to_pylist() == [1, 3, 5]


def test_source_without_a_new_column_reads_defaults(tmp_path: Path) -> None:
    old = schema("k")
    new_cols = (*COLUMNS, ("z", parse_type("Int32")))
    new = schema("k", columns=new_cols)
    a = write_part(tmp_path / "a", old, rows_table([(19754, 2, b"a", 1.0)]))
    t = rows_table([(19754, 1, b"b", 2.0)]).append_column("z", pa.array([7], pa.int32()))
    b = write_part(tmp_path / "b", new, t)
    merged = merge_parts([a, b], tmp_path / "m", new, SETTINGS)
    got = PartReader(merged.path).read()
    assert got.column("k").to_pylist() == [1, 2] and got.column("z").to_pylist() == [7, 0]
    assert "`z` Int32" in merged.columns_text


def test_no_sorting_key_concatenates(tmp_path: Path) -> None:
    sch = schema("tuple()")
    a = write_part(tmp_path / "a", sch, rows_table([(19754, 9, b"a", 1.0), (19754, 1, b"b", 1.0)]))
    b = write_part(tmp_path / "b", sch, rows_table([(19754, 5, b"c", 1.0)]))
    merged = merge_parts([a, b], tmp_path / "m", sch, SETTINGS)
    assert PartReader(merged.path).read().column("k").to_pylist() == [9, 1, 5]


def test_corrupt_source_fails_and_cleans_up(tmp_path: Path) -> None:
    sch = schema("k")
    a = write_part(tmp_path / "a", sch, rows_table([(19754, i, b"s", 1.0) for i in range(100)]))
    b = write_part(tmp_path / "b", sch, rows_table([(19754, i, b"t", 1.0) for i in range(100)]))
    data = bytearray((b / "s.bin").read_bytes())
    data[-1] ^= 0xFF
    (b / "s.bin").write_bytes(bytes(data))
    for prefetch, read_threads in ((0, 0), (1, 0), (0, 2), (1, 2)):
        with pytest.raises(CorruptedDataError):
            merge_parts([a, b], tmp_path / "m", sch, SETTINGS, prefetch=prefetch, read_threads=read_threads)
        assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError):
        merge_parts([], tmp_path / "m", sch, SETTINGS)
    march = rows_table([(19790, 1, b"x", 1.0)])  # 2024-03-10
    keys = TableKeys(sch)
    with keys.writer(tmp_path / "c", SETTINGS, [(U32, 202403)]) as w:
        w.write(march)
        w.finish()
    with pytest.raises(ValueError, match="different partitions"):
        merge_parts([a, tmp_path / "c"], tmp_path / "m", sch, SETTINGS)


def test_ahead_propagates_errors_and_stops_early() -> None:
    def gen() -> Iterator[int]:
        yield 1
        yield 2
        raise RuntimeError("boom")

    it = ahead(gen(), 1)
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(RuntimeError, match="boom"):
        next(it)
    endless = ahead(iter(range(10**9)), 2)
    assert next(endless) == 0
    assert isinstance(endless, Generator)
    endless.close()  # joins the producer thread


# ---- memory: flat in part size ----------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import json, re, sys, threading
    from pathlib import Path
    import pyarrow as pa
    from replicad.storage.merge import PartSchema, merge_parts
    from replicad.datatypes import DataType, parse_type
    from replicad.storage.writer import WriterSettings

    def status(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    peak_anon = 0
    done = threading.Event()

    def sample():  # the kernel keeps no high-water mark of anonymous memory alone
        global peak_anon
        while not done.wait(0.005):
            peak_anon = max(peak_anon, status("RssAnon"))

    cols = tuple((n, parse_type(t)) for n, t in [("k", "UInt64"), ("s", "String"), ("f", "Float64")])
    sch = PartSchema(cols, None, "k")
    pa.table({"x": [1]})  # one-time pyarrow imports before the baseline
    base_anon = status("RssAnon")
    threading.Thread(target=sample, daemon=True).start()
    part = merge_parts(sys.argv[2:], sys.argv[1], sch, WriterSettings(fsync=False, method="lz4"))
    done.set()
    print(json.dumps({"rows": part.rows, "anon_kb": max(peak_anon, status("RssAnon")) - base_anon,
                      "hwm_kb": status("VmHWM"), "arrow_peak": pa.default_memory_pool().max_memory()}))
""")


def _write_big_part(path: Path, rows: int, seed: int) -> Path:
    """A sorted part of ``rows`` rows (k ascending, interleaving with the other seed), written in chunks."""
    cols = (("k", parse_type("UInt64")), ("s", parse_type("String")), ("f", parse_type("Float64")))
    keys = TableKeys(PartSchema(cols, None, "k"))
    rng = np.random.default_rng(seed)
    start = 0
    with keys.writer(path, WriterSettings(fsync=False, method="lz4"), None) as w:
        for pos in range(0, rows, 1 << 18):
            n = min(1 << 18, rows - pos)
            k = start + np.cumsum(rng.integers(0, 4, n)).astype(np.uint64)
            start = int(k[-1])
            s = pa.array(np.char.add(b"value-", (k % 100000).astype("S6")).astype(object), pa.binary())
            w.write(pa.table({"k": k, "s": s, "f": rng.normal(size=n)}))
        w.finish()
    return path


def test_memory_is_flat_in_part_size(tmp_path: Path) -> None:
    figures = {}
    for total in (1_000_000, 4_000_000):
        d = tmp_path / str(total)
        sources = [_write_big_part(d / f"src{i}", total // 2, seed=i) for i in range(2)]
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(d / "merged"), *map(str, sources)],
            check=True, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        figures[total] = json.loads(out.stdout)
        assert figures[total]["rows"] == total
    small, big = figures[1_000_000], figures[4_000_000]
    print(f"merge memory, 1M vs 4M rows: anonymous RSS peak above baseline {small['anon_kb'] / 1024:.0f} vs "
          f"{big['anon_kb'] / 1024:.0f} MiB, Arrow pool peak {small['arrow_peak'] / 2**20:.0f} vs "
          f"{big['arrow_peak'] / 2**20:.0f} MiB, VmHWM (incl. mapped source files) "
          f"{small['hwm_kb'] / 1024:.0f} vs {big['hwm_kb'] / 1024:.0f} MiB")
    # 4x the rows must not mean (much) more memory: bounded by batches, not by parts
    assert big["arrow_peak"] < small["arrow_peak"] * 1.5 + (8 << 20)
    assert big["anon_kb"] < small["anon_kb"] * 1.5 + 16 * 1024


def test_missing_columns_are_computed_from_defaults(tmp_path: Path) -> None:
    old = schema("k")
    a = write_part(tmp_path / "a", old, rows_table([(19754, 2, b"a", 1.0), (19754, 4, b"b", 1.0)]))
    cols = (*COLUMNS, ("z", parse_type("UInt32")), ("m", parse_type("String")))
    new = PartSchema(cols, "toYYYYMM(d)", "k",
                     defaults=(("z", "DEFAULT", "k * 10"), ("m", "MATERIALIZED", "concat(s, 'x')")))
    t = rows_table([(19754, 3, b"c", 1.0)])
    t = t.append_column("z", pa.array([7], pa.uint32())).append_column("m", pa.array([b"q"], pa.binary()))
    b = write_part(tmp_path / "b", new, t)
    got = PartReader(merge_parts([a, b], tmp_path / "m", new, SETTINGS).path).read()
    assert got.column("z").to_pylist() == [20, 7, 40]
    assert got.column("m").to_pylist() == [b"ax", b"q", b"bx"]


def test_writer_failure_stops_reading_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from replicad.storage.writer import PartWriter

    sch = schema("k")
    sources = [write_part(tmp_path / f"p{i}", sch, rows_table([(19754, j, b"s", 1.0) for j in range(300)]))
               for i in range(3)]
    calls = []

    def failing_write(self: PartWriter, *args: object, **kwargs: object) -> None:
        calls.append(1)
        raise OSError("disk full")

    monkeypatch.setattr(PartWriter, "write", failing_write)
    before = threading.active_count()
    with pytest.raises(OSError, match="disk full"):
        merge_parts(sources, tmp_path / "m", sch, SETTINGS, granules_per_batch=1, prefetch=2, read_threads=2)
    assert calls == [1]
    assert threading.active_count() == before
    assert not (tmp_path / "m").exists()


WIDE_COLUMNS = tuple((n, parse_type(t)) for n, t in [
    ("d", "Date"), ("k", "UInt16"), ("s", "String"), ("fs", "FixedString(3)"), ("u", "UUID"),
    ("dec", "Decimal(18, 4)"), ("e", "Enum8('a' = 1, 'b' = 2)"), ("ts", "DateTime"), ("i8", "Int8"),
    ("f", "Float64"), ("ns", "Nullable(String)"), ("lc", "LowCardinality(String)"), ("arr", "Array(UInt32)"),
])


def test_serialized_columns_give_the_bytes_of_decoded_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Columns copied still serialized (no decode/encode) must give the same part as decoded ones; only
    one-stream columns no key reads are copied so."""
    rng = np.random.default_rng(7)
    sch = PartSchema(WIDE_COLUMNS, "toYYYYMM(d)", "(k, s)", "k")
    sources = []
    for i in range(3):
        n = int(rng.integers(1, 400))
        fs = [bytes(rng.integers(0, 256, 3, dtype=np.uint8)) for _ in range(n)]
        t = pa.table({
            "d": pa.array([19754] * n, pa.int32()).cast(pa.date32()),
            "k": pa.array(rng.integers(0, 50, n), pa.uint16()),
            "s": pa.array([b"\x00\xff" * int(rng.integers(0, 200)) for _ in range(n)], pa.binary()),
            "fs": pa.array(fs, pa.binary(3)),
            "u": pa.array([bytes(rng.integers(0, 256, 16, dtype=np.uint8)) for _ in range(n)], pa.binary(16)),
            "dec": pa.array([decimal_value(int(x)) for x in rng.integers(-10**9, 10**9, n)],
                            pa.decimal128(18, 4)),
            "e": pa.array(rng.integers(1, 3, n), pa.int8()),
            "ts": pa.array(rng.integers(0, 2**31, n), pa.uint32()),
            "i8": pa.array(rng.integers(-128, 128, n), pa.int8()),
            "f": pa.array([math.nan if x < 0.1 else -0.0 if x < 0.2 else x for x in rng.random(n)],
                          pa.float64()),
            "ns": pa.array([None if x < 0.3 else b"v%d" % int(x * 100) for x in rng.random(n)], pa.binary()),
            "lc": pa.array([b"x%d" % int(x) for x in rng.integers(0, 5, n)], pa.binary()),
            "arr": pa.array([list(range(int(x))) for x in rng.integers(0, 4, n)], pa.list_(pa.uint32())),
        })
        t = pa.Table.from_arrays(
            [dt.to_storage(t.column(name).combine_chunks(), name, "UTC") for name, dt in WIDE_COLUMNS],
            names=[name for name, _ in WIDE_COLUMNS])
        sources.append(write_part(tmp_path / f"p{i}", sch, t))
    keys = TableKeys(sch)
    readers = [PartReader(p, keys.types) for p in sources]
    assert keys.raw_columns(readers) == {"fs", "u", "dec", "e", "ts", "i8", "f"}  # "s" is in the key
    for r in readers:
        r.close()
    serialized = merge_parts(sources, tmp_path / "raw", sch, SETTINGS)
    monkeypatch.setattr(TableKeys, "raw_columns", lambda self, readers: frozenset())
    decoded = merge_parts(sources, tmp_path / "decoded", sch, SETTINGS)
    assert serialized.checksums == decoded.checksums
    got = PartReader(serialized.path).read().to_pylist()
    assert repr(got) == repr(PartReader(decoded.path).read().to_pylist()) and len(got) == serialized.rows


def test_serialized_string_column_rows_past_the_stream_are_corrupt(tmp_path: Path) -> None:
    """An unkeyed String column is read as serialized rows: a bad record is still a CorruptedDataError."""
    from replicad.storage.compression import compress_block

    sch = schema("k")
    a = write_part(tmp_path / "a", sch, rows_table([(19754, i, b"abc", 1.0) for i in range(5)]))
    # a valid block whose last record declares more bytes than the stream holds
    (a / "s.bin").write_bytes(compress_block(b"\x03abc" * 4 + b"\x09abc", "lz4"))
    from replicad.storage.checksums import Checksums
    part = PartDirectory(a)
    files = dict(part.checksums.files)
    (a / "checksums.txt").write_bytes(Checksums(files=files).to_bytes())
    reader = PartReader(a, dict(sch.columns))
    assert reader.raw_width("s") == 0
    with pytest.raises(CorruptedDataError, match=r"column s.*past the end"):
        reader.read_granules(0, reader.granules, raw={"s"})
    reader.close()


def test_columns_serialized_otherwise_are_decoded(tmp_path: Path) -> None:
    """A String column of a part with a separate size stream (serialization.json of current ClickHouse) or
    a Sparse column is not copied as VarUInt-prefixed records."""
    from replicad.storage.serialization import SizedStringType, SparseType

    sch = schema("k")
    a = write_part(tmp_path / "a", sch, rows_table([(19754, 1, b"abc", 1.0)]))
    reader = PartReader(a, dict(sch.columns))
    assert reader.raw_width("s") == 0 and reader.raw_width("f") == 8
    reader._serial["s"] = SizedStringType()
    reader._serial["f"] = SparseType(parse_type("Float64"))
    reader._raw_widths.clear()
    assert reader.raw_width("s") is None and reader.raw_width("f") is None
    reader.close()


def decimal_value(x: int) -> object:
    import decimal

    return decimal.Decimal(x).scaleb(-4)


@pytest.mark.parametrize("order_by", ["k", "f", "s"])
def test_equal_keys_across_a_batch_boundary_keep_source_order(tmp_path: Path, order_by: str) -> None:
    """Source 0's rows of key 5 span its batch boundary while source 1 ends its batch with them: a round
    ends at (5, source 0), so source 1 must keep its 5s back until source 0 has given all of its own."""
    # one granule of 8 rows per batch; source 1's last batch key is 9 (above the frontier)
    first = [(19754, k, f"a{i}".encode(), float(k)) for i, k in enumerate([1, 2, 3, 4, 5, 5, 5, 5, 5, 5, 7])]
    second = [(19754, k, f"b{i}".encode(), float(k)) for i, k in enumerate([5, 5, 5, 9, 9, 9, 9, 9])]
    if order_by == "s":  # the same shape with string keys; f tells the rows apart
        first = [(d, k, str(k).encode(), 100.0 + i) for i, (d, k, _s, _f) in enumerate(first)]
        second = [(d, k, str(k).encode(), 200.0 + i) for i, (d, k, _s, _f) in enumerate(second)]
    sch = schema(order_by)
    sources = [write_part(tmp_path / f"p{i}", sch, rows_table(rows))
               for i, rows in enumerate([first, second])]
    merged = merge_parts(sources, tmp_path / "merged", sch, SETTINGS, granules_per_batch=1, prefetch=0)
    got = PartReader(merged.path).read().to_pylist()
    stored = [PartReader(p).read().to_pylist() for p in sources]
    expected = sorted((r for rows in stored for r in rows), key=lambda r: py_key(order_by, r))
    assert [(r["k"], r["s"], r["f"]) for r in got] == [(r["k"], r["s"], r["f"]) for r in expected]


def test_sources_given_as_directories_are_read_with_what_they_cached(tmp_path: Path) -> None:
    """The daemon hands merge_parts its parts' PartDirectory objects: their cached count.txt and columns.txt
    are used, not read again (removed from disk here, the merge still works), and the bytes are those of a
    merge of the same parts given by path."""
    sch = schema("k")
    sources = [write_part(tmp_path / f"p{i}", sch, rows_table([(19754, 12 - i - j, b"x", 0.5)
                                                                 for j in range(5)]))
               for i in range(3)]
    by_path = merge_parts(sources, tmp_path / "by_path", sch, SETTINGS)
    dirs = [PartDirectory(p) for p in sources]
    for d in dirs:
        _ = d.rows, d.column_types  # cached, as the daemon's parts have them
        (d.path / "count.txt").unlink()
        (d.path / "columns.txt").unlink()
    by_dir = merge_parts(dirs, tmp_path / "by_dir", sch, SETTINGS)
    assert by_dir.rows == by_path.rows == 15
    names = sorted(os.listdir(by_path.path))
    assert names == sorted(os.listdir(by_dir.path))
    for name in names:
        assert (by_dir.path / name).read_bytes() == (by_path.path / name).read_bytes(), name
    with pytest.raises(CorruptedDataError):  # by path, the removed files are missed
        merge_parts(sources, tmp_path / "again", sch, SETTINGS)
