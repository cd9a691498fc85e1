"""Turning an insert block into temporary parts (MergeTreeDataWriter + the block-id part of the 18.16 sink).

One insert block (a batch of storage-Arrow rows) is split by the partition key, each partition's rows are
sorted by the sorting key, and written as one ``tmp_insert_…`` Wide part.  Each part gets its deduplication
``block_id``: from its data (SipHash of the ``.bin`` files' uncompressed sizes and hashes, as 18.16), or from
``insert_deduplication_token`` + ``_<ordinal>`` (ordinal = position of the part among all parts of the
INSERT, as modern ClickHouse does).  Grouping, sorting and key evaluation are vectorised (pyarrow); the
writing runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import pyarrow as pa

from replicad import stage_times
from replicad.datatypes import DataType
from replicad.errors import BadInputError
from replicad.replication.commit import TempPart
from replicad.replication.early_lock import EarlyLock, block_id_of
from replicad.sql.expressions import Expr, compile_key
from replicad.sql.partition import PartitionKey, split_by_partition
from replicad.sql.table_metadata import ColumnsDescription
from replicad.storage.block import ColumnDefaults, sort_order
from replicad.storage.checksums import Checksums
from replicad.storage.layout import TMP_INSERT, TableDataLayout
from replicad.storage.prepared_dirs import prepared_for
from replicad.storage.small_part import SmallPartWriter, small_part_fits
from replicad.storage.writer import PartWriter, WriterSettings, WrittenPart, prepare_block

_tmp_counter = itertools.count(1)

#: how long the writer's thread waits, its part written, for the early lock before leaving the rename to the
#: commit (which costs a thread trip): the rest of a ZooKeeper round trip, bounded so that a slow ZooKeeper
#: cannot hold the worker threads
EARLY_RENAME_WAIT_S = 0.01


@dataclass(frozen=True)
class TableSchema:
    """What the sink (and merges, mutations) need to know about a table.

    ``columns``: the physical columns; ``defaults``: ``(column, DEFAULT|MATERIALIZED|ALIAS, expression)``
    as in the ``columns`` znode (see :func:`column_defaults`).  Given ``defaults``, ``columns`` is put in
    ClickHouse's physical order (ordinary columns, then MATERIALIZED ones, as a part's columns.txt lists
    them) and ALIAS columns are dropped (never stored).
    """

    columns: tuple[tuple[str, DataType], ...]
    partition_by: str | None
    order_by: str | None
    primary_key: str | None = None
    tz: str = "UTC"
    defaults: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        kinds = {c: k.upper() for c, k, _e in self.defaults}
        physical = [c for c in self.columns if kinds.get(c[0]) != "ALIAS"]
        physical.sort(key=lambda c: kinds.get(c[0]) == "MATERIALIZED")  # stable
        if [n for n, _t in physical] != [n for n, _t in self.columns]:
            object.__setattr__(self, "columns", tuple(physical))

    @cached_property
    def types(self) -> dict[str, DataType]:
        return dict(self.columns)

    @cached_property
    def column_defaults(self) -> ColumnDefaults:
        return ColumnDefaults(self.defaults)

    @cached_property
    def insertable_columns(self) -> tuple[tuple[str, DataType], ...]:
        """The columns an INSERT without a column list expects (all but MATERIALIZED)."""
        return tuple(c for c in self.columns if self.column_defaults.kind(c[0]) != "MATERIALIZED")

    @cached_property
    def partition_key(self) -> PartitionKey:
        return PartitionKey.parse(self.partition_by)

    @cached_property
    def sorting_exprs(self) -> list[Expr]:
        return compile_key(self.order_by)

    @cached_property
    def primary_exprs(self) -> list[Expr]:
        return compile_key(self.primary_key) if self.primary_key else self.sorting_exprs

    @cached_property
    def primary_of_sorting(self) -> bool:
        """The PRIMARY KEY expressions are the first ORDER BY ones (always so without a PRIMARY KEY clause):
        a block's key arrays are evaluated once for both."""
        n = len(self.primary_exprs)
        return [e.text for e in self.primary_exprs] == [e.text for e in self.sorting_exprs[:n]]

    @cached_property
    def minmax_columns(self) -> list[str]:
        """Columns the partition expression reads (``minmax_<col>.idx``), in order of appearance."""
        return self.partition_key.columns


@dataclass(frozen=True)
class PartitionBlock:
    partition_id: str
    partition_value: list[tuple[DataType, object]] | None
    rows: pa.Table


@dataclass
class InsertContext:
    """State shared by the blocks of one INSERT."""

    deduplicate: bool = True
    token: str | None = None
    ordinal: int = 0
    parts: list[TempPart] = field(default_factory=list)
    #: ``max_partitions_per_insert_block`` (0 = no limit): a block touching more is refused before any part
    #: of it is written
    max_partitions: int = 0


