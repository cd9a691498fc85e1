"""The event-loop monitor: a stall is seen whether the loop was busy or idle, and an idle loop wakes for it
once per idle period, not ten times a second."""

from __future__ import annotations

import asyncio
import time

import pytest

from replicad import loop_monitor
from replicad.loop_monitor import LoopMonitor


class Cpu:
    """A CPU clock that advances by ``step`` at each reading (0: an idle loop)."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def watch(seconds: float, cpu: Cpu, *, stall_at: float | None = None, stall_s: float = 0.0,
          idle_period_s: float = 0.5) -> list[float]:
    lags: list[float] = []

    async def main() -> None:
        monitor = LoopMonitor(lags.append, busy_period_s=0.05, idle_period_s=idle_period_s, cpu_clock=cpu)
        monitor.start()
        if stall_at is not None:
            asyncio.get_running_loop().call_later(stall_at, time.sleep, stall_s)  # blocks the loop
        await asyncio.sleep(seconds)
        monitor.stop()
        n = len(lags)
        await asyncio.sleep(0.2)
        assert len(lags) == n, "the timer ran after stop()"

    asyncio.run(main())
    return lags


def test_a_busy_loop_is_watched_every_busy_period() -> None:
    lags = watch(1.0, Cpu(0.01))
    assert 14 <= len(lags) <= 21, len(lags)
    assert max(lags) < loop_monitor.STALL_S


def test_an_idle_loop_is_watched_once_per_idle_period() -> None:
    lags = watch(1.6, Cpu(0.0))
    assert 3 <= len(lags) <= 5, len(lags)  # 0.05, then every 0.5 s: not 32 wake-ups


@pytest.mark.parametrize("cpu_step", [0.01, 0.0], ids=["busy", "idle"])
def test_a_stall_longer_than_the_period_is_counted(cpu_step: float) -> None:
    lags = watch(1.5, Cpu(cpu_step), stall_at=0.3, stall_s=0.6)
    stalls = [lag for lag in lags if lag > loop_monitor.STALL_S]
    assert len(stalls) == 1, lags
    assert stalls[0] >= 0.1, lags


def test_the_stall_is_logged(capsys: pytest.CaptureFixture[str]) -> None:
    watch(0.8, Cpu(0.01), stall_at=0.2, stall_s=0.3)
    assert "event_loop_stalled" in capsys.readouterr().out
