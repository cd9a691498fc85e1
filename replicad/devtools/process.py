"""Spawning test server processes that cannot outlive the test run.

Each server runs in its own process group (so kill() reaches any children too).  Every live process
is remembered and killed at interpreter exit (atexit), and on Linux the child also gets SIGKILL from
the kernel if the process that started it dies (``setpriv --pdeathsig``) — only when started from the main
thread, because the death signal follows the *thread* that forked.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

_live: set[subprocess.Popen[bytes]] = set()
_lock = threading.Lock()


def _with_pdeathsig(argv: Sequence[str]) -> list[str]:
    """Prefix ``argv`` with util-linux ``setpriv --pdeathsig KILL`` when available (Linux, main thread)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return list(argv)
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", *argv] if setpriv else list(argv)


def spawn(
    argv: Sequence[str], log_path: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new process group with stdout+stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            _with_pdeathsig(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    with _lock:
        _live.add(proc)
    return proc


def terminate(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
    """Send ``sig`` to the process group, wait up to ``timeout``, then SIGKILL.  Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    else:  # the leader is gone; make sure nothing else in its group lingers
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with _lock:
        _live.discard(proc)
    return proc.returncode


def kill(proc: subprocess.Popen[bytes]) -> int | None:
    return terminate(proc, signal.SIGKILL, timeout=30.0)


@atexit.register
def _kill_all() -> None:
    with _lock:
        procs = list(_live)
    for p in procs:
        with contextlib.suppress(Exception):
            kill(p)


class ServerProcess:
    """A server started with :func:`spawn` and held in ``self.proc`` (None before start and after a stop)."""

    proc: subprocess.Popen[bytes] | None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _terminate(self, timeout: float) -> int | None:
        """SIGTERM to the process group, SIGKILL after ``timeout``; the exit code (None: not running)."""
        if self.proc is None:
            return None
        code = terminate(self.proc, timeout=timeout)
        self.proc = None
        return code

    def kill(self) -> None:
        """SIGKILL: the server vanishes without closing anything."""
        if self.proc is not None:
            kill(self.proc)
            self.proc = None


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
