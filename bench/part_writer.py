"""Part writer throughput: replicad's PartWriter vs ClickHouse 18.16 inserting the same rows.

    .venv/bin/python bench/part_writer.py [--rows 2000000] [--method zstd|lz4] [--threads N] [--no-fsync]
                                          [--repeat 3] [--skip-clickhouse]

Rows: (d Date, ts DateTime, k UInt64, s String, f Float64, u UInt8), one month, random order.
replicad: Arrow (memory-mapped IPC file) -> sort permutation by ORDER BY (k) -> PartWriter (applies the
permutation column by column) -> part, fsynced; measured in a
fresh child process so that its peak RSS is the writer's.  ClickHouse: the same rows as TSV over HTTP
into a plain MergeTree with the same PARTITION BY / ORDER BY on a throwaway 18.16 server (same
compression method).  The two sides run alternately ``--repeat`` times and the best run of each is
reported (the machine may be shared).  Prints rows/s, MB/s (uncompressed column bytes), peak RSS, CPU
seconds (replicad process / ClickHouse server process) and the wall and CPU ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLUMNS = [
    ("d", "Date"), ("ts", "DateTime"), ("k", "UInt64"), ("s", "String"), ("f", "Float64"), ("u", "UInt8"),
]


def make_rows(n: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    d = rng.integers(19723, 19723 + 30, n).astype(np.int32)  # 2024-01-01 .. 2024-01-30
    ts = d.astype(np.int64) * 86400 + rng.integers(0, 86400, n)
    k = rng.integers(0, 1 << 40, n).astype(np.uint64)
    lens = rng.integers(5, 30, n)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz_-0123456789", np.uint8)
    chars = alphabet[rng.integers(0, len(alphabet), int(lens.sum()))]
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(chars.tobytes())]
    s = pa.BinaryArray.from_buffers(pa.binary(), n, buffers)
    f = np.round(rng.normal(100, 30, n), 3)
    u = rng.integers(0, 256, n).astype(np.uint8)
    return pa.table({
        "d": pa.array(d, pa.date32()), "ts": pa.array(ts, pa.timestamp("s")), "k": k, "s": s, "f": f, "u": u,
    })


def to_tsv(table: pa.Table) -> bytes:
    cols = [pc.cast(table.column(n), pa.string()) for n, _ in COLUMNS]
    lines = pc.binary_join_element_wise(*cols, "\t")
    return "\n".join(lines.to_pylist()).encode() + b"\n"


def child(ipc_path: str, out_dir: str, method: str, threads: int, fsync: bool, batch_rows: int) -> None:
    """Runs in a fresh process: read Arrow, sort, write the part; print JSON stats.

    The sort permutation is applied by the writer column by column (``order=``), in slices of
    ``batch_rows`` rows: the sorted table is never materialised.
    """
    from replicad.storage.types import parse_type
    from replicad.storage.writer import PartWriter, WriterSettings, sort_indices

    types = [(n, parse_type(t)) for n, t in COLUMNS]
    with pa.memory_map(ipc_path) as src:
        table = pa.ipc.open_file(src).read_all()
        rss0 = vm_hwm_kb(os.getpid())
        c0 = time.process_time()
        t0 = time.perf_counter()
        order = sort_indices([table.column("k")])
        t_sort = time.perf_counter() - t0
        settings = WriterSettings(method=method, threads=threads, fsync=fsync)  # type: ignore[arg-type]
        with PartWriter(Path(out_dir) / "tmp_insert_202401_1_1_0", types, settings, primary_key=["k"],
                        minmax_columns=["d"], partition_value=[(parse_type("UInt32"), 202401)]) as w:
            for i in range(0, len(order), batch_rows):
                w.write(table, order=order[i:i + batch_rows])
            part = w.finish()
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
    from replicad.storage.reader import PartReader

    rows_back = sum(b.num_rows for b in PartReader(part.path).iter_batches(["k"]))
    uncompressed = sum(c.uncompressed_size for c in part.checksums.files.values() if c.is_compressed)
    print(json.dumps({
        "seconds": elapsed, "cpu_seconds": cpu, "sort_seconds": t_sort, "rows": part.rows,
        "uncompressed": uncompressed,
        "bytes_on_disk": part.bytes_on_disk, "rss0_kb": rss0,
        "peak_rss_kb": vm_hwm_kb(os.getpid()), "rows_read_back": rows_back,
    }))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--method", default="zstd", choices=["zstd", "lz4"])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--skip-clickhouse", action="store_true")
    ap.add_argument("--batch-rows", type=int, default=262144, help="rows per PartWriter.write call")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the best one is reported")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    return ap


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run both sides ``args.repeat`` times, alternating.  Returns every run: ``replicad`` (the child's JSON
    dicts), ``clickhouse`` ((wall, cpu) seconds), plus ``tsv_bytes``, ``clickhouse_parts`` and
    ``clickhouse_peak_rss_kb`` (used by ``python -m bench``)."""
    work = Path(tempfile.mkdtemp(prefix="bench-part-writer-"))
    try:
        table = make_rows(args.rows)
        ipc = work / "rows.arrow"
        with pa.OSFile(str(ipc), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        tsv = b"" if args.skip_clickhouse else to_tsv(table)
        del table
        ours: list[dict[str, float]] = []
        theirs: list[tuple[float, float]] = []
        out: dict[str, Any] = {"replicad": ours, "clickhouse": theirs, "tsv_bytes": len(tsv)}
        ch = None if args.skip_clickhouse else start_clickhouse(work / "ch", args.method)
        try:
            # alternate the two sides so that both see the same machine load
            for i in range(args.repeat):
                out_dir = work / f"replicad{i}"
                out_dir.mkdir()
                cmd = [sys.executable, __file__, "--method", args.method, "--threads", str(args.threads),
                       "--batch-rows", str(args.batch_rows), "--child", str(ipc), str(out_dir)]
                cmd += ["--no-fsync"] if args.no_fsync else []
                run = subprocess.run(cmd, check=True, capture_output=True, text=True)
                ours.append(json.loads(run.stdout))
                subprocess.run(["rm", "-rf", str(out_dir)], check=False)
                if ch is not None:
                    theirs.append(clickhouse_insert(ch, tsv, i))
            if ch is not None:
                assert ch.proc is not None
                out["clickhouse_parts"] = ch.query(
                    "SELECT count(), sum(bytes_on_disk) FROM system.parts WHERE table = 't0' AND active"
                ).strip()
                out["clickhouse_peak_rss_kb"] = vm_hwm_kb(ch.proc.pid)
        finally:
            if ch is not None:
                ch.stop()
        return out
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


def main() -> None:
    args = parser().parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.method, args.threads, not args.no_fsync, args.batch_rows)
        return
    m = measure(args)
    ours, theirs = m["replicad"], m["clickhouse"]
    res = min(ours, key=lambda r: r["seconds"])
    mb = res["uncompressed"] / 1e6
    print(f"replicad  : {res['rows']} rows in {res['seconds']:.3f} s "
          f"(sort {res['sort_seconds']:.3f} s; best of {args.repeat}) = "
          f"{res['rows'] / res['seconds']:,.0f} rows/s, {mb / res['seconds']:.1f} MB/s uncompressed, "
          f"part {res['bytes_on_disk'] / 1e6:.1f} MB, peak RSS {res['peak_rss_kb'] / 1024:.0f} MiB "
          f"(input mapped: {res['rss0_kb'] / 1024:.0f} MiB before writing)")
    if not theirs:
        return
    ch_s, ch_cpu = min(theirs)
    n = res["rows"]
    print(f"clickhouse: {n:.0f} rows in {ch_s:.3f} s (best of {args.repeat}) = "
          f"{n / ch_s:,.0f} rows/s, "
          f"{mb / ch_s:.1f} MB/s uncompressed "
          f"(TSV {m['tsv_bytes'] / 1e6:.0f} MB over HTTP; parts, bytes: {m['clickhouse_parts']}), "
          f"server peak RSS {m['clickhouse_peak_rss_kb'] / 1024:.0f} MiB")
    print(f"cpu seconds: replicad {res['cpu_seconds']:.3f} (same run), "
          f"ClickHouse server {ch_cpu:.3f}")
    print(f"ratio (replicad speed / ClickHouse speed): {ch_s / res['seconds']:.2f}x wall, "
          f"{ch_cpu / res['cpu_seconds']:.2f}x cpu")


