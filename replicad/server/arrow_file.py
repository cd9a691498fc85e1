"""ClickHouse's ``Arrow`` format: the Arrow IPC *file* format (``ArrowStream`` is the stream format).

clickhouse-connect's ``insert_arrow`` sends a whole table as one IPC file (its record batches may use the
IPC buffer compression, lz4 or zstd, which pyarrow reads) and ``query_arrow`` asks for ``FORMAT Arrow``.

The file's footer, which locates the batches, is at its end: input is spooled to a temporary file (as
Parquet is) and memory-mapped.  Output is streamed: the file writer writes the magic and schema first,
each batch as it is rendered and the footer at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from replicad.service import QueryResult


def parse_arrow_file(body: Any, spec: Any) -> Iterator[Any]:
    """The ``formats`` parser of Arrow IPC file input (run in a worker thread)."""
    from replicad.server.formats import _Converter, _select_columns

    fd, path = tempfile.mkstemp(prefix="replicad-insert-", suffix=".arrow", dir=spec.spool_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            while data := body.read(1 << 20):
                f.write(data)
        with pa.memory_map(path) as source:
            reader = pa_ipc.open_file(source)
            names, positions, types = _select_columns(spec, list(reader.schema.names))
            yield names
            conv = _Converter(names, types, spec)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                yield from conv.feed([batch.column(p) for p in positions])
            yield from conv.finish()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


async def render_arrow_file(result: QueryResult, tz: str) -> AsyncIterator[bytes]:
    """A SELECT's rows as an Arrow IPC file (columns in their user Arrow form, as ``ArrowStream``)."""
    names = [n for n, _ in result.columns]
    types = [t for _, t in result.columns]
    sink = io.BytesIO()
    writer: pa_ipc.RecordBatchFileWriter | None = None

    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays = [dt.to_user_arrow(batch.column(i), tz) for i, dt in enumerate(types)]
        return pa.RecordBatch.from_arrays(arrays, names=names)

    def drain() -> bytes:
        data = sink.getvalue()
        sink.seek(0)
        sink.truncate()
        return data

    async for batch in result.batches:
        user = await asyncio.to_thread(convert, batch)
        if writer is None:
            writer = pa_ipc.new_file(sink, user.schema)
        writer.write_batch(user)
        yield drain()
    if writer is None:  # no rows: the schema and the footer
        empty = convert(pa.RecordBatch.from_arrays([pa.array([], dt.arrow_type) for dt in types],
                                                   names=names))
        writer = pa_ipc.new_file(sink, empty.schema)
    writer.close()
    yield drain()
