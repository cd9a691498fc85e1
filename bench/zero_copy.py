"""S3 zero-copy fetch against a full fetch of the same part (replicad only; ``python -m bench.zero_copy``).

Two in-process replicas (tests/support/table_cluster.py) on a real ZooKeeper and moto (S3 on loopback), the
table on an S3 policy.  Replica A inserts one part of ~1 kB random strings per row; the time is from A's
acknowledgement to the part active on B.  Measured per mode: seconds, bytes over the interserver port (the
DataPartsExchange body B received), bytes B uploaded to and downloaded from the bucket, and the bucket's
size afterwards.  Zero-copy: the body is the metadata; B reads the part from the bucket (its local copy)
and uploads nothing.  Full: the body is the part; B uploads its own copy (the bucket holds two).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from replicad.devtools.zookeeper import ZooKeeperServer
from tests.support.s3_server import S3Server
from tests.support.table_cluster import Cluster, wait_for

STRING_LEN = 1000


def make_rows(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    letters = rng.integers(ord("a"), ord("z") + 1, size=n * STRING_LEN, dtype=np.uint8).tobytes()
    names = pa.array([letters[i * STRING_LEN:(i + 1) * STRING_LEN] for i in range(n)], pa.binary())
    ids = np.arange(n, dtype=np.int32)
    return pa.table({
        "id": pa.array(ids),
        "ctime": pa.array(np.full(n, 1_793_534_400, dtype="datetime64[s]")),  # 2026-11-01
        "name": names,
        "v": pa.array(ids.astype(np.uint32)),
    })


async def measure_mode(zk: ZooKeeperServer, s3: S3Server, work: Path, table: pa.Table, zero_copy: bool,
                       tag: str) -> dict[str, Any]:
    root = zk.new_chroot(f"bench_zero_copy_{tag}")
    bucket = f"bench-{tag}".replace("_", "-")
    cluster = Cluster(zk, root, work / tag)
    settings = {"storage_policy": "s3", "allow_remote_fs_zero_copy_replication": int(zero_copy)}
    try:
        disks = {n: s3.disk(work / tag / n, bucket, "data/") for n in ("a", "b")}
        policies = {"s3": "s3main"}
        a = await cluster.start("a", settings, disks={"s3main": disks["a"]}, storage_policies=policies)
        b = await cluster.start("b", settings, disks={"s3main": disks["b"]}, storage_policies=policies)
        await a.insert_table(table)
        t0 = time.monotonic()
        [part] = a.store.active_names()
        await wait_for(lambda: b.store.active_names() == [part], timeout=1800, poll=0.05)
        seconds = time.monotonic() - t0
        part_bytes = sum(f.stat().st_size for f in a.layout.part_path(part).iterdir())
        client = disks["b"].client
        bucket_bytes = sum(o.size for o in s3.client(bucket, "data/").list_sync("data/"))
        return {"seconds": seconds, "part_bytes": part_bytes, "interserver_bytes": b.fetcher.bytes_received,
                "s3_upload_bytes": client.bytes_uploaded, "s3_download_bytes": client.bytes_downloaded,
                "bucket_bytes": bucket_bytes, "zero_copy_fetches": b.fetcher.zero_copy_fetches}
    finally:
        await cluster.close()


async def measure(rows: int, runs: int, work: Path) -> dict[str, list[dict[str, Any]]]:
    table = make_rows(rows)
    zk = ZooKeeperServer(work / "zk")
    zk.start()
    s3 = S3Server.start(work)
    try:
        out: dict[str, list[dict[str, Any]]] = {"zero_copy": [], "full": []}
        for i in range(runs):
            for mode in ("zero_copy", "full"):
                out[mode].append(await measure_mode(zk, s3, work, table, mode == "zero_copy", f"{mode}-{i}"))
                s3.reset()  # moto keeps objects in memory
        return out
    finally:
        s3.stop()
        zk.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=500_000, help="rows of ~1 kB (500,000: a part of ~500 MB)")
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-zero-copy-", dir=os.environ.get("TMPDIR")) as tmp:
        result = asyncio.run(measure(args.rows, args.runs, Path(tmp)))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def run(ctx: Any) -> list[Any]:
    """``python -m bench`` figures (replicad only: the ClickHouse column stays empty)."""
    from bench.report import Figure

    rows = int(ctx.sizes.fetch_rows * 1.25)  # random letters compress to ~60%: ≥ 500 MB on disk in full
    work = ctx.work_dir / "zero_copy"
    result = asyncio.run(measure(rows, ctx.sizes.runs, work))
    zc, full = result["zero_copy"], result["full"]
    mb = zc[0]["part_bytes"] / 1e6
    ctx.say(f"zero-copy fetch of {mb:.0f} MB: {[round(r['seconds'], 2) for r in zc]} s; full fetch "
            f"{[round(r['seconds'], 2) for r in full]} s")
    note = ("replicad only (no ClickHouse column): in-process replicas, ZooKeeper + moto on loopback, "
            "table on an S3 policy — bench/zero_copy.py")
    return [
        Figure("zero_copy_fetch_s", f"S3 zero-copy fetch of a {mb:.0f} MB part (acknowledged → active on B)",
               "s", [r["seconds"] for r in zc], [], higher_is_better=False, decimals=2, note=note),
        Figure("full_fetch_s3_s", f"Full fetch of the same {mb:.0f} MB part (S3 policy, no zero-copy)", "s",
               [r["seconds"] for r in full], [], higher_is_better=False, decimals=2),
        Figure("zero_copy_interserver_bytes", "Zero-copy fetch: bytes over the interserver port", "bytes",
               [r["interserver_bytes"] for r in zc], [], higher_is_better=False),
        Figure("full_interserver_bytes", "Full fetch: bytes over the interserver port", "bytes",
               [r["interserver_bytes"] for r in full], [], higher_is_better=False),
        Figure("zero_copy_bucket_mb", "Bucket size after the zero-copy fetch (one copy)", "MB",
               [r["bucket_bytes"] / 1e6 for r in zc], [], higher_is_better=False, decimals=1),
        Figure("full_bucket_mb", "Bucket size after the full fetch (each replica's copy)", "MB",
               [r["bucket_bytes"] / 1e6 for r in full], [], higher_is_better=False, decimals=1),
    ]
