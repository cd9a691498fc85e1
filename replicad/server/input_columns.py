"""The columns of an INSERT's input: which input columns go where (:func:`select_columns`) and their
conversion into storage-Arrow insert blocks (:class:`Converter`), shared by every input format's parser
(``formats``, ``native_format``, ``arrow_file``), with the parser settings (:class:`InputSpec`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicad.datatypes import DataType
from replicad.datatypes.base import BadValue
from replicad.datatypes.dates import DateTimeType, DateType, localize
from replicad.datatypes.numeric import FloatType, IntType
from replicad.errors import BadInputError
from replicad.server.sync_body import DEFAULT_MAX_LINE_BYTES, DEFAULT_RECEIVE_TIMEOUT_S
from replicad.server.text_values import array_element, check_array_rows, tsv_unescape, zero_dates
from replicad.storage.block import storage_types_metadata

INCORRECT_DATA = 117
NO_SUCH_COLUMN = 16


@dataclass(frozen=True)
class InputSpec:
    format: str
    columns: Sequence[tuple[str, DataType]]  # the INSERT's column list, or all table columns
    explicit_columns: bool  # the INSERT named its columns
    block_rows: int = 1048576
    tz: str = "UTC"
    skip_unknown_fields: bool = False
    csv_delimiter: str = ","
    spool_dir: str | None = None
    read_block_bytes: int = 4 << 20
    receive_timeout_s: float = DEFAULT_RECEIVE_TIMEOUT_S
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    #: the insert parsers' own threads (None: the loop's default executor, for tests and tools)
    executor: Executor | None = None



# ---- converting parsed columns ---------------------------------------------------------------------------


class Converter:
    """Turns raw parsed batches into storage batches and re-cuts them into insert blocks."""

    def __init__(self, names: list[str], types: list[DataType], spec: InputSpec, *, text: str = "") -> None:
        self.names, self.types, self.spec, self.text = names, types, spec, text
        self.row = 0  # rows converted so far (for 1-based row numbers in errors)
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._metadata = storage_types_metadata(names, types)

    def feed(self, columns: list[pa.Array], escaped: bool | Sequence[bool] = True,
             empty: Sequence[bool] | None = None, ready: Sequence[bool] | None = None
             ) -> Iterator[pa.RecordBatch]:
        """Convert one parsed block; ``escaped`` False for the block or for a column: its text has no
        backslash (nothing to unescape); ``empty`` False for a column: none of its fields is empty (no
        default to fill in; None: not known); ``ready`` True for a column: storage Arrow already (read as
        its values by a text splitter: :func:`typed_column`)."""
        n = len(columns[0]) if columns else 0
        if n == 0:
            return
        flags = [escaped] * len(columns) if isinstance(escaped, bool) else escaped
        empties = [True] * len(columns) if empty is None else empty
        done = [False] * len(columns) if ready is None else ready
        arrays = [arr if rdy else self._column(name, dt, arr, esc, emp) for name, dt, arr, esc, emp, rdy
                  in zip(self.names, self.types, columns, flags, empties, done, strict=True)]
        self.row += n
        self._pending.append(pa.RecordBatch.from_arrays(arrays, names=self.names))
        self._pending_rows += n
        while self._pending_rows >= self.spec.block_rows:
            yield self._cut(self.spec.block_rows)

    def finish(self) -> Iterator[pa.RecordBatch]:
        if self._pending_rows:
            yield self._cut(self._pending_rows)

    def _cut(self, n: int) -> pa.RecordBatch:
        """The first ``n`` pending rows as one batch; the rest stays pending.  Column by column, each column's
        pieces released once joined (the block is held about once, not twice); the rest keeps only the
        pieces it needs (not the whole joined block, as slices of a combined table did)."""
        if len(self._pending) == 1 and self._pending_rows == n:  # a small body: its one batch as it is
            (whole,) = self._pending
            self._pending, self._pending_rows = [], 0
            return whole.replace_schema_metadata(self._metadata)
        head: list[pa.RecordBatch] = []
        rest: list[pa.RecordBatch] = []
        seen = 0
        for b in self._pending:
            if seen >= n:
                rest.append(b)
            elif seen + b.num_rows <= n:
                head.append(b)
            else:
                head.append(b.slice(0, n - seen))
                rest.append(b.slice(n - seen))
            seen += b.num_rows
        self._pending = rest
        self._pending_rows -= n
        pieces = [[b.column(i) for b in head] for i in range(len(self.names))]
        del head
        columns = []
        for i in range(len(pieces)):
            chunks, pieces[i] = pieces[i], []
            columns.append(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks))
            del chunks
        # storage Arrow already (each column through its DataType.convert): the table takes it as it is
        return pa.RecordBatch.from_arrays(columns, names=self.names).replace_schema_metadata(self._metadata)

    def _column(self, name: str, dt: DataType, arr: pa.Array, escaped: bool = True,
                maybe_empty: bool = True) -> pa.Array:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        default_mask = None
        is_array = array_element(dt.name) is not None
        if self.text == "tsv" and escaped:  # an array field is a literal with its own (quoted-string) escapes
            arr = pc.if_else(pc.equal(arr, b"\\N"), pa.scalar(None, arr.type), arr) if is_array \
                else tsv_unescape(arr)
        if not dt.is_nullable and arr.null_count:
            if self.text == "json":  # omitted fields and nulls get the default (input_format_null_as_default)
                default_mask = arr.is_null()
            else:
                i = _first(arr.is_null())
                raise BadInputError(f"Cannot parse input: column {name}, row {self.row + i + 1}: NULL is not "
                                    f"allowed, type {dt.name} is not Nullable")
        if self.text and _is_date(dt) and (pa.types.is_binary(arr.type) or pa.types.is_string(arr.type)):
            arr = zero_dates(arr, "0" if "DateTime" in dt.name else "1970-01-01")
        # the TSV splitter says whether a column has an empty field; else the offsets tell
        if self.text in ("tsv", "csv") and maybe_empty and not _is_textual(dt) and _may_have_empty(arr):
            empty = pc.fill_null(pc.equal(arr, b""), False)
            if pc.any(empty).as_py():  # an empty field means the column's default, as in ClickHouse
                default_mask = empty
                arr = pc.if_else(empty, pa.scalar(None, arr.type), arr)
        if self.text in ("tsv", "csv") and is_array:
            arr = check_array_rows(arr, dt.name, name, self.row)
        try:
            out = dt.convert(arr, self.spec.tz)
        except BadValue as e:
            raise BadInputError(f"Cannot parse input: column {name}, row {self.row + e.row + 1}: value "
                                f"{e.value} {e.reason}") from None
        except BadInputError as e:
            raise BadInputError(f"Cannot parse input: column {name}, rows {self.row + 1}.."
                                f"{self.row + len(arr)}: {e}") from None
        if default_mask is not None:
            out = pc.if_else(default_mask, dt.defaults(len(out)), out)
        return out


def _is_date(dt: DataType) -> bool:
    n = dt.name.removeprefix("Nullable(")
    return n.startswith(("Date", "DateTime"))


def _is_textual(dt: DataType) -> bool:
    n = dt.name.removeprefix("Nullable(").removeprefix("LowCardinality(")
    return n.startswith(("String", "FixedString"))


def _may_have_empty(arr: pa.Array) -> bool:
    """False when no value of a binary/string array is empty, read from its offsets (a few µs, where the
    compute calls that find the empty fields cost tens of µs per column); True otherwise, or when unsure."""
    t = arr.type
    if not (pa.types.is_binary(t) or pa.types.is_string(t)) or arr.null_count:
        return True
    n = len(arr)
    if n == 0:
        return False
    offsets = np.frombuffer(arr.buffers()[1], np.int32, count=n + 1, offset=arr.offset * 4)
    return bool((offsets[1:] == offsets[:-1]).any())


def _first(mask: pa.Array) -> int:
    return int(pc.index(pc.fill_null(mask, False), True).as_py())


# ---- columns the text splitters read as values -----------------------------------------------------------

#: the splitters' kinds of the integer types (replicad/native/text_numbers.h), by (bits, signed)
_INT_KINDS = {(8, False): "B", (16, False): "H", (32, False): "I", (64, False): "Q",
              (8, True): "b", (16, True): "h", (32, True): "i", (64, True): "q"}


def text_kinds(width: int, positions: Sequence[int], types: Sequence[DataType], tz: str) -> bytes:
    """The typed kind of each of the ``width`` field positions for the TSV/CSV splitters: the plain
    (UInt|Int)N, Float32/64, Date and DateTime columns are read as their values in the splitting pass ('s':
    as texts; Nullable, LowCardinality, Enum and every other type keep the general path)."""
    kinds = ["s"] * width
    for pos, dt in zip(positions, types, strict=True):
        if type(dt) is IntType:
            kinds[pos] = _INT_KINDS[(dt.bits, dt.signed)]
        elif type(dt) is DateType:
            kinds[pos] = "D"
        elif type(dt) is DateTimeType:
            kinds[pos] = "T" if (dt.tz or tz) == "UTC" else "t"
        elif type(dt) is FloatType:
            kinds[pos] = "F" if dt.arrow_type == pa.float64() else "f"
    return "".join(kinds).encode()


def typed_column(dt: DataType, kind: str, values: pa.Buffer, rows: int, tz: str) -> pa.Array:
    """A column a splitter read as values of ``kind`` (text_kinds) as storage Arrow: what ``dt.convert``
    makes of the same texts (the splitter read only fields of the shape and range that path parses in C)."""
    if kind == "D":
        return pa.Array.from_buffers(pa.date32(), rows, [None, values])
    if kind in ("T", "t"):
        local = pa.Array.from_buffers(pa.timestamp("s"), rows, [None, values])
        if kind == "T":  # UTC: local seconds are unix seconds
            return local
        assert isinstance(dt, DateTimeType)
        # 2 days inside 0..2^32-1 (the splitter checked): no UTC offset takes the time out of range
        return localize(local, dt.tz or tz).cast(pa.timestamp("s"))
    return pa.Array.from_buffers(dt.arrow_type, rows, [None, values])


# ---- column mapping ------------------------------------------------------------------------------------


def select_columns(spec: InputSpec, input_names: list[str]) -> tuple[list[str], list[int], list[DataType]]:
    """Map the input's named columns onto the insert's columns: (names, input positions, types)."""
    allowed = {n: t for n, t in spec.columns}
    names, positions, types, seen = [], [], [], set()
    for pos, n in enumerate(input_names):
        if n in seen:
            raise BadInputError(f"Column {n} is given more than once in the input", code=INCORRECT_DATA)
        seen.add(n)
        if n not in allowed:
            if spec.skip_unknown_fields:
                continue
            where = "the INSERT's column list" if spec.explicit_columns else "the table"
            raise BadInputError(f"Unknown column {n} in the input: not in {where}", code=NO_SUCH_COLUMN)
        names.append(n)
        positions.append(pos)
        types.append(allowed[n])
    if spec.explicit_columns:
        missing = [n for n, _ in spec.columns if n not in seen]
        if missing:
            raise BadInputError(f"Columns {', '.join(missing)} are named in the INSERT but missing in "
                                "the input", code=NO_SUCH_COLUMN)
    return names, positions, types
