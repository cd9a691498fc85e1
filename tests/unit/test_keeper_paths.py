"""ZooKeeper path helpers: macros as ClickHouse 18.16 expands them, the 18.16 node names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicad.errors import BadInputError
from replicad.keeper.paths import TablePaths, expand_macros, normalize_zk_path, pad_index, sequence_number


def test_expand_macros() -> None:
    macros = {"shard": "01", "replica": "r1", "layer": "{shard}-x", "database": "explicit"}
    assert expand_macros("/clickhouse/tables/{shard}/t", macros) == "/clickhouse/tables/01/t"
    assert expand_macros("{layer}", macros) == "01-x"  # expanded again, like Macros::expand
    # an explicit macro wins over the implicit {database}; {table} falls back to the table name
    assert expand_macros("/{database}/{table}", macros, "db", "events") == "/explicit/events"
    assert expand_macros("no macros", {}) == "no macros"
    with pytest.raises(BadInputError, match="No macro shard"):
        expand_macros("{shard}", {})
    with pytest.raises(BadInputError, match="Unbalanced"):
        expand_macros("{shard", {"shard": "1"})
    with pytest.raises(BadInputError, match="recursion"):
        expand_macros("{a}", {"a": "{a}"})


def test_table_paths_are_18_16_names() -> None:
    p = TablePaths.create("clickhouse/tables/01/t/", "r1")
    assert p.zk_path == "/clickhouse/tables/01/t"
    assert p.log_prefix == "/clickhouse/tables/01/t/log/log-"
    assert p.block_number_prefix("202611") == "/clickhouse/tables/01/t/block_numbers/202611/block-"
    assert p.abandonable_lock_prefix == "/clickhouse/tables/01/t/temp/abandonable_lock-"
    assert p.me.root == "/clickhouse/tables/01/t/replicas/r1"
    assert p.me.queue_prefix == "/clickhouse/tables/01/t/replicas/r1/queue/queue-"
    assert p.me.part_checksums("all_0_0_0") == "/clickhouse/tables/01/t/replicas/r1/parts/all_0_0_0/checksums"
    assert p.endpoint_id == "DataPartsExchange:/clickhouse/tables/01/t/replicas/r1"
    assert p.quorum_failed_parts == "/clickhouse/tables/01/t/quorum/failed_parts"
    with pytest.raises(BadInputError):
        TablePaths.create("/t", "a/b")
    with pytest.raises(BadInputError):
        TablePaths.create("/", "r1")


@given(st.integers(min_value=0, max_value=9_999_999_999), st.sampled_from(["log-", "queue-", "block-"]))
def test_sequence_numbers_round_trip(n: int, prefix: str) -> None:
    name = prefix + pad_index(n)
    assert len(name) == len(prefix) + 10
    assert sequence_number(name) == n
    assert sequence_number("/x/y/" + name) == n


def test_normalize() -> None:
    assert normalize_zk_path("a/b/") == "/a/b"
    assert normalize_zk_path("/a") == "/a"
