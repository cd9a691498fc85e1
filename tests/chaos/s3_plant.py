"""The S3 planted bug: the checker's S3 half must report a replica that deletes shared objects while other
replicas still hold zero-copy locks on them (``REPLICAD_FAULT_PLANT=delete_shared_objects`` on r1).

r1 inserts a part; r2 and r3 fetch it in zero-copy mode (one instance, three locks).  A byte of r1's local
copy is flipped while r1 is stopped; r1 starts again and a SELECT makes it notice the broken part: it moves
it to ``detached/`` and lets go of the shared instance.  Correctly, r1 only removes its own lock leaf (the
others hold theirs); with the plant it deletes the objects, and r2's and r3's active parts lose them.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

from tests.chaos.checker import ReplicaView, served_parts
from tests.chaos.ensemble import Ensemble
from tests.chaos.nemeses import flip_byte
from tests.chaos.netns import Network
from tests.chaos.rig import PLANT_ENV, Rig
from tests.chaos.s3_member import S3Member
from tests.chaos.scenarios import NAMES, RunResult, _insert_batches, _judge, _wait_part_everywhere
from tests.chaos.workload import TABLE, http_query

PLANT = "delete_shared_objects"


def delete_shared_objects(base: Path, ensemble: Ensemble, planted: bool = True,
                          net: Network | None = None) -> RunResult:
    env = {"r1": {PLANT_ENV: PLANT}} if planted else {}
    with S3Member(base / "s3", net) as s3:
        rig = Rig(base, ensemble, NAMES, env=env, net=net, **s3.rig_options())
        rig.s3 = s3
        try:
            rig.start()
            ops = _insert_batches(rig, "r1", 0, 1)
            part = _wait_part_everywhere(rig, NAMES)
            rig.kill("r1")
            flip = flip_byte(rig, "r1", random.Random(5), part)
            assert flip is not None, "no part to flip"
            rig.start(["r1"])
            detached = rig.table_dir("r1") / "detached"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # reading every column makes r1 notice the broken part
                http_query(rig.url("r1"), f"SELECT * FROM {TABLE} FORMAT TabSeparated", timeout=10)
                if detached.is_dir() and any(part in d.name for d in detached.iterdir()):
                    break
                time.sleep(0.5)
            # judged once r1 has let go of its copy and has the part again (the S3 check stops at once when
            # its first look finds nothing: the release must be over by then)
            view = ReplicaView("r1", rig.url("r1"), rig.table_dir("r1"))
            while time.monotonic() < deadline + 30 and part not in served_parts(view):
                time.sleep(0.5)
            rig.heal()
            healed_at = time.monotonic()
            verdict = _judge(rig, ops, healed_at, [flip])
            s3.judge(rig, verdict)
            name = f"plant {PLANT}" if planted else f"control {PLANT}"
            return RunResult(name, 0, verdict, inserts=ops, variant=s3.variant)
        finally:
            rig.close()
