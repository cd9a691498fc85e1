"""What a finished part writer made (:class:`WrittenPart`) and the files every Wide part ends with: primary
index, partition value, min/max per partition column, row count, columns list and checksums (FACTS §5.1),
written by :func:`write_part_metadata` for :class:`replicad.storage.writer.PartWriter` and
:class:`replicad.storage.small_part.SmallPartWriter` alike."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from replicad.datatypes import DataType
from replicad.errors import BadInputError
from replicad.storage.checksums import Checksum, Checksums
from replicad.storage.column_writer import combine_chunks, is_serialized, plain_checksum
from replicad.storage.fresh_files import PartFiles
from replicad.storage.part import (
    CHECKSUMS_FILE,
    COLUMNS_FILE,
    COUNT_FILE,
    PARTITION_FILE,
    PRIMARY_INDEX_FILE,
    columns_text,
    fsync_dir,
    minmax_file_name,
    write_file,
)

__all__ = ["WrittenPart", "closing_files", "write_part_metadata", "written_part"]


def storage_arrays(batch: pa.RecordBatch | pa.Table, columns: Sequence[tuple[str, DataType]],
                   raw_columns: frozenset[str] | set[str] = frozenset()) -> dict[str, pa.Array]:
    """Each of ``columns`` from ``batch`` as one array of its storage type (``raw_columns``: rows already
    serialized); BadInputError naming a column that is missing or of another type."""
    arrays: dict[str, pa.Array] = {}
    for name, dtype in columns:
        idx = batch.schema.get_field_index(name)
        if idx < 0:
            raise BadInputError(f"column {name}: missing from the block being written")
        arr = combine_chunks(batch.column(idx))
        if name in raw_columns:
            if not is_serialized(arr.type):
                raise BadInputError(f"column {name}: serialized rows expected, not {arr.type}")
        elif arr.type != dtype.arrow_type:
            raise BadInputError(
                f"column {name}: storage type {arr.type} does not match {dtype.name} ({dtype.arrow_type})"
            )
        arrays[name] = arr
    return arrays


@dataclass(frozen=True)
class WrittenPart:
    """What a part writer's ``finish`` produced (the part is still in its temporary directory)."""

    path: Path
    rows: int
    marks_count: int
    checksums: Checksums
    columns_text: str
    bytes_on_disk: int
    #: every file of the part, (name, bytes), when its writer held them all (a small part written whole;
    #: kept for the replicas that fetch it: replicad.storage.fresh_files); () otherwise
    files: PartFiles = field(default=(), compare=False, repr=False)


def closing_files(
    files: dict[str, Checksum],
    columns: Sequence[tuple[str, DataType]],
    *,
    rows: int,
    primary: bytes | None,
    partition_value: Sequence[tuple[DataType, object]] | None,
    minmax_columns: Sequence[str],
    minmax: Mapping[str, tuple[Any, Any]],
) -> tuple[list[tuple[str, bytes]], str, Checksums]:
    """The part's closing files, ``(name, bytes)`` in writing order with ``checksums.txt`` last, its
    columns.txt text and its checksums: ``primary.idx`` unless ``primary`` is None, with a partition key
    ``partition.dat`` and (rows written) each ``minmax_<column>.idx`` from ``minmax`` (column → (min, max)),
    ``count.txt``, ``columns.txt``, ``checksums.txt``.  ``files`` (the streams' checksums) gets theirs but
    the last two."""
    out: list[tuple[str, bytes]] = []

    def put(name: str, data: bytes) -> None:
        out.append((name, data))
        files[name] = plain_checksum(data)

    if primary is not None:
        put(PRIMARY_INDEX_FILE, primary)
    if partition_value is not None:
        put(PARTITION_FILE, b"".join(
            t.serialize_value(pa.array([v], t.arrow_type), 0) for t, v in partition_value
        ))
        if rows:
            types = dict(columns)
            for c in minmax_columns:
                t = types[c]
                lo, hi = minmax[c]
                pair = pa.array([lo, hi], t.arrow_type)
                put(minmax_file_name(c), t.serialize_value(pair, 0) + t.serialize_value(pair, 1))
    elif minmax_columns:
        raise ValueError("minmax_columns given without a partition_value")
    put(COUNT_FILE, str(rows).encode())

    text = columns_text(columns)
    out.append((COLUMNS_FILE, text.encode("utf-8")))
    checksums = Checksums(files=files)
    out.append((CHECKSUMS_FILE, checksums.to_bytes()))
    return out, text, checksums


def written_part(path: Path, checksums: Checksums, closing: Sequence[tuple[str, bytes]], text: str, *,
                 rows: int, marks_count: int, files: PartFiles = ()) -> WrittenPart:
    """The description of a part whose files are all made (``closing``: :func:`closing_files`' list;
    ``files``: every file's bytes, when the writer held them all)."""
    # every file of the (fresh) directory is one of these: no stat of each
    size = sum(c.file_size for c in checksums.files.values()) + len(closing[-2][1]) + len(closing[-1][1])
    return WrittenPart(path, rows, marks_count, checksums, text, size, files)


def write_part_metadata(
    path: Path,
    files: dict[str, Checksum],
    columns: Sequence[tuple[str, DataType]],
    *,
    rows: int,
    marks_count: int,
    primary: bytes | None,
    partition_value: Sequence[tuple[DataType, object]] | None,
    minmax_columns: Sequence[str],
    minmax: Mapping[str, tuple[Any, Any]],
    fsync: bool,
) -> WrittenPart:
    """Write the part's closing files (:func:`closing_files`) next to its streams, one after another (the
    directory fsynced with ``fsync``); the part's description."""
    closing, text, checksums = closing_files(files, columns, rows=rows, primary=primary,
                                             partition_value=partition_value, minmax_columns=minmax_columns,
                                             minmax=minmax)
    dirname = str(path)
    for name, data in closing:
        write_file(os.path.join(dirname, name), data, fsync)
    if fsync:
        fsync_dir(path)
    return written_part(path, checksums, closing, text, rows=rows, marks_count=marks_count)
