"""Sampling profiles of the benchmark's processes with py-spy, folded into a short text report."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path


class PySpy:
    """``py-spy record`` of a running process over a ``with`` block; ``top()`` summarises the samples.

    Frames are grouped by function and module; ``self`` counts samples where the function was the
    innermost frame, ``total`` samples where it was anywhere on the stack.  Idle threads are excluded.
    """

    def __init__(self, pid: int, out_path: Path, rate: int = 200, only_process: str | None = None) -> None:
        self.pid = pid
        self.out_path = out_path
        self.rate = rate
        self.only_process = only_process  # keep only samples of processes whose command line has this
        self.proc: subprocess.Popen[bytes] | None = None
        self.error = ""

    @staticmethod
    def find() -> str | None:
        exe = Path(sys.executable).parent / "py-spy"
        return str(exe) if exe.exists() else shutil.which("py-spy")

    def __enter__(self) -> PySpy:
        exe = self.find()
        if exe is None:
            self.error = "py-spy is not installed (pip install py-spy)"
            return self
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw",
             "--nonblocking", "--output", str(self.out_path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # let it attach
        return self

    @classmethod
    def record_command(cls, argv: Sequence[str], out_path: Path, rate: int = 200, timeout: float = 900.0,
                       only_process: str | None = None) -> PySpy:
        """Run ``argv`` under ``py-spy record --subprocesses`` to its end (child processes included)."""
        spy = cls(0, out_path, rate, only_process)
        exe = cls.find()
        if exe is None:
            spy.error = "py-spy is not installed (pip install py-spy)"
            return spy
        out_path.parent.mkdir(parents=True, exist_ok=True)
        run = subprocess.run([exe, "record", "--subprocesses", "--rate", str(rate), "--format", "raw",
                              "--nonblocking", "--output", str(out_path), "--", *argv],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        if not out_path.exists():
            spy.error = f"py-spy wrote nothing: {run.stderr.decode(errors='replace').strip()[-300:]}"
        return spy

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not self.out_path.exists():
            self.error = f"py-spy wrote nothing: {err.decode(errors='replace').strip()[-300:]}"

    def top(self, n: int = 12) -> tuple[int, list[tuple[str, int, int]], list[tuple[str, int, int]]]:
        """(samples, by function, by replicad function).

        By function: ``(function (module), self samples, total samples)`` sorted by self samples.  By replicad
        function: the same with every sample charged to its innermost frame in the ``replicad`` package
        (so time in pyarrow/numpy/zstd counts for the replicad function that called it)."""
        samples = 0
        self_counts: Counter[str] = Counter()
        incl_counts: Counter[str] = Counter()
        own_self: Counter[str] = Counter()
        own_incl: Counter[str] = Counter()
        if not self.out_path.exists():
            return 0, [], []
        for line in self.out_path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            if self.only_process is not None:
                procs = [f for f in stack.split(";") if f.startswith("process ")]
                if not procs or self.only_process not in procs[-1]:
                    continue
            if "(<frozen importlib._bootstrap>" in stack:
                continue  # module imports: one-time costs, not the work measured
            frames = [_frame_name(f) for f in stack.split(";") if f and not f.startswith("process ")
                      and not f.startswith("thread ")]
            if not frames:
                continue
            samples += count
            self_counts[frames[-1]] += count
            for f in set(frames):
                incl_counts[f] += count
            own = [f for f in frames if "(replicad/" in f]
            if own:
                own_self[own[-1]] += count
                for f in set(own):
                    own_incl[f] += count
        rows = [(f, c, incl_counts[f]) for f, c in self_counts.most_common(n)]
        own_rows = [(f, c, own_incl[f]) for f, c in own_self.most_common(n)]
        return samples, rows, own_rows

    def markdown(self, title: str, n: int = 12) -> str:
        if self.error:
            return f"{title}: {self.error}"
        samples, rows, own_rows = self.top(n)
        if not samples:
            return f"{title}: no samples"
        lines = [f"{title} — {samples} samples at {self.rate} Hz, all threads, idle and imports excluded. "
                 "self = innermost frame; total = anywhere on the stack.", "",
                 "| self % | total % | function (module) |", "|---:|---:|:---|"]
        lines += [f"| {100 * s / samples:.1f} | {100 * t / samples:.1f} | `{f}` |" for f, s, t in rows]
        lines += ["", READING_NOTE, "",
                  "Charged to the innermost `replicad` frame (library time counted for its caller):", "",
                  "| self % | total % | replicad function (module) |", "|---:|---:|:---|"]
        lines += [f"| {100 * s / samples:.1f} | {100 * t / samples:.1f} | `{f}` |" for f, s, t in own_rows]
        return "\n".join(lines)


READING_NOTE = (
    "Reading the frames: `Runner.run` self time (charged to `run_daemon`) is the uvloop event loop's native "
    "code (socket reads/writes, callbacks); `_WorkItem.run` self time is a builtin handed directly to "
    "`asyncio.to_thread` (e.g. `f.write`, `os.fsync`); `_worker` / `Condition.wait` are thread-pool "
    "hand-offs."
)


def _frame_name(frame: str) -> str:
    """``"fn (path/to/module.py:123)"`` → ``"fn (path/to/module.py)"`` (lines folded together)."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0] if where.rsplit(":", 1)[-1].isdigit() else where
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"
