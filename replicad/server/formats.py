"""Input formats → storage Arrow, streamed from the request body.

A request body is never held in memory: a worker thread pulls it from the (async) HTTP stream in
chunks through :class:`SyncBody`, pyarrow parses it block by block, every column is converted to
storage Arrow by its ``DataType`` and the rows are re-cut into insert blocks of exactly
``max_insert_block_size`` rows (the last one shorter) — so a retried body produces the same blocks and
the same ``block_id`` s.  Parquet needs random access to its footer: it is spooled to a temporary file.

Formats (ClickHouse names): ``JSONEachRow``, ``TabSeparated``/``TSV`` (ClickHouse escaping, ``\\N`` =
NULL), ``TabSeparatedWithNames``/``TSVWithNames``, ``CSV``, ``CSVWithNames``, ``ArrowStream``, ``Parquet``.
Errors are :class:`BadInputError` naming the column and the (1-based) row.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.ipc as pa_ipc
import pyarrow.json as pa_json

from replicad.datatypes import DataType
from replicad.errors import BadInputError, ReplicadError
from replicad.native import _csvsplit, _jsonsplit, _tsvsplit
from replicad.server.input_columns import Converter, InputSpec, select_columns, text_kinds, typed_column
from replicad.server.sync_body import BodySource, ReceiveTimeoutError, SyncBody, spooled
from replicad.server.text_values import (
    array_element,
    json_kind,
    text_kind,
    tsv_unescape,
)

__all__ = ["INPUT_FORMATS", "BodySource", "InputSpec", "ParsedBody", "SyncBody", "parse_body", "tsv_unescape"]

_ALIASES = {"TSV": "TabSeparated", "TSVWithNames": "TabSeparatedWithNames"}
INPUT_FORMATS = frozenset({"JSONEachRow", "TabSeparated", "TSV", "TabSeparatedWithNames", "TSVWithNames",
                           "CSV", "CSVWithNames", "ArrowStream", "Parquet", "Native", "Arrow"})
UNKNOWN_FORMAT = 73
INCORRECT_DATA = 117
def canonical_format(name: str) -> str:
    if name not in INPUT_FORMATS:
        raise BadInputError(f"Unknown input format {name}", code=UNKNOWN_FORMAT)
    return _ALIASES.get(name, name)


@dataclass
class ParsedBody:
    """The insert's column names (in batch order) and the storage-Arrow insert blocks."""

    columns: list[str]
    batches: AsyncIterator[pa.RecordBatch]
    body: SyncBody


#: a body of at most this many bytes (known ``Content-Length``, no ``Content-Encoding``) is read whole on the
#: loop and parsed to its end in one worker-thread trip (one thread hand-over, not one per chunk and per
#: block).  As large as one read block (``InputSpec.read_block_bytes``, 4 MiB): the streamed parse holds a
#: block of that size too, so reading such a body whole costs no memory more, and a 10k-row insert (~0.7
#: MB of TSV) saves the trips for the column list, the body's chunks, the end and the close, each a wait for
#: the scheduler on a busy machine (it was 256 KiB)
SMALL_BODY_BYTES = 4 << 20
#: a whole text body of at most this many bytes is parsed on the loop itself, as a short statement is
#: (api.PARSE_INLINE_BYTES): a 100-row insert's rows take well under a millisecond of CPU, which the parser
#: spent holding the GIL in its worker thread anyway, and the two thread hand-overs of the trip cost more
#: than that on a busy machine (each waits for the scheduler)
INLINE_PARSE_BYTES = 16384
_INLINE_FORMATS = frozenset({"TabSeparated", "TabSeparatedWithNames", "CSV", "CSVWithNames", "JSONEachRow"})