def column_defaults(columns_text: str) -> tuple[tuple[str, str, str], ...]:
    """``TableSchema.defaults`` from the ``columns`` znode text (or ``TableDef.columns_text()``)."""
    described = ColumnsDescription.parse(columns_text)
    return tuple((c.name, c.default_kind, c.default_expression) for c in described.columns if c.default_kind)


def split_block(table: pa.Table, schema: TableSchema) -> list[PartitionBlock]:
    """Rows grouped by partition (groups in order of first appearance, rows in original order)."""
    if table.num_rows == 0:
        return []
    chunks = split_by_partition(table, schema.partition_key, schema.types, schema.tz)
    out = []
    for c in chunks:
        value = list(zip(c.key_types, c.values, strict=True)) if c.key_types else None
        out.append(PartitionBlock(c.partition_id, value, c.table))
    return out


def _key_arrays(
    exprs: Sequence[Expr], rows: pa.Table, schema: TableSchema
) -> list[tuple[str, pa.Array, DataType]]:
    out = []
    for e in exprs:
        arr, dtype = e.evaluate(rows, schema.types, schema.tz)
        out.append((e.text, arr, dtype))
    return out


#: a lone insert write (no other in flight: ``threads`` is not 1, see write_parts) of more Arrow bytes is
#: PartWriter's, whose column threads finish it sooner on several cores than SmallPartWriter's one native
#: call (a 70k-row, 3.5 MB events block: 13.8 against 17.2 ms of wall time; at 30k rows, 1.5 MB, the one
#: call wins, 9.2 against 13.0); concurrent writes, where the cores are busy anyway, take SmallPartWriter up
#: to its SMALL_PART_MAX_BYTES (less CPU: 3.9 against 5.5 ms for a 10k-row block)
LONE_WHOLE_MAX_BYTES = 2 << 20


def write_temp_part(
    block: PartitionBlock, schema: TableSchema, layout: TableDataLayout, settings: WriterSettings,
    early: EarlyLock | None = None,
) -> WrittenPart:
    """Sort the rows and write them to a fresh ``tmp_insert_`` directory (blocking).  With ``early``, the
    part's block-number lock is started as soon as its block id is known, before its files are made, and
    the directory is renamed to the part's name if the lock is back once they are (see
    :mod:`replicad.replication.early_lock`)."""
    rows = block.rows
    # the ORDER BY permutation is applied column by column inside the writer (writeWithPermutation): the
    # sorted copy of the whole block is never held (peak RSS of a big insert)
    sort_keys = _key_arrays(schema.sorting_exprs, rows, schema)
    order = sort_order([a for _n, a, _t in sort_keys])
    pk = (sort_keys[:len(schema.primary_exprs)] if schema.primary_of_sorting
          else _key_arrays(schema.primary_exprs, rows, schema))
    extra_types = {name: dtype for name, _a, dtype in pk if name not in schema.types}
    extra_arrays = {name: arr for name, arr, _t in pk if name not in schema.types}
    n = next(_tmp_counter)
    # made by the writer (one mkdir; a leftover directory of the name is emptied there)
    tmp_dir = layout.tmp_path(TMP_INSERT, f"{block.partition_id}_{n}_{n}_0")
    # a part held whole in memory (up to 4 MiB) is written in one go: the same bytes (storage/small_part.py)
    shape: dict[str, Any] = dict(
        primary_key=[name for name, _a, _t in pk],
        key_types=extra_types,
        minmax_columns=schema.minmax_columns,
        partition_value=block.partition_value,
    )
    writer: SmallPartWriter | PartWriter
    nbytes = rows.nbytes
    if small_part_fits(schema.columns, rows.num_rows, nbytes) and (
            settings.threads == 1 or nbytes <= LONE_WHOLE_MAX_BYTES):
        # its files may go to a directory made ahead (storage/prepared_dirs.py)
        writer = SmallPartWriter(tmp_dir, list(schema.columns), settings,
                                 prepared=prepared_for(layout.data_path, layout.path), **shape)
    else:
        writer = PartWriter(tmp_dir, list(schema.columns), settings, **shape)
    with writer:
        writer.write(rows, extra_arrays, order=order)
        if early is not None:
            early.sealed(block.partition_id, writer.seal())
            stage_times.mark("seal")
        written = writer.finish()
    if early is not None:  # ``written.path`` stays the tmp_insert_ path; ``early.renamed`` the new one
        written.checksums.minimalistic_text()  # the commit's value, made while the lock may still be out
        stage_times.mark("files")
        early.rename_if_locked(written.path, EARLY_RENAME_WAIT_S)
    return written


def block_id_for(partition_id: str, checksums: Checksums, ctx: InsertContext) -> str:
    return block_id_of(partition_id, checksums.files, ctx.deduplicate, ctx.token, ctx.ordinal)


