"""The fault suite's S3 half (tests/chaos/s3_*): its checker stays independent of replicad, and it reports
the planted bug ``delete_shared_objects`` (a replica deleting shared objects while other replicas still hold
zero-copy locks on them) as lost objects.  ``make chaos S3=K`` runs the randomized S3 schedules (a minute or
more each, too long for this smoke)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicad.devtools.zookeeper import available
from tests.chaos import s3_plant
from tests.chaos.ensemble import Ensemble

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    if not available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    e = Ensemble(tmp_path_factory.mktemp("chaos-s3-zk"))
    e.start()
    try:
        yield e
    finally:
        e.stop()


def test_s3_checker_does_not_import_replicad() -> None:
    code = ("import sys, tests.chaos.s3_checker; "
            "bad = sorted(m for m in sys.modules if m == 'replicad' or m.startswith('replicad.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_deleting_shared_objects_is_reported(ensemble: Ensemble, tmp_path: Path) -> None:
    result = s3_plant.delete_shared_objects(tmp_path, ensemble, True)
    lost = [d for k, d in result.verdict.violations if k == "s3_lost"]
    assert any(d.startswith("r2: active part") for d in lost), result.verdict.violations
    assert any(d.startswith("r3: active part") for d in lost), result.verdict.violations
