"""Clock skew between replicas: a replica restarted with its wall clock off (an LD_PRELOAD shim).

    reason = clock_support()             # None, or why no clock nemesis can run here
    ClockSkew().inject(rig, rng)         # stop one replicad replica, start it with its wall clock off
    measured_skew(rig.url("r1"))         # the daemon's now() minus ours, in seconds

The victim is stopped (SIGTERM: an ordered shutdown, so the nemesis is the clock, not a crash) and started
again with ``LD_PRELOAD`` = :file:`fakeclock.c` (compiled here on first use with ``cc``, which the build needs
anyway) and an offset (``clock_skew``: from a minute to a day and a half, either way) or a rate
(``clock_drift``: the wall clock runs 1.5 to 3 times as fast, so the skew grows).  The skew stays: the heal
does not restart the replica, so the checker judges a replica set whose clocks disagree (a later kill
restarts the victim with the same skew; another clock nemesis re-skews it).  The inject measures the skew
through the daemon's ``SELECT toUnixTimestamp(now())`` and raises when it is not there (a shim not taking
effect would otherwise pass silently).

Only CLOCK_REALTIME is skewed: clocks of different machines disagree in wall-clock time, which NTP steps and
slews, while CLOCK_MONOTONIC is the elapsed time of one machine, never stepped; replicad's timeouts, the
ZooKeeper session and asyncio's timers run on it, and sleeps and timed waits are not touched.  Why not
libfaketime (Debian ``faketime``, tried first): 0.9.10 breaks Python itself.  With its monotonic clock faked,
``threading.Event.wait(0.05)`` hangs; with ``FAKETIME_DONT_FAKE_MONOTONIC=1``, ``time.sleep(0.05)`` fails
with EINVAL (its ``clock_nanosleep`` converts Python's absolute CLOCK_MONOTONIC deadline as if it were faked
wall-clock time).  A replica run that way stalled its event loop 300 times in a minute and fell behind by
200 queue entries: libfaketime's failure, not the skew's.  Neither libfaketime nor this shim skews the times
``stat`` returns: files a skewed replica writes carry the true time, so to the replica each of its files
looks ``offset`` old the moment it is written, as right after a clock step.  ClickHouse 18.16 members are
not skewed (a static binary).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.nemeses import Nemesis
from tests.chaos.rig import Rig
from tests.chaos.workload import http_query

SOURCE = Path(__file__).with_name("fakeclock.c")
CLOCK_ENV = ("LD_PRELOAD", "CHAOS_CLOCK_OFFSET_NS", "CHAOS_CLOCK_RATE")
#: offsets in seconds: around a minute, the 5-10 minute range, hours, and past a day (the 24 h lifetimes of
#: temporary directories and staged runs)
SKEWS_S = (75, 420, 7200, 93600)
_built: tuple[Path | None, str | None] | None = None


def _build() -> tuple[Path | None, str | None]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) to build the clock shim"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    lib = Path(tempfile.gettempdir()) / f"replicad-chaos-fakeclock-{os.getuid()}-{digest}.so"
    if not lib.is_file():
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SOURCE), "-ldl"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            return None, f"the clock shim does not build: {r.stderr.strip()[-300:]}"
        os.replace(tmp, lib)
    probe = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], capture_output=True,
                           text=True, timeout=60, env={**os.environ, **_env(lib, -86400.0, 1.0)})
    try:
        skew = float(probe.stdout) - time.time()
    except ValueError:
        return None, f"the clock shim does not load: {probe.stderr.strip()[-300:]}"
    if abs(skew + 86400) > 60:
        return None, f"the clock shim has no effect (a -86400 s skew measured {skew:+.0f} s)"
    return lib, None


def shim() -> Path | None:
    global _built
    if _built is None:
        _built = _build()
    return _built[0]


def clock_support() -> str | None:
    """None when replicas can be started with a skewed clock here, else why not."""
    shim()
    assert _built is not None
    return _built[1]


def describe_support() -> str:
    reason = clock_support()
    if reason is None:
        return ("clock skew and drift (a replica restarted with its wall clock off, by an LD_PRELOAD "
                "shim, and left so through the check; monotonic clock untouched)")
    return f"no clock skew ({reason})"


def _env(lib: Path, offset_s: float, rate: float) -> dict[str, str]:
    return {"LD_PRELOAD": str(lib), "CHAOS_CLOCK_OFFSET_NS": str(int(offset_s * 1e9)),
            "CHAOS_CLOCK_RATE": repr(rate)}


def measured_skew(url: str, timeout: float = 10.0) -> float:
    """The daemon's wall clock minus ours (seconds, to about one second)."""
    before = time.time()
    status, _h, body = http_query(url, "SELECT toUnixTimestamp(now())", timeout=timeout)
    after = time.time()
    if status != 200:
        raise RuntimeError(f"now() failed: {status} {body[:200]!r}")
    return int(body.strip()) - (before + after) / 2


def restart_skewed(rig: Rig, name: str, offset_s: float = 0.0, rate: float = 1.0) -> float:
    """Stop ``name`` (SIGTERM) and start it with its wall clock ``offset_s`` off and running ``rate`` times as
    fast (0 and 1: the true clock); returns the measured skew."""
    daemon = rig.daemons[name]
    rig.resume(name)
    daemon.stop(timeout=15)
    for k in CLOCK_ENV:
        daemon.env.pop(k, None)
    if offset_s or rate != 1.0:
        lib = shim()
        assert lib is not None, clock_support()
        daemon.env.update(_env(lib, offset_s, rate))
    rig.start([name])
    return measured_skew(rig.url(name))


class ClockSkew(Nemesis):
    """One replicad replica restarted with its wall clock off by a fixed offset (kept until the run ends)."""

    name = "clock_skew"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice(rig.replicad_names)
        offset = rng.choice(SKEWS_S) * rng.choice((1, -1))
        skew = restart_skewed(rig, victim, offset_s=offset)
        if abs(skew - offset) > max(5.0, 0.01 * abs(offset)):
            raise RuntimeError(f"{victim}: asked for a clock {offset:+d} s off, measured {skew:+.0f} s")
        return f"{victim} restarted with its clock {offset:+d} s off (measured {skew:+.0f} s)"


class ClockDrift(Nemesis):
    """One replicad replica restarted with a wall clock that runs 1.5 to 3 times as fast (kept until the run
    ends): the skew grows while the run goes on."""

    name = "clock_drift"

    def inject(self, rig: Rig, rng: random.Random) -> str:
        victim = rng.choice(rig.replicad_names)
        rate = rng.choice((1.5, 2.0, 3.0))
        skew = restart_skewed(rig, victim, rate=rate)
        time.sleep(2.0)
        later = measured_skew(rig.url(victim))
        if later <= skew:
            raise RuntimeError(f"{victim}: its clock was to run {rate}x as fast; skew {skew:+.1f} s, then "
                               f"{later:+.1f} s two seconds later")
        return f"{victim} restarted with its clock running {rate}x as fast (skew {later:+.0f} s and growing)"


CLOCK_NEMESES: dict[str, type[Nemesis]] = {n.name: n for n in (ClockSkew, ClockDrift)}
