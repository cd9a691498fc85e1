"""Merge throughput: replicad's merge_parts vs ClickHouse 18.16 OPTIMIZE FINAL of the same parts.

    .venv/bin/python bench/merge.py [--parts 10] [--rows 200000] [--method lz4|zstd] [--order-by k]
                                    [--granules-per-batch 4] [--threads N]

Table: (d Date, ts DateTime, k UInt64, s String, f Float64, u UInt8) PARTITION BY toYYYYMM(d)
ORDER BY k (random keys: every source interleaves with every other).  18.16 inserts ``--parts`` blocks
with merges stopped (one part each); the parts are copied; then 18.16 runs ``OPTIMIZE TABLE t FINAL``
(timed) and replicad merges the copies in a fresh child process (timed; its peak RSS is the merge's).
Throughput is MB/s of *input*: the uncompressed bytes of the source parts' column streams.  The two
merged parts are also compared file by file (same compression method -> they should be identical).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.part_writer import COLUMNS, make_rows, to_tsv, vm_hwm_kb  # noqa: E402

ZSTD_CONFIG = (
    "<compression><case><min_part_size>0</min_part_size><min_part_size_ratio>0</min_part_size_ratio>"
    "<method>zstd</method></case></compression>"
)


def input_bytes(part_dirs: list[Path]) -> int:
    from replicad.storage.part import PartDirectory

    return sum(
        c.uncompressed_size
        for p in part_dirs
        for c in PartDirectory(p).checksums.files.values()
        if c.is_compressed
    )


def child(sources_file: str, out_dir: str, order_by: str, method: str, gpb: int, threads: int) -> None:
    """Runs in a fresh process: merge the parts listed in ``sources_file``; print JSON stats."""
    from replicad.memory import keep_pandas_out, tune_allocators

    tune_allocators()  # as ``replicad run`` does: the daemon merges in its own process, with these options
    keep_pandas_out()  # and the daemon process never imports pandas
    from replicad.datatypes import parse_type
    from replicad.storage.merge import PartSchema, merge_parts
    from replicad.storage.writer import WriterSettings

    sources = [Path(p) for p in Path(sources_file).read_text().split()]
    schema = PartSchema(tuple((n, parse_type(t)) for n, t in COLUMNS), "toYYYYMM(d)", order_by)
    settings = WriterSettings(method=method, fsync=False, threads=threads)  # type: ignore[arg-type]
    import numpy as np
    import pyarrow as pa

    pa.table({"x": [1]})  # pyarrow's one-time lazy imports: a running daemon has paid them
    pa.array(np.zeros(1))  # and numpy.ma's (pyarrow looks for masked arrays): ~60 ms, once per process
    rss0 = vm_hwm_kb(os.getpid())
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    part = merge_parts(sources, Path(out_dir), schema, settings, granules_per_batch=gpb)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"seconds": elapsed, "cpu_seconds": time.process_time() - cpu0, "rows": part.rows,
                      "rss0_kb": rss0, "peak_rss_kb": vm_hwm_kb(os.getpid())}))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_replicad(sources: list[Path], out: Path, args: argparse.Namespace) -> dict[str, float]:
    listing = out.parent / "sources.txt"
    listing.write_text("\n".join(str(s) for s in sources))
    cmd = [sys.executable, __file__, "--method", args.method, "--order-by", args.order_by,
           "--granules-per-batch", str(args.granules_per_batch), "--threads", str(args.threads),
           "--child", str(listing), str(out)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", type=int, default=10)
    ap.add_argument("--rows", type=int, default=200_000, help="rows per part")
    ap.add_argument("--method", default="lz4", choices=["zstd", "lz4"])
    ap.add_argument("--order-by", default="k")
    ap.add_argument("--granules-per-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return ap


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One run of both sides; returns ``mb`` (input, uncompressed), ``replicad`` (the child's JSON),
    ``clickhouse_seconds``, ``clickhouse_cpu_seconds``, ``clickhouse_peak_rss_kb``,
    ``clickhouse_rss0_kb``, ``identical`` and ``differ`` (used by ``python -m bench``)."""
    from replicad.devtools.clickhouse import ClickHouseServer

    work = Path(tempfile.mkdtemp(prefix="bench-merge-"))
    try:
        extra = ZSTD_CONFIG if args.method == "zstd" else ""
        with ClickHouseServer(work / "ch", extra_config=extra) as ch:
            ddl = ", ".join(f"{n} {t}" for n, t in COLUMNS)
            ch.query(f"CREATE TABLE t ({ddl}) ENGINE = MergeTree PARTITION BY toYYYYMM(d) "
                     f"ORDER BY {args.order_by}")
            ch.query("SYSTEM STOP MERGES")
            for i in range(args.parts):
                rows = to_tsv(make_rows(args.rows, seed=100 + i))
                ch.query("INSERT INTO t FORMAT TSV", data=rows, timeout=600)
            names = [r[0] for r in ch.query_rows("SELECT name FROM system.parts WHERE table='t' AND active "
                                                 "ORDER BY name")]
            assert len(names) == args.parts, names
            table_dir = ch.table_dir("default", "t")
            sources = []
            for name in names:
                shutil.copytree(table_dir / name, work / "sources" / name)
                sources.append(work / "sources" / name)
            ch.query("SYSTEM START MERGES")
            assert ch.proc is not None
            hwm0 = vm_hwm_kb(ch.proc.pid)
            cpu0 = cpu_seconds(ch.proc.pid)
            t0 = time.perf_counter()
            ch.query("OPTIMIZE TABLE t FINAL", timeout=600)
            ch_s = time.perf_counter() - t0
            ch_cpu = cpu_seconds(ch.proc.pid) - cpu0
            ch_hwm = vm_hwm_kb(ch.proc.pid)
            (merged,) = [r[0] for r in ch.query_rows(
                "SELECT name FROM system.parts WHERE table='t' AND active")]
            theirs = work / "theirs"
            shutil.copytree(table_dir / merged, theirs)
        mb = input_bytes(sources) / 1e6
        res = run_replicad(sources, work / "ours", args)
        names_ours = sorted(os.listdir(work / "ours"))
        listing = sorted(os.listdir(theirs))
        _same, diff, errors = filecmp.cmpfiles(theirs, work / "ours", listing, shallow=False)
        identical = names_ours == listing and not diff and not errors
        return {"mb": mb, "replicad": res, "clickhouse_seconds": ch_s, "clickhouse_cpu_seconds": ch_cpu,
                "clickhouse_peak_rss_kb": ch_hwm, "clickhouse_rss0_kb": hwm0, "identical": identical,
                "differ": diff + errors}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    args = parser().parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.order_by, args.method, args.granules_per_batch, args.threads)
        return
    m = measure(args)
    res, mb, ch_s, ch_cpu = m["replicad"], m["mb"], m["clickhouse_seconds"], m["clickhouse_cpu_seconds"]
    n = int(res["rows"])
    print(f"input     : {args.parts} parts x {args.rows} rows, {mb:.1f} MB uncompressed, "
          f"method {args.method}")
    print(f"replicad  : {n} rows in {res['seconds']:.3f} s = {mb / res['seconds']:.1f} MB/s, "
          f"peak RSS {res['peak_rss_kb'] / 1024:.0f} MiB "
          f"(before merging {res['rss0_kb'] / 1024:.0f} MiB)")
    print(f"clickhouse: OPTIMIZE FINAL in {ch_s:.3f} s = {mb / ch_s:.1f} MB/s, "
          f"server peak RSS {m['clickhouse_peak_rss_kb'] / 1024:.0f} MiB "
          f"(before {m['clickhouse_rss0_kb'] / 1024:.0f} MiB)")
    print(f"ratio (replicad speed / ClickHouse speed): {ch_s / res['seconds']:.2f}x (target >= 0.5x); "
          f"CPU seconds: replicad {res['cpu_seconds']:.2f}, ClickHouse {ch_cpu:.2f} "
          f"(ratio {ch_cpu / res['cpu_seconds']:.2f}x; wall times suffer from other load, CPU less so)")
    differ = "" if m["identical"] else f" (differ: {m['differ']})"
    print(f"merged parts byte-identical: {m['identical']}{differ}")


if __name__ == "__main__":
    main()
