"""mutate_part: DELETE / UPDATE on one part, checked against a reference computed directly in pyarrow."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import BadInputError
from replicad.storage.merge import PartSchema, TableKeys
from replicad.storage.mutate import MutationCommand, iter_mutated, mutate_part
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader
from replicad.storage.writer import WriterSettings

U32 = parse_type("UInt32")
COLUMNS = tuple(
    (n, parse_type(t))
    for n, t in [
        ("d", "Date"),
        ("k", "UInt64"),
        ("u", "UInt8"),
        ("s", "String"),
        ("f", "Float64"),
        ("e", "Int32"),
    ]
)
SCHEMA = PartSchema(COLUMNS, "toYYYYMM(d)", "(k, intDiv(e, 10))", "k")
SETTINGS = WriterSettings(index_granularity=16, fsync=False, threads=1)


def make_table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "d": pa.array(rng.integers(19754, 19780, n).astype(np.int32)).cast(pa.date32()),
            "k": pa.array(np.arange(n, dtype=np.uint64) * 3),
            "u": pa.array(rng.integers(0, 256, n).astype(np.uint8)),
            "s": pa.array([b"s%d" % i for i in rng.integers(0, 50, n)], pa.binary()),
            "f": pa.array(np.round(rng.normal(size=n), 2)),
            "e": pa.array(np.arange(n, dtype=np.int32)),
        }
    )


def write_source(path: Path, table: pa.Table) -> Path:
    keys = TableKeys(SCHEMA)
    with keys.writer(path, SETTINGS, [(U32, 202402)]) as w:
        w.write(table, keys.primary_arrays(table))
        w.finish()
    return path


def inodes(path: Path) -> dict[str, int]:
    return {f: os.stat(path / f).st_ino for f in os.listdir(path)}


# ---- reference: the same commands applied with pyarrow ----------------------------------------------


@dataclass(frozen=True)
class Case:
    """A command and its pyarrow reference: ``where(table) -> bool mask``, updates as column functions."""

    command: MutationCommand
    where: Callable[[pa.Table], np.ndarray]
    updates: tuple[tuple[str, Callable[[pa.Table], pa.Array]], ...] = ()


def _np(t: pa.Table, c: str) -> np.ndarray:
    return np.asarray(t.column(c).to_numpy())


def delete_u_below(x: int) -> Case:
    return Case(MutationCommand.delete(f"u < {x}"), lambda t: _np(t, "u") < x)


def delete_k_mod(m: int, r: int) -> Case:
    return Case(MutationCommand.delete(f"k % {m} = {r}"), lambda t: _np(t, "k") % m == r)


def bump_u(a: int, m: int) -> Case:
    # UPDATE u = u + a: UInt16 arithmetic, CAST back to UInt8 wraps
    return Case(
        MutationCommand.update([("u", f"u + {a}")], f"e % {m} = 0"),
        lambda t: _np(t, "e") % m == 0,
        (("u", lambda t: pa.array(((_np(t, "u").astype(np.int64) + a) % 256).astype(np.uint8))),),
    )


def tag_s_scale_f(x: int) -> Case:
    # two simultaneous assignments, the second reading a column the first one changes
    return Case(
        MutationCommand.update([("s", "concat(s, toString(u))"), ("u", "0"), ("f", "f * 2")], f"u > {x}"),
        lambda t: _np(t, "u") > x,
        (
            (
                "s",
                lambda t: pc.binary_join_element_wise(
                    t.column("s"), pc.cast(pc.cast(t.column("u"), pa.string()), pa.binary()), b""
                ),
            ),
            ("u", lambda t: pa.array(np.zeros(t.num_rows, np.uint8))),
            ("f", lambda t: pc.multiply(t.column("f"), 2.0)),
        ),
    )


def reference(table: pa.Table, cases: list[Case]) -> pa.Table:
    for case in cases:
        mask = case.where(table)
        if case.command.kind == "DELETE":
            table = table.filter(pa.array(~mask))
            continue
        new = {c: fn(table) for c, fn in case.updates}
        for c, values in new.items():
            values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
            old = table.column(c).combine_chunks()
            table = table.set_column(
                table.schema.get_field_index(c), c, pc.if_else(pa.array(mask), values.cast(old.type), old)
            )
    return table


case_strategy = st.one_of(
    st.integers(0, 256).map(delete_u_below),
    st.tuples(st.integers(1, 7), st.integers(0, 6)).map(lambda mr: delete_k_mod(*mr)),
    st.tuples(st.integers(0, 300), st.integers(1, 5)).map(lambda am: bump_u(*am)),
    st.integers(0, 255).map(tag_s_scale_f),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(0, 200),
    seed=st.integers(0, 1000),
    cases=st.lists(case_strategy, min_size=1, max_size=3),
    granules=st.integers(1, 4),
)
def test_mutation_matches_pyarrow_reference(
    tmp_path_factory: pytest.TempPathFactory, n: int, seed: int, cases: list[Case], granules: int
) -> None:
    tmp = tmp_path_factory.mktemp("mutate")
    table = make_table(n, seed)
    source = write_source(tmp / "src", table)
    result = mutate_part(
        source, tmp / "out", SCHEMA, [c.command for c in cases], SETTINGS, granules_per_batch=granules
    )
    expected = reference(table, cases)
    got = PartReader(result.path, index_granularity=16).read()
    assert got.equals(expected)
    assert result.rows == expected.num_rows
    PartDirectory(result.path).verify(require_all_files_listed=True)
    streamed = list(iter_mutated(source, SCHEMA, [c.command for c in cases], index_granularity=16))
    assert pa.concat_tables([pa.Table.from_pylist([], schema=got.schema), *streamed]).equals(expected)

    touched = any(c.where(t).any() for c, t in zip(cases, [table] * len(cases), strict=True))
    linked = {f for f, ino in inodes(result.path).items() if inodes(source).get(f) == ino}
    if not touched:
        assert linked == set(os.listdir(source))
    elif all(c.command.kind == "UPDATE" for c in cases):
        assert {"k.bin", "k.mrk", "primary.idx", "count.txt"} <= linked
        assert "checksums.txt" not in linked and "u.bin" not in linked
    else:
        assert not linked


# ---- the three outcomes -----------------------------------------------------------------------------


def test_untouched_part_is_cloned(tmp_path: Path) -> None:
    source = write_source(tmp_path / "src", make_table(100, 1))
    result = mutate_part(source, tmp_path / "out", SCHEMA, [MutationCommand.delete("k > 1000000")], SETTINGS)
    assert inodes(result.path) == inodes(source)
    assert (
        result.checksums == PartDirectory(source).checksums and result.rows == 100 and result.marks_count == 7
    )


def test_update_rewrites_only_updated_columns(tmp_path: Path) -> None:
    table = make_table(100, 2)
    source = write_source(tmp_path / "src", table)
    result = mutate_part(
        source, tmp_path / "out", SCHEMA, [MutationCommand.update([("f", "f + 1")], "k < 30")], SETTINGS
    )
    before, after = inodes(source), inodes(result.path)
    assert sorted(after) == sorted(before)
    assert {f for f in after if after[f] != before[f]} == {"f.bin", "f.mrk", "checksums.txt", "columns.txt"}
    src_sums, new_sums = PartDirectory(source).checksums.files, result.checksums.files
    assert {f for f in new_sums if new_sums[f] != src_sums[f]} == {"f.bin"}  # f.mrk: same offsets
    got = PartReader(result.path, index_granularity=16).read()
    f = table.column("f").to_numpy()
    assert got.column("f").to_pylist() == list(np.where(np.arange(100) * 3 < 30, f + 1, f))
    assert not (result.path / "updated_columns.tmp").exists()


def test_delete_rewrites_and_recomputes_minmax(tmp_path: Path) -> None:
    table = make_table(300, 3)
    source = write_source(tmp_path / "src", table)
    result = mutate_part(
        source, tmp_path / "out", SCHEMA, [MutationCommand.delete("d != toDate('2024-02-10')")], SETTINGS
    )
    part = PartDirectory(result.path)
    lo, hi = part.minmax("d", parse_type("Date"))  # type: ignore[misc]
    assert str(lo) == str(hi) == "2024-02-10"
    assert not set(inodes(result.path).values()) & set(inodes(source).values())
    assert part.partition_dat == PartDirectory(source).partition_dat


def test_deleting_every_row_leaves_an_empty_part_like_18_16(tmp_path: Path) -> None:
    source = write_source(tmp_path / "src", make_table(50, 4))
    result = mutate_part(source, tmp_path / "out", SCHEMA, [MutationCommand.delete("1")], SETTINGS)
    assert result.rows == 0 and result.marks_count == 0
    files = sorted(os.listdir(result.path))
    assert not [f for f in files if f.startswith("minmax_")]
    assert {"partition.dat", "count.txt", "primary.idx", "k.bin", "k.mrk"} <= set(files)
    for f in files:
        if f.endswith((".bin", ".mrk")) or f == "primary.idx":
            assert os.path.getsize(result.path / f) == 0, f
    assert (result.path / "count.txt").read_bytes() == b"0"
    PartDirectory(result.path).verify(require_all_files_listed=True)


def test_batching_does_not_change_bytes(tmp_path: Path) -> None:
    source = write_source(tmp_path / "src", make_table(500, 5))
    commands = [MutationCommand.update([("u", "u * 3")], "e % 2 = 0"), MutationCommand.delete("u < 100")]
    sums = {
        g: mutate_part(source, tmp_path / f"o{g}", SCHEMA, commands, SETTINGS, granules_per_batch=g).checksums
        for g in (1, 3, 64)
    }
    assert len({s.to_bytes() for s in sums.values()}) == 1


# ---- validation and command records -----------------------------------------------------------------


@pytest.mark.parametrize(("column", "code"), [("k", 420), ("e", 420), ("d", 420), ("nope", 16)])
def test_refused_updates(tmp_path: Path, column: str, code: int) -> None:
    source = write_source(tmp_path / "src", make_table(10, 6))
    with pytest.raises(BadInputError) as err:
        mutate_part(
            source, tmp_path / "out", SCHEMA, [MutationCommand.update([(column, "1")], "1")], SETTINGS
        )
    assert err.value.code == code
    assert not (tmp_path / "out").exists()


def test_null_in_non_nullable_column_is_refused(tmp_path: Path) -> None:
    source = write_source(tmp_path / "src", make_table(10, 7))
    with pytest.raises(BadInputError):
        mutate_part(
            source, tmp_path / "out", SCHEMA, [MutationCommand.update([("u", "NULL")], "1")], SETTINGS
        )


def test_command_records() -> None:
    assert MutationCommand.coerce(("delete", "x = 1")) == MutationCommand.delete("x = 1")
    assert MutationCommand.coerce(("UPDATE", "1", [("a", "2")])) == MutationCommand.update([("a", "2")], "1")

    @dataclass
    class Record:
        kind: str
        predicate: str
        assignments: dict[str, str]

    assert MutationCommand.coerce(Record("UPDATE", "p", {"a": "1", "b": "2"})) == MutationCommand(
        "UPDATE", "p", (("a", "1"), ("b", "2"))
    )
    for bad in [("DELETE", "p", [("a", "1")]), ("UPDATE", "p"), ("DROP", "p"), 42]:
        with pytest.raises(BadInputError):
            MutationCommand.coerce(bad)


def test_commands_as_mutation_entry_text_and_sql_records(tmp_path: Path) -> None:
    statements = pytest.importorskip("replicad.sql.statements")
    table = make_table(200, 8)
    source = write_source(tmp_path / "src", table)
    text = "UPDATE u = u + 1, s = concat(s, 'x') WHERE (k % 3) = 0, DELETE WHERE u < 50 "
    ours = [
        MutationCommand.update([("u", "u + 1"), ("s", "concat(s, 'x')")], "(k % 3) = 0"),
        MutationCommand.delete("u < 50"),
    ]
    expected = mutate_part(source, tmp_path / "a", SCHEMA, ours, SETTINGS).checksums
    assert mutate_part(source, tmp_path / "b", SCHEMA, text, SETTINGS).checksums == expected
    records = statements.parse_mutation_commands(text)
    assert mutate_part(source, tmp_path / "c", SCHEMA, records, SETTINGS).checksums == expected


def test_update_to_null_keeps_the_values_underneath(tmp_path: Path) -> None:
    cols = (*COLUMNS, ("n", parse_type("Nullable(Int32)")))
    sch = PartSchema(cols, "toYYYYMM(d)", "k")
    table = make_table(40, 9).append_column("n", pa.array(range(40), pa.int32()))
    keys = TableKeys(sch)
    with keys.writer(tmp_path / "src", SETTINGS, [(U32, 202402)]) as w:
        w.write(table)
        w.finish()
    batches = list(
        iter_mutated(
            tmp_path / "src",
            sch,
            [MutationCommand.update([("n", "NULL")], "e % 2 = 0")],
            index_granularity=16,
        )
    )
    n = pa.concat_arrays([b.column("n").combine_chunks() for b in batches])
    assert n.to_pylist() == [None if i % 2 == 0 else i for i in range(40)]
    values = np.frombuffer(n.buffers()[1], np.int32, count=len(n) + n.offset)[n.offset :]
    assert values.tolist() == list(range(40))  # 18.16 leaves the old values in n.bin under the NULLs


def test_update_recomputes_materialized_columns(tmp_path: Path) -> None:
    cols = (*COLUMNS, ("m", parse_type("String")), ("m2", parse_type("UInt64")))
    defaults = (("m", "MATERIALIZED", "concat(s, '!')"), ("m2", "MATERIALIZED", "k + 1000"))
    sch = PartSchema(cols, "toYYYYMM(d)", "k", defaults=defaults)
    table = make_table(30, 10)
    table = table.append_column("m", pc.binary_join_element_wise(table.column("s"), b"!", b""))
    table = table.append_column(
        "m2", pc.add(table.column("k"), pa.scalar(1, pa.uint64()))
    )  # an older expression: k + 1
    keys = TableKeys(sch)
    with keys.writer(tmp_path / "src", SETTINGS, [(U32, 202402)]) as w:
        w.write(table)
        w.finish()
    # u is read by no MATERIALIZED expression: only u is rewritten
    only_u = mutate_part(
        tmp_path / "src", tmp_path / "a", sch, [MutationCommand.update([("u", "1")], "1")], SETTINGS
    )
    assert {
        f
        for f, c in only_u.checksums.files.items()
        if PartDirectory(tmp_path / "src").checksums.files[f] != c
    } == {"u.bin"}
    # s is: every MATERIALIZED column is recomputed for every row
    got = PartReader(
        mutate_part(
            tmp_path / "src", tmp_path / "b", sch, [MutationCommand.update([("s", "'X'")], "k = 3")], SETTINGS
        ).path,
        index_granularity=16,
    ).read()
    assert got.column("m").to_pylist()[:2] == [table.column("m")[0].as_py(), b"X!"]
    assert got.column("m2").to_pylist() == [k + 1000 for k in table.column("k").to_pylist()]


def test_missing_column_is_computed_from_its_default(tmp_path: Path) -> None:
    source = write_source(tmp_path / "src", make_table(20, 11))
    cols = (*COLUMNS, ("z", parse_type("UInt64")))
    sch = PartSchema(cols, "toYYYYMM(d)", "k", defaults=(("z", "DEFAULT", "k * 10"),))
    result = mutate_part(source, tmp_path / "out", sch, [MutationCommand.delete("k = 3")], SETTINGS)
    got = PartReader(result.path, index_granularity=16).read()
    assert got.column("z").to_pylist() == [k * 10 for k in got.column("k").to_pylist()]
    assert 3 not in got.column("k").to_pylist()
