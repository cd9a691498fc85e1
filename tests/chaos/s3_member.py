"""The S3 variant of a chaos run: a moto server (S3 in server mode) that every replica reaches, the chaos
table on an S3 disk with zero-copy replication, the S3 nemeses and the S3 half of the checker.

    with S3Member(base / "s3", net) as s3:          # net: the rig's Network (with an "s3" member) or None
        result = scenarios.random_run(base / "run", ensemble, seed, net=net, s3=s3)

With network namespaces the server runs in the namespace of the network member ``s3`` (as each ZooKeeper node
runs in its own): the replicas reach it over the bridge, ``partition_s3`` cuts a replica from its address.
Without them it listens on loopback.  The moto server lives for one run (its state is in memory).

The table (``db.t``, as every run) gets ``storage_policy = 's3'`` and zero-copy, an orphan scan every
:data:`SCAN_PERIOD_S` with a :data:`SCAN_GRACE_S` grace, and a short ``old_parts_lifetime`` and cleanup
period, so that parts are released (and shared objects deleted) during the run rather than 8 minutes later.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from replicad.devtools import process
from replicad.devtools.ports import free_port, port_is_open
from tests.chaos import s3_checker, s3_nemeses
from tests.chaos.checker import ReplicaView, Verdict, served_parts
from tests.chaos.netns import Network
from tests.chaos.rig import DDL, TABLE_ZK_PATH, Rig

BUCKET = "chaos"
KEY_PREFIX = "replicad/"
DISK = "s3main"
ACCESS_KEY = "chaos"
SECRET_KEY = "chaos-secret"
SCAN_PERIOD_S = 3
SCAN_GRACE_S = 30  # longer than any upload-to-commit under the nemeses (a pause holds at most ~13 s)
OLD_PARTS_LIFETIME_S = 10
S3_SETTINGS = {
    "storage_policy": "'s3'",
    "allow_remote_fs_zero_copy_replication": 1,
    "remote_fs_orphan_scan_period_s": SCAN_PERIOD_S,
    "remote_fs_orphan_scan_grace_s": SCAN_GRACE_S,
    "old_parts_lifetime": OLD_PARTS_LIFETIME_S,
    "cleanup_delay_period": 3,
    "cleanup_delay_period_random_add": 2,
}
DDL_S3 = DDL + " SETTINGS " + ", ".join(f"{k} = {v}" for k, v in S3_SETTINGS.items())


class S3Member:
    def __init__(self, base: Path, net: Network | None = None) -> None:
        self.base = base
        in_ns = net is not None and "s3" in net.members
        self.host = net.ip("s3") if in_ns and net is not None else "127.0.0.1"
        self.prefix = net.prefix("s3") if in_ns and net is not None else []
        self.port = free_port()
        self.proc: Any = None
        self.paused = False
        self.network = net is not None and in_ns

    # ---- the server

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def bucket(self) -> s3_checker.Bucket:
        return s3_checker.Bucket(self.endpoint_url, BUCKET, KEY_PREFIX, ACCESS_KEY, SECRET_KEY)

    def start(self) -> S3Member:
        argv = [*self.prefix, sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        self.proc = process.spawn(argv, self.base / "moto.log", cwd=self.base.parent,
                                  env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"})
        deadline = time.monotonic() + 30
        while not port_is_open(self.port, self.host):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start:\n{process.tail(self.base / 'moto.log')}")
            time.sleep(0.1)
        self.bucket.client().create_bucket(Bucket=BUCKET)
        return self

    def pause(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        self.resume()
        if self.proc is not None:
            process.kill(self.proc)
            self.proc = None

    def __enter__(self) -> S3Member:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- what a run needs

    def rig_options(self) -> dict[str, Any]:
        """``Rig(**s3.rig_options())``: the S3 table and the ``storage:`` section."""
        storage = {
            "disks": {DISK: {"type": "s3", "endpoint": f"{self.endpoint_url}/{BUCKET}/{KEY_PREFIX}",
                             "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                             "max_attempts": 3}},
            "policies": {"s3": {"volumes": {"main": {"disk": DISK}}}},
        }
        return {"ddl": DDL_S3, "config": {"storage": storage}}

    def schedule(self, rng: random.Random, n: int, others: Sequence[str]) -> list[str]:
        return s3_nemeses.schedule(rng, n, others, self.network)

    @property
    def variant(self) -> str:
        return "s3 zero-copy (netns)" if self.network else "s3 zero-copy (loopback)"

    def judge(self, rig: Rig, verdict: Verdict) -> s3_checker.Snapshot:
        """The S3 checks, after the general checker (queues drained)."""
        self.resume()
        replicas = []
        for name in rig.replicad_names:
            disk_root = rig.daemons[name].data_path / "disks" / DISK
            view = ReplicaView(name, rig.url(name), rig.table_dir(name))
            replicas.append(s3_checker.S3Replica(name, disk_root / "store" / "db" / "t", disk_root,
                                                 lambda v=view: served_parts(v)))
        age = SCAN_GRACE_S + 2 * SCAN_PERIOD_S + 5
        return s3_checker.check(verdict, self.bucket, rig.ensemble.hosts, rig.chroot, TABLE_ZK_PATH, replicas,
                                wait_s=age + 15, orphan_age_s=age)
