"""replicad.memory.release_unused_memory gives freed Arrow memory back to the system; keep_pandas_out keeps
pyarrow from importing pandas."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from replicad.datatypes import parse_type
from replicad.memory import release_unused_memory
from replicad.replication.sink import TableSchema, write_parts
from replicad.server import sync_body
from replicad.storage.block import prepare_block
from replicad.storage.layout import TableDataLayout
from replicad.storage.writer import WriterSettings


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


def test_an_insert_block_is_freed_without_the_cycle_collector(tmp_path: Path) -> None:
    """Preparing and writing an insert block leaves no reference cycle holding its columns: they are freed
    by reference counting as soon as the caller lets go, not at the next full collection (a self-calling
    closure in the DEFAULT evaluation kept a whole block alive: 45 MiB at rest after an insert, measured)."""
    columns = (("a", parse_type("UInt32")), ("b", parse_type("UInt64")), ("s", parse_type("String")))
    schema = TableSchema(columns, None, "a", "a", defaults=(("b", "DEFAULT", "a * 2"),))
    rows = pa.table({"a": pa.array(np.arange(50_000, 0, -1, dtype=np.uint32)),
                     "s": pa.array([b"x" * (i % 20) for i in range(50_000)], pa.binary())})
    layout = TableDataLayout(tmp_path, "db", "t")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds unreachable stays in gc.garbage to look at
    try:
        prepared = prepare_block(rows, list(schema.columns), defaults=schema.column_defaults)
        assert prepared.column("b")[0].as_py() == 100_000
        del prepared
        written = write_parts(rows, schema, layout, WriterSettings(fsync=False, threads=2))
        assert [w.rows for _pid, w in written] == [50_000]
        del written
        gc.collect()
        held = [type(o).__name__ for o in gc.garbage
                if isinstance(o, (pa.Array, pa.ChunkedArray, pa.Table, pa.RecordBatch, pa.Buffer))]
        assert held == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


_THREAD_FREE = """
import sys, threading
from replicad.memory import tune_allocators
tuned = tune_allocators() if sys.argv[1] == "tuned" else False
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon")) / 1024

source = pa.array(np.arange(4_000_000, dtype=np.int64))
before = rss_mb()
def work():  # a worker thread fills Arrow memory, frees it, and goes idle (as an insert's threads do)
    held = [pc.add(source, i) for i in range(8)]  # 8 x 32 MB
    assert held[7][1].as_py() == 8
    del held
t = threading.Thread(target=work)
t.start(); t.join()
print(tuned, round(rss_mb() - before))
"""


def test_tuned_allocator_returns_an_idle_threads_memory() -> None:
    """With :func:`tune_allocators` (the daemon calls it before pyarrow loads), memory a worker thread freed
    goes back to the system without anyone asking (mimalloc's ``release_unused`` only reaches the calling
    thread); untuned, the same run keeps most of it."""
    def run(mode: str) -> tuple[str, int]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC")}
        out = subprocess.run([sys.executable, "-c", _THREAD_FREE, mode], capture_output=True, text=True,
                             check=True, env=env)
        tuned, kept = out.stdout.split()
        return tuned, int(kept)

    tuned, kept = run("tuned")
    assert tuned == "True" and kept < 40
    untuned, kept_untuned = run("plain")
    assert untuned == "False" and kept_untuned > 150


_SMALL_ALLOCATIONS = """
import sys
from replicad.memory import tune_allocators
if sys.argv[1] == "tuned":
    tune_allocators()
