"""``split_by_partition`` evaluates a one-column key once per distinct value of the column and skips the
per-row grouping for a single partition: the same chunks (IDs, key values, rows in order) as evaluating the
key on every row, checked against that reference on random blocks."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.sql.partition import PartitionKey, _group_codes, partition_id_at, split_by_partition

TYPES = {"d": parse_type("Date"), "k": parse_type("UInt64"), "s": parse_type("String")}
KEYS = ["toYYYYMM(d)", "d", "s", "intDiv(k, 3)", "(toYYYYMM(d), s)", "toMonday(d)", "k % 2", "toYear(d)",
        "toStartOfMonth(d)", "toYYYYMMDD(d)", "toDayOfMonth(d)", "toDayOfWeek(d)"]


def _reference(table: pa.Table, key: str) -> list[tuple[str, list[object], pa.Table]]:
    pk = PartitionKey.parse(key)
    arrays, types = pk.evaluate(table, TYPES, "UTC")
    groups, count = _group_codes(arrays)
    out = []
    for g in range(count):
        idx = np.flatnonzero(groups == g)
        values = [a.slice(int(idx[0]), 1) for a in arrays]
        rows = table.take(pa.array(idx))
        out.append((partition_id_at(types, values, 0), [v[0].as_py() for v in values], rows))
    return out


_day = st.integers(0, 40).map(lambda n: dt.date(2030, 1, 1) + dt.timedelta(days=n))


@settings(deadline=None, max_examples=150)
@given(st.lists(st.tuples(_day, st.integers(0, 20), st.sampled_from([b"a", b"b", b"c"])), min_size=1,
                max_size=60), st.sampled_from(KEYS))
def test_split_matches_per_row_evaluation(rows: list[tuple[dt.date, int, bytes]], key: str) -> None:
    table = pa.table({"d": pa.array([r[0] for r in rows], pa.date32()),
                      "k": pa.array([r[1] for r in rows], pa.uint64()),
                      "s": pa.array([r[2] for r in rows], pa.binary())})
    got = [(c.partition_id, list(c.values), c.table) for c in split_by_partition(table, key, TYPES)]
    want = _reference(table, key)
    assert [(p, v) for p, v, _ in got] == [(p, v) for p, v, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want, strict=True):
        assert g.equals(w)


def test_equal_ends_prove_one_partition_only_for_non_decreasing_keys() -> None:
    """The smallest and largest date of the block give the same key value: one partition for a key that
    never decreases (toYYYYMM), but not for toDayOfMonth / toDayOfWeek, whose rows in between differ."""
    days = [dt.date(2030, 1, 5), dt.date(2030, 1, 20), dt.date(2030, 2, 5), dt.date(2030, 1, 12)]
    table = pa.table({"d": pa.array(days, pa.date32()), "k": pa.array([0, 1, 2, 3], pa.uint64()),
                      "s": pa.array([b"a"] * 4, pa.binary())})
    for key in KEYS:
        got = [(c.partition_id, list(c.values), c.table) for c in split_by_partition(table, key, TYPES)]
        want = _reference(table, key)
        assert [(p, v) for p, v, _ in got] == [(p, v) for p, v, _ in want], key
        for (_, _, g), (_, _, w) in zip(got, want, strict=True):
            assert g.equals(w), key
    same_month = table.slice(0, 2)
    assert len(split_by_partition(same_month, "toYYYYMM(d)", TYPES)) == 1
    assert len(split_by_partition(same_month, "toDayOfMonth(d)", TYPES)) == 2