async def parse_body(source: BodySource, spec: InputSpec, limit: int, prefix: bytes = b"", *,
                     whole: bool = False) -> ParsedBody:
    """Start parsing; returns once the column list is known (headers/schemas read).  ``whole``: the rest of
    the body is small (:data:`SMALL_BODY_BYTES`): read it now and parse it all at once."""
    fmt = canonical_format(spec.format)
    loop = asyncio.get_running_loop()
    if whole:
        try:
            async with asyncio.timeout(spec.receive_timeout_s):
                rest = await _read_pieces(source)
        except TimeoutError:
            raise ReceiveTimeoutError("Timeout exceeded while reading from socket: the body did not arrive "
                                      f"in {spec.receive_timeout_s:g} s (api.receive_timeout_s)") from None
        body = SyncBody(source, loop, limit, [prefix, *rest], receive_timeout_s=spec.receive_timeout_s,
                        max_line_bytes=spec.max_line_bytes, complete=True)
        if body.bytes_read <= INLINE_PARSE_BYTES and fmt in _INLINE_FORMATS:
            try:  # in memory already, a text format: nothing here can block
                items = _drain(_PARSERS[fmt](body, spec))
            except ReplicadError:
                raise
            except Exception as e:
                raise _parse_error(e, body) from e
        else:
            items = await _run(_drain, _PARSERS[fmt](body, spec), body, spec.executor)
        if not items or not isinstance(items[0], list):
            raise AssertionError("a parser must yield its column list first")
        return ParsedBody(items[0], _from_list(items[1:]), body)
    body = SyncBody(source, loop, limit, prefix, receive_timeout_s=spec.receive_timeout_s,
                    max_line_bytes=spec.max_line_bytes)
    gen = _PARSERS[fmt](body, spec)
    first = await _next(gen, body, spec.executor)
    if not isinstance(first, list):
        raise AssertionError("a parser must yield its column list first")
    return ParsedBody(first, _aiter(gen, body, spec.executor), body)


async def _read_pieces(source: BodySource) -> list[bytes]:
    """The rest of ``source`` in the pieces it arrived in: not joined on the loop (a copy of the whole body,
    ~0.7 MB for 10k rows, and the page faults of a fresh buffer: ~0.25 ms); the parser joins what it needs in
    its worker thread."""
    readany = getattr(source, "readany", None)
    if readany is None:
        data = await source.read(-1)
        return [data] if data else []
    pieces: list[bytes] = []
    while piece := await readany():
        pieces.append(piece)
    return pieces


def _drain(gen: Iterator[Any]) -> list[Any]:
    try:
        return list(gen)
    finally:
        gen.close()  # type: ignore[attr-defined]


async def _from_list(batches: list[pa.RecordBatch]) -> AsyncIterator[pa.RecordBatch]:
    for b in batches:
        yield b


async def _next(gen: Iterator[Any], body: SyncBody, executor: Executor | None) -> Any:
    return await _run(next, gen, body, executor, None)


async def _run(fn: Any, gen: Iterator[Any], body: SyncBody, executor: Executor | None, *args: Any) -> Any:
    """``fn(gen, *args)`` in the executor, the parser's errors made ours."""
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, fn, gen, *args)
    except ReplicadError:
        raise
    except Exception as e:
        raise _parse_error(e, body) from e


def _parse_error(e: Exception, body: SyncBody) -> BaseException:
    """What a parser's exception ``e`` becomes: the body's own error (a timeout, a body too large), else a
    BadInputError."""
    if body.error is not None:
        return body.error
    return BadInputError(f"Cannot parse input: {_short(e)}")


async def _aiter(gen: Iterator[Any], body: SyncBody, executor: Executor | None
                 ) -> AsyncIterator[pa.RecordBatch]:
    try:
        while True:
            batch = await _next(gen, body, executor)
            if batch is None:
                return
            yield batch
            del batch  # not held while the next block is parsed
    finally:
        body.error = body.error or ConnectionAbortedError("insert finished")
        body.cancel_read_ahead()
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(executor, gen.close)  # type: ignore[attr-defined]


def _short(e: BaseException) -> str:
    text = str(e).strip().replace("\n", " ")
    return text[:500] + ("…" if len(text) > 500 else "")


# ---- the parsers (generators run in a worker thread) ------------------------------------------------------
# Each yields the column list first, then storage record batches.


