"""Parts written by replicad, ATTACHed by current ClickHouse (chdb, ClickHouse 26.x in-process).

For each case two MergeTree tables with the same columns are created in chdb: ``t_ins`` gets the rows
by ``INSERT ... FORMAT TabSeparated`` (ClickHouse's own parser defines the expected values), ``t_att``
gets a part written by PartWriter from the same rows (storage Arrow) via ``ALTER TABLE ... ATTACH
PART``.  Both must answer ``SELECT * ORDER BY k`` identically and ``CHECK TABLE`` must pass.
Then chdb's own part (non-adaptive Wide) is read back with PartReader.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.storage.part import PartDirectory
from replicad.storage.reader import PartReader, incompatibilities_with_18_16
from replicad.storage.writer import PartWriter, WriterSettings
from tests.support.chdb_session import chs, q
from tests.support.part_rows import ALL_TYPES, LOW_CARDINALITY, ddl_columns, make_rows

pytest.importorskip("chdb.session")

__all__ = ["chs"]  # the chdb session fixture
pytestmark = pytest.mark.integration

PARTITION = 202402
_names = itertools.count()


#: what makes current ClickHouse write the 18.16 Wide layout (FACTS §1.6)
COMPAT_SETTINGS = (
    "index_granularity_bytes = 0, min_bytes_for_wide_part = 0, min_rows_for_wide_part = 0, "
    "compress_marks = 0, compress_primary_key = 0, string_serialization_version = 'single_stream', "
    "serialization_info_version = 'basic', ratio_of_defaults_for_sparse_serialization = 1, "
    "replace_long_file_name_to_hash = 0"
)


def create_table(chs: Any, columns: list[tuple[str, str]], granularity: int, extra: str = "") -> str:
    name = f"db.t{next(_names)}"
    q(chs, f"CREATE TABLE {name} ({ddl_columns(columns)}) ENGINE = MergeTree PARTITION BY toYYYYMM(d) "
           f"ORDER BY k SETTINGS index_granularity = {granularity}, index_granularity_bytes = 0, "
           f"min_bytes_for_wide_part = 0, min_rows_for_wide_part = 0{extra}")
    return name


def only_part(chs: Any, table: str) -> Path:
    name = q(chs, f"SELECT name FROM system.parts WHERE database = 'db' AND table = '{table.split('.')[1]}' "
                  "AND active").strip()
    return data_path(chs, table) / name


def data_path(chs: Any, table: str) -> Path:
    db, name = table.split(".")
    text = q(chs, "SELECT arrayJoin(data_paths) FROM system.tables "
                  f"WHERE database = '{db}' AND name = '{name}'")
    return Path(text.strip())


def write_part(path: Path, columns: list[tuple[str, str]], table: pa.Table, granularity: int,
               method: str = "zstd") -> None:
    types = [(n, parse_type(t)) for n, t in columns]
    settings_ = WriterSettings(index_granularity=granularity, method=method, fsync=False)  # type: ignore[arg-type]
    with PartWriter(path, types, settings_, primary_key=["k"], minmax_columns=["d"],
                    partition_value=[(parse_type("UInt32"), PARTITION)]) as w:
        for batch in table.to_batches(max_chunksize=1000):
            w.write(batch)
        w.finish()


def check_attach(chs: Any, columns: list[tuple[str, str]], n: int, seed: int, granularity: int = 8192,
                 method: str = "zstd") -> None:
    table, tsv = make_rows(columns, n, seed)
    t_ins = create_table(chs, columns, granularity)
    if n:
        chs.query(f"INSERT INTO {t_ins} FORMAT TabSeparated\n" + tsv.decode())
    t_att = create_table(chs, columns, granularity)
    part = f"{PARTITION}_1_1_0"
    write_part(data_path(chs, t_att) / "detached" / part, columns, table, granularity, method)
    q(chs, f"ALTER TABLE {t_att} ATTACH PART '{part}'")
    assert q(chs, f"SELECT count() FROM {t_att}") == f"{n}\n"
    expected = q(chs, f"SELECT * FROM {t_ins} ORDER BY k")
    assert q(chs, f"SELECT * FROM {t_att} ORDER BY k") == expected
    assert q(chs, f"CHECK TABLE {t_att} SETTINGS check_query_single_value_result = 1").strip() == "1"
    q(chs, f"DROP TABLE {t_ins} SYNC")
    q(chs, f"DROP TABLE {t_att} SYNC")


def test_chdb_attaches_every_type(chs: Any) -> None:
    check_attach(chs, ALL_TYPES, 20000, seed=11)


def test_low_cardinality_supported() -> None:
    if not LOW_CARDINALITY:
        pytest.xfail("LowCardinality(String) is not implemented by replicad.datatypes yet")


def test_chdb_attaches_lz4_and_uncompressed(chs: Any) -> None:
    check_attach(chs, ALL_TYPES, 500, seed=12, granularity=64, method="lz4")
    check_attach(chs, ALL_TYPES, 500, seed=13, granularity=64, method="none")


def test_replicad_reads_chdb_part(chs: Any) -> None:
    """A part written by 26.x with the 18.16-compatible settings: same files, same rows."""
    table, tsv = make_rows(ALL_TYPES, 10000, seed=14)
    t = create_table(chs, ALL_TYPES, 1000, ", " + COMPAT_SETTINGS)
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    part = only_part(chs, t)
    assert incompatibilities_with_18_16(PartDirectory.at(part)) == []
    reader = PartReader(part, index_granularity=1000, verify=True)
    got = reader.read()
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name
    q(chs, f"DROP TABLE {t} SYNC")


def test_replicad_reads_modern_default_part(chs: Any) -> None:
    """26.x defaults: adaptive granularity, compressed marks (.cmrk2), primary.cidx, string size streams
    (more variants in test_modern_parts_chdb)."""
    columns = [("k", "UInt64"), ("d", "Date"), ("i", "Int32"), ("s", "String")]
    table, tsv = make_rows(columns, 5000, seed=15)
    t = f"db.t{next(_names)}"
    q(chs, f"CREATE TABLE {t} ({ddl_columns(columns)}) ENGINE = MergeTree PARTITION BY toYYYYMM(d) "
           "ORDER BY k SETTINGS index_granularity = 1000, min_bytes_for_wide_part = 0")
    chs.query(f"INSERT INTO {t} FORMAT TabSeparated\n" + tsv.decode())
    part = only_part(chs, t)
    reasons = incompatibilities_with_18_16(PartDirectory.at(part))
    assert any("primary.cidx" in r for r in reasons) and any(".cmrk2" in r for r in reasons)
    assert any("size stream" in r for r in reasons)
    reader = PartReader(part, {n: parse_type(ty) for n, ty in columns[:3]})
    assert reader.layout.adaptive and reader.layout.compressed
    assert reader.read().equals(table.select(["k", "d", "i"]))
    assert PartReader(part).read().equals(table)
    q(chs, f"DROP TABLE {t} SYNC")


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[str, str]], int, int, int]:
    others = [c for c in ALL_TYPES if c[0] not in ("k", "d")]
    chosen = draw(st.lists(st.sampled_from(others), min_size=1, max_size=6, unique=True))
    columns = [ALL_TYPES[0], ALL_TYPES[1], *chosen]
    n = draw(st.integers(1, 3000))
    granularity = draw(st.sampled_from([1, 7, 100, 8192]))
    return columns, n, granularity, draw(st.integers(0, 2**31))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_chdb_attaches_random_parts(chs: Any, case: tuple[list[tuple[str, str]], int, int, int]) -> None:
    columns, n, granularity, seed = case
    check_attach(chs, columns, n, seed, granularity)

