"""The ``storage:`` section (INTERFACE.md): disks and policies as ClickHouse's storage_configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from replicad.config import Config, ConfigError, load_config
from replicad.s3 import S3Endpoint
from replicad.storage.disk_s3 import build_disks

DISK = {"type": "s3", "endpoint": "http://127.0.0.1:9000/bucket/prefix/", "access_key_id": "k",
        "secret_access_key": "s"}
TABLE = ("CREATE TABLE db.t (d Date, x UInt64) ENGINE = ReplicatedMergeTree('/t', '{replica}') "
         "PARTITION BY toYYYYMM(d) ORDER BY x SETTINGS storage_policy = '{policy}', "
         "allow_remote_fs_zero_copy_replication = 1")


def load(tmp_path: Path, **extra: object) -> Config:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"replica": "r1", "data_path": str(tmp_path / "data"), **extra}))
    return load_config(p, environ={})


def test_the_documented_shape_loads(tmp_path: Path) -> None:
    policies = {"s3": {"volumes": {"main": {"disk": "s3main"}}}}
    cfg = load(tmp_path, storage={"disks": {"s3main": DISK}, "policies": policies},
               tables=[TABLE.replace("{policy}", "s3")])
    assert cfg.storage.policy_disks() == {"s3": "s3main"}
    disks = build_disks(cfg.storage, tmp_path)
    assert disks["s3main"].client.bucket == "bucket" and disks["s3main"].prefix == "prefix/"
    assert disks["s3main"].metadata_path == tmp_path / "disks" / "s3main"


def test_every_storage_problem_is_listed(tmp_path: Path) -> None:
    bad_disk = {**DISK, "endpoint": "ftp://host/b"}
    with pytest.raises(ConfigError) as e:
        load(tmp_path, storage={
            "disks": {"a": bad_disk, "b": {**DISK, "type": "local"}, "c": {**DISK, "secret_access_key": ""}},
            "policies": {"p1": {"volumes": {"main": {"disk": "nope"}}},
                         "p2": {"volumes": {"v1": {"disk": "a"}, "v2": {"disk": "a"}}}},
        }, tables=[TABLE.replace("{policy}", "missing")])
    text = "\n".join(e.value.problems)
    assert "ftp://host/b" in text
    assert "storage.disks.b.type" in text
    assert "storage.disks.c.secret_access_key" in text
    assert "exactly one volume" in text
    assert "storage_policy 'missing' is not in storage.policies" in text


def test_dangling_disk_reference(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, storage={"disks": {"s3main": DISK},
                                "policies": {"s3": {"volumes": {"main": {"disk": "x"}}}}})
    assert e.value.problems == ["storage.policies.s3.volumes.main.disk: no disk 'x' in storage.disks"]


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:9000/bucket/prefix/", ("http://127.0.0.1:9000", "bucket", "prefix/")),
    ("https://s3.example.com/my-bucket/a/b", ("https://s3.example.com", "my-bucket", "a/b/")),
    ("http://h/bucket", ("http://h", "bucket", "")),
])
def test_endpoint(url: str, expected: tuple[str, str, str]) -> None:
    e = S3Endpoint.parse(url)
    assert (e.url, e.bucket, e.prefix) == expected


@pytest.mark.parametrize("url", ["http://h/", "http://h/B", "http://h/ab", "http://h/bucket/a//b", "s3://b/p",
                                 "http://h/bucket/p?x=1"])
def test_bad_endpoint(url: str) -> None:
    with pytest.raises(ValueError):
        S3Endpoint.parse(url)
