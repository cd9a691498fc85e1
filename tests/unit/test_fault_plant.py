"""The test-only planted bugs are off unless REPLICAD_FAULT_PLANT names them (read once, at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = ("from replicad import fault_plant as f; "
         "print(f.planted('drop_log_entry'), f.planted('ack_before_commit'), f.planted('bogus'), "
         "f.once('drop_log_entry'), f.once('drop_log_entry'))")


def probe(value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "REPLICAD_FAULT_PLANT"}
    if value is not None:
        env["REPLICAD_FAULT_PLANT"] = value
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_nothing_is_planted_by_default() -> None:
    assert probe(None) == "False False False False False"


def test_named_plants_only_and_once_means_once() -> None:
    assert probe(" drop_log_entry , bogus") == "True False False True False"
