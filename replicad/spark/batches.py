"""Cutting a task's Arrow input into request bodies (ArrowStream), independent of how it was chunked."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.ipc as pa_ipc


def _narrow(t: pa.DataType) -> pa.DataType:
    """Large (64-bit offset) Arrow types → the regular ones (a batch is far below 2 GiB)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_narrow(t.value_type))
    return t


def _normalise(arr: pa.Array) -> pa.Array:
    t = _narrow(arr.type)
    return arr if t == arr.type else arr.cast(t)


def rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Re-cut a stream of batches into single-chunk batches of exactly ``rows`` rows (the last shorter).

    The cut depends only on the sequence of rows, not on how the input was chunked."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        pending.append(b)
        count += b.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending)
            yield _one_batch(table.slice(0, rows))
            rest = table.slice(rows)
            pending = rest.combine_chunks().to_batches() if rest.num_rows else []
            count -= rows
    if count:
        yield _one_batch(pa.Table.from_batches(pending))


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    table = table.combine_chunks()
    arrays = [_normalise(table.column(i).chunk(0) if table.column(i).num_chunks else
                         pa.array([], table.schema.field(i).type)) for i in range(table.num_columns)]
    return pa.RecordBatch.from_arrays(arrays, names=table.schema.names)


def ipc_stream(batch: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa_ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()
