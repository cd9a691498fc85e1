"""ClickHouse's ``Arrow`` format: the Arrow IPC *file* format (``ArrowStream`` is the stream format).

clickhouse-connect's ``insert_arrow`` sends a whole table as one IPC file (its record batches may use the
IPC buffer compression, lz4 or zstd, which pyarrow reads) and ``query_arrow`` asks for ``FORMAT Arrow``.

The file's footer, which locates the batches, is at its end: input is spooled to a temporary file (as
Parquet is) and memory-mapped.  Output is streamed: the file writer writes the magic and schema first,
each batch as it is rendered and the footer at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc

from replicad.server.input_columns import Converter, select_columns
from replicad.server.sync_body import spooled


def parse_arrow_file(body: Any, spec: Any) -> Iterator[Any]:
    """The ``formats`` parser of Arrow IPC file input (run in a worker thread)."""

    with spooled(body, spec.spool_dir, ".arrow") as path, pa.memory_map(path) as source:
        reader = pa_ipc.open_file(source)
        names, positions, types = select_columns(spec, list(reader.schema.names))
        yield names
        conv = Converter(names, types, spec)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            yield from conv.feed([batch.column(p) for p in positions])
        yield from conv.finish()
