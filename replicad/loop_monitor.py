"""The event-loop monitor: how late the loop runs a timer (its lag), and the stalls over 100 ms.

A stall is a request or task that kept the loop from running anything else.  The monitor sets a timer and,
when it runs, records how late it ran; a stall longer than the timer's period always covers one.  The
period is short (100 ms) while the loop works and long (1 s) after a period in which the loop's thread used
almost no CPU: each wake-up of an idle daemon costs ~0.2 ms of CPU on a virtual machine, and ten a second
were nine tenths of an idle daemon's CPU.  A stall shorter than 1 s that starts on an idle loop is seen only
when it covers the timer; whatever the loop then does makes the next period short again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from replicad.logging import get_logger

log = get_logger(__name__)

BUSY_PERIOD_S = 0.1
IDLE_PERIOD_S = 1.0
#: the loop's thread used less CPU than this over a period: the loop idled through it
IDLE_CPU_S = 0.001
#: a lag over this is a stall: logged (``event_loop_stalled``) as well as observed
STALL_S = 0.1


class LoopMonitor:
    """Observes the loop's lag (``observe(seconds)``) at every run of its timer."""

    def __init__(self, observe: Callable[[float], None], *, busy_period_s: float = BUSY_PERIOD_S,
                 idle_period_s: float = IDLE_PERIOD_S,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self._observe = observe
        self._busy = busy_period_s
        self._idle = idle_period_s
        self._cpu_clock = cpu_clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Set the first timer (one busy period ahead) on the running loop."""
        self._loop = asyncio.get_running_loop()
        due = self._loop.time() + self._busy
        self._timer = self._loop.call_at(due, self._tick, due, self._cpu_clock())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self, due: float, cpu_before: float) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag = max(0.0, now - due)
        self._observe(lag)
        if lag > STALL_S:
            log.warning("event_loop_stalled", seconds=round(lag, 3))
        cpu = self._cpu_clock()
        period = self._busy if cpu - cpu_before >= IDLE_CPU_S else self._idle
        self._timer = self._loop.call_at(now + period, self._tick, now + period, cpu)
