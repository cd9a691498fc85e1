"""SmallPartWriter (a part held whole in memory, written in one go) against PartWriter: the same files,
bytes, checksums and sealed ``.bin`` checksums, across types, NULLs, empty strings, permutations,
compression methods, block sizes, granularities and granule counts, natively and in Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import DataType, parse_type
from replicad.errors import BadInputError
from replicad.storage import small_part
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader
from replicad.storage.small_part import SmallPartWriter, small_part_fits
from replicad.storage.writer import PartWriter, WriterSettings, WrittenPart
from tests.support.part_rows import ALL_TYPES, LOW_CARDINALITY, make_rows

U32 = parse_type("UInt32")
SIMPLE = [c for c in ALL_TYPES[1:] if not c[1].startswith("LowCardinality")]


def _write(cls: Any, path: Path, cols: list[tuple[str, DataType]], s: WriterSettings, table: pa.Table,
           order: Any, keys: dict[str, pa.Array], **kw: Any) -> tuple[WrittenPart, dict[str, Any]]:
    with cls(path, cols, s, **kw) as w:
        w.write(table, keys, order=order)
        sealed = w.seal()
        return w.finish(), sealed


def _same_parts(tmp: Path, cols: list[tuple[str, DataType]], s: WriterSettings, table: pa.Table,
                order: Any = None, keys: dict[str, pa.Array] | None = None, **kw: Any) -> None:
    big, big_sealed = _write(PartWriter, tmp / "big", cols, s, table, order, keys or {}, **kw)
    small, small_sealed = _write(SmallPartWriter, tmp / "small", cols, s, table, order, keys or {}, **kw)
    names = sorted(p.name for p in big.path.iterdir())
    assert sorted(p.name for p in small.path.iterdir()) == names
    different = [f for f in names if (big.path / f).read_bytes() != (small.path / f).read_bytes()]
    assert different == []
    assert small_sealed == big_sealed
    assert (small.rows, small.marks_count, small.checksums, small.columns_text, small.bytes_on_disk) == (
        big.rows, big.marks_count, big.checksums, big.columns_text, big.bytes_on_disk)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chosen=st.lists(st.sampled_from(SIMPLE), min_size=1, max_size=6, unique=True),
    n=st.integers(1, 300),
    granularity=st.sampled_from([1, 7, 300, 8192]),
    method=st.sampled_from(["lz4", "zstd", "none"]),
    min_block=st.sampled_from([1, 8, 100, 65536]),
    max_block=st.sampled_from([16, 200, 1048576]),
    permuted=st.booleans(),
    native=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_same_bytes_as_part_writer(
    tmp_path_factory: pytest.TempPathFactory, chosen: list[tuple[str, str]], n: int, granularity: int,
    method: str, min_block: int, max_block: int, permuted: bool, native: bool, seed: int,
) -> None:
    """Every simple type (NULLs, empty strings, arrays included), permuted or not, one granule or many (of
    one row up to one granule of all rows), blocks cut before granules (min_compress_block_size) and inside
    them (a granule longer than max_compress_block_size); sealed natively, and in Python as when the
    system's compression library cannot be loaded."""
    columns = [("k", "UInt64"), *chosen]
    table, _tsv = make_rows(columns, n, seed)
    cols = [(c, parse_type(t)) for c, t in columns]
    s = WriterSettings(index_granularity=granularity, min_compress_block_size=min(min_block, max_block),
                       max_compress_block_size=max_block, method=method, fsync=False)  # type: ignore[arg-type]
    order = np.random.default_rng(seed).permutation(n).astype(np.int64) if permuted else None
    assert small_part_fits(cols, n)
    # partition key columns of every kind min/max is taken of (numpy's integer and date paths, pyarrow's)
    minmax = [c for c in ("d", "ts", "i8", "u32", "f64", "s") if c in table.column_names]
    with pytest.MonkeyPatch.context() as mp:
        if not native:
            _unloadable(mp)
        _same_parts(tmp_path_factory.mktemp("sp"), cols, s, table, order, primary_key=["k"],
                    minmax_columns=minmax, partition_value=[(U32, 202401)])


def _unloadable(mp: pytest.MonkeyPatch) -> None:
    """SmallPartWriter as where the system's compression library cannot be loaded."""
    def unloadable(*_a: Any) -> Any:
        raise OSError("cannot load libzstd.so.1")
    mp.setattr(small_part, "seal_streams", unloadable)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("as_arrow", [False, True])
