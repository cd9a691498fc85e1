"""replicad.memory.release_unused_memory gives freed Arrow memory back to the system."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.memory import release_unused_memory


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_freed_arrow_memory_goes_back_to_the_system() -> None:
    source = pa.array(np.arange(8_000_000, dtype=np.int64))  # 64 MB, numpy's memory
    held = [pc.add(source, i) for i in range(6)]  # 6 x 64 MB from Arrow's pool, written (resident)
    assert held[5][1].as_py() == 6
    del held
    after_free = rss_mb()  # the allocator keeps what was freed
    release_unused_memory()
    assert after_free - rss_mb() > 200
