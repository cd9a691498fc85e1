"""The staging decision records age by ZooKeeper's clock, never the leader's: a leader whose wall clock is 40
days ahead (the chaos suite's clock shim) must not forget a committed job id before its lifetime, or a re-run
of the job would commit its rows a second time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replicad.model.staged_job import StagedTask
from replicad.replication.staging_records import StagingRecords
from tests.chaos import clock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
TABLE = "/clickhouse/tables/01/t"
RUN1, RUN2 = "0123456789abcdef", "fedcba9876543210"

# the leader's cleanup, in a process whose wall clock is skewed; prints (removed, its own time.time())
CLEANUP = """
import asyncio, json, sys, time
from replicad.keeper.client import Keeper
from replicad.replication.staging_records import StagingRecords

async def main():
    k = Keeper(sys.argv[1], session_timeout_s=10.0, chroot=sys.argv[2])
    await k.start()
    try:
        removed = await StagingRecords(k, sys.argv[3]).cleanup(float(sys.argv[4]), float(sys.argv[5]))
    finally:
        await k.close()
    print(json.dumps([removed, time.time()]))

asyncio.run(main())
"""


def _leader_cleanup(zookeeper: Any, zk_root: str, offset_s: float, run_s: float, job_s: float) -> list[float]:
    lib = clock.shim()
    assert lib is not None
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **clock._env(lib, offset_s, 1.0)}
    argv = [sys.executable, "-c", CLEANUP, zookeeper.hosts, zk_root, TABLE, str(run_s), str(job_s)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    out: list[float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


async def test_a_leader_40_days_ahead_keeps_the_job_ids(zookeeper: Any, zk_root: str, keeper: Any) -> None:
    if clock.clock_support() is not None:
        pytest.skip(str(clock.clock_support()))
    await keeper.ensure_path(TABLE)
    records = StagingRecords(keeper, TABLE)
    first = await records.commit("job-1", RUN1, [StagedTask("r1", "task-0", (1,), rows=5)])
    assert first.state == "committed"

    # the default lifetimes (3 days for runs, 30 days for job ids), judged by a leader 40 days ahead
    removed, leader_time = await asyncio.to_thread(_leader_cleanup, zookeeper, zk_root, 40 * 86400.0,
                                                   259200.0, 2592000.0)
    assert leader_time > __import__("time").time() + 39 * 86400  # the shim did skew the leader
    assert removed == 0
    assert sorted(await keeper.get_children(f"{TABLE}/replicad_staging/jobs")) == ["job-1"]
    again = await records.commit("job-1", RUN2, [StagedTask("r1", "task-0", (2,), rows=5)])
    assert again.state == "already_committed" and again.committed_run == RUN1  # no second commit

    # by ZooKeeper's clock the records do expire (1 s lifetimes), whatever the leader's clock says
    await asyncio.sleep(1.5)
    removed, _ = await asyncio.to_thread(_leader_cleanup, zookeeper, zk_root, -40 * 86400.0, 1.0, 1.0)
    assert removed >= 1  # job-1 at least (run-1 still has a task to publish: it stays)
    assert await keeper.get_children(f"{TABLE}/replicad_staging/jobs") == []