def test_permuted_strings_nested_and_key_expressions(tmp_path: Path, as_arrow: bool, native: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The string columns' permuted paths (a sliced String, Nullable(String) whose NULL rows store nothing
    or store bytes), Nested arrays sharing one sizes stream, a primary key expression given as an array, an
    Arrow permutation or a numpy one; sealed natively, and in Python as when the system's compression
    library cannot be loaded."""
    if not native:
        _unloadable(monkeypatch)
    n = 20_000
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 4, n)
    t = pa.table({
        "k": pa.array(rng.integers(0, 50, n).astype(np.uint32)),
        "d": pa.array(rng.integers(19000, 19020, n).astype(np.int32), pa.date32()),
        "s": pa.array([b"x" * int(x) for x in rng.integers(0, 300, n + 3)]).slice(3),
        "ns": pa.array([None if i % 3 == 0 else b"y" * (i % 200) for i in range(n + 1)]).slice(1),
        "nv": pa.Array.from_buffers(pa.binary(), n, [
            pa.py_buffer(np.packbits(np.arange(n) % 4 != 0, bitorder="little")),
            pa.py_buffer(np.arange(n + 1, dtype=np.int32)), pa.py_buffer(b"a" * n)]),
        "n.a": pa.array([list(range(int(x))) for x in lens], pa.list_(pa.uint16())),
        "n.b": pa.array([[b"v%d" % j for j in range(int(x))] for x in lens], pa.list_(pa.binary())),
    })
    cols = [("k", U32), ("d", parse_type("Date")), ("s", parse_type("String")),
            ("ns", parse_type("Nullable(String)")), ("nv", parse_type("Nullable(String)")),
            ("n.a", parse_type("Array(UInt16)")), ("n.b", parse_type("Array(String)"))]
    key = pa.array(rng.integers(0, 7, n).astype(np.uint32), pa.uint32())
    order = np.lexsort([rng.random(n), t.column("k").to_numpy()]).astype(np.int64)
    s = WriterSettings(fsync=False)  # three granules of 8192 rows
    _same_parts(tmp_path, cols, s, t, pa.array(order) if as_arrow else order, {"e": key},
                primary_key=["k", "e"], key_types={"e": U32}, minmax_columns=["d"],
                partition_value=[(U32, 202201)])
    assert PartReader(tmp_path / "small").read().equals(t.take(order))
    PartDirectory.at(tmp_path / "small").verify(require_all_files_listed=True)


def test_fits_stateless_columns_of_at_most_4_mib() -> None:
    cols = [("k", parse_type("UInt64")), ("s", parse_type("String"))]
    assert small_part_fits(cols, 1) and small_part_fits(cols, 100) and small_part_fits(cols, 100_000)
    assert not small_part_fits(cols, 0)
    assert small_part_fits(cols, 100, 4 << 20) and not small_part_fits(cols, 100, (4 << 20) + 1)
    if LOW_CARDINALITY:
        assert not small_part_fits([*cols, ("lc", parse_type("LowCardinality(String)"))], 10)


def test_failure_removes_the_directory_and_no_rows_are_refused(tmp_path: Path) -> None:
    cols = [("k", parse_type("UInt64"))]
    s = WriterSettings(index_granularity=4, fsync=False)
    with pytest.raises(BadInputError, match="storage type"), SmallPartWriter(tmp_path / "a", cols, s) as w:
        w.write(pa.table({"k": pa.array([1, 2], pa.int32())}))
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="1 row or more"), SmallPartWriter(tmp_path / "b", cols, s) as w:
        w.write(pa.table({"k": pa.array([], pa.uint64())}))
    assert not (tmp_path / "b").exists()
    with SmallPartWriter(tmp_path / "c", cols, s) as w:  # sealed, never finished: nothing left
        w.write(pa.table({"k": pa.array([3], pa.uint64())}))
        assert set(w.seal()) == {"k.bin"}
        assert not (tmp_path / "c").exists()  # no directory, no file before finish
    assert not (tmp_path / "c").exists()


def test_directory_made_with_the_files_leftovers_replaced(tmp_path: Path) -> None:
    """The directory is made by finish, with its files; an empty one of the name is used, a leftover with
    files replaced, missing parents made (as PartWriter)."""
    cols = [("k", parse_type("UInt64"))]
    s = WriterSettings(fsync=False)
    rows = pa.table({"k": pa.array([2, 1], pa.uint64())})
    (tmp_path / "empty").mkdir()
    (tmp_path / "left").mkdir()
    (tmp_path / "left" / "junk.bin").write_bytes(b"old")
    for where in (tmp_path / "new", tmp_path / "empty", tmp_path / "left", tmp_path / "a" / "b" / "c"):
        with SmallPartWriter(where, cols, s, primary_key=["k"]) as w:
            w.write(rows, order=np.array([1, 0]))
            done = w.finish()
        assert sorted(p.name for p in where.iterdir()) == sorted(
            ["checksums.txt", "columns.txt", "count.txt", "k.bin", "k.mrk", "primary.idx"])
        assert PartReader(where).read().column("k").to_pylist() == [1, 2] and done.rows == 2


@pytest.mark.parametrize("fsync", [False, True])
def test_write_files_makes_every_file_or_names_the_failure(tmp_path: Path, fsync: bool) -> None:
    """replicad.native._files.write_files: every file whole (bytes, views, empty, a few MB), created or
    truncated, mode from the umask as os.open; a failure raises OSError with its errno and the file's path,
    and stops there; no '/' in a name."""
    import errno
    import os

    from replicad.native._files import write_files

    (tmp_path / "old.bin").write_bytes(b"x" * 100)
    big = os.urandom(3 << 20)
    write_files(tmp_path, [("a.bin", b"abc"), ("old.bin", memoryview(b"0123456789")[2:5]), ("e.txt", b""),
                           ("big.bin", big)], fsync)
    assert (tmp_path / "a.bin").read_bytes() == b"abc" and (tmp_path / "old.bin").read_bytes() == b"234"
    assert (tmp_path / "e.txt").read_bytes() == b"" and (tmp_path / "big.bin").read_bytes() == big
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(FileNotFoundError) as gone:
        write_files(tmp_path / "missing", [("a", b"1")], fsync)
    assert gone.value.errno == errno.ENOENT and gone.value.filename == str(tmp_path / "missing")
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError) as isdir:
        write_files(tmp_path, [("f1", b"1"), ("d", b"2"), ("f3", b"3")], fsync)
    assert isdir.value.filename == str(tmp_path / "d")
    assert (tmp_path / "f1").exists() and not (tmp_path / "f3").exists()
    with pytest.raises(ValueError, match="'/'"):
        write_files(tmp_path, [("d/x", b"1")], fsync)


@pytest.mark.parametrize(("rows", "value_bytes", "threads", "small"),
                         [(10, 8, 0, True), (9000, 8, 0, True), (5, 1 << 20, 0, False),
                          (3, 1 << 20, 0, False), (3, 1 << 20, 1, True)])
def test_write_temp_part_takes_the_small_writer_for_a_small_block(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, value_bytes: int, threads: int,
        small: bool) -> None:
    """An insert's part of at most 4 MiB is SmallPartWriter's, one granule or more, while other writes run
    (threads=1); a lone write of more than 2 MiB and any of more than 4 MiB go to PartWriter (same bytes
    either way)."""
    from replicad.replication import sink
    from replicad.storage.layout import TableDataLayout

    used: list[str] = []
    for cls in (SmallPartWriter, PartWriter):
        real = cls.finish
        monkeypatch.setattr(cls, "finish",
                            lambda self, real=real: used.append(type(self).__name__) or real(self))
    schema = sink.TableSchema((("k", parse_type("UInt64")), ("s", parse_type("String"))), None, "k")
    layout = TableDataLayout(tmp_path, "db", "t")
    layout.path.mkdir(parents=True)
    block = sink.PartitionBlock("all", None, pa.table({
        "k": pa.array(range(rows, 0, -1), pa.uint64()), "s": pa.array([b"v" * value_bytes] * rows)}))
    written = sink.write_temp_part(block, schema, layout, WriterSettings(fsync=False, threads=threads))
    assert used == ["SmallPartWriter" if small else "PartWriter"]
    assert PartReader(written.path).read().column("k").to_pylist() == list(range(1, rows + 1))
