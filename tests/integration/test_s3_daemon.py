"""Two real daemons configured with the INTERFACE.md ``storage:`` section share one bucket (moto on loopback):
an HTTP insert on r1 is read back on r2, with one set of objects in the bucket (zero-copy)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import make_chroot, start_daemon
from tests.support.s3_server import ACCESS_KEY, SECRET_KEY, S3Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DDL = ("CREATE TABLE IF NOT EXISTS db.s3t (d Date, id UInt64, s String) "
       "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/s3t', '{replica}') "
       "PARTITION BY toYYYYMM(d) ORDER BY id "
       "SETTINGS storage_policy = 's3', allow_remote_fs_zero_copy_replication = 1")


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server.start(tmp_path / "moto")
    try:
        yield server
    finally:
        server.stop()


def test_daemons_share_parts_through_the_bucket(
    zookeeper: ZooKeeperServer, tmp_path: Path, s3: S3Server
) -> None:
    client = s3.client("shared", "replicad/")
    storage = {
        "disks": {"s3main": {"type": "s3", "endpoint": s3.endpoint("shared", "replicad/"),
                             "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}},
        "policies": {"s3": {"volumes": {"main": {"disk": "s3main"}}}},
    }
    env = {"REPLICAD_STORAGE": json.dumps(storage)}
    chroot = make_chroot(zookeeper, "s3_daemon")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], env=env, wait_table="db.s3t")
    try:
        r2 = start_daemon(tmp_path, zookeeper, chroot, "r2", tables=[DDL], env=env, wait_table="db.s3t")
        try:
            body = "\n".join(json.dumps({"d": f"2026-11-0{1 + i % 9}", "id": i, "s": f"v{i}"})
                             for i in range(5000)).encode()
            r1.http("/?query=" + "INSERT%20INTO%20db.s3t%20FORMAT%20JSONEachRow", body)
            deadline = time.monotonic() + 60
            while r2.query("SELECT count() FROM db.s3t").strip() != "5000":
                assert time.monotonic() < deadline, "r2 did not get the rows"
                time.sleep(0.2)
            assert r2.query("SELECT id, s FROM db.s3t WHERE id = 4321").strip() == "4321\tv4321"
            keys = {o.key for o in client.list_sync("replicad/")}
            meta = list((tmp_path / "r2" / "data" / "disks" / "s3main" / "store" / "db" / "s3t").iterdir())
            assert len(meta) == 1
            files = list(meta[0].iterdir())
            # r2 references exactly r1's objects: one copy in the bucket
            assert len(keys) == len(files)
            for f in files:
                key = f.read_text().split("\n")[2].split("\t")[1]
                assert "replicad/" + key in keys
        finally:
            r2.stop()
    finally:
        r1.stop()
