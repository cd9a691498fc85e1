"""A bounded fuzz smoke against a real daemon (the long run: ``FUZZ_EXAMPLES=5000 pytest this file``).

Random and mutated inserts in every input format, random statements and random URL settings.  Whatever
comes in: no 5xx, the daemon keeps answering, the table holds exactly the rows of the inserts that were
answered 200, and no temporary part directory or spool file is left behind.
"""

from __future__ import annotations

import io
import json
import os
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad import settings as settings_table
from replicad.devtools.daemon import Daemon
from replicad.devtools.zookeeper import ZooKeeperServer
from replicad.storage.prepared_dirs import PREPARED_DIR
from tests.support.replicad_daemon import Reply, make_chroot, ok, query, request, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
TABLE = "db.fz"
DDL = ("CREATE TABLE IF NOT EXISTS db.fz (d Date, ts DateTime, k UInt64, i Int32, f Float64, s String, "
       "n Nullable(String)) ENGINE = ReplicatedMergeTree('/clickhouse/tables/01/fz', '{replica}') "
       "PARTITION BY toYYYYMM(d) ORDER BY k")
SEED_ROWS = [
    {"d": "2024-01-01", "ts": "2024-01-01 10:00:00", "k": 1, "i": -5, "f": 1.5, "s": "a\tb", "n": None},
    {"d": "2024-02-29", "ts": "2024-02-29 23:59:59", "k": 2, "i": 7, "f": -0.25, "s": "é\"x", "n": "z"},
]


def seed_bodies() -> dict[str, bytes]:
    tsv = (b"2024-01-01\t2024-01-01 10:00:00\t1\t-5\t1.5\ta\\tb\t\\N\n"
           b"2024-02-29\t2024-02-29 23:59:59\t2\t7\t-0.25\tx\tz\n")
    csv = (b'2024-01-01,"2024-01-01 10:00:00",1,-5,1.5,"a,b",\\N\n'
           b"2024-02-29,2024-02-29 23:59:59,2,7,-0.25,x,z\n")
    names = b"d,ts,k,i,f,s,n\n" + csv
    jsonl = b"".join(json.dumps(r).encode() + b"\n" for r in SEED_ROWS)
    table = pa.table({"d": pa.array([19723, 19782], pa.date32()), "ts": pa.array([1704103200, 1709251199],
                     pa.uint32()), "k": pa.array([1, 2], pa.uint64()), "i": pa.array([-5, 7], pa.int32()),
                      "f": pa.array([1.5, -0.25]), "s": pa.array(["a", "b"]), "n": pa.array([None, "z"])})
    sink = io.BytesIO()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    parquet = io.BytesIO()
    pq.write_table(table, parquet)
    return {"TabSeparated": tsv, "CSV": csv, "CSVWithNames": names, "JSONEachRow": jsonl,
            "ArrowStream": sink.getvalue(), "Parquet": parquet.getvalue()}


SEEDS = seed_bodies()


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup", "delete"]))
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        if op == "flip":
            out[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del out[at:]
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=20))
        elif op == "dup":
            out[at:at] = out[at:at + draw(st.integers(1, 64))] * draw(st.integers(1, 50))
        else:
            del out[at:at + draw(st.integers(1, 16))]
    return bytes(out)


FRAGMENTS = ["SELECT", "k", "*", "count()", "FROM", TABLE, "WHERE", "k", "=", "1", "IN", "(", ")", ",",
             "'x'", "ORDER BY", "LIMIT", "2", "OFFSET", "FORMAT", "JSONEachRow", "ALTER TABLE", "DELETE",
             "UPDATE", "s", "DROP PARTITION", "ID", "'202401'", "OPTIMIZE TABLE", "FINAL", "TRUNCATE TABLE",
             "SYSTEM", "SYNC REPLICA", "AND", "OR", "NOT", "toDate('2024-01-01')", "-", "1e308",
             "99999999999999999999", "\\", "`", "'", "--", "/*", "ATTACH PART", "DETACH PARTITION",
             "SETTINGS", "GROUP BY", "\x00", "é"]
SETTING_NAMES = sorted(n for n, d in settings_table.SETTINGS.items()
                       if d.scope is settings_table.SettingScope.QUERY)


