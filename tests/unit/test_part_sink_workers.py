"""The receiving writer threads are reused between parts (part_sink._Workers)."""

from __future__ import annotations

import threading
import time

from replicad.storage.part_sink import _Workers


def test_workers_are_reused_and_grow_only_when_all_are_busy() -> None:
    pool = _Workers("test-workers")
    done = threading.Event()
    names: list[str] = []
    for _ in range(5):  # one after the other: one thread does everything
        done.clear()
        pool.submit(lambda: (names.append(threading.current_thread().name), done.set()))
        assert done.wait(5)
        time.sleep(0.01)  # the worker counts itself idle after the job
    assert pool.started == 1 and len(set(names)) == 1
    release = threading.Event()
    running = threading.Semaphore(0)

    def blocking() -> None:
        running.release()
        release.wait(5)

    for _ in range(3):  # three at once: two more threads
        pool.submit(blocking)
    for _ in range(3):
        assert running.acquire(timeout=5)
    assert pool.started == 3
    release.set()