def _tsv(body: SyncBody, spec: InputSpec, with_names: bool = False) -> Iterator[Any]:
    if with_names:
        header = body.readline_raw().rstrip(b"\r\n")
        names_in = [tsv_unescape(pa.array([f], pa.binary()))[0].as_py().decode("utf-8", "replace")
                    for f in header.split(b"\t")] if header else []
        names, positions, types = select_columns(spec, names_in)
        fields = names_in
    else:
        names = [n for n, _ in spec.columns]
        types = [t for _, t in spec.columns]
        positions = list(range(len(names)))
        fields = names
    width = len(fields)
    yield names
    conv = Converter(names, types, spec, text="tsv")
    kinds = text_kinds(width, positions, types, spec.tz)
    for block in body.line_blocks(spec.read_block_bytes):
        got = _tsvsplit.split(block, width, width > 1, pa.allocate_buffer, kinds)
        if got is None:  # a line with another number of fields (or an unusual block): pyarrow's reader
            col_names = [f"c{i}" for i in range(width)]
            try:
                table = pa_csv.read_csv(  # its options made only here: most bodies never need them
                    io.BytesIO(block),
                    read_options=pa_csv.ReadOptions(column_names=col_names, use_threads=True),
                    parse_options=pa_csv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                                      ignore_empty_lines=width > 1),
                    convert_options=pa_csv.ConvertOptions(
                        column_types={c: pa.binary() for c in col_names}, null_values=[],
                        strings_can_be_null=False, check_utf8=False))
            except pa.ArrowInvalid as e:
                raise _tsv_shape_error(block, fields, conv.row, e) from None
            yield from conv.feed([table.column(p) for p in positions], escaped=b"\\" in block)
            continue
        parts = [(o, d, None) for o, d, _, _ in got]
        columns, ready = _split_columns(parts, positions, types, kinds, spec.tz)
        yield from conv.feed(columns, escaped=[got[p][2] for p in positions],
                             empty=[got[p][3] for p in positions], ready=ready)
    yield from conv.finish()


def _tsv_split(block: bytes, width: int) -> tuple[list[pa.Array], list[bool], list[bool]] | None:
    """The block's fields as one binary array per position, split in C (:mod:`replicad.native._tsvsplit`:
    pyarrow's CSV reader with the options above gives the same columns), whether each column holds a
    backslash (something to unescape) and whether it has an empty field (a default to fill in); None: the
    C splitter declined."""
    got = _tsvsplit.split(block, width, width > 1, pa.allocate_buffer)
    if got is None:
        return None
    rows = got[0][0].size // 4 - 1
    return ([pa.Array.from_buffers(pa.binary(), rows, [None, o, d]) for o, d, _, _ in got],
            [e for _, _, e, _ in got], [z for _, _, _, z in got])


def _split_columns(parts: Sequence[tuple[Any, Any, Any]], positions: Sequence[int], types: Sequence[DataType],
                   kinds: bytes, tz: str) -> tuple[list[pa.Array], list[bool]]:
    """The columns at ``positions`` of a C splitter's answer, ``(offsets, data, validity)`` per field
    position: a binary array of its texts, or, offsets None, the values of a column it read as its kind
    (``kinds``, text_kinds) made storage Arrow (typed_column); and which columns are the latter."""
    o0, d0, _ = parts[0]
    rows = o0.size // 4 - 1 if o0 is not None else d0.size // _KIND_SIZES[kinds[0]]
    columns, ready = [], []
    for p, dt in zip(positions, types, strict=True):
        o, d, v = parts[p]
        ready.append(o is None)
        columns.append(typed_column(dt, chr(kinds[p]), d, rows, tz) if o is None
                       else pa.Array.from_buffers(pa.binary(), rows, [v, o, d]))
    return columns, ready


#: bytes per value of the splitters' typed kinds (text_kinds)
_KIND_SIZES = {ord(k): n for k, n in (("B", 1), ("b", 1), ("H", 2), ("h", 2), ("I", 4), ("i", 4), ("D", 4),
                                      ("f", 4), ("Q", 8), ("q", 8), ("T", 8), ("t", 8), ("F", 8))}


def _tsv_shape_error(block: bytes, fields: Sequence[str], row0: int, e: Exception) -> BadInputError:
    """The first row of ``block`` without one tab-separated field per name in ``fields``, named by its
    1-based row number (error path only, so a plain scan of the lines is fine)."""
    width, row = len(fields), row0
    for line in block.split(b"\n"):
        line = line.removesuffix(b"\r")
        if not line and width > 1:
            continue  # empty lines are skipped, as pyarrow does
        row += 1
        got = line.count(b"\t") + 1
        if got != width:
            what = (f"column {fields[got]} is missing" if got < width
                    else f"{got - width} more field(s) than the {width} columns")
            return BadInputError(f"Cannot parse input: row {row}: expected {width} tab-separated fields, "
                                 f"got {got}: {what}")
    return BadInputError(f"Cannot parse input: after row {row0}: {_short(e)}")


