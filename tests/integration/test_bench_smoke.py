"""Smoke test of the benchmark harness (bench/): the cluster (ZooKeeper + 2 replicad daemons + 2 ClickHouse
18.16 servers) comes up, the insert / schemas / formats / lag / ZooKeeper / fetch benchmarks run at tiny sizes
and produce figures with values on both sides, and the report renders.  Part writer and merge have their own
CLIs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bench import Context, Sizes
from bench.cluster import BenchCluster, make_events, to_tsv_fast
from bench.report import Report
from replicad.devtools import zookeeper as zk_support

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse, pytest.mark.timeout(180)]

TINY = Sizes(runs=1, insert_rows=4_000, lag_inserts=5, lag_rows=10, fetch_rows=400, fetch_string_len=(50, 60),
             quick=True)


def test_tsv_generator_matches_the_reference() -> None:
    from bench.part_writer import to_tsv

    t = make_events(1000, seed=5, month=14)
    assert to_tsv_fast(t) == to_tsv(t)
    assert to_tsv_fast(t).startswith(b"2025-03-")


def test_quick_pieces_on_a_real_cluster(tmp_path: Path) -> None:
    if not zk_support.available():
        pytest.skip("ZooKeeper (and Java) are not installed")
    from bench import fetch, formats, insert, lag, schemas

    ctx = Context(TINY, tmp_path, profile=False, log=lambda s: None)
    with BenchCluster(tmp_path / "cluster") as cluster:
        figures = insert.run(cluster, ctx) + schemas.run(cluster, ctx) + formats.run(cluster, ctx) + \
            lag.run(cluster, ctx) + fetch.run(cluster, ctx)
        # both pairs replicated every row written to them
        for pair in cluster.pairs():
            assert pair.a.count(insert.TABLE) == pair.b.count(insert.TABLE) > 0
            lag_rows = (3 + TINY.lag_inserts) * TINY.lag_rows  # 3 warm-up inserts, then the batch
            assert pair.a.count(lag.TABLE) == pair.b.count(lag.TABLE) == lag_rows
        # every replica talks to ZooKeeper over its own connection(s), seen in `cons`
        packets = cluster.zk_packets([r for p in cluster.pairs() for r in p.replicas])
        assert len(packets) == 4 and all(v > 0 for v in packets.values()), packets
    by_key = {f.key: f for f in figures}
    shapes = [f"schema_{key}_rows" for key, *_rest in schemas.SCHEMAS]  # both systems took every shape
    shapes += [f"format_{fmt}_mb" for fmt in formats.FORMATS]  # and every shared input format
    for key in ("insert_tsv_rows", "lag_p50", "insert_ack_p50", "insert_ack_p99", "zk_per_insert_a",
                "zk_per_insert_total", "fetch_mb", *shapes):
        f = by_key[key]
        assert len(f.replicad) == len(f.clickhouse) == 1 and f.replicad[0] > 0 and f.clickhouse[0] > 0, f
        assert f.ratio is not None and f.verdict in ("met", "NOT met")
    assert len(by_key["insert_cpu"].replicad) == len(by_key["insert_cpu"].clickhouse) == 1
    # replicad's small insert stage by stage: every insert of the batch matched to its insert_stages line, the
    # two ZooKeeper round trips (dedup probe + block number, commit) and the floor they make
    stages = dict(ctx.sections)["replicad small insert: time per stage against the ZooKeeper floor"]
    assert f"Over {TINY.lag_inserts} of {TINY.lag_inserts} inserts" in stages, stages
    assert "(`zk_lock_multi`)" in stages and "(`zk_commit_multi`)" in stages and "(`write_part`)" in stages
    assert "counted by its client): 2, all in the 2 round trips" in stages, stages
    report = Report("python -m bench --quick", dt.datetime.now(dt.UTC), figures, runs=1)
    md = report.markdown()
    assert "| Replication lag p50" in md and "cores" in md
    assert len(report.text_table().splitlines()) == len(figures) + 2
