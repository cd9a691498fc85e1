"""In-process microbenchmark of a small insert's path without ZooKeeper: a 100-row TSV body of the bench's
events table parsed to storage Arrow, prepared, split by partition, written as a ``tmp_insert_`` part (no
fsync, as the daemon; ``seal``: sorted, serialized and compressed, its block id known, ``files``: the files
made), its block id computed and the directory renamed.  Per stage: this thread's CPU time
(``--clock cpu``, the default: less sensitive to other load on the machine) or wall time, p10/p50/p90 µs.

    python -m bench.small_insert_micro [--inserts 300] [--rows 100] [--dir /dev/shm] [--clock wall]
                                       [--gap-ms 10]

``--dir`` on a tmpfs leaves out the file system's share of the part writing (on ext4 the 18 file creations
of a part cost more kernel time than the Python around them).

``--gap-ms`` sleeps between inserts, as a daemon's small inserts arrive: the same code is much slower run
cold than back to back (2-core VM, wall p50 of the whole path: 1.77 ms back to back, 4.35 ms with 10 ms
gaps, 3.6 ms with the 10 ms spent spinning in Python instead).  That, not the code's hot cost, is most of
the gap between this benchmark and the daemon's stage times.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bench.cluster import EVENTS_COLUMNS, make_events, to_tsv_fast
from replicad.datatypes import parse_type
from replicad.replication.sink import InsertContext, TableSchema, block_id_for, split_block, write_temp_part
from replicad.server.formats import _PARSERS, SyncBody, _drain
from replicad.server.input_columns import InputSpec
from replicad.storage.layout import TableDataLayout
from replicad.storage.writer import WriterSettings, prepare_block

STAGES = ("parse", "prepare", "split", "seal", "files", "block_id", "rename", "total")


class _SealMark:
    """Stands for the insert's early lock (replicad/replication/early_lock.py) in write_temp_part: notes when
    the part was sealed (sorted, serialized, compressed: its block id known), so the write splits into the
    work before the files and the files themselves; renames nothing."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.at = 0

    def sealed(self, _partition_id: str, _files: object) -> None:
        self.at = self.clock()

    def rename_if_locked(self, tmp_dir: Path, _wait_s: float = 0.0) -> Path:
        return tmp_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inserts", type=int, default=300)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--dir", default=None, help="where the parts go (default: a temporary directory)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="sleep between inserts (cold runs)")
    args = ap.parse_args()
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    cols = tuple((n, parse_type(t)) for n, t in EVENTS_COLUMNS)
    schema = TableSchema(cols, "toYYYYMM(d)", "k", None, "UTC")
    spec = InputSpec(format="TabSeparated", columns=list(cols), explicit_columns=False)
    settings = WriterSettings()
    bodies = [to_tsv_fast(make_events(args.rows, seed=10_000 + j)) for j in range(args.inserts)]
    tmp = Path(tempfile.mkdtemp(dir=args.dir))
    layout = TableDataLayout(tmp, "bench", "events")
    layout.path.mkdir(parents=True)
    loop = asyncio.new_event_loop()
    times: dict[str, list[float]] = {s: [] for s in STAGES}
    cpu0 = time.process_time()
    try:
        for i, raw in enumerate(bodies):
            if args.gap_ms:
                time.sleep(args.gap_ms / 1000)
            t0 = clock()
            items = _drain(_PARSERS["TabSeparated"](SyncBody(None, loop, 1 << 30, raw, complete=True), spec))
            table = pa.Table.from_batches(items[1:])
            t1 = clock()
            prepared = prepare_block(table, list(schema.columns), schema.tz, defaults=schema.column_defaults)
            t2 = clock()
            blocks = split_block(prepared, schema)
            t3 = clock()
            seal = _SealMark(clock)
            written = [write_temp_part(b, schema, layout, settings, seal if k == 0 else None)
                       for k, b in enumerate(blocks)]
            t4 = clock()
            ctx = InsertContext()
            for b, w in zip(blocks, written, strict=True):
                block_id_for(b.partition_id, w.checksums, ctx)
            t5 = clock()
            for w in written:
                os.rename(w.path, w.path.parent / f"{w.path.name.removeprefix('tmp_insert_')}_{i}")
            t6 = clock()
            marks = (t0, t1, t2, t3, seal.at or t3, t4, t5, t6)
            for k, stage in enumerate(STAGES[:-1]):
                times[stage].append((marks[k + 1] - marks[k]) / 1000)
            times["total"].append((t6 - t0) / 1000)
    finally:
        cpu = time.process_time() - cpu0
        loop.close()
        shutil.rmtree(tmp, ignore_errors=True)
    warm = max(1, args.inserts // 10)  # the first inserts import and warm up
    gap = f", {args.gap_ms:g} ms between inserts" if args.gap_ms else ""
    print(f"{args.inserts} inserts of {args.rows} rows, {args.clock} time per stage (µs){gap}, "
          f"load {os.getloadavg()[0]:.1f}; process CPU (all threads) {1e3 * cpu / len(bodies):.2f} ms "
          "per insert")
    for stage in STAGES:
        v = sorted(times[stage][warm:])
        print(f"{stage:9s} p10 {v[len(v) // 10]:7.0f}  p50 {statistics.median(v):7.0f}  "
              f"p90 {v[int(len(v) * 0.9)]:7.0f}")


if __name__ == "__main__":
    main()
