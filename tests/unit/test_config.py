"""Config loading: YAML + environment overrides, every problem listed, the settings table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from replicad import settings as st
from replicad.config import Config, ConfigError, build_config, load_config, restart_required, split_hosts

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, data: object, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def minimal(tmp_path: Path, **extra: object) -> dict[str, object]:
    return {"replica": "r1", "data_path": str(tmp_path / "data"), **extra}


def test_defaults_follow_the_contract(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, minimal(tmp_path)), environ={})
    assert cfg.replica == "r1"
    assert cfg.timezone == "UTC"
    assert cfg.zookeeper.hosts == "127.0.0.1:2181" and cfg.zookeeper.session_timeout_s == 30
    assert (cfg.interserver.listen_host, cfg.interserver.port, cfg.interserver.host) == ("127.0.0.1", 9009,
                                                                                          "127.0.0.1")
    assert cfg.interserver.user is None and cfg.interserver.password is None
    assert (cfg.api.listen_host, cfg.api.port) == ("127.0.0.1", 8123)
    assert cfg.settings == {} and cfg.tables == [] and cfg.macros == {}
    assert cfg.setting("index_granularity") == 8192
    assert cfg.tables_path == tmp_path / "data" / "data"
    assert cfg.metadata_path == tmp_path / "data" / "metadata"


def test_shipped_configs_are_valid() -> None:
    paths = [REPO / "config" / "replicad.example.yaml", *sorted((REPO / "config" / "cluster").glob("*.yaml"))]
    assert len(paths) == 4
    cfgs = [load_config(p, environ={}) for p in paths]
    cluster = cfgs[1:]
    assert [c.replica for c in cluster] == ["r1", "r2", "r3"]
    ports = [p for c in cluster for p in (c.api.port, c.interserver.port)]
    assert len(set(ports)) == 6 and not {8123, 9009, 2181} & set(ports)
    assert all(c.api.listen_host == "127.0.0.1" and c.interserver.listen_host == "127.0.0.1" for c in cluster)
    assert cfgs[0].macros == {"shard": "01"}


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    bad = {
        "replica": "r/1",
        "timezone": "Mars/Olympus",
        "zookeeper": {"hosts": "h1:2181,:x", "session_timeout_s": 0},
        "api": {"port": 70000, "typo": 1},
        "interserver": {"port": "nine"},
        "settings": {"index_granularity": 0, "parts_to_throw_insert": "lots", "no_such_setting": 1},
        "tables": ["CREATE TABLE db.t (a UInt8) ENGINE = ReplicatedMergeTree('/t/{shard}/x', '{replica}') "
                   "ORDER BY a", "DROP TABLE x"],
        "unknown_top": True,
    }
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, bad), environ={})
    problems = exc.value.problems
    text = "\n".join(problems)
    for needle in ("replica:", "timezone: unknown time zone 'Mars/Olympus'", "zookeeper.hosts:",
                   "zookeeper.session_timeout_s:", "api.port:", "api.typo: unknown key", "interserver.port:",
                   "settings.index_granularity: must be > 0",
                   "settings.parts_to_throw_insert: expected an integer",
                   "settings.no_such_setting: unknown setting", "tables[0]: macro {shard} is not defined",
                   "tables[1]: expected a CREATE TABLE statement", "unknown_top: unknown key"):
        assert needle in text, needle
    assert len(problems) == 13
    assert str(exc.value).count("\n  - ") == 13


def test_missing_replica_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, {"data_path": str(tmp_path)}), environ={})
    assert exc.value.problems == ["replica: required"]
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "replica: [unclosed\n"), environ={})
    assert exc.value.problems[0].startswith("YAML syntax")
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path / "absent.yaml", environ={})
    assert "cannot read config file" in exc.value.problems[0]
    with pytest.raises(ConfigError):
        load_config(write(tmp_path, "- a\n- b\n"), environ={})


def test_environment_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(tmp_path, macros={"shard": "01"}))
    env = {
        "REPLICAD_REPLICA": "r9",
        "REPLICAD_ZOOKEEPER__HOSTS": "10.0.0.1:2181,10.0.0.2:2182/chroot",
        "REPLICAD_API__PORT": "18123",
        "REPLICAD_MACROS__SHARD": "02",
        "REPLICAD_SETTINGS__PARTS_TO_THROW_INSERT": "500",
        "REPLICAD_TABLES": "['CREATE TABLE db.t (a UInt8) ENGINE = ReplicatedMergeTree(''/t/{shard}'', "
                           "''{replica}'') ORDER BY a']",
        "REPLICAD_SOMETHING_ELSE": "ignored",  # not a config key: left alone
        "PATH": "/usr/bin",
    }
    cfg = load_config(path, environ=env)
    assert cfg.replica == "r9"
    assert cfg.zookeeper.host_list == [("10.0.0.1", 2181), ("10.0.0.2", 2182)]
    assert cfg.zookeeper.chroot == "/chroot"
    assert cfg.api.port == 18123
    assert cfg.macros == {"shard": "02"}  # text, not the integer 2
    assert cfg.settings == {"parts_to_throw_insert": 500}
    assert cfg.setting("parts_to_throw_insert") == 500 and cfg.setting("parts_to_delay_insert") == 150
    assert len(cfg.tables) == 1 and "{shard}" in cfg.tables[0]


def test_environment_errors_are_listed(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(tmp_path))
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={"REPLICAD_API__PORT": "http", "REPLICAD_API__X__Y": "1",
                                   "REPLICAD_SETTINGS__INDEX_GRANULARITY": "-5"})
    text = "\n".join(exc.value.problems)
    assert "api.port" in text and "REPLICAD_API__X__Y" in text and "settings.index_granularity" in text


def test_yaml_integer_macro_stays_text(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "replica: r1\ndata_path: " + str(tmp_path) + "\nmacros: {shard: 01}\n"),
                      environ={})
    assert cfg.macros == {"shard": "1"}  # YAML already read 01 as the number 1; quote it to keep "01"
    assert cfg.expand_macros("/clickhouse/tables/{shard}/{table}/{replica}", table="t") == \
        "/clickhouse/tables/1/t/r1"
    with pytest.raises(ValueError, match=r"macro \{nope\}"):
        cfg.expand_macros("/x/{nope}")


def test_listener_clash_and_data_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    data = minimal(tmp_path, api={"port": 9009, "listen_host": "127.0.0.1"})
    data["data_path"] = str(tmp_path / "file")
    with pytest.raises(ConfigError) as exc:
        build_config(data, {})
    text = "\n".join(exc.value.problems)
    assert "api.port and interserver.port are both 9009" in text
    assert "exists and is not a directory" in text


@pytest.mark.parametrize("hosts,expected", [
    ("127.0.0.1:2181", ([("127.0.0.1", 2181)], "")),
    ("a:1,b:2/ch/root", ([("a", 1), ("b", 2)], "/ch/root")),
    ("zk", ([("zk", 2181)], "")),
    ("[::1]:2181/", ([("::1", 2181)], "")),
])
def test_split_hosts(hosts: str, expected: tuple[list[tuple[str, int]], str]) -> None:
    assert split_hosts(hosts) == expected


@pytest.mark.parametrize("hosts", ["", "a:1,", "a:99999", "a:1/x/", "a b:1"])
def test_split_hosts_rejects(hosts: str) -> None:
    with pytest.raises(ValueError):
        split_hosts(hosts)


def test_restart_required(tmp_path: Path) -> None:
    a = build_config(minimal(tmp_path), {})
    b = a.model_copy(update={"log_level": "debug", "settings": {"parts_to_throw_insert": 10}})
    assert restart_required(a, b) == []
    c = a.model_copy(update={"replica": "r2", "api": a.api.model_copy(update={"port": 1})})
    assert restart_required(a, c) == ["replica", "api.listen_host/api.port"]
    assert isinstance(c, Config)


# ---- the settings table --------------------------------------------------------------------------------


def test_settings_defaults_match_clickhouse_18_16() -> None:
    # Read from system.merge_tree_settings / system.settings of a ClickHouse 18.16.1 server.
    expected = {
        "index_granularity": 8192, "min_compress_block_size": 65536, "max_compress_block_size": 1048576,
        "parts_to_delay_insert": 150, "parts_to_throw_insert": 300, "max_insert_block_size": 1048576,
        "replicated_deduplication_window": 100, "replicated_deduplication_window_seconds": 604800,
        "old_parts_lifetime": 480, "max_replicated_logs_to_keep": 10000, "min_replicated_logs_to_keep": 100,
        "cleanup_delay_period": 30, "background_pool_size": 16, "insert_quorum_timeout": 600000,
        "max_bytes_to_merge_at_max_space_in_pool": 161061273600, "always_fetch_merged_part": 0,
        "replicated_max_parallel_fetches": 0, "replicated_max_parallel_fetches_for_host": 15,
        "insert_deduplicate": 1, "insert_quorum": 0, "use_minimalistic_checksums_in_zookeeper": 1,
    }
    assert {k: st.SETTINGS[k].default for k in expected} == expected


@pytest.mark.parametrize("name,raw,value", [
    ("index_granularity", "1024", 1024), ("index_granularity", 1024.0, 1024), ("insert_deduplicate", True, 1),
    ("insert_deduplicate", "false", 0), ("replicated_max_ratio_of_wrong_parts", "0.25", 0.25),
    ("insert_deduplication_token", 12, "12"),
])
def test_settings_coerce(name: str, raw: object, value: object) -> None:
    assert st.coerce(name, raw) == (value, None)


@pytest.mark.parametrize("name,raw,problem", [
    ("nope", 1, "unknown setting"), ("index_granularity", "x", "expected an integer"),
    ("index_granularity", 1.5, "expected an integer"), ("insert_deduplicate", 2, "must be 0 or 1"),
    ("index_granularity_bytes", 10485760, "only 0"), ("replicated_max_ratio_of_wrong_parts", 2, "between"),
])
def test_settings_coerce_rejects(name: str, raw: object, problem: str) -> None:
    value, got = st.coerce(name, raw)
    assert value is None and got is not None and problem in got


def test_settings_cross_checks() -> None:
    _, problems = st.validate({"parts_to_delay_insert": 500})
    assert problems == ["parts_to_delay_insert: must not exceed parts_to_throw_insert"]
    out, problems = st.validate({"parts_to_delay_insert": 10, "parts_to_throw_insert": 20})
    assert problems == [] and out["parts_to_throw_insert"] == 20 and out["index_granularity"] == 8192


def test_table_ddl_is_parsed(tmp_path: Path) -> None:
    pytest.importorskip("replicad.sql.ddl")
    tables = [
        "CREATE TABLE db.t (a UIntX) ENGINE = ReplicatedMergeTree('/t/x', '{replica}') ORDER BY a",
        "CREATE TABLE db.u (a UInt8) ENGINE = MergeTree ORDER BY a",
        "CREATE TABLE db.v (a UInt8 ENGINE = ReplicatedMergeTree('/t/v', '{replica}') ORDER BY a",
        "CREATE TABLE db.w (a UInt8) ENGINE = ReplicatedMergeTree('/t/w', '{replica}') ORDER BY a",
    ]
    with pytest.raises(ConfigError) as exc:
        build_config(minimal(tmp_path, tables=tables), {})
    problems = exc.value.problems
    assert [p.split(":")[0] for p in problems] == ["tables[0]", "tables[1]", "tables[2]"]
    assert "UIntX" in problems[0] and "not replicated" in problems[1] and "Syntax error" in problems[2]
