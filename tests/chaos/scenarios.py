"""Runs of the suite: a random schedule from a seed, and the three planted-bug scenarios.

Every scenario starts its own replicas (in ``base``) on a shared :class:`Ensemble` under a fresh chroot, and
returns a :class:`RunResult` whose ``verdict`` the checker produced.  Every wait is bounded.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.chaos import checker, clock, disk, linkfaults
from tests.chaos.checker import Flip, ReplicaView, Verdict
from tests.chaos.ensemble import Ensemble
from tests.chaos.nemeses import (
    ALL_NEMESES,
    DISK_NEMESES,
    LOOPBACK_NEMESES,
    NETWORK_NEMESES,
    Event,
    FlipPart,
    flip_byte,
    random_schedule,
    run_schedule,
)
from tests.chaos.netns import Network
from tests.chaos.rig import PLANT_ENV, Rig
from tests.chaos.workload import Clients, InsertOp, http_query

if TYPE_CHECKING:
    from tests.chaos.s3_member import S3Member

NAMES = ["r1", "r2", "r3"]
ALL_NEMESES.update({**clock.CLOCK_NEMESES, **linkfaults.LINK_NEMESES})  # known to run_schedule


@dataclass
class RunResult:
    name: str
    seed: int
    verdict: Verdict
    events: list[Event] = field(default_factory=list)
    inserts: list[InsertOp] = field(default_factory=list)
    admin_ops: int = 0
    duration_s: float = 0.0
    variant: str = ""

    @property
    def acked_rows(self) -> int:
        return sum(len(op.ids) for op in self.inserts if op.status == "acked")

    @property
    def indeterminate(self) -> int:
        return sum(1 for op in self.inserts if op.status == "indeterminate")


def _views(rig: Rig) -> list[ReplicaView]:
    return [ReplicaView(n, rig.url(n), rig.table_dir(n), n in rig.clickhouse_names) for n in rig.names]


def _judge(rig: Rig, inserts: list[InsertOp], healed_at: float, flips: list[Flip] = ()) -> Verdict:  # type: ignore[assignment]
    return checker.check(_views(rig), rig.ensemble.hosts, rig.zk_table_path, inserts, healed_at, flips)


def random_run(base: Path, ensemble: Ensemble, seed: int, faults: int = 4,
               schedule: list[str] | None = None, hold: tuple[float, float] = (2.0, 6.0),
               quiet: tuple[float, float] = (1.0, 3.0), net: Network | None = None,
               tmpfs_mb: int = 0, clickhouse: bool = False, s3: S3Member | None = None) -> RunResult:
    """Three replicas, insert clients and an admin client, ``faults`` nemeses picked by ``seed`` among those
    the rig supports (``net``: network namespaces; ``tmpfs_mb``: data directories on tmpfs; ``s3``: a started
    :class:`~tests.chaos.s3_member.S3Member`: the table on its S3 disk, S3 nemeses and checks too)."""
    t0 = time.monotonic()
    rng = random.Random(seed)
    rig = Rig(base, ensemble, NAMES, net=net, tmpfs_mb=tmpfs_mb, clickhouse=["ch1"] if clickhouse else [],
              **(s3.rig_options() if s3 is not None else {}))
    available = [*LOOPBACK_NEMESES, *(DISK_NEMESES if rig.mounts else ()), *(NETWORK_NEMESES if net else ()),
                 *(clock.CLOCK_NEMESES if clock.clock_support() is None else ()),
                 *(linkfaults.available_link_nemeses() if net else ())]
    names = schedule or random_schedule(rng, faults, available)
    if s3 is not None:
        rig.s3 = s3
        names = schedule or s3.schedule(rng, faults, available)
    try:
        rig.start()
        urls = {n: rig.url(n) for n in rig.names}
        clients = Clients(urls, seed, quorum_probe=lambda op: checker.quorum_probe(urls, op),
                          tokens=not clickhouse).start()
        flipper = FlipPart()
        try:
            time.sleep(2.0)
            events = run_schedule(rig, rng, names, t0, hold, quiet, flipper=flipper)
            rig.heal()
        finally:
            healed_at = time.monotonic()
            clients.stop()
        verdict = _judge(rig, clients.inserts, healed_at, flipper.flips)
        variant = "mixed (ClickHouse 18.16)" if clickhouse else "netns" if net is not None else "loopback"
        if s3 is not None:
            s3.judge(rig, verdict)
            variant = s3.variant
        return RunResult(f"seed {seed}", seed, verdict, events, clients.inserts, len(clients.admin_ops),
                         round(time.monotonic() - t0, 1), variant)
    finally:
        rig.close()


def _insert_batches(rig: Rig, replica: str, first: int, count: int, client: int = 7) -> list[InsertOp]:
    clients = Clients({replica: rig.url(replica)}, seed=0, n=0, admin=False, op_deadline_s=20)
    ops = []
    rng = random.Random(first)
    for k in range(first, first + count):
        ids = [client * 10**6 + k * 5 + j for j in range(5)]
        op = InsertOp(client, k, k % 4, 1, ids, f"plant-c{client}-b{k}")
        ops.append(clients.insert_one(op, rng))
    return ops


def _wait(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def ack_before_commit(base: Path, ensemble: Ensemble, planted: bool = True) -> RunResult:
    """Inserts acknowledged by r1, then kill -9 of r1 at once."""
    env = {n: {PLANT_ENV: "ack_before_commit"} for n in NAMES} if planted else {}
    rig = Rig(base, ensemble, NAMES, env=env)
    try:
        rig.start()
        ops = _insert_batches(rig, "r1", 0, 3)
        rig.kill("r1")
        rig.heal()
        healed_at = time.monotonic()
        return RunResult("plant ack_before_commit" if planted else "control ack_before_commit", 0,
                         _judge(rig, ops, healed_at), inserts=ops)
    finally:
        rig.close()


def skip_fetch_checksum(base: Path, ensemble: Ensemble, planted: bool = True) -> RunResult:
    """r1 and r2 hold a part; r2 goes down; a byte of r1's copy is flipped while r1 is stopped; r3 joins
    while r1 is the only source of the part; then r2 comes back."""
    env = {n: {PLANT_ENV: "skip_fetch_checksum"} for n in NAMES} if planted else {}
    rig = Rig(base, ensemble, NAMES, env=env)
    try:
        rig.start(["r1", "r2"])
        ops = _insert_batches(rig, "r1", 0, 1)
        part = _wait_part_everywhere(rig, ["r1", "r2"])
        rig.kill("r2")
        rig.kill("r1")
        flip = flip_byte(rig, "r1", random.Random(1), part)
        assert flip is not None, "no part to flip"
        rig.start(["r1", "r3"])
        _wait(lambda: (rig.table_dir("r3") / part).is_dir(), 20.0)
        rig.heal()
        healed_at = time.monotonic()
        return RunResult("plant skip_fetch_checksum" if planted else "control skip_fetch_checksum", 0,
                         _judge(rig, ops, healed_at, [flip]), inserts=ops)
    finally:
        rig.close()


def _wait_part_everywhere(rig: Rig, names: list[str]) -> str:
    parts: list[set[str]] = []

    def same() -> bool:
        parts[:] = [disk.maximal(disk.disk_parts(rig.table_dir(n))) for n in names]
        return bool(parts[0]) and all(p == parts[0] for p in parts)

    if not _wait(same, 30.0):
        raise RuntimeError(f"the part did not reach every replica: {parts}")
    return sorted(parts[0])[0]


def drop_log_entry(base: Path, ensemble: Ensemble, planted: bool = True) -> RunResult:
    """r2 skips the first GET_PART entry it pulls; inserts go to r1."""
    env = {"r2": {PLANT_ENV: "drop_log_entry"}} if planted else {}
    rig = Rig(base, ensemble, NAMES, env=env)
    try:
        rig.start()
        ops = _insert_batches(rig, "r1", 0, 3)
        healed_at = time.monotonic()
        return RunResult("plant drop_log_entry" if planted else "control drop_log_entry", 0,
                         _judge(rig, ops, healed_at), inserts=ops)
    finally:
        rig.close()


def merge_over_broken_part(base: Path, ensemble: Ensemble) -> tuple[RunResult, Flip]:
    """Regression (found by seed 7's fixed schedule): a byte of one of r1's parts is flipped while r1 is
    stopped, then the partition is merged.  r1's merge cannot read that part; it has to be reported broken
    (moved to detached/, the merged part fetched) instead of failing the merge entry forever."""
    rig = Rig(base, ensemble, NAMES)
    try:
        rig.start()
        ops = [op for k in range(3) for op in _insert_batches(rig, "r1", 4 * k, 1)]  # 3 parts in partition 0
        part = sorted(_wait_parts(rig, 3))[0]
        rig.kill("r1")
        flip = flip_byte(rig, "r1", random.Random(3), part)
        assert flip is not None, "no part to flip"
        rig.start(["r1"])
        status, _h, text = http_query(rig.url("r2"), "OPTIMIZE TABLE db.t PARTITION 0 FINAL", timeout=30)
        assert status == 200, text
        healed_at = time.monotonic()
        verdict = _judge(rig, ops, healed_at, [flip])
        return RunResult("merge over a broken part", 0, verdict, inserts=ops), flip
    finally:
        rig.close()


def _wait_parts(rig: Rig, count: int) -> set[str]:
    parts: list[set[str]] = []

    def ready() -> bool:
        parts[:] = [disk.maximal(disk.disk_parts(rig.table_dir(n))) for n in rig.names]
        return len(parts[0]) == count and all(p == parts[0] for p in parts)

    if not _wait(ready, 30.0):
        raise RuntimeError(f"the parts did not reach every replica: {parts}")
    return parts[0]


PLANTS = {"ack_before_commit": ack_before_commit, "skip_fetch_checksum": skip_fetch_checksum,
          "drop_log_entry": drop_log_entry}
#: the violation kinds each planted bug must produce (at least one of them)
PLANT_EXPECTS = {"ack_before_commit": {"lost"}, "skip_fetch_checksum": {"corruption", "diverged"},
                 "drop_log_entry": {"lost", "diverged"},
                 "delete_shared_objects": {"s3_lost"}}  # tests/chaos/s3_plant.py (make chaos S3=K)
