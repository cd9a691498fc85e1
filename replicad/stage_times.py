"""Where one INSERT's time goes: per-stage timestamps, a debug aid for the small-insert latency.

``REPLICAD_INSERT_STAGES=1`` in the daemon's environment (read once, at import; off otherwise) makes the
HTTP handler open a :class:`StageClock` per INSERT; the code on the insert's path calls :func:`mark` at the
end of each stage (``parse``, ``prepare``, ``zk_allocate``, ``commit_multi``, …), from the loop or from a
worker thread (``asyncio.to_thread`` copies the context).  When the request is answered, one
``insert_stages`` log line lists each stage's microseconds, from the previous mark, and where each
ZooKeeper request fell (``zk``: request kind → count).  bench/lag.py switches it on and turns the lines into
the per-stage table of BENCHMARKS.md.

Off, :func:`mark` costs one context-variable read.
"""

from __future__ import annotations

import contextvars
import os
import time
from collections import Counter

ENV_VAR = "REPLICAD_INSERT_STAGES"
ENABLED = os.environ.get(ENV_VAR, "") not in ("", "0")


class StageClock:
    """The marks of one INSERT: (stage, nanoseconds since the clock started), in order."""

    __slots__ = ("marks", "t0", "wall0", "zk")

    def __init__(self) -> None:
        self.wall0 = time.time()  # to line up with a client's clock (same machine)
        self.t0 = time.perf_counter_ns()
        self.marks: list[tuple[str, int]] = []
        self.zk: Counter[str] = Counter()

    def mark(self, stage: str) -> None:
        self.marks.append((stage, time.perf_counter_ns() - self.t0))

    def durations_us(self) -> dict[str, int]:
        """Each stage's microseconds since the previous mark (a stage marked twice adds up)."""
        out: dict[str, int] = {}
        prev = 0
        for stage, t in self.marks:
            out[stage] = out.get(stage, 0) + (t - prev) // 1000
            prev = t
        return out


_current: contextvars.ContextVar[StageClock | None] = contextvars.ContextVar("insert_stages", default=None)


def start() -> StageClock | None:
    """A new clock for the current task's request (``None`` when stage timing is off)."""
    if not ENABLED:
        return None
    clock = StageClock()
    _current.set(clock)
    return clock


def stop() -> None:
    """Forget the current task's clock."""
    if ENABLED:
        _current.set(None)


def mark(stage: str) -> None:
    """End ``stage`` of the current INSERT (no-op without a clock)."""
    clock = _current.get()
    if clock is not None:
        clock.mark(stage)


def zk_request(kind: str) -> None:
    """Count one ZooKeeper request issued on the current INSERT's behalf."""
    clock = _current.get()
    if clock is not None:
        clock.zk[kind] += 1
