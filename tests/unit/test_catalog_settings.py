"""The config's ``settings:`` are the defaults of every table's MergeTree settings; DDL ``SETTINGS`` win."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from replicad.catalog import ReplicationEngine, merge_tree_defaults, spec_from_ddl
from replicad.config import Config, build_config
from replicad.devtools.ports import free_ports
from replicad.keeper.client import Keeper
from replicad.replica import ReplicaEnv, TableReplica
from replicad.server.interserver import InterserverServer
from replicad.server.parts_exchange import InterserverExchange
from replicad.sql.ddl import parse_create_table
from replicad.tasks import Supervisor

DDL = ("CREATE TABLE db.t (d Date, x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', "
       "'{replica}') PARTITION BY toYYYYMM(d) ORDER BY x")

CONFIG_SETTINGS_YAML = """
old_parts_lifetime: 60
max_replicated_logs_to_keep: 500
min_replicated_logs_to_keep: 10
cleanup_delay_period: 1
index_granularity: 1024
parts_to_throw_insert: 400
insert_quorum: 2
"""


def config(tmp_path: Path) -> Config:
    api, inter = free_ports(2)
    raw = {
        "replica": "r1",
        "data_path": str(tmp_path / "data"),
        "macros": {"shard": "01"},
        "api": {"port": api},
        "interserver": {"port": inter, "listen_host": "127.0.0.1"},
        "settings": yaml.safe_load(CONFIG_SETTINGS_YAML),
    }
    return build_config(raw, {})


def test_only_merge_tree_settings_become_table_defaults() -> None:
    out = merge_tree_defaults({"old_parts_lifetime": 60, "insert_quorum": 2, "background_pool_size": 4,
                               "replicated_max_ratio_of_wrong_parts": 0.25})
    assert out == {"old_parts_lifetime": "60", "replicated_max_ratio_of_wrong_parts": "0.25"}


def test_config_settings_under_ddl_settings() -> None:
    table = parse_create_table(DDL + " SETTINGS old_parts_lifetime = 5")
    spec = spec_from_ddl(table, {"shard": "01"}, "r1",
                         config_settings={"old_parts_lifetime": 60, "max_replicated_logs_to_keep": 500,
                                          "index_granularity": 1024, "insert_quorum": 2})
    assert spec.settings == {"old_parts_lifetime": "5", "max_replicated_logs_to_keep": "500",
                             "index_granularity": "1024"}
    # the effective granularity is what the table metadata records, as ClickHouse's <merge_tree> default
    assert "index granularity: 1024\n" in spec.metadata_text
    # DDL granularity wins over the config's
    ddl_wins = spec_from_ddl(parse_create_table(DDL + " SETTINGS index_granularity = 256"), {"shard": "01"},
                             "r1", config_settings={"index_granularity": 1024})
    assert "index granularity: 256\n" in ddl_wins.metadata_text
    assert ddl_wins.settings == {"index_granularity": "256"}


def test_without_config_settings_the_spec_is_the_ddl() -> None:
    table = parse_create_table(DDL + " SETTINGS cleanup_delay_period = 3")
    assert spec_from_ddl(table, {"shard": "01"}, "r1") == spec_from_ddl(table, {"shard": "01"}, "r1",
                                                                        config_settings={})
    spec = spec_from_ddl(table, {"shard": "01"}, "r1")
    assert spec.settings == {"cleanup_delay_period": "3"}
    assert "index granularity: 8192\n" in spec.metadata_text


def test_replica_runs_with_the_config_settings(tmp_path: Path) -> None:
    table = parse_create_table(DDL + " SETTINGS cleanup_delay_period = 2")
    spec = spec_from_ddl(table, {"shard": "01"}, "r1",
                         config_settings={"old_parts_lifetime": 60, "max_replicated_logs_to_keep": 500,
                                          "cleanup_delay_period": 1, "index_granularity": 1024,
                                          "parts_to_throw_insert": 400})
    env = ReplicaEnv(data_path=tmp_path, interserver=InterserverExchange(InterserverServer("127.0.0.1", 0)),
                     interserver_host="127.0.0.1")
    replica = TableReplica(spec, Keeper("127.0.0.1:1"), env)
    cs = replica.cleanup.settings
    assert cs.old_parts_lifetime == 60 and cs.max_replicated_logs_to_keep == 500
    assert cs.cleanup_delay_period == 2  # DDL
    assert cs.min_replicated_logs_to_keep == 100  # ClickHouse's default
    assert replica.store.old_parts_lifetime_s == 60.0
    assert replica.writer_settings.index_granularity == 1024
    assert replica.parts_limit.throw_at == 400


async def test_engine_catalog_applies_yaml_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's path: YAML settings -> Config -> ReplicationEngine -> catalog -> TableReplica."""

    async def no_zookeeper(self: TableReplica) -> None:
        return None

    monkeypatch.setattr(TableReplica, "start", no_zookeeper)
    cfg = config(tmp_path)
    engine = ReplicationEngine(cfg, Supervisor())
    replica = await engine.catalog.create_from_ddl(DDL + " SETTINGS old_parts_lifetime = 7", persist=False)
    cs = replica.cleanup.settings
    assert (cs.old_parts_lifetime, cs.max_replicated_logs_to_keep, cs.min_replicated_logs_to_keep,
            cs.cleanup_delay_period) == (7, 500, 10, 1)
    assert replica.writer_settings.index_granularity == 1024
    assert replica.parts_limit.throw_at == 400
    assert "index granularity: 1024\n" in replica.spec.metadata_text
    assert "insert_quorum" not in replica.spec.settings

    # after a reload, new tables take the new settings
    cfg2 = cfg.model_copy(update={"settings": {"old_parts_lifetime": 90}})
    await engine.reload(cfg2)
    other = await engine.catalog.create_from_ddl(DDL.replace("db.t", "db.u").replace("/t'", "/u'"),
                                                 persist=False)
    assert other.cleanup.settings.old_parts_lifetime == 90
    assert other.cleanup.settings.max_replicated_logs_to_keep == 10000
    assert replica.cleanup.settings.old_parts_lifetime == 7