@pytest.fixture(scope="module")
def daemon(zookeeper: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("fuzz")
    d = start_daemon(base, zookeeper, make_chroot(zookeeper, "fuzz"), "r1", tables=[DDL], wait_table=TABLE)
    try:
        yield d
    finally:
        d.kill()


class Ledger:
    """Rows the daemon said it wrote (200 answers) and every answer's status."""

    def __init__(self) -> None:
        self.rows = 0
        self.statuses: dict[int, int] = {}
        self.truncated = False

    def record(self, r: Reply, insert: bool) -> None:
        self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
        # 503 only for "the replica set cannot do this now" (read-only 242, quorum 285/286): retriable
        assert r.status < 500 or (r.status == 503 and r.exception_code in (242, 285, 286)), \
            (r.status, r.text[:500])
        if r.status != 200:
            assert r.text.startswith("Code: "), r.text[:300]
            assert "/tmp/" not in r.text and "/work/" not in r.text, r.text[:300]
        elif insert:
            self.rows += int(json.loads(r.body or b"{}").get("written_rows", 0) or 0)


LEDGER = Ledger()


def table_dir(d: Daemon) -> Path:
    return d.data_path / "data" / "db" / "fz"


def leftovers(d: Daemon) -> list[str]:
    out = [p.name for p in table_dir(d).iterdir() if p.name.startswith("tmp")]
    spool = d.data_path / "tmp"
    if spool.exists():
        # the part directories made ahead of small inserts are not leftovers (storage/prepared_dirs.py)
        out += [f"tmp/{p.name}" for p in spool.iterdir() if p.name != PREPARED_DIR]
    return out


def post(d: Daemon, sql: str, body: bytes | None, params: dict[str, str] | None = None) -> Reply:
    q = {"query": sql, **(params or {})}
    return request(d.url, "/?" + urllib.parse.urlencode(q), body if body is not None else b"", timeout=60)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fmt=st.sampled_from(sorted(SEEDS)), data=st.data())
def test_mutated_inserts(daemon: Daemon, fmt: str, data: st.DataObject) -> None:
    body = data.draw(mutated(SEEDS[fmt]))
    LEDGER.record(post(daemon, f"INSERT INTO {TABLE} FORMAT {fmt}", body), insert=True)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=14))
def test_random_statements(daemon: Daemon, words: list[str]) -> None:
    sql = " ".join(words)
    if any(w in sql for w in ("TRUNCATE", "DELETE", "DROP PARTITION", "UPDATE", "DETACH")):
        sql = "SELECT " + sql  # keep the ledger exact: destructive statements only as non-statements
    r = request(daemon.url, "/?" + urllib.parse.urlencode({"query": sql}), timeout=60)
    LEDGER.record(r, insert=False)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(params=st.dictionaries(st.sampled_from([*SETTING_NAMES, "nonexistent_setting", "query_id",
                                               "database"]),
                              st.one_of(st.text(max_size=30), st.integers(-2**70, 2**70).map(str),
                                        st.sampled_from(["0", "1", "-1", "1e9", "", "nan"])), max_size=4))
def test_random_url_settings(daemon: Daemon, params: dict[str, Any]) -> None:
    params = {k: v for k, v in params.items() if not k.startswith("replicad_stage")}
    r = post(daemon, f"INSERT INTO {TABLE} FORMAT TabSeparated", SEEDS["TabSeparated"], params)
    LEDGER.record(r, insert=True)


def test_afterwards_the_table_holds_exactly_the_acknowledged_rows(daemon: Daemon) -> None:
    assert ok(request(daemon.url, "/ping")).text == "Ok.\n"
    count = int(ok(query(daemon.url, f"SELECT count() FROM {TABLE}")).text)
    assert count == LEDGER.rows, (count, LEDGER.rows, LEDGER.statuses)
    assert leftovers(daemon) == []
    assert LEDGER.statuses.get(200, 0) > 0 and sum(v for k, v in LEDGER.statuses.items() if k >= 400) > 0
    assert daemon.proc is not None and daemon.proc.poll() is None  # no crash
    metrics = ok(request(daemon.url, "/metrics")).text
    stalls = next(float(ln.split()[1]) for ln in metrics.splitlines()
                  if ln.startswith("replicad_event_loop_stalls_total "))
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    hwm_kb = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM:"))
    figures = {"inputs": sum(LEDGER.statuses.values()), "statuses": LEDGER.statuses,
               "rows_acknowledged": count,
               "crashes": 0, "leftovers": 0, "event_loop_stalls_over_100ms": stalls,
               "memory_high_water_mib": round(hwm_kb / 1024, 1)}
    print("fuzz figures:", json.dumps(figures, sort_keys=True))
    if os.environ.get("FUZZ_REPORT"):
        Path(os.environ["FUZZ_REPORT"]).write_text(json.dumps(figures, sort_keys=True, indent=1) + "\n")
