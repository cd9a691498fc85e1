"""replicad.memory.defer_import: pyarrow.compute stays unloaded until first used, then works as imported.

Each check runs in a fresh interpreter (the test process has pyarrow.compute loaded already)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_stand_in_imports_the_module_on_first_attribute_read() -> None:
    out = run("""
        import sys
        from replicad import memory
        assert memory.defer_import() == ["pyarrow.compute", "replicad.server.formats", "replicad.ddl.service"]
        import pyarrow as pa
        import pyarrow.compute as pc
        maps = lambda: open("/proc/self/maps").read()
        assert isinstance(pc, memory.DeferredModule) and memory.deferred_pending()
        assert "_compute.cpython" not in maps()
        print(pc.sum(pa.array([1, 2, 3])).as_py())
        assert "_compute.cpython" in maps() and memory.deferred_pending()  # the formats module still waits
        real = sys.modules["pyarrow.compute"]
        assert real is not pc and pa.compute is real and pc.sum is real.sum
        import pyarrow.compute as again
        assert again is real
        print(pa.array([1, 2], pa.int32()).cast(pa.int64()).type)  # pyarrow's own use of the module
    """)
    assert out.split() == ["6", "int64"]


def test_first_reads_from_many_threads_load_it_once() -> None:
    out = run("""
        import importlib, threading, types
        from replicad import memory
        memory.defer_import()
        import pyarrow as pa
        import pyarrow.compute as pc
        loads = []
        memory.importlib = types.SimpleNamespace(
            import_module=lambda name: loads.append(name) or importlib.import_module(name))
        start = threading.Barrier(8)
        sums = []
        def use():
            start.wait()
            try:
                sums.append(pc.sum(pa.array([1, 2, 3])).as_py())
            except Exception as e:
                sums.append(repr(e))
        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(sums, loads)
    """)
    assert out.strip() == "[6, 6, 6, 6, 6, 6, 6, 6] ['pyarrow.compute']"


def test_deferred_loaded_imports_in_a_worker_thread() -> None:
    out = run("""
        import asyncio, importlib, threading, types
        from replicad import memory
        memory.defer_import()
        import pyarrow.compute as pc
        where = []
        memory.importlib = types.SimpleNamespace(import_module=lambda name: where.append(
            threading.current_thread().name) or importlib.import_module(name))
        async def main():
            await memory.deferred_loaded()
            await memory.deferred_loaded()  # nothing left to do
        asyncio.run(main())
        from replicad.server import formats
        print("MainThread" not in where, len(where), memory.deferred_pending(), callable(pc.sum),
              callable(formats.parse_body))
    """)
    assert out.split() == ["True", "3", "False", "True", "True"]


def test_nothing_deferred_when_already_imported() -> None:
    out = run("""
        import pyarrow.compute
        import replicad.ddl.service
        import replicad.server.formats
        from replicad import memory
        print(memory.defer_import(), memory.deferred_pending())
    """)
    assert out.split() == ["[]", "False"]


@pytest.mark.parametrize("key", ["toYYYYMM(d)", "toYYYYMM(ts)", "toMonday(d)", "toDate(ts)", "d",
                                 "tuple()", "intDiv(k, 100)", "toYYYYMMDD(d)", "toStartOfMonth(d)"])
def test_create_table_key_checks_need_no_compute_kernel(key: str) -> None:
    """A daemon parses each table's CREATE TABLE at start: the key checks evaluate keys over zero rows."""
    out = run(f"""
        from replicad import memory
        memory.keep_out()  # as the daemon: pandas (which imports pyarrow.compute) kept out
        memory.defer_import()
        from replicad.sql.ddl import parse_create_table
        t = parse_create_table("CREATE TABLE db.t (d Date, ts DateTime, k UInt64) ENGINE = "
                               "ReplicatedMergeTree('/t', '{{replica}}') PARTITION BY {key} ORDER BY (k, d)")
        print(memory.deferred_pending(), t.partition_key.expressions[0].result_type(t.physical_types).name
              if t.partition_key.expressions else "-")
    """)
    pending, _type = out.split()
    assert pending == "True"


def test_aiohttp_imported_without_the_ca_bundle() -> None:
    """aiohttp's import-time default client contexts get no CA (the fetcher has its own: test_auth's
    tls-system-ca case); the environment is as it was after the import."""
    out = run("""
        import os
        from replicad import memory
        os.environ["SSL_CERT_FILE"] = "/somewhere/ca.pem"
        os.environ.pop("SSL_CERT_DIR", None)
        assert memory.import_without_default_tls()
        import aiohttp.connector as c
        print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"], os.environ["SSL_CERT_FILE"],
              "SSL_CERT_DIR" in os.environ, memory.import_without_default_tls())
    """)
    assert out.split() == ["0", "/somewhere/ca.pem", "False", "False"]
