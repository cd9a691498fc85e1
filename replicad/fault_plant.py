"""Deliberate bugs for proving the fault suite's checker (tests/chaos) — NOT for production.

``REPLICAD_FAULT_PLANT`` in the daemon's environment (a comma-separated list; never set by the config file or
the shipped units) switches on:

* ``ack_before_commit`` — an INSERT is answered before its part is committed to ZooKeeper; the commit runs
  :data:`ACK_BEFORE_COMMIT_DELAY_S` later in the background (a crash meanwhile loses acknowledged rows);
* ``skip_fetch_checksum`` — DataPartsExchange neither checks file hashes when sending nor when receiving;
* ``drop_log_entry`` — the first GET_PART entry pulled from the shared log is skipped (the log pointer still
  moves past it), so this replica never fetches that part;
* ``delete_shared_objects`` — a replica letting go of a zero-copy part instance deletes its S3 objects even
  though other replicas still hold lock leaves on it (the last-lock rule skipped).

Each switch is read once, at import.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any

ENV_VAR = "REPLICAD_FAULT_PLANT"
PLANTS = frozenset({"ack_before_commit", "skip_fetch_checksum", "drop_log_entry", "delete_shared_objects"})
ACK_BEFORE_COMMIT_DELAY_S = 3.0

_ACTIVE = frozenset(p.strip() for p in os.environ.get(ENV_VAR, "").split(",") if p.strip()) & PLANTS
_spent: set[str] = set()
_background: set[asyncio.Task[Any]] = set()


def planted(name: str) -> bool:
    return name in _ACTIVE


def once(name: str) -> bool:
    """True the first time it is asked for an active plant, False afterwards (and when not planted)."""
    if name not in _ACTIVE or name in _spent:
        return False
    _spent.add(name)
    return True


def later(coro: Coroutine[Any, Any, Any], delay_s: float = ACK_BEFORE_COMMIT_DELAY_S) -> None:
    """Run ``coro`` ``delay_s`` from now in the background (errors are swallowed: nobody waits for it)."""

    async def run() -> None:
        await asyncio.sleep(delay_s)
        try:
            await coro
        except Exception:  # the planted bug: the client was told OK whatever happens here
            pass

    task = asyncio.get_running_loop().create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)
