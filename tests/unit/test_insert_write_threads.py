"""Concurrent insert writes get no column threads of their own (replicad/replication/sink.py
``WRITES_IN_FLIGHT``); a lone write keeps them; the part's bytes are the same either way."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from replicad.datatypes import parse_type
from replicad.replication import sink
from replicad.replication.sink import WRITES_IN_FLIGHT, TableSchema, write_parts
from replicad.storage import writer as writer_module
from replicad.storage.layout import TableDataLayout
from replicad.storage.small_part import SMALL_PART_MAX_BYTES
from replicad.storage.writer import PARALLEL_MIN_ROWS, WriterSettings
from tests.support.call_log import record_first_arguments

ROWS = PARALLEL_MIN_ROWS + 1808  # enough rows for the column pool


def _block() -> pa.Table:
    """A block of more than SMALL_PART_MAX_BYTES: PartWriter's (a smaller one is written whole, in one
    thread, by SmallPartWriter)."""
    rng = np.random.default_rng(5)
    t = pa.table({
        "d": pa.array(np.full(ROWS, 19723, dtype=np.int32), pa.date32()),
        "k": pa.array(rng.integers(0, 1 << 40, ROWS).astype(np.uint64)),
        "s": pa.array([b"x" * int(450 + i % 23) for i in range(ROWS)], pa.binary()),
    })
    assert t.nbytes > SMALL_PART_MAX_BYTES
    return t


SCHEMA = TableSchema((("d", parse_type("Date")), ("k", parse_type("UInt64")), ("s", parse_type("String"))),
                     "toYYYYMM(d)", "k")


@pytest.fixture
def pools(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread counts of the column pools part writers take (the process's, storage/writer.py
    ``column_pool``), one entry per writer that takes one."""
    return record_first_arguments(monkeypatch, writer_module, "column_pool")


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_a_lone_write_uses_the_column_pool_and_a_concurrent_one_does_not(tmp_path: Path,
                                                                         pools: list[int]) -> None:
    layout = TableDataLayout(tmp_path, "db", "t")
    settings = WriterSettings(threads=2)
    assert WRITES_IN_FLIGHT.count == 0
    [(_pid, alone)] = write_parts(_block(), SCHEMA, layout, settings)
    assert pools == [2]
    assert WRITES_IN_FLIGHT.count == 0

    WRITES_IN_FLIGHT.enter()  # another insert is writing its block
    try:
        [(_pid, beside)] = write_parts(_block(), SCHEMA, layout, settings)
    finally:
        WRITES_IN_FLIGHT.leave()
    assert pools == [2]  # no pool for the second write
    assert WRITES_IN_FLIGHT.count == 0
    assert _files(alone.path) == _files(beside.path)


def test_a_failed_write_is_not_counted_as_in_flight_afterwards(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a: object, **_k: object) -> object:
        raise OSError("disk gone")

    monkeypatch.setattr(sink, "_write_parts", fail)
    with pytest.raises(OSError, match="disk gone"):
        write_parts(_block(), SCHEMA, TableDataLayout(tmp_path, "db", "t"), WriterSettings())
    assert WRITES_IN_FLIGHT.count == 0


def test_writes_in_threads_see_each_other(tmp_path: Path, pools: list[int], monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Two writes in two threads, the second started while the first is inside: one pool at most."""
    layout = TableDataLayout(tmp_path, "db", "t")
    inside, release = threading.Event(), threading.Event()
    real = sink._write_parts

    def slow(*args: object, **kwargs: object) -> object:
        if not inside.is_set():
            inside.set()
            release.wait(10)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sink, "_write_parts", slow)
    settings = WriterSettings(threads=2)
    first = threading.Thread(target=write_parts, args=(_block(), SCHEMA, layout, settings))
    first.start()
    assert inside.wait(10)
    write_parts(_block(), SCHEMA, layout, settings)  # while the first is in flight
    release.set()
    first.join(10)
    assert pools == [2]
    assert WRITES_IN_FLIGHT.count == 0
