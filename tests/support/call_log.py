"""Recording the calls of a module's function in a test, the function still doing its work."""

from __future__ import annotations

from typing import Any

import pytest


def record_first_arguments(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[Any]:
    """Replace ``owner.<name>`` (for the test) by a wrapper that appends each call's first argument to the
    list returned here, then calls the original."""
    seen: list[Any] = []
    real = getattr(owner, name)

    def recording(first: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(first)
        return real(first, *args, **kwargs)

    monkeypatch.setattr(owner, name, recording)
    return seen
