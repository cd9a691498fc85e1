"""docs/ARCHITECTURE.md stays true: every module it names exists, and every ``path.py::name`` is defined."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# `replicad/x/y.py`, `replicad/x/`, `scripts/run_cluster.py::main`, `replicad/replica.py::TableReplica.insert`
REF = re.compile(r"`((?:replicad|scripts|bench|tests)/[\w/]*?(?:\.py|/))(?:::([\w.]+))?`")


def _refs() -> list[tuple[str, str | None]]:
    return sorted(set(REF.findall(DOC.read_text())), key=lambda r: (r[0], r[1] or ""))


def _defines(path: Path, dotted: str) -> bool:
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found: ast.stmt | None = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        scope = found.body if isinstance(found, ast.ClassDef) else []
    return True


def test_the_doc_names_modules() -> None:
    assert len(_refs()) > 50


@pytest.mark.parametrize("path,name", [(p, n or None) for p, n in _refs()], ids=lambda v: v or "")
def test_named_module_exists(path: str, name: str | None) -> None:
    target = ROOT / path
    assert target.exists(), f"docs/ARCHITECTURE.md names {path}, which no longer exists"
    if name is not None:
        assert _defines(target, name), f"docs/ARCHITECTURE.md names {path}::{name}, not defined there"