def start_clickhouse(root: Path, method: str) -> Any:
    from replicad.devtools.clickhouse import ClickHouseServer

    extra = ""
    if method == "zstd":
        extra = ("<compression><case><min_part_size>0</min_part_size>"
                 "<min_part_size_ratio>0</min_part_size_ratio>"
                 "<method>zstd</method></case></compression>")
    ch = ClickHouseServer(root, extra_config=extra)
    ch.start()
    return ch


def clickhouse_insert(ch: Any, tsv: bytes, i: int) -> tuple[float, float]:
    """(wall, server cpu) seconds for ClickHouse to insert the TSV rows into a fresh MergeTree ``t<i>``."""
    ddl = ", ".join(f"{n} {t}" for n, t in COLUMNS)
    ch.query(f"CREATE TABLE t{i} ({ddl}) ENGINE = MergeTree PARTITION BY toYYYYMM(d) ORDER BY k")
    c0 = cpu_seconds(ch.proc.pid)
    t0 = time.perf_counter()
    ch.query(f"INSERT INTO t{i} FORMAT TSV", data=tsv, timeout=600)
    seconds = time.perf_counter() - t0
    cpu = cpu_seconds(ch.proc.pid) - c0
    if i:
        ch.query(f"DROP TABLE t{i}")
    return seconds, cpu


if __name__ == "__main__":
    main()