class _WritesInFlight:
    """How many insert blocks this process is writing right now (all tables).  A block written while
    another one is gets no column threads of its own: the concurrent writes already keep the cores busy,
    and a pool per part (its threads started, the columns handed over and awaited, under a GIL the other
    writes want too) cost ~25 % more CPU per 10k-row part (4.6 against 6.0 ms, measured); a lone write
    keeps them (its wall time is the insert's latency)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def enter(self) -> int:
        """Count one more write; returns how many others were in flight."""
        with self._lock:
            self.count += 1
            return self.count - 1

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


WRITES_IN_FLIGHT = _WritesInFlight()


def write_parts(
    table: pa.Table,
    schema: TableSchema,
    layout: TableDataLayout,
    settings: WriterSettings,
    *,
    fill_missing: bool = True,
    max_partitions: int = 0,
    early: EarlyLock | None = None,
) -> list[tuple[str, WrittenPart]]:
    """(blocking) Prepare one insert block, split it by partition and write each partition's part:
    ``(partition id, written part)`` per part.  One worker-thread trip for the whole block: a small insert
    pays one thread hand-over, not one per step.  On an error the parts already written are removed."""
    others = WRITES_IN_FLIGHT.enter()
    try:
        if others and settings.threads != 1:
            settings = replace(settings, threads=1)
        return _write_parts(table, schema, layout, settings, fill_missing=fill_missing,
                            max_partitions=max_partitions, early=early)
    finally:
        WRITES_IN_FLIGHT.leave()


def _write_parts(
    table: pa.Table,
    schema: TableSchema,
    layout: TableDataLayout,
    settings: WriterSettings,
    *,
    fill_missing: bool,
    max_partitions: int,
    early: EarlyLock | None,
) -> list[tuple[str, WrittenPart]]:
    prepared = prepare_block(table, list(schema.columns), schema.tz, fill_missing=fill_missing,
                             defaults=schema.column_defaults)
    stage_times.mark("prepare")
    blocks = split_block(prepared, schema)
    stage_times.mark("split")
    if max_partitions and len(blocks) > max_partitions:
        raise BadInputError(f"Too many partitions for single INSERT block (more than {max_partitions}). "
                            "The limit is the max_partitions_per_insert_block setting: partition by a coarse "
                            "key (a month), not a fine-grained one", code=252)
    out: list[tuple[str, WrittenPart]] = []
    try:
        for i, block in enumerate(blocks):
            # the early lock is the first part's only: the others are committed one after another as before
            out.append((block.partition_id,
                        write_temp_part(block, schema, layout, settings, early if i == 0 else None)))
            stage_times.mark("write_part")
    except BaseException:
        for _pid, written in out:
            shutil.rmtree(written.path, ignore_errors=True)
        if early is not None and early.renamed is not None:
            shutil.rmtree(early.renamed, ignore_errors=True)
        raise
    return out


async def write_block(
    table: pa.Table,
    schema: TableSchema,
    layout: TableDataLayout,
    settings: WriterSettings,
    ctx: InsertContext,
    *,
    fill_missing: bool = True,
    early: EarlyLock | None = None,
) -> list[TempPart]:
    """Write one insert block as temporary parts (one per partition); appended to ``ctx.parts`` too.  With
    ``early`` (made for ``ctx``'s next ordinal), the first part's lock is taken while its files are written
    and that part carries it to the commit; a failed write lets it go."""
    ordinal = ctx.ordinal

    def write() -> list[tuple[str, WrittenPart, str]]:  # the block ids made in the same thread, off the loop
        parts = write_parts(table, schema, layout, settings, fill_missing=fill_missing,
                            max_partitions=ctx.max_partitions, early=early)
        return [(pid, w, block_id_of(pid, w.checksums.files, ctx.deduplicate, ctx.token, ordinal + i))
                for i, (pid, w) in enumerate(parts)]

    try:
        written_parts = await asyncio.to_thread(write)
    except BaseException:
        if early is not None:
            early.abandon()
        raise
    out: list[TempPart] = []
    for i, (partition_id, written, bid) in enumerate(written_parts):
        ctx.ordinal += 1
        carried = early if i == 0 and early is not None and early.started else None
        if carried is not None and (carried.block_id, carried.partition_id) != (bid, partition_id):
            carried.abandon()  # cannot happen: the same checksums' .bin entries
            raise AssertionError(f"early block id {carried.block_id} differs from {bid}")
        part = TempPart(
            path=written.path,
            partition_id=partition_id,
            rows=written.rows,
            checksums=written.checksums,
            columns_text=written.columns_text,
            block_id=bid,
            bytes_on_disk=written.bytes_on_disk,
            early=carried,
            files=written.files,
        )
        out.append(part)
        ctx.parts.append(part)
    stage_times.mark("block_id")
    return out
