"""replicad.memory.release_unused_memory gives freed Arrow memory back to the system; keep_pandas_out keeps
pyarrow from importing pandas."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_pyarrow_runs_without_importing_pandas() -> None:
    code = (
        "import sys\n"
        "from replicad.memory import keep_pandas_out\n"
        "assert keep_pandas_out()\n"
        "import pyarrow as pa\n"
        "t = pa.table({'x': [1, None]}); a = pa.array([1.5, 2.5])\n"
        "assert t.to_pylist() == [{'x': 1}, {'x': None}] and a.to_numpy().sum() == 4.0\n"
        "assert 'pandas' not in sys.modules\n"
        "try:\n"
        "    t.to_pandas()\n"
        "except ImportError:\n"
        "    print('refused')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "refused"
