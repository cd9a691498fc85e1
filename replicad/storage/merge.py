"""Merging sorted parts into one (an Ordinary MergeTree merge, as ClickHouse 18.16 performs it).

``merge_parts(sources, tmp_dir, schema, settings)`` streams a k-way merge: every source part is read
``granules_per_batch`` granules at a time (:class:`~replicad.storage.reader.PartReader`), and each round

1. takes the *frontier*: the smallest "last pending key" over the sources, with the source number as
   tie-break (``(F, m)``); when that round would exceed ``max_round_rows``, a smaller frontier — the key
   of an earlier pending row of source ``m``, which then gives only the rows up to it;
2. cuts every source's pending rows at the frontier by binary search on its (sorted) keys — rows ``<= F``
   from sources numbered below ``m``, everything pending from ``m``, rows ``< F`` from the others;
3. merges the cut prefixes (the runs) by the sorting key, equal keys in source order and, inside a
   source, in row order — exactly the order of ClickHouse's ``MergingSortedBlockInputStream`` (ties go to
   the lower source number): in C for keys of numbers and strings, every column gathered straight from
   the runs (:mod:`replicad.storage.merge_runs`); for other keys (NULLs, Decimal, FixedString ...) by a
   stable sort of the runs concatenated in source order;
4. hands the rows to :class:`~replicad.storage.writer.PartWriter`, whose output does not depend on
   where the batches are cut.

A source whose pending rows fall under a quarter of a batch is topped up with its next batch first (a
remainder that small would make a round of its own).  Columns no key, partition or DEFAULT expression reads
(fixed-width non-Nullable types and String) travel still serialized — ``PartReader.read_granules(raw=...)``
to ``PartWriter(raw_columns=...)`` — and are never decoded or encoded.

Memory is bounded by about a batch and a quarter per source plus the round being written (at most
``max_round_rows``), not by the part sizes.  The
merged part is a function of the source rows, their order and the writer settings only, so every replica
(and 18.16 itself, with the same compression method) produces the same bytes.  18.16 picks its Vertical
algorithm for >= 11 non-key columns and >= 131072 rows; the rows and granules it writes are the same, so
the bytes are too (see tests/integration/test_merge_clickhouse18.py).

Sorting-key order follows ClickHouse: ascending, NaN after every number, NULL last, strings and
FixedString/UUID bytes compared unsigned byte-wise.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from replicad.datatypes import DataType
from replicad.datatypes.composite import take_rows
from replicad.errors import CorruptedDataError
from replicad.sql.expressions import Expr, compile_expression, compile_key
from replicad.sql.expressions_ast import Function, Literal
from replicad.sql.partition import PartitionKey
from replicad.storage.merge_cuts import Key, cut, key_at
from replicad.storage.merge_runs import BufferPool, MergedOrder, merge_runs, reference_order
from replicad.storage.part import PartDirectory
from replicad.storage.read_ahead import ahead
from replicad.storage.reader import PartReader
from replicad.storage.writer import PartWriter, WriterSettings, WrittenPart

#: granules read from each source per batch (4 × 8192 rows; with read-ahead two batches per source)
DEFAULT_GRANULES_PER_BATCH = 4
#: rows merged per round at most (when one pivot row can bound it): the merged batch and its copies.  Sources
#: whose keys advance in step would otherwise give rounds of every source's whole batch at once.
MAX_ROUND_ROWS = 65536


class TableSchemaLike(Protocol):
    """What merging and mutating need to know about the table (the sink's ``TableSchema`` fits)."""

    @property
    def columns(self) -> Sequence[tuple[str, DataType]]: ...

    @property
    def partition_by(self) -> str | None: ...

    @property
    def order_by(self) -> str | None: ...

    @property
    def primary_key(self) -> str | None: ...

    @property
    def tz(self) -> str: ...


@dataclass(frozen=True)
class PartSchema:
    """A plain :class:`TableSchemaLike`: the physical columns in ClickHouse's order (ordinary columns,
    then MATERIALIZED ones, as ``getAllPhysical``), the key clauses' expression text, and the
    ``defaults``: ``(column, kind, expression)`` for DEFAULT / MATERIALIZED columns.

    ``defaults`` is optional for other schema objects too (read with ``getattr``): merges and mutations
    compute a column that a source part lacks (added by ALTER) from its expression, and an UPDATE of a
    column some MATERIALIZED expression reads recomputes every MATERIALIZED column, as 18.16 does.
    """

    columns: tuple[tuple[str, DataType], ...]
    partition_by: str | None = None
    order_by: str | None = None
    primary_key: str | None = None
    tz: str = "UTC"
    defaults: tuple[tuple[str, str, str], ...] = ()


class TableKeys:
    """A schema's compiled keys and what :class:`PartWriter` needs from them."""

    def __init__(self, schema: TableSchemaLike) -> None:
        self.schema = schema
        self.columns = list(schema.columns)
        self.types: dict[str, DataType] = dict(self.columns)
        self.tz = schema.tz

    @cached_property
    def sorting(self) -> list[Expr]:
        return compile_key(self.schema.order_by)

    @cached_property
    def primary(self) -> list[Expr]:
        return compile_key(self.schema.primary_key) if self.schema.primary_key else self.sorting

    @cached_property
    def partition(self) -> PartitionKey:
        return PartitionKey.parse(self.schema.partition_by)

    @cached_property
    def sorting_columns(self) -> set[str]:
        """Columns the sorting key reads (ClickHouse refuses to UPDATE them)."""
        return {c for e in self.sorting for c in e.columns}

    @cached_property
    def defaults(self) -> dict[str, tuple[str, Expr]]:
        """column -> (DEFAULT or MATERIALIZED, ``CAST(expression AS type)``)."""
        out: dict[str, tuple[str, Expr]] = {}
        for column, kind, text in getattr(self.schema, "defaults", ()) or ():
            dtype = self.types.get(column)
            if dtype is None or kind.upper() not in ("DEFAULT", "MATERIALIZED") or not text:
                continue  # ALIAS columns are not stored
            node = Function("CAST", (compile_expression(text).node, Literal(dtype.name, "string")))
            out[column] = (kind.upper(), Expr(node))
        return out

    @cached_property
    def materialized(self) -> list[tuple[str, Expr]]:
        return [(c, e) for c, (kind, e) in self.defaults.items() if kind == "MATERIALIZED"]

    def computed(self, column: str, table: pa.Table) -> pa.Array:
        """A DEFAULT/MATERIALIZED column computed from the other columns of ``table``."""
        arr, _t = self.defaults[column][1].evaluate(table, self.types, self.tz)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        dtype = self.types[column]
        if arr.type != dtype.arrow_type or (not dtype.is_nullable and arr.null_count):
            arr = dtype.to_storage(arr, column, self.tz)
        if len(arr) != table.num_rows:  # a constant expression over zero referenced columns
            arr = pa.repeat(arr[0], table.num_rows) if len(arr) else dtype.defaults(table.num_rows)
        return arr

    def missing_with_defaults(self, reader: PartReader) -> list[str]:
        """Table columns the part lacks that have a DEFAULT/MATERIALIZED expression (table order)."""
        return [c for c, _t in self.columns if c not in reader.part_columns and c in self.defaults]

    def fill_defaults(self, table: pa.Table, missing: Sequence[str]) -> pa.Table:
        """``table`` with the ``missing`` columns computed from their expressions, in order."""
        for c in missing:
            if c in table.column_names:
                table = table.set_column(table.schema.get_field_index(c), c, self.computed(c, table))
        return table

    def raw_columns(self, readers: Sequence[PartReader]) -> frozenset[str]:
        """Columns a merge can copy still serialized (``PartReader.read_granules``' ``raw``): no key,
        partition or DEFAULT expression reads them, and every source stores them alike
        (:meth:`PartReader.raw_width`).  None when a source lacks a column with a DEFAULT (the
        expression is computed from the decoded columns)."""
        if any(self.missing_with_defaults(r) for r in readers):
            return frozenset()
        read = {c for e in (*self.sorting, *self.primary) for c in e.columns} | set(self.partition.columns)
        out = set()
        for name, _t in self.columns:
            if name in read:
                continue
            widths = {r.raw_width(name) for r in readers}
            if len(widths) == 1 and None not in widths:
                out.add(name)
        return frozenset(out)

    @cached_property
    def partition_types(self) -> list[DataType]:
        return self.partition.result_types(self.types, self.tz)

    def evaluate(self, exprs: Sequence[Expr], table: pa.Table) -> list[pa.Array]:
        out = []
        for e in exprs:
            arr, _t = e.evaluate(table, self.types, self.tz)
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            out.append(arr)
        return out

    def partition_value(self, part: PartDirectory) -> list[tuple[DataType, object]] | None:
        """The partition-key values stored in a part's ``partition.dat`` (None without a partition key)."""
        types = self.partition_types
        if not types:
            return None
        data = part.partition_dat
        if data is None:
            raise CorruptedDataError(f"part {part.name}: no partition.dat but the table has a partition key")
        view = memoryview(data)
        pos = 0
        out: list[tuple[DataType, object]] = []
        for t in types:
            try:
                arr, used = t.decode(view[pos:], 1)
            except (CorruptedDataError, ValueError, IndexError) as e:
                raise CorruptedDataError(f"part {part.name}: bad partition.dat: {e}") from None
            out.append((t, arr[0].as_py()))
            pos += used
        if pos != len(data):
            raise CorruptedDataError(f"part {part.name}: partition.dat has {len(data) - pos} trailing bytes")
        return out

    def writer(
        self,
        tmp_dir: Path,
        settings: WriterSettings,
        partition_value: list[tuple[DataType, object]] | None,
        raw_columns: Collection[str] = (),
    ) -> PartWriter:
        names = [e.text for e in self.primary]
        key_types = {
            e.text: e.result_type(self.types, self.tz) for e in self.primary if e.text not in self.types
        }
        return PartWriter(
            tmp_dir,
            self.columns,
            settings,
            primary_key=names,
            key_types=key_types,
            minmax_columns=self.partition.columns if partition_value is not None else (),
            partition_value=partition_value,
            raw_columns=raw_columns,
        )

    def primary_arrays(
        self, table: pa.Table, sorted_keys: Sequence[pa.Array] | None = None
    ) -> dict[str, pa.Array]:
        """Arrays of the primary-key expressions that are not plain columns (for ``PartWriter.write``);
        a primary expression that is also a sorting expression reuses ``sorted_keys``."""
        out: dict[str, pa.Array] = {}
        for i, e in enumerate(self.primary):
            if e.text in self.types:
                continue
            if sorted_keys is not None and i < len(self.sorting) and self.sorting[i].text == e.text:
                out[e.text] = sorted_keys[i]
            else:
                out[e.text] = self.evaluate([e], table)[0]
        return out


class _Source:
    """One source part: its batches, and the pending (not yet merged) rows of the current batch.

    With a ``pool`` the next batch is read (and its keys evaluated) ahead, in the pool.
    """

    def __init__(
        self,
        index: int,
        batches: Iterator[pa.Table],
        keys: TableKeys,
        pool: ThreadPoolExecutor | None,
        missing: Sequence[str] = (),
    ) -> None:
        self.index = index
        self._batches = batches
        self._keys = keys
        self._missing = list(missing)
        self._pool = pool
        self.table: pa.Table | None = None
        self.sort_keys: list[pa.Array] = []
        self.exhausted = False
        self._low_water = 0
        self._ahead: Future[tuple[pa.Table, list[pa.Array]] | None] | None = (
            pool.submit(self._read) if pool is not None else None
        )

    def _read(self) -> tuple[pa.Table, list[pa.Array]] | None:
        for batch in self._batches:
            if batch.num_rows:
                batch = self._keys.fill_defaults(batch, self._missing)
                return batch, self._keys.evaluate(self._keys.sorting, batch)
        return None

    @property
    def pending(self) -> int:
        return 0 if self.table is None else self.table.num_rows

    def fill(self, top_up: bool = False) -> bool:
        """Make sure rows are pending unless the source is exhausted; True if rows are pending.

        With ``top_up`` the next batch is also appended when fewer than a quarter of a batch's rows are
        pending: a remainder that small would otherwise make a round of its own (a few rows, the whole
        per-round cost)."""
        while not self.exhausted and (self.pending == 0 or (top_up and self.pending < self._low_water)):
            if self._ahead is not None:
                item = self._ahead.result()
                self._ahead = self._pool.submit(self._read) if item is not None and self._pool else None
            else:
                item = self._read()
            if item is None:
                self.exhausted = True
            elif self.table is None or self.pending == 0:
                self.table, self.sort_keys = item
                self._low_water = item[0].num_rows // 4
            else:
                table, sort_keys = item
                self.table = pa.concat_tables([self.table, table])  # chunked: no copy
                self.sort_keys = [pa.chunked_array([*_chunks(a), *_chunks(b)], a.type)
                                  for a, b in zip(self.sort_keys, sort_keys, strict=True)]
        if self.pending == 0:
            self.table = None
            self.sort_keys = []
        return self.pending > 0

    def last_key(self) -> Key:
        return self.key_at(self.pending - 1)

    def key_at(self, i: int) -> Key:
        return key_at(self.sort_keys, i)

    def cut(self, frontier: Key, inclusive: bool) -> int:
        """Pending rows before ``frontier`` (``inclusive``: rows equal to it too)."""
        return cut(self.sort_keys, frontier, inclusive)

    def take(self, n: int) -> tuple[pa.Table, list[pa.Array]]:
        assert self.table is not None
        head = self.table.slice(0, n)
        keys = [k.slice(0, n) for k in self.sort_keys]
        self.table = self.table.slice(n)
        self.sort_keys = [k.slice(n) for k in self.sort_keys]
        return head, keys


def merged_batches(
    readers: Sequence[PartReader],
    keys: TableKeys,
    granules_per_batch: int = DEFAULT_GRANULES_PER_BATCH,
    read_threads: int = 0,
    raw: Collection[str] = (),
    max_round_rows: int = MAX_ROUND_ROWS,
) -> Iterator[tuple[pa.Table, list[pa.Array]]]:
    """The rows of ``readers`` (each sorted) merged by the sorting key, as (batch, sorting-key arrays).

    Ties keep source order, then row order (ClickHouse's stable merge).  Without a sorting key the
    sources are concatenated.  With ``read_threads`` > 0 every source reads its next batch ahead in a
    pool of that many threads (one more batch per source in memory).
    """
    pool = ThreadPoolExecutor(read_threads, thread_name_prefix="merge-read") if read_threads > 0 else None
    try:
        yield from _merge(readers, keys, granules_per_batch, pool, raw, max_round_rows)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _merge(
    readers: Sequence[PartReader],
    keys: TableKeys,
    granules_per_batch: int,
    pool: ThreadPoolExecutor | None,
    raw: Collection[str],
    max_round_rows: int,
) -> Iterator[tuple[pa.Table, list[pa.Array]]]:
    names = [n for n, _ in keys.columns]
    sources = [
        _Source(i, r.iter_batches(names, granules_per_batch, raw), keys, pool, keys.missing_with_defaults(r))
        for i, r in enumerate(readers)
    ]
    if not keys.sorting:
        for s in sources:
            while s.fill():
                yield s.take(s.pending)
        return
    if len(sources) > 1 and sum(r.rows for r in readers) <= max_round_rows:
        # small sources (a merge of small inserts' parts): every row in one round, sorted at once; rounds
        # of cuts and run merges cost ~0.5 ms per source (30 sources of 100 rows: 47 of 83 ms, cProfile)
        whole = [s.take(s.pending) for s in sources for _ in iter(s.fill, False)]
        if whole:
            yield _sorted_round(whole, keys)
        return
    buffers = BufferPool()  # the gathered columns' buffers, used again round after round
    while True:
        active = [s for s in sources if s.fill(top_up=True)]
        if not active:
            return
        if len(active) == 1:
            s = active[0]
            yield s.take(s.pending)
            continue
        frontier, m = min((s.last_key(), s.index) for s in active)
        pivot = sources[m]
        cuts = _cuts(active, frontier, m, pivot.pending)
        total = sum(cuts)
        while total > max_round_rows and _cuts_of(active, cuts, m) > 1:
            # A smaller frontier: a prefix of the pivot source, every other source cut at its last key
            # (each source below m still ends above it, so the order stays ClickHouse's).
            j = _cuts_of(active, cuts, m)
            j = max(1, min(j - 1, j * max_round_rows // total))
            cuts = _cuts(active, pivot.key_at(j - 1), m, j)
            total = sum(cuts)
        pieces: list[tuple[pa.Table, list[pa.Array]]] = []
        for s, n in zip(active, cuts, strict=True):
            if n:
                pieces.append(s.take(n))
        if len(pieces) == 1:
            yield pieces[0]
            continue
        done = merge_runs([t for t, _ in pieces], [k for _, k in pieces], buffers)
        if done is not None:
            merged, order = done
            yield merged, [_merged_key(e, [k[i] for _, k in pieces], merged, keys, order)
                           for i, e in enumerate(keys.sorting)]
            continue
        yield _sorted_round(pieces, keys)


def _sorted_round(pieces: Sequence[tuple[pa.Table, list[pa.Array]]],
                  keys: TableKeys) -> tuple[pa.Table, list[pa.Array]]:
    """The pieces of a round (in source order) concatenated and stably sorted: ties keep source order."""
    table = _concat_tables([t for t, _ in pieces])
    cols = [_concat_key(e, [k[i] for _, k in pieces], table, keys) for i, e in enumerate(keys.sorting)]
    order = pa.array(reference_order(cols), pa.int64())
    merged = take_rows(table, order)
    return merged, [_sorted_key(e, c, merged, keys, order) for e, c in zip(keys.sorting, cols, strict=True)]


def _chunks(a: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(a.chunks) if isinstance(a, pa.ChunkedArray) else [a]


def _cuts(active: Sequence[_Source], frontier: Key, m: int, pivot_rows: int) -> list[int]:
    """Rows each active source gives to a round ending at ``frontier`` (ties: sources below ``m`` first);
    the pivot source ``m`` gives ``pivot_rows``."""
    return [pivot_rows if s.index == m else s.cut(frontier, inclusive=s.index < m) for s in active]


def _cuts_of(active: Sequence[_Source], cuts: Sequence[int], m: int) -> int:
    return next(n for s, n in zip(active, cuts, strict=True) if s.index == m)


def _concat_tables(tables: Sequence[pa.Table]) -> pa.Table:
    """``tables`` one after the other, every column one contiguous array (the merged batch is taken
    from it: a chunked column would be combined first, one more copy)."""
    first = tables[0]
    columns = [
        pa.concat_arrays([chunk for t in tables for chunk in t.column(i).chunks])
        for i in range(first.num_columns)
    ]
    return pa.Table.from_arrays(columns, schema=first.schema)


def _concat_key(e: Expr, pieces: list[pa.Array], table: pa.Table, keys: TableKeys) -> pa.Array:
    """A sorting-key array of the round: a plain column's is the concatenated column (no second copy)."""
    if e.text in keys.types:
        i = table.schema.get_field_index(e.text)
        if i >= 0:
            col = table.column(i)
            if col.num_chunks == 1 and col.type == pieces[0].type:
                return col.chunk(0)
    return pa.concat_arrays([c for p in pieces for c in _chunks(p)])


def _merged_key(e: Expr, pieces: list[pa.Array], merged: pa.Table, keys: TableKeys,
                order: MergedOrder) -> pa.Array:
    """A sorting-key array in merged order from the runs' key ``pieces``: a plain column's is the merged
    column; an expression's is taken from the concatenated pieces."""
    plain = _plain_key(e, merged, keys, pieces[0].type)
    if plain is not None:
        return plain
    return pa.concat_arrays([c for p in pieces for c in _chunks(p)]).take(order.indices)


def _plain_key(e: Expr, merged: pa.Table, keys: TableKeys, key_type: pa.DataType) -> pa.Array | None:
    if e.text in keys.types:
        i = merged.schema.get_field_index(e.text)
        if i >= 0:
            col = merged.column(i)
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            if arr.type == key_type:
                return arr
    return None


def _sorted_key(e: Expr, key: pa.Array, merged: pa.Table, keys: TableKeys, order: pa.Array) -> pa.Array:
    """A sorting-key array in merged order: a plain column's is the merged column (no second take)."""
    plain = _plain_key(e, merged, keys, key.type)
    return plain if plain is not None else key.take(order)


def merge_parts(
    source_dirs: Sequence[str | os.PathLike[str] | PartDirectory],
    tmp_dir: str | os.PathLike[str],
    schema: TableSchemaLike,
    settings: WriterSettings | None = None,
    *,
    granules_per_batch: int = DEFAULT_GRANULES_PER_BATCH,
    prefetch: int = 0,
    read_threads: int = 0,
    max_round_rows: int = MAX_ROUND_ROWS,
    writer_threads: int = 1,
) -> WrittenPart:
    """Merge the parts in ``source_dirs`` (in part order: by block number) into a new part in ``tmp_dir``.

    A source given as a :class:`PartDirectory` is read with what it has cached (the daemon's parts: the
    checksums, columns.txt and count.txt it wrote or read before), not read again: a tenth of the CPU of a
    merge of 22 parts of 100 rows (interleaved in-process runs: 17.6 vs 19.2 ms and 21.0 vs 22.7 ms,
    medians of 80).  All sources must belong to one partition (their ``partition.dat`` is taken from the
    first).  Columns are the table's (``schema.columns``); a source lacking one reads as the type's
    defaults.  With ``prefetch`` > 0 reading and merging run in a helper thread, up to that many batches
    ahead of the writer; with ``read_threads`` > 0 the sources also read ahead in parallel (see
    :func:`merged_batches`).  ``writer_threads`` replaces ``settings.threads`` (the writer's column pool).
    Blocking: run it in a worker thread.

    By default a merge runs in the caller's thread alone, as a merge of 18.16 does.  A second thread
    reading and merging ahead of the writer (``prefetch=1``) cost about 10% more CPU time in hand-overs
    and contention for the GIL (the 10 x 200k-row bench merge in a fresh process, 8 alternating runs
    each, load 4-6 on 2 cores: median 0.375 vs 0.337 CPU-s, and 0.374 vs 0.337 in another 8) and gave no
    shorter wall time on the shared machine; more threads (a read pool, a column pool) cost more still.
    Merges run in parallel with each other instead, as in 18.16's background pool.
    """
    if not source_dirs:
        raise ValueError("merge_parts needs at least one source part")
    settings = replace(settings or WriterSettings(), threads=writer_threads)
    keys = TableKeys(schema)
    parts = [p if isinstance(p, PartDirectory) else PartDirectory(Path(p)) for p in source_dirs]
    partition_value = keys.partition_value(parts[0])
    for part in parts[1:]:
        if part.partition_dat != parts[0].partition_dat:
            raise ValueError(f"cannot merge parts of different partitions: {parts[0].name} and {part.name}")
    readers: list[PartReader] = []
    try:
        for part in parts:
            readers.append(PartReader(part, keys.types, index_granularity=settings.index_granularity))

        raw = keys.raw_columns(readers)

        def produce() -> Iterator[tuple[pa.Table, dict[str, pa.Array]]]:
            for batch, sort_keys in merged_batches(readers, keys, granules_per_batch, read_threads, raw,
                                                   max_round_rows):
                yield batch, keys.primary_arrays(batch, sort_keys)

        batches = ahead(produce(), prefetch)
        try:
            with keys.writer(Path(tmp_dir), settings, partition_value, raw) as writer:
                for batch, pk in batches:
                    writer.write(batch, pk)
                return writer.finish()
        finally:
            batches.close()  # stops and joins the reading thread before the readers close
    finally:
        for r in readers:
            r.close()
