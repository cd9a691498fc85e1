"""TableReader: the read side of a table replica — SELECT, count() and full reads over the active parts.

Parts are read with :class:`PartReader` a few granules at a time in a worker thread, filtered by the
WHERE expression there; a part that turns out broken or vanished is handed to the part check.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType, parse_type
from replicad.errors import BadInputError, CorruptedDataError, TooManyRowsOrBytesError
from replicad.replication.part_store import PartStore
from replicad.service import QueryResult, SelectQuery
from replicad.sql.expressions import Expr, compile_expression
from replicad.storage.merge import TableKeys, TableSchemaLike
from replicad.storage.reader import PartReader

#: ORDER BY … LIMIT n re-sorts and keeps the best n rows whenever this many more have been read
TOP_N_SLACK_ROWS = 65536
#: MergeTree's virtual columns served here: the part's name and partition ID (readable, filterable)
VIRTUAL_COLUMNS: dict[str, DataType] = {"_part": parse_type("String"), "_partition_id": parse_type("String")}


def _virtual_values(name: str, partition_id: str) -> dict[str, bytes]:
    return {"_part": name.encode(), "_partition_id": partition_id.encode()}


class TableReader:
    """Reads a table's active parts.  ``columns`` are its stored columns; ``select_star`` the columns of
    ``SELECT *`` (no MATERIALIZED ones, as ClickHouse); ``on_broken_part(name)`` is told of a part that fails
    to read."""

    def __init__(
        self,
        columns: Sequence[tuple[str, DataType]],
        select_star: Sequence[str],
        store: PartStore,
        tz: str,
        on_broken_part: Callable[[str], None],
        schema: TableSchemaLike | None = None,
    ) -> None:
        #: DEFAULT expressions, computed for parts that lack their column (written before ALTER ADD COLUMN)
        self.keys = TableKeys(schema) if schema is not None else None
        self.columns = list(columns)
        self.types = {**VIRTUAL_COLUMNS, **dict(columns)}
        self.select_star = list(select_star)
        self.stored = set(dict(columns))
        self.store = store
        self.tz = tz
        self.on_broken_part = on_broken_part

    def empty(self, names: Sequence[str]) -> pa.Table:
        return pa.Table.from_arrays(
            [pa.array([], self.types[n].arrow_type) for n in names],
            schema=pa.schema([pa.field(n, self.types[n].arrow_type) for n in names]),
        )

    async def iter_rows(
        self, names: Sequence[str], where: str | None = None, granules_per_batch: int = 16
    ) -> AsyncIterator[pa.Table]:
        """The active parts' rows, part by part and a few granules at a time, filtered by ``where``.

        Reading and filtering run in a worker thread; the active set is the one at the first batch."""
        types = self.types
        expr = await compiled(where) if where else None
        virtual = [n for n in dict.fromkeys([*names, *(expr.columns if expr else [])]) if n in VIRTUAL_COLUMNS
                   and n not in self.stored]
        wanted = {n: types[n] for n in names if n not in virtual} or dict(self.columns[:1])  # (row counts)
        only_virtual = expr is not None and all(c in virtual for c in expr.columns)
        tz = self.tz
        for p in self.store.active():
            values = _virtual_values(p.name, p.info.partition_id)
            if only_virtual and expr is not None:  # a filter on the part alone: skip the part, or keep all
                one = pa.table({n: pa.array([values[n]], types[n].arrow_type) for n in virtual})
                if not pa.array(expr.mask(one, types, tz))[0].as_py():
                    continue
            read, missing = wanted, self._missing_defaults(p.directory.column_types, wanted)
            if missing and self.keys is not None:
                need = {c for m in missing for c in self.keys.defaults[m][1].columns}
                read = {**wanted, **{c: types[c] for c in need if c not in wanted and c in types}}
            try:
                reader = await asyncio.to_thread(PartReader, p.directory, read)
            except (CorruptedDataError, OSError):
                self.on_broken_part(p.name)  # a broken or vanished part: the part check repairs it
                raise
            try:
                batches = reader.iter_batches(list(read), granules_per_batch)

                def step(
                    it: Iterator[pa.Table] = batches, values: dict[str, bytes] = values,
                    missing: list[str] = missing,
                ) -> pa.Table | None:
                    batch = next(it, None)
                    if batch is None:
                        return batch
                    if missing and self.keys is not None:
                        batch = self.keys.fill_defaults(batch, missing)
                    for n in virtual:
                        batch = batch.append_column(n, pa.array([values[n]] * batch.num_rows, pa.binary()))
                    if expr is not None and not only_virtual:
                        batch = batch.filter(pa.array(expr.mask(batch, types, tz)))
                    return batch.select(list(names)) if list(batch.column_names) != list(names) else batch

                while True:
                    try:
                        batch = await asyncio.to_thread(step)
                    except (CorruptedDataError, OSError):
                        self.on_broken_part(p.name)
                        raise
                    if batch is None:
                        break
                    if batch.num_rows:
                        yield batch
            finally:
                reader.close()

    def _missing_defaults(self, part_columns: Sequence[tuple[str, str]], wanted: Mapping[str, DataType]
                          ) -> list[str]:
        """Wanted columns the part lacks that have a DEFAULT expression (computed instead of type defaults,
        as ClickHouse reads a part written before ALTER ADD COLUMN)."""
        if self.keys is None or not self.keys.defaults:
            return []
        have = {n for n, _t in part_columns}
        return [n for n in wanted if n not in have and n in self.keys.defaults]

    async def read_all(self, columns: Sequence[str] | None = None, where: str | None = None) -> pa.Table:
        """Every (matching) row of the active parts, in storage Arrow."""
        names = list(columns) if columns is not None else [n for n, _ in self.columns]
        tables = [t async for t in self.iter_rows(names, where)]
        return pa.concat_tables(tables) if tables else self.empty(names)

    async def _needed_columns(self, query: SelectQuery) -> list[str]:
        types = self.types
        out: list[str] = list(query.columns) if query.columns is not None else list(types)
        extra: list[str] = []
        if query.where:
            extra += (await compiled(query.where)).columns
        for k in query.order_by:
            extra += (await compiled(k.expression)).columns
        for c in out + extra:
            if c not in types:
                raise BadInputError(f"Missing columns: '{c}' while processing query", code=47)
        return list(dict.fromkeys(out + extra))

    async def select(self, query: SelectQuery) -> QueryResult:
        types = self.types
        names = await self._needed_columns(query)
        out_names = list(query.columns) if query.columns is not None else list(self.select_star)
        columns = [(n, types[n]) for n in out_names]
        if not query.order_by:
            return QueryResult(columns, self._stream(names, out_names, query.where, query.limit))
        keys = [(await compiled(k.expression), k.descending) for k in query.order_by]
        limit, max_rows, max_bytes = query.limit, query.max_rows_to_sort, query.max_bytes_to_sort
        kept: list[pa.Table] = []
        rows = size = 0
        async for t in self.iter_rows(names, query.where):
            kept.append(t)
            rows += t.num_rows
            size += t.nbytes
            over = (max_rows and rows > max_rows) or (max_bytes and size > max_bytes)
            if limit is not None and (over or rows >= 2 * limit + TOP_N_SLACK_ROWS):  # keep the best rows
                best = await asyncio.to_thread(self._sorted, pa.concat_tables(kept), keys, limit)
                kept, rows, size = [best], best.num_rows, best.nbytes
                over = (max_rows and rows > max_rows) or (max_bytes and size > max_bytes)
            if over:
                raise TooManyRowsOrBytesError(
                    f"Limit for rows or bytes to sort exceeded: more than {max_rows or 'any'} rows or "
                    f"{max_bytes or 'any'} bytes (max_rows_to_sort / max_bytes_to_sort); add a LIMIT or a "
                    "narrower WHERE")
        table = pa.concat_tables(kept) if kept else self.empty(names)
        result = await asyncio.to_thread(self._sorted, table, keys, limit)
        return QueryResult.from_table(columns, result.select(out_names))

    def _sorted(self, table: pa.Table, keys: Sequence[tuple[Expr, bool]], limit: int | None) -> pa.Table:
        """``table`` ordered by ``keys`` (expression, descending), its first ``limit`` rows (blocking)."""
        arrays = {f"k{i}": e.evaluate(table, self.types, self.tz)[0] for i, (e, _d) in enumerate(keys)}
        sort_keys = [(f"k{i}", "descending" if d else "ascending", "at_end")
                     for i, (_e, d) in enumerate(keys)]
        idx = pc.sort_indices(pa.table(arrays), sort_keys=sort_keys)
        if limit is not None:
            idx = idx.slice(0, limit)
        return table.take(idx)

    async def _stream(
        self, names: list[str], out_names: list[str], where: str | None, limit: int | None
    ) -> AsyncIterator[pa.RecordBatch]:
        left = limit
        if left is not None and left <= 0:
            return
        async for table in self.iter_rows(names, where):
            if left is not None:
                table = table.slice(0, left)
                left -= table.num_rows
            for b in table.select(out_names).to_batches():
                yield b
            if left is not None and left <= 0:
                return

    async def count(self, where: str | None) -> int:
        if not where:
            return self.store.active_rows()
        expr = await compiled(where)
        names = list(dict.fromkeys(expr.columns)) or [self.columns[0][0]]
        total = 0
        async for t in self.iter_rows(names, where):
            total += t.num_rows
        return total


#: expressions longer than this are compiled in a worker thread (parsing is pure Python: a WHERE with a long
#: IN list takes seconds the event loop must not lose); shorter ones are compiled once and kept
COMPILE_INLINE_CHARS = 4096
_compile_cached = functools.lru_cache(maxsize=256)(compile_expression)


async def compiled(text: str) -> Expr:
    if len(text) <= COMPILE_INLINE_CHARS:
        return _compile_cached(text)
    return await asyncio.to_thread(compile_expression, text)
