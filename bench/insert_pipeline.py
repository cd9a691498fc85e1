"""The text insert pipeline in one process, without HTTP or ZooKeeper: body parsing
(``server.formats.parse_body``) -> ``prepare_block`` -> ``split_block`` -> ``write_temp_part`` (sort + write).

    .venv/bin/python bench/insert_pipeline.py [--rows 2000000] [--format TSV|CSV|JSONEachRow] [--tz UTC]
                                              [--method zstd|lz4] [--sorted]

Rows: the events table of bench/part_writer.py (Date, DateTime, UInt64, String, Float64, UInt8), PARTITION BY
toYYYYMM(d) ORDER BY k.  A small body is pushed through first (pyarrow's lazy imports).  Prints wall and
CPU seconds and the split between parsing, block preparation and writing; run it under
``py-spy record -- python bench/insert_pipeline.py`` to see where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.part_writer import COLUMNS, make_rows, to_tsv  # noqa: E402
from replicad.datatypes import parse_type  # noqa: E402
from replicad.replication.sink import TableSchema, split_block, write_temp_part  # noqa: E402
from replicad.server.formats import InputSpec, parse_body  # noqa: E402
from replicad.storage.block import prepare_block  # noqa: E402
from replicad.storage.layout import TableDataLayout  # noqa: E402
from replicad.storage.writer import WriterSettings  # noqa: E402


class Body:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = memoryview(data), 0

    async def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(len(self.data), self.pos + n)
        out = bytes(self.data[self.pos:end])
        self.pos = end
        return out


def make_body(rows: int, fmt: str, presorted: bool = False) -> bytes:
    table = make_rows(rows)
    if presorted:  # as a SELECT from a MergeTree table renders them: already in ORDER BY order
        table = table.sort_by("k")
    tsv = to_tsv(table)
    if fmt == "TSV":
        return tsv
    if fmt == "CSV":
        return tsv.replace(b"\t", b",")  # no commas or quotes in the generated values
    lines = []
    for line in tsv.decode().splitlines():
        d, ts, k, s, f, u = line.split("\t")
        lines.append(json.dumps({"d": d, "ts": ts, "k": int(k), "s": s, "f": float(f), "u": int(u)}))
    return ("\n".join(lines) + "\n").encode()


async def run(body: bytes, fmt: str, tz: str, work: Path, method: str) -> dict[str, float]:
    cols = [(n, parse_type(t)) for n, t in COLUMNS]
    schema = TableSchema(tuple(cols), "toYYYYMM(d)", "k", None, tz)
    layout = TableDataLayout(work, "default", "events")
    layout.create()
    settings = WriterSettings(method=method, fsync=False)  # type: ignore[arg-type]
    spec = InputSpec(format=fmt, columns=cols, explicit_columns=False, tz=tz)
    t = {"parse": 0.0, "prepare": 0.0, "write": 0.0, "rows": 0.0}
    t0 = time.perf_counter()
    parsed = await parse_body(Body(body), spec, 1 << 40)
    batches = parsed.batches.__aiter__()
    while True:
        try:
            batch = await batches.__anext__()
        except StopAsyncIteration:
            break
        t1 = time.perf_counter()
        t["rows"] += batch.num_rows
        t["parse"] += t1 - t0
        blocks = split_block(prepare_block(pa.Table.from_batches([batch]), cols, tz), schema)
        t2 = time.perf_counter()
        t["prepare"] += t2 - t1
        for b in blocks:
            write_temp_part(b, schema, layout, settings)
        del batch, blocks, b  # as the daemon does: the block goes before the next one is parsed
        t0 = time.perf_counter()
        t["write"] += t0 - t2
    t["parse"] += time.perf_counter() - t0
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--format", default="TSV", choices=["TSV", "CSV", "JSONEachRow"])
    ap.add_argument("--tz", default="UTC")
    ap.add_argument("--method", default="zstd", choices=["zstd", "lz4"])
    ap.add_argument("--sorted", action="store_true", help="rows already in ORDER BY order")
    args = ap.parse_args()
    body = make_body(args.rows, args.format, args.sorted)
    work = Path(tempfile.mkdtemp(prefix="bench-insert-pipeline-"))
    try:
        warm = body[:body.rindex(b"\n", 0, 100_000) + 1]
        asyncio.run(run(warm, args.format, args.tz, work / "warm", args.method))
        c0, w0 = time.process_time(), time.perf_counter()
        t = asyncio.run(run(body, args.format, args.tz, work / "data", args.method))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.format}: {int(t['rows'])} rows, {len(body) / 1e6:.0f} MB, tz {args.tz}: wall {wall:.2f} s "
          f"({t['rows'] / wall / 1e6:.2f} M rows/s), CPU {cpu:.2f} s; parse {t['parse']:.2f} s, "
          f"prepare+split {t['prepare']:.2f} s, sort+write {t['write']:.2f} s")


if __name__ == "__main__":
    main()
