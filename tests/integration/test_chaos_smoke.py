"""A short deterministic smoke of the fault suite (tests/chaos): the checker must first catch each planted bug
(REPLICAD_FAULT_PLANT), then a fixed schedule of faults against three replicas on a 3-node ZooKeeper ensemble
must end with no violation.  ``make chaos`` runs the long randomized version."""

from __future__ import annotations

from pathlib import Path

import pytest

from replicad.devtools.zookeeper import available
from tests.chaos import linkfaults, scenarios
from tests.chaos.ensemble import Ensemble
from tests.chaos.netns import Network
from tests.chaos.rig import netns_support
from tests.support.isolation import replicad_modules_imported_by

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

def test_checker_does_not_import_replicad() -> None:
    assert replicad_modules_imported_by("tests.chaos.checker", "tests.chaos.disk",
                                        "tests.chaos.workload") == []


@pytest.mark.parametrize("plant", sorted(scenarios.PLANTS))
def test_planted_bug_is_reported(plant: str, chaos_ensemble: Ensemble, tmp_path: Path) -> None:
    result = scenarios.PLANTS[plant](tmp_path, chaos_ensemble, True)
    assert result.verdict.kinds() & scenarios.PLANT_EXPECTS[plant], result.verdict.violations


def test_fixed_schedule_has_no_violation(chaos_ensemble: Ensemble, tmp_path: Path) -> None:
    result = scenarios.random_run(tmp_path, chaos_ensemble, seed=7,
                                  schedule=["kill_one", "pause_one", "zk_leader_kill", "flip_part"],
                                  hold=(1.0, 2.0), quiet=(0.5, 1.0))
    assert [e.nemesis for e in result.events] == ["kill_one", "pause_one", "zk_leader_kill", "flip_part"]
    assert result.acked_rows > 0
    assert result.verdict.violations == [], result.verdict.violations
    assert result.verdict.recovery_s is not None and result.verdict.recovery_s < 60


def test_merge_over_a_broken_part_recovers(chaos_ensemble: Ensemble, tmp_path: Path) -> None:
    """Regression: a merge that cannot read a corrupted source part used to fail forever (the queue never
    drained); the part must be reported broken, moved to detached/ and the merged part fetched."""
    result, flip = scenarios.merge_over_broken_part(tmp_path, chaos_ensemble)
    assert result.verdict.violations == [], result.verdict.violations
    detached = tmp_path / "r1" / "data" / "data" / "db" / "t" / "detached"
    assert any(flip.part in d.name for d in detached.iterdir()), sorted(p.name for p in detached.iterdir())


NETWORK_SCHEDULE = ["partition_interserver", "partition_zookeeper", "zk_minority", "disk_full",
                    "isolate_replica"]


def test_network_and_disk_schedule_has_no_violation(tmp_path: Path) -> None:
    """Replicas and ZooKeeper nodes in their own network namespaces, data on tmpfs (skipped, with the reason,
    where namespaces cannot be built)."""
    if not available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    reason = netns_support()
    if reason is not None:
        pytest.skip(f"no network namespaces here: {reason}")
    schedule = [*NETWORK_SCHEDULE, *(["link_loss"] if linkfaults.link_fault_support()[0] else [])]
    net = Network(["zk1", "zk2", "zk3", *scenarios.NAMES])
    net.setup()
    e = Ensemble(tmp_path / "zk", hosts=[net.ip(f"zk{i}") for i in (1, 2, 3)],
                 prefixes=[net.prefix(f"zk{i}") for i in (1, 2, 3)])
    try:
        e.start()
        result = scenarios.random_run(tmp_path / "run", e, seed=5, schedule=schedule, hold=(2.0, 3.0),
                                      quiet=(0.5, 1.0), net=net, tmpfs_mb=96)
    finally:
        e.stop()
        net.teardown()
    assert [ev.nemesis for ev in result.events] == schedule
    assert result.acked_rows > 0
    assert result.verdict.violations == [], result.verdict.violations
