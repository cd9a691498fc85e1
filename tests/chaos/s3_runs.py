"""``make chaos S3=K``: the S3 planted-bug proof and K random runs with the table on an S3 disk (zero-copy).

Each run gets its own moto server (:class:`~tests.chaos.s3_member.S3Member`), in the ``s3`` member's network
namespace when the suite runs with namespaces, else on loopback; the schedule mixes the suite's nemeses with
the S3 ones (at least one of them), and the S3 half of the checker judges after the general one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.chaos import s3_plant, scenarios
from tests.chaos.ensemble import Ensemble
from tests.chaos.netns import Network
from tests.chaos.s3_member import S3Member


def plant(base: Path, ensemble: Ensemble, say: Callable[[str], None]) -> scenarios.RunResult:
    r = s3_plant.delete_shared_objects(base / f"plant-{s3_plant.PLANT}", ensemble, True)
    say(f"plant {s3_plant.PLANT}: violations {sorted(r.verdict.kinds()) or 'NONE (not caught!)'}")
    return r


def runs(base: Path, ensemble: Ensemble, seeds: Iterable[int], faults: int, net: Network | None,
         tmpfs_mb: int, say: Callable[[str], None], schedule: list[str] | None = None,
         ) -> list[scenarios.RunResult]:
    out = []
    for seed in seeds:
        t0 = time.monotonic()
        with S3Member(base / f"s3-{seed}" / "moto", net) as s3:
            r = scenarios.random_run(base / f"s3-{seed}", ensemble, seed, faults, net=net, tmpfs_mb=tmpfs_mb,
                                     s3=s3, schedule=schedule)
        faults_done = ", ".join(e.nemesis for e in r.events)
        say(f"seed {seed} ({r.variant}): {faults_done}; {r.acked_rows} acked rows, "
            f"recovery {r.verdict.recovery_s} s, {len(r.verdict.violations)} violations "
            f"({time.monotonic() - t0:.0f} s)")
        for k, d in r.verdict.violations:
            say(f"  {k}: {d}")
        out.append(r)
    return out
