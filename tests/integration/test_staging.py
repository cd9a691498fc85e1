"""Two-phase writes against real daemons and a real ZooKeeper: stage, decide once, publish exactly once.

Every test checks the exact row multiset on every replica, and that nothing is visible before the decision.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.replicad_daemon import Reply, make_chroot, ok, query, request, start_daemon
from tests.support.spark import staged_batch_dirs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TABLE = "db.st"
DDL = ("CREATE TABLE db.st (k UInt64, p UInt8, s String) ENGINE = "
       "ReplicatedMergeTree('/clickhouse/tables/{shard}/st', '{replica}') PARTITION BY p ORDER BY k")


def rows_tsv(start: int, n: int, tag: str = "") -> bytes:
    return "".join(f"{k}\t{k % 3}\t{tag}{k}\n" for k in range(start, start + n)).encode()


def expected(*ranges: tuple[int, int]) -> collections.Counter[str]:
    c: collections.Counter[str] = collections.Counter()
    for start, n in ranges:
        c.update(f"{k}\t{k % 3}\t{k}" for k in range(start, start + n))
    return c


def table_rows(d: Daemon) -> collections.Counter[str]:
    r = ok(query(d.url, f"SELECT k, p, s FROM {TABLE}"))
    return collections.Counter(line for line in r.text.splitlines() if line)


def stage(d: Daemon, run: str, task: str, batch: int, body: bytes) -> Reply:
    return query(d.url, f"INSERT INTO {TABLE} FORMAT TSV", body, replicad_stage_run=run,
                 replicad_stage_task=task, replicad_stage_batch=batch)


def post_json(d: Daemon, path: str, obj: dict[str, Any]) -> Reply:
    return request(d.url, path, json.dumps(obj).encode(), headers={"Content-Type": "application/json"})


def commit(d: Daemon, job: str, run: str, tasks: list[dict[str, Any]]) -> Reply:
    return post_json(d, "/staging/commit", {"table": TABLE, "job_id": job, "run": run, "tasks": tasks})


def status(d: Daemon, run: str) -> dict[str, Any]:
    return dict(ok(request(d.url, f"/staging/status?table={TABLE}&run={run}")).json())


def wait_published(d: Daemon, run: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        st = status(d, run)
        if st.get("decision") == "commit" and not st.get("pending"):
            return st
        assert time.monotonic() < deadline, f"run {run} not published: {st}"
        time.sleep(0.1)


def wait_rows(daemons: list[Daemon], want: collections.Counter[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = [table_rows(d) for d in daemons]
        if all(g == want for g in got):
            return
        if time.monotonic() > deadline:
            for d, g in zip(daemons, got, strict=True):
                missing, extra = list((want - g).items())[:3], list((g - want).items())[:3]
                assert g == want, f"{d.url}: {sum(g.values())} rows, want {sum(want.values())}; " \
                                  f"missing {missing} extra {extra}"
        time.sleep(0.2)


def staged_dirs(base: Path, replica: str) -> list[str]:
    root = base / replica / "data" / "staging"
    return [str(p.relative_to(root)) for p in staged_batch_dirs(root)]


def new_run() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def pair(zookeeper: ZooKeeperServer, tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    chroot = make_chroot(zookeeper, "staging")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    r2 = start_daemon(tmp_path, zookeeper, chroot, "r2", tables=[DDL], wait_table=TABLE)
    try:
        yield r1, r2
    finally:
        r1.kill()
        r2.kill()


def test_staged_rows_are_invisible_until_committed_and_only_winners_publish(
        pair: tuple[Daemon, Daemon], tmp_path: Path) -> None:
    r1, r2 = pair
    run = new_run()
    ok(stage(r1, run, "p0-a0", 0, rows_tsv(0, 1000)))
    ok(stage(r1, run, "p0-a0", 1, rows_tsv(1000, 500)))
    ok(stage(r2, run, "p1-a0", 0, rows_tsv(2000, 700)))
    loser = ok(stage(r1, run, "p1-a1", 0, rows_tsv(2000, 300, tag="loser-"))).json()  # failed attempt
    assert loser["staged_on"] == "r1" and loser["written_rows"] == 300
    # a retried request of the same batch is deduplicated, not staged twice
    again = ok(stage(r1, run, "p0-a0", 1, rows_tsv(1000, 500))).json()
    assert again["deduplicated_blocks"] == 1 and again["written_rows"] == 0
    time.sleep(1.0)
    assert table_rows(r1) == collections.Counter() and table_rows(r2) == collections.Counter()
    assert staged_dirs(tmp_path, "r1") and staged_dirs(tmp_path, "r2")
    tasks = [{"r": "r1", "t": "p0-a0", "b": [0, 1], "n": 1500}, {"r": "r2", "t": "p1-a0", "b": [0], "n": 700}]
    answer = ok(commit(r1, "job-1", run, tasks)).json()
    assert answer["state"] == "committed" and answer["rows"] == 2200
    wait_published(r1, run)
    want = expected((0, 1500), (2000, 700))
    wait_rows([r1, r2], want)
    # the commit is idempotent: the same request again changes nothing
    assert ok(commit(r1, "job-1", run, tasks)).json()["state"] == "committed"
    # a re-run of the same job id (another run) adds nothing and its stages are dropped
    run2 = new_run()
    ok(stage(r2, run2, "p0-a0", 0, rows_tsv(0, 1000)))
    answer2 = ok(commit(r2, "job-1", run2, [{"r": "r2", "t": "p0-a0", "b": [0], "n": 1000}])).json()
    assert answer2["state"] == "already_committed" and answer2["committed_run"] == run
    deadline = time.monotonic() + 20
    while staged_dirs(tmp_path, "r1") or staged_dirs(tmp_path, "r2"):
        assert time.monotonic() < deadline, (staged_dirs(tmp_path, "r1"), staged_dirs(tmp_path, "r2"))
        time.sleep(0.2)
    time.sleep(1.0)
    wait_rows([r1, r2], want, timeout=5)
    parts = ok(request(r1.url, f"/tables/{TABLE}/parts")).json()
    assert all("stage" not in p["name"] for p in parts)


def test_abort_and_ttl_drop_staged_data(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "staging_ttl")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE,
                      settings={"replicad_staging_ttl": 3})
    try:
        aborted, expired = new_run(), new_run()
        ok(stage(r1, aborted, "p0-a0", 0, rows_tsv(0, 100)))
        ok(stage(r1, expired, "p0-a0", 0, rows_tsv(100, 100)))
        ok(post_json(r1, "/staging/abort", {"table": TABLE, "job_id": "j-abort", "run": aborted}))
        assert status(r1, aborted)["decision"] == "abort"
        # a commit after the abort is refused; nothing becomes visible
        late = commit(r1, "j-abort", aborted, [{"r": "r1", "t": "p0-a0", "b": [0], "n": 100}])
        assert late.status == 409, late.text
        deadline = time.monotonic() + 30
        while status(r1, expired).get("decision") != "abort" or staged_dirs(tmp_path, "r1"):
            assert time.monotonic() < deadline, (status(r1, expired), staged_dirs(tmp_path, "r1"))
            time.sleep(0.3)
        assert "ttl" in status(r1, expired)["reason"]
        late = commit(r1, "j-ttl", expired, [{"r": "r1", "t": "p0-a0", "b": [0], "n": 100}])
        assert late.status == 409, late.text
        assert table_rows(r1) == collections.Counter()
        # the TTL counts from the run's last staged batch: a run that keeps staging outlives it
        alive = new_run()
        for b in range(5):  # 6 s from the first batch to the commit: twice the TTL
            if b:
                time.sleep(1.5)
            ok(stage(r1, alive, "p0-a0", b, rows_tsv(1000 + 100 * b, 100)))
        done = commit(r1, "j-alive", alive, [{"r": "r1", "t": "p0-a0", "b": list(range(5)), "n": 500}])
        assert done.status == 200, done.text
        wait_published(r1, alive)
        assert table_rows(r1) == expected((1000, 500))
    finally:
        r1.kill()


def test_publish_survives_kill_9_half_way(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "staging_kill")
    env = {"REPLICAD_FAULT_INJECTION": "1", "REPLICAD_FAULT_KILL_AFTER_PUBLISHED_PARTS": "1"}
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE, env=env)
    r2 = start_daemon(tmp_path, zookeeper, chroot, "r2", tables=[DDL], wait_table=TABLE)
    try:
        run = new_run()
        tasks = []
        for t in range(4):  # 4 tasks x 2 batches x 3 partitions = 24 staged parts, published as 3
            for b in range(2):
                start = (t * 2 + b) * 100
                ok(stage(r1, run, f"p{t}-a0", b, rows_tsv(start, 100)))
            tasks.append({"r": "r1", "t": f"p{t}-a0", "b": [0, 1], "n": 200})
        ok(commit(r2, "job-kill", run, tasks))  # the decision is taken on the other replica
        assert r1.proc is not None
        assert r1.proc.wait(timeout=60) == -signal.SIGKILL  # killed by the fault after 1 of 3 parts
        partial = table_rows(r2)
        assert 0 < sum(partial.values()) < 800 or partial == collections.Counter()
        r1.env.pop("REPLICAD_FAULT_INJECTION", None)
        r1.start()
        r1.wait_ready(TABLE, timeout=60)
        wait_published(r2, run)
        wait_rows([r1, r2], expected((0, 800)))
        assert staged_dirs(tmp_path, "r1") == []
    finally:
        r1.kill()
        r2.kill()


def test_staging_survives_restart_and_refuses_hostile_ids(zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    chroot = make_chroot(zookeeper, "staging_restart")
    r1 = start_daemon(tmp_path, zookeeper, chroot, "r1", tables=[DDL], wait_table=TABLE)
    try:
        run = new_run()
        ok(stage(r1, run, "p0-a0", 0, rows_tsv(0, 250)))
        for bad_run, bad_task in [("../../etc", "t"), (run, "../x"), (run, "a/b"), ("ABC", "t"), (run, "")]:
            r = stage(r1, bad_run, bad_task, 0, rows_tsv(0, 1))
            assert r.status == 400, (bad_run, bad_task, r.status, r.text)
        bad = commit(r1, "j", run, [{"r": "r1", "t": "../x", "b": [0], "n": 1}])
        assert bad.status == 400, bad.text
        assert r1.stop() == 0
        r1.start()
        r1.wait_ready(TABLE, timeout=60)
        ok(commit(r1, "j", run, [{"r": "r1", "t": "p0-a0", "b": [0], "n": 250}]))
        wait_published(r1, run)
        wait_rows([r1], expected((0, 250)))
        assert os.listdir(tmp_path / "r1" / "data" / "staging" / "db" / "st") == []
    finally:
        r1.kill()