def _tsv_with_names(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    return _tsv(body, spec, with_names=True)


def _csv(body: SyncBody, spec: InputSpec, with_names: bool = False) -> Iterator[Any]:
    delim = spec.csv_delimiter
    if with_names:
        header = body.readline_raw().decode("utf-8", "replace")
        names_in = next(csv.reader([header], delimiter=delim), []) if header.strip() else []
        names, positions, types = select_columns(spec, [n.strip() for n in names_in])
        width = len(names_in)
    else:
        names = [n for n, _ in spec.columns]
        types = [t for _, t in spec.columns]
        positions = list(range(len(names)))
        width = len(names)
    yield names
    conv = Converter(names, types, spec, text="csv")
    col_names = [f"c{i}" for i in range(width)]
    read_opts = pa_csv.ReadOptions(column_names=col_names, use_threads=False)
    parse_opts = pa_csv.ParseOptions(delimiter=delim, quote_char='"', double_quote=True, escape_char=False,
                                     newlines_in_values=True)
    convert_opts = pa_csv.ConvertOptions(column_types={c: pa.binary() for c in col_names},
                                         null_values=["\\N"], strings_can_be_null=True,
                                         quoted_strings_can_be_null=False, check_utf8=False)

    def general(data: bytes) -> list[pa.Array]:  # pyarrow's reader: the rows, or the error's wording
        try:
            table = pa_csv.read_csv(io.BytesIO(data), read_options=read_opts, parse_options=parse_opts,
                                    convert_options=convert_opts)
        except pa.ArrowInvalid as e:
            raise BadInputError(f"Cannot parse input: after row {conv.row}: {_short(e)}") from None
        return [table.column(p) for p in positions]

    carry = b""  # a row the previous block cut inside a quoted field
    delim_byte = delim.encode()
    kinds = text_kinds(width, positions, types, spec.tz)
    for block in body.line_blocks(spec.read_block_bytes):
        data = carry + block if carry else block
        got = _csvsplit.split(data, width, delim_byte, pa.allocate_buffer, kinds) if len(delim_byte) == 1 \
            else None
        if got is None:
            carry = b""
            yield from conv.feed(general(data))
            continue
        parts, used = got
        carry = data[used:]
        body.check_line(len(carry))
        columns, ready = _split_columns([(o, d, v) for o, d, v, _ in parts], positions, types, kinds, spec.tz)
        yield from conv.feed(columns, empty=[parts[p][3] for p in positions], ready=ready)  # none: no rows
    if carry.strip(b"\r\n"):  # ClickHouse refuses it too (pyarrow took the rest of the body as the value)
        raise BadInputError(f"Cannot parse input: row {conv.row + 1}: a quoted field is not closed before "
                            "the end of the data")
    yield from conv.finish()


def _csv_with_names(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    return _csv(body, spec, with_names=True)


def _json(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    names = [n for n, _ in spec.columns]
    types = [t for _, t in spec.columns]
    yield names
    conv = Converter(names, types, spec, text="json")
    unexpected = "ignore" if spec.skip_unknown_fields else "error"
    # numbers as JSON numbers; then integers as JSON strings, as ClickHouse writes 64-bit integers
    # (output_format_json_quote_64bit_integers, on by default)
    attempts = [pa_json.ParseOptions(explicit_schema=pa.schema([(n, json_kind(t.name, quoted_ints=q))
                                                                for n, t in spec.columns]),
                                     unexpected_field_behavior=unexpected) for q in (False, True)]
    if attempts[0].explicit_schema == attempts[1].explicit_schema:
        del attempts[1]
    # flat objects (no array column) are split in C into value texts, as the row-by-row path gives them
    keys = tuple(n.encode() for n in names) if not any(array_element(t.name) for t in types) else None
    kinds = text_kinds(len(names), range(len(names)), types, spec.tz)
    positions = list(range(len(names)))
    for block in body.line_blocks(spec.read_block_bytes):
        got = _jsonsplit.split(block, keys, spec.skip_unknown_fields, pa.allocate_buffer, kinds) \
            if keys is not None else None
        if got is not None:  # flat objects split in C: texts, and the columns read as their values
            columns, ready = _split_columns(got, positions, types, kinds, spec.tz)
            yield from conv.feed(columns, ready=ready)
            continue
        cols = None
        for i, opts in enumerate(attempts):
            try:
                table = pa_json.read_json(io.BytesIO(block), parse_options=opts)
            except pa.ArrowInvalid:
                continue
            cols = [table.column(n) for n in names]
            if i:  # the next block is most likely written the same way
                attempts.insert(0, attempts.pop(i))
            break
        if cols is None:
            # mixed spellings, raw bytes, unknown fields: the slow path (it names the field and the row)
            cols = _json_slow(block, spec.columns, conv.row, spec.skip_unknown_fields)
        yield from conv.feed(cols)
    yield from conv.finish()


def _json_split(block: bytes, keys: tuple[bytes, ...], skip_unknown: bool) -> list[pa.Array] | None:
    """The block's values as one binary array per key, split in C (:mod:`replicad.native._jsonsplit`);
    None: the C splitter declined (arrays, invalid JSON, unknown keys ...: the general readers decide)."""
    got = _jsonsplit.split(block, keys, skip_unknown, pa.allocate_buffer)
    if got is None:
        return None
    rows = got[0][0].size // 4 - 1
    return [pa.Array.from_buffers(pa.binary(), rows, [v, o, d]) for o, d, v in got]


def _json_slow(block: bytes, columns: Sequence[tuple[str, DataType]], row0: int,
               skip_unknown: bool) -> list[pa.Array]:
    """Fallback for blocks pyarrow refuses (numbers given both as strings and as numbers, raw non-UTF-8
    bytes inside strings as ClickHouse writes them): every value as text bytes."""
    names = [n for n, _ in columns]
    values: dict[str, list[Any]] = {n: [] for n in names}
    known = set(names)
    row = row0
    for line in block.splitlines():
        if not line.strip():
            continue
        row += 1
        try:
            obj = json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError as e:
            raise BadInputError(f"Cannot parse input: row {row}: invalid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise BadInputError(f"Cannot parse input: row {row}: expected a JSON object")
        extra = set(obj) - known
        if extra and not skip_unknown:
            raise BadInputError(f"Unknown field found while parsing JSONEachRow format: {sorted(extra)[0]}"
                                f" (row {row})", code=INCORRECT_DATA)
        for n in names:
            values[n].append(_as_text(obj.get(n)))
    out = []
    for n, t in columns:
        try:
            out.append(pa.array(values[n], text_kind(t.name)))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise BadInputError(f"Cannot parse input: column {n}, rows {row0 + 1}..{row}: JSON values do not "
                                f"fit {t.name}: {_short(e)}") from None
    return out


def _as_text(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape")
    if isinstance(v, bool):
        return b"1" if v else b"0"
    if isinstance(v, list):
        return [_as_text(x) for x in v]
    if isinstance(v, dict):
        return json.dumps(v).encode()
    return (repr(v) if isinstance(v, float) else str(v)).encode()


def _arrow_stream(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    reader = pa_ipc.open_stream(body)
    names, positions, types = select_columns(spec, list(reader.schema.names))
    yield names
    conv = Converter(names, types, spec)
    for batch in reader:
        yield from conv.feed([batch.column(p) for p in positions])
    yield from conv.finish()


def _parquet(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    import pyarrow.parquet as pq  # here: ~9 MiB of RSS (with its filesystems) a daemon may never need

    with spooled(body, spec.spool_dir, ".parquet") as path:
        pf = pq.ParquetFile(path)
        names, _, types = select_columns(spec, list(pf.schema_arrow.names))
        yield names
        conv = Converter(names, types, spec)
        for batch in pf.iter_batches(batch_size=min(spec.block_rows, 65536), columns=names):
            yield from conv.feed([batch.column(i) for i in range(len(names))])
        yield from conv.finish()


def _native(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    from replicad.server.native_format import parse_native  # imports this module

    return parse_native(body, spec)


def _arrow_file(body: SyncBody, spec: InputSpec) -> Iterator[Any]:
    from replicad.server.arrow_file import parse_arrow_file  # imports this module

    return parse_arrow_file(body, spec)


_PARSERS = {
    "TabSeparated": _tsv,
    "TabSeparatedWithNames": _tsv_with_names,
    "CSV": _csv,
    "CSVWithNames": _csv_with_names,
    "JSONEachRow": _json,
    "ArrowStream": _arrow_stream,
    "Parquet": _parquet,
    "Native": _native,
    "Arrow": _arrow_file,
}
