"""replicad vs ClickHouse 18.16 benchmarks: ``python -m bench [--quick]`` (see bench/__main__.py).

Modules: cluster (ZooKeeper + 2 replicad daemons + 2 ClickHouse servers), insert (HTTP insert
throughput), lag (replication lag), zk_requests (ZooKeeper requests per insert), fetch (one big part
fetched by the second replica), part_writer and merge (storage engine alone), report (the table and
BENCHMARKS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark does; :meth:`full` is ``make bench``, :meth:`quick` a smoke check."""

    runs: int = 3
    insert_rows: int = 2_000_000
    lag_inserts: int = 200
    lag_rows: int = 100
    fetch_rows: int = 680_000  # × ~1 kB strings: a part of ≥ 500 MB on disk
    fetch_string_len: tuple[int, int] = (900, 1100)
    part_writer_rows: int = 2_000_000
    merge_parts: int = 10
    merge_rows: int = 200_000
    spark_rows: int = 2_000_000
    spark_tasks: int = 200
    quick: bool = False

    @classmethod
    def full(cls, runs: int = 3) -> Sizes:
        return cls(runs=runs)

    @classmethod
    def quick_sizes(cls) -> Sizes:
        return cls(runs=1, insert_rows=100_000, lag_inserts=20, lag_rows=100, fetch_rows=20_000,
                   part_writer_rows=100_000, merge_parts=4, merge_rows=20_000, spark_rows=100_000,
                   spark_tasks=20, quick=True)


@dataclass
class Context:
    """What every benchmark gets: sizes, a scratch directory, a logger, whether to profile shortfalls."""

    sizes: Sizes
    work_dir: Path
    profile: bool = True
    log: Callable[[str], None] = field(default=print)
    sections: list[tuple[str, str]] = field(default_factory=list)  # profiles etc. for the report
    notes: list[str] = field(default_factory=list)
    clickhouse_version: str = ""
    t0: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        self.log(f"[bench {time.monotonic() - self.t0:6.0f}s] {text}")
