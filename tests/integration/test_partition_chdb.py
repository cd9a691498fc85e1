"""Partition IDs, partition.dat and key result types checked against ClickHouse 26.9 (chdb, in-process).

For each partition expression a MergeTree table is created in chdb, a few hundred generated rows are
inserted, and ClickHouse's ``_partition_id`` of every row and ``partition.dat`` of every part are compared
with ``split_by_partition``.  Partition IDs are the same in 18.16 and 26.9 except for Decimal keys (checked
against the live-18.16 fixture in tests/unit/test_ddl.py instead) and for intDiv / % mixing signed and
unsigned operands (18.16 computes them with C++ conversions, 26.9 in signed arithmetic: see
tests/unit/test_expressions.py).  partition.dat also depends on the key's result type, which differs for
``%`` with a signed dividend (26.9 widens it), so those bytes are not compared there.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from replicad.sql.ddl import parse_create_table
from replicad.sql.expressions_lexer import quote_string
from replicad.sql.partition import split_by_partition
from replicad.storage.types import TypeSyntaxError

chdb_session = pytest.importorskip("chdb.session")

pytestmark = pytest.mark.integration

N_ROWS = 100
UUIDS = [
    "01234567-89ab-cdef-0123-456789abcdef",
    "00000000-0000-0001-0000-000000000002",
    "ffffffff-ffff-ffff-ffff-ffffffffffff",
]
STRINGS = ["", "a", "hello", "x\ty", "it's", "ünï", "\\"]
FLOATS = [1.5, -0.25, 0.1, 1e300, 0.0, 3.0]
FLOAT32S = [2.5, 0.1, -3.75, 0.0]
FIXED = ["ab", "abcd", "", "x"]

COLUMNS = (
    "rid UInt32, u64 UInt64, u32 UInt32, i32 Int32, i8 Int8, u8 UInt8, d Date, t DateTime('UTC'), "
    "tm DateTime('Europe/Moscow'), tk DateTime('Asia/Kolkata'), s String, f Float64, g Float32, "
    "fs FixedString(4)"
)
EXTRA_COLUMNS = {"uuid": "u UUID", "enum": "e Enum8('a' = 1, 'b' = 2, 'c' = -3)"}

# (partition key, extra column group or None, partition.dat comparable with 18.16's bytes)
KEYS: list[tuple[str, str | None, bool]] = [
    ("u8", None, True),
    ("i8", None, True),
    ("i32", None, True),
    ("d", None, True),
    ("t", None, True),
    ("toYYYYMM(d)", None, True),
    ("toYYYYMM(t)", None, True),
    ("toYYYYMM(tm)", None, True),
    ("toYYYYMMDD(t)", None, True),
    ("toYYYYMMDD(tk)", None, True),
    ("toDate(t)", None, True),
    ("toDate(tm)", None, True),
    ("toMonday(d)", None, True),
    ("toMonday(tm)", None, True),
    ("toStartOfMonth(d)", None, True),
    ("toStartOfMonth(t)", None, True),
    ("intDiv(u64, 1000000000000000)", None, True),
    ("intDiv(i32, -100000000)", None, True),
    ("u64 % 7", None, True),
    ("modulo(u32, 5)", None, True),
    ("i32 % 5", None, False),
    ("tuple()", None, True),
    ("(toYYYYMM(d), i8)", None, True),
    ("(toMonday(d), i8 % 3)", None, False),
    ("(intDiv(u8, 50), toStartOfMonth(d), u32 % 2)", None, True),
    ("s", None, True),
    ("(s, i8)", None, True),
    ("f", None, True),
    ("g", None, True),
    ("(f, toYYYYMM(d))", None, True),
    ("fs", None, True),
    ("(fs, s)", None, True),
    ("u", "uuid", True),
    ("(u, u8 % 2)", "uuid", True),
    ("e", "enum", True),
    ("(e, s)", "enum", True),
]


def _rows(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for rid in range(N_ROWS):
        rows.append(
            {
                "rid": rid,
                "u64": rng.choice([0, 2**64 - 1, rng.randrange(2**64)]),
                "u32": rng.randrange(2**32),
                "i32": rng.randrange(-(2**31), 2**31),
                "i8": rng.randrange(-128, 128),
                "u8": rng.randrange(256),
                "d": rng.randrange(0, 40000),
                "t": rng.randrange(0, 2**31),
                "tm": rng.randrange(0, 2**31),
                "tk": rng.randrange(0, 2**31),
                "s": rng.choice(STRINGS),
                "f": rng.choice(FLOATS),
                "g": rng.choice(FLOAT32S),
                "fs": rng.choice(FIXED),
                "u": rng.choice(UUIDS),
                "e": rng.choice("abc"),
            }
        )
    return rows


def _sql_value(name: str, v: Any) -> str:
    if name == "d":
        return f"toDate({v})"
    if name in ("t", "tm", "tk"):
        return f"toDateTime({v}, 'UTC')"
    if isinstance(v, str):
        return quote_string(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    with tempfile.TemporaryDirectory(prefix="chdb-partition-") as d:
        s = chdb_session.Session(d)
        s.query("CREATE DATABASE IF NOT EXISTS p")
        yield s
        s.cleanup() if hasattr(s, "cleanup") else None


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return _rows(random.Random(20261122))


def _storage_table(columns: list[str], rows: list[dict[str, Any]], types: dict[str, Any]) -> pa.Table:
    data = {}
    for name in columns:
        values = [r[name] for r in rows]
        if name == "d":
            arr = pa.array(values, pa.int32()).cast(pa.date32())
        elif name in ("t", "tm", "tk"):
            arr = pa.array(values, pa.int64()).cast(pa.timestamp("s"))
        elif name in ("s", "fs", "u", "e"):  # text -> FixedString padding, UUID bytes, Enum codes
            arr = types[name].to_storage(pa.array(values), name)
        else:
            arr = pa.array(values, types[name].arrow_type)
        data[name] = arr
    return pa.table(data)


@pytest.mark.parametrize(("key", "extra", "dat_comparable"), KEYS, ids=[k for k, _, _ in KEYS])
def test_partition_ids_match_clickhouse(
    session: Any, rows: list[dict[str, Any]], key: str, extra: str | None, dat_comparable: bool
) -> None:
    columns_sql = COLUMNS + (", " + EXTRA_COLUMNS[extra] if extra else "")
    name = "k" + format(abs(hash(key)) % 10**12, "d")
    ddl = f"CREATE TABLE p.{name} ({columns_sql}) ENGINE = MergeTree PARTITION BY {key} ORDER BY rid"
    try:
        table_def = parse_create_table(ddl)
    except TypeSyntaxError as e:
        pytest.skip(f"type not supported by replicad.storage.types yet: {e}")
    session.query(f"DROP TABLE IF EXISTS p.{name}")
    session.query(ddl + " SETTINGS allow_floating_point_partition_key = 1")
    col_names = [c.name for c in table_def.columns]
    values = ", ".join("(" + ", ".join(_sql_value(c, r[c]) for c in col_names) + ")" for r in rows)
    session.query(
        f"INSERT INTO p.{name} ({', '.join(col_names)}) SETTINGS max_partitions_per_insert_block = 0 "
        f"VALUES {values}"
    )

    theirs = {}
    for line in str(session.query(f"SELECT rid, _partition_id FROM p.{name}", "TSV")).splitlines():
        rid, pid = line.split("\t")
        theirs[int(rid)] = pid
    parts = {}
    for line in str(
        session.query(
            "SELECT partition_id, path FROM system.parts "
            f"WHERE database = 'p' AND table = '{name}' AND active",
            "TSV",
        )
    ).splitlines():
        pid, path = line.split("\t")
        dat = Path(path) / "partition.dat"
        parts[pid] = dat.read_bytes() if dat.exists() else b""

    table = _storage_table(col_names, rows, table_def.types)
    chunks = split_by_partition(table, table_def.partition_key, table_def.types)
    ours = {}
    for chunk in chunks:
        for rid in chunk.table.column("rid").to_pylist():
            ours[rid] = chunk.partition_id
    assert ours == theirs
    assert {c.partition_id for c in chunks} == set(parts)
    if dat_comparable:
        assert {c.partition_id: c.partition_dat() for c in chunks} == parts
    session.query(f"DROP TABLE p.{name}")


def test_result_types_match_clickhouse(session: Any) -> None:
    """Key expression result types on which ClickHouse 26.9 and 18.16 agree."""
    from replicad.sql.expressions import compile_expression

    table_def = parse_create_table(f"CREATE TABLE x ({COLUMNS}) ENGINE = MergeTree ORDER BY rid")
    exprs = [
        "toYYYYMM(d)",
        "toYYYYMMDD(t)",
        "toDate(t)",
        "toMonday(d)",
        "toStartOfMonth(t)",
        "intDiv(u64, 10)",
        "intDiv(i8, u64)",
        "u64 % 3",
        "u8 + u8",
        "u32 + i8",
        "u8 - u8",
        "-u8",
        "u8 = 1",
        "toYear(d)",
        "intHash32(u64)",
        "if(u8 > 1, u8, i8)",
        "length(s)",
        "f / 2",
        "u32 * i32",
        "toStartOfDay(t)",
        "toString(u8)",
        "s LIKE 'a%'",
        "isNull(s)",
    ]
    structure = quote_string(COLUMNS)
    for e in exprs:
        want = str(
            session.query(f"SELECT toTypeName({e}) FROM generateRandom({structure}) LIMIT 1", "TSVRaw")
        ).strip()
        got = compile_expression(e).result_type(table_def.types).name
        assert (e, got) == (e, want)
