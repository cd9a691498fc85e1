"""Checks that a test-side component stays independent of the code it judges."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def replicad_modules_imported_by(*modules: str) -> list[str]:
    """The ``replicad`` modules a fresh interpreter has loaded after importing ``modules`` (expected: none).
    Raises AssertionError when the import itself fails."""
    code = (f"import sys, {', '.join(modules)}; "
            "print(' '.join(sorted(m for m in sys.modules if m == 'replicad' or m.startswith('replicad.'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()
