"""Write ``requirements.lock``: the exact versions of replicad's dependency closure (with the test and bench
extras) as installed in the running interpreter's environment.  ``make lock`` runs it after installing;
``make venv`` and the Dockerfile install with it as pip constraints."""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

HEADER = """\
# Exact versions of everything `make` installs: replicad's dependencies with the test and bench extras,
# and theirs. Used as pip constraints, so every machine builds the same environment (and writes the same
# bytes). Regenerate after changing pyproject.toml: `make lock`.
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras: tuple[str, ...]) -> dict[str, str]:
    env = default_environment()
    dists = {_norm(d.metadata["Name"]): d for d in md.distributions()}
    pinned: dict[str, str] = {}
    seen: set[tuple[str, tuple[str, ...]]] = set()

    def walk(name: str, wanted: tuple[str, ...]) -> None:
        key = (_norm(name), wanted)
        if key in seen:
            return
        seen.add(key)
        dist = dists.get(key[0])
        if dist is None:
            return
        pinned[dist.metadata["Name"]] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in ("", *wanted)):
                walk(req.name, tuple(sorted(req.extras)))

    walk(root, extras)
    pinned.pop(root, None)
    return pinned


def main() -> int:
    pins = closure("replicad", ("bench", "test"))
    lines = [f"{name}=={version}" for name, version in sorted(pins.items(), key=lambda kv: _norm(kv[0]))]
    Path("requirements.lock").write_text(HEADER + "\n".join(lines) + "\n")
    print(f"requirements.lock: {len(lines)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