import pyarrow as pa
held = [pa.array(list(range(i, i + 100))) for i in range(50)]  # a few small allocations from Arrow's pool
with open("/proc/self/smaps_rollup") as f:
    print(next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages")))
"""


def test_tuned_allocator_backs_small_allocations_with_no_huge_pages() -> None:
    """A resting daemon makes a few small allocations from Arrow's pool; tuned (``arena_eager_commit`` 0)
    they cost no transparent huge page, untuned mimalloc commits its whole first arena and the kernel backs
    it with huge pages (2 x 2 MiB resident) wherever transparent huge pages are not off."""
    def huge_kb(mode: str) -> int:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC")}
        out = subprocess.run([sys.executable, "-c", _SMALL_ALLOCATIONS, mode], capture_output=True, text=True,
                             check=True, env=env)
        return int(out.stdout)

    assert huge_kb("tuned") == 0
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists() and "[never]" not in thp.read_text():
        assert huge_kb("plain") >= 2048  # the case the option is for


def test_parse_pool_releases_in_its_own_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a big insert the parser threads (which allocated the blocks) each return their allocator's
    cache, then the process-wide release runs; the caller does not wait for it."""
    calls: list[str] = []
    def in_thread() -> None:
        calls.append(threading.current_thread().name)

    monkeypatch.setattr(sync_body, "release_thread_cache", in_thread)
    monkeypatch.setattr(sync_body, "release_unused_memory", lambda: calls.append("process"))

    async def main() -> None:
        pool = sync_body.ParsePool(4)
        try:
            for _ in range(2):  # two inserts at once: the pool has two parser threads
                pool.enter()
            await asyncio.gather(*(asyncio.get_running_loop().run_in_executor(pool.executor, time.sleep, 0.05)
                                   for _ in range(2)))
            pool.leave()
            pool.leave()
            pool.release_memory_soon()
            pool.release_memory_soon()  # one release at a time: this one joins the first
            assert calls == []  # not waited for
            while len(calls) < 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
        finally:
            pool.shutdown()

    asyncio.run(main())
    assert len(calls) == 3 and calls[-1] == "process"
    assert all(name.startswith("insert-parse") for name in calls[:2])


def test_daemon_imports_and_logs_without_rich() -> None:
    """keep_out (``replicad run`` calls it first): the daemon's modules import without rich and pygments,
    and an exception is still logged with its traceback (plain text in the JSON line).  boto3 waits for the
    first S3 client (a daemon without an S3 disk never loads it: ~9 MiB)."""
    code = (
        "import sys, io, json\n"
        "from replicad.memory import keep_out\n"
        "assert keep_out()\n"
        "import replicad.daemon, replicad.catalog, replicad.replica\n"
        "from replicad import logging as rlog\n"
        "out = io.StringIO()\n"
        "rlog.configure('info', out)\n"
        "try:\n"
        "    1 / 0\n"
        "except ZeroDivisionError:\n"
        "    rlog.get_logger('t').exception('failed')\n"
        "line = json.loads(out.getvalue().splitlines()[-1])\n"
        "assert 'ZeroDivisionError' in line['exception'], line\n"
        "print(sorted(m for m in ('rich', 'pygments', 'pandas', 'boto3') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


_ARENA_PROBE = r"""
import ctypes, sys, threading
from replicad.memory import _malloc_trim, limit_malloc_arenas

limited = limit_malloc_arenas() if sys.argv[1] == "1" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


def anon_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssAnon:"))


# a big block freed, as an insert's body: glibc raises its mmap and trim thresholds (to 24 and 48 MiB)
big = libc.malloc(24 << 20)
ctypes.memset(big, 1, 24 << 20)
libc.free(big)


def work():  # a worker thread's 25 MiB of mid-sized buffers, used and freed
    ptrs = [libc.malloc(64 << 10) for _ in range(400)]
    for p in ptrs:
        ctypes.memset(p, 1, 64 << 10)
    for p in ptrs:
        libc.free(p)


base = anon_mib()
threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
_malloc_trim()(0)  # what release_unused_memory does after a big insert
print(limited, anon_mib() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
@pytest.mark.parametrize("limit", [False, True])
def test_one_malloc_arena_lets_the_trim_return_what_worker_threads_freed(limit: bool) -> None:
    """With an arena per thread (glibc's default) the free space at the top of a worker thread's arena stays
    resident after malloc_trim (50 MiB of the 50 the threads used, measured); with limit_malloc_arenas (the
    daemon calls it at start) it is the main heap's top, and the trim gives it back."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX" and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _ARENA_PROBE, "1" if limit else "0"], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    limited, kept_mib = out[0] == "True", float(out[1])
    assert limited is limit
    if limit:
        assert kept_mib < 8
    else:
        assert kept_mib > 30  # the probe still shows the retention the limit is for


def test_malloc_arenas_are_left_alone_when_the_user_chose_or_threads_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from replicad import memory

    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return 1

    monkeypatch.setattr(memory, "_libc_function", lambda name, *argtypes: mallopt)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert memory.limit_malloc_arenas() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert memory.limit_malloc_arenas() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert memory.limit_malloc_arenas() is False  # a thread that allocated keeps its arena
    finally:
        stop.set()
        t.join()
    assert calls == []
    if threading.active_count() == 1:
        assert memory.limit_malloc_arenas() is True and calls == [(-8, 1)]
