"""SELECT output formats: storage Arrow → ClickHouse's text (or Arrow) output, vectorised.

``TabSeparated`` (default; ``TSV``), ``TabSeparatedWithNames``, ``CSV``, ``CSVWithNames``, ``JSONEachRow``
and ``ArrowStream``.  Rendering follows ClickHouse: TSV escapes ``\\ \\t \\n \\0 \\b \\f \\r '``; CSV quotes
strings, dates and arrays (doubling ``"``); NULL is ``\\N`` in both; JSONEachRow quotes 64-bit integers,
dates and strings, escapes ``/``, and writes NaN/inf as ``null``; arrays are ``['a','b']`` / ``[1,2]`` in
text formats and JSON arrays in JSONEachRow.  Columns are first turned into user Arrow with
``DataType.to_user_arrow`` (Enum names, UUID text, DateTime in the server time zone).
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as pa_ipc

from replicad.datatypes import DataType
from replicad.errors import BadInputError
from replicad.memory import deferred_pending
from replicad.server import native_format
from replicad.service import QueryResult

Style = Literal["tsv", "csv", "json", "quoted"]
OUTPUT_FORMATS: dict[str, str] = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=UTF-8",
    "TSVWithNames": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
    "JSONEachRow": "application/json; charset=UTF-8",
    "ArrowStream": "application/octet-stream",
    "Native": "application/octet-stream",
    "Arrow": "application/octet-stream",
}
RENDER_ROWS = 65536  # rows rendered at a time (keeps 32-bit string offsets safe)
#: a batch this small is rendered on the event loop (tens of µs, less than the trip to a worker thread): a
#: count() or a handful of rows; not while pyarrow.compute is still unloaded, unless it needs no kernel (a few
#: integers, :func:`_few_int_rows`): its import must not stall the loop (replicad.memory)
INLINE_RENDER_ROWS = 16
_TSV_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\0", "\\0"), ("\b", "\\b"), ("\f", "\\f"),
                ("\r", "\\r"), ("'", "\\'"))
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("/", "\\/"), ("\n", "\\n"), ("\t", "\\t"), ("\r", "\\r"),
                 ("\b", "\\b"), ("\f", "\\f"), ("\0", "\\u0000"))
_JSON_CONTROL = r"[\x01-\x07\x0b\x0e-\x1f]"


def content_type(fmt: str) -> str:
    try:
        return OUTPUT_FORMATS[fmt]
    except KeyError:
        raise BadInputError(f"Unknown output format {fmt}", code=73) from None


async def render(result: QueryResult, fmt: str, tz: str = "UTC") -> AsyncIterator[bytes]:
    """The response body, chunk by chunk (rendering runs in a worker thread)."""
    content_type(fmt)
    names = [n for n, _ in result.columns]
    types = [t for _, t in result.columns]
    if fmt in ("ArrowStream", "Arrow"):  # Arrow IPC stream, or file (clickhouse-connect's query_arrow)
        async for chunk in render_arrow(result, names, types, tz, file=fmt == "Arrow"):
            yield chunk
        return
    if fmt == "Native":  # the format clickhouse-connect reads
        async for chunk in native_format.render_native(result):
            yield chunk
        return
    if fmt in ("TabSeparatedWithNames", "TSVWithNames"):
        yield ("\t".join(_tsv_escape_text(n) for n in names) + "\n").encode()
    elif fmt == "CSVWithNames":
        yield (",".join('"' + n.replace('"', '""') + '"' for n in names) + "\n").encode()
    async for batch in result.batches:
        for start in range(0, batch.num_rows, RENDER_ROWS):
            piece = batch.slice(start, RENDER_ROWS)
            inline = piece.num_rows <= INLINE_RENDER_ROWS
            text = render_few_ints(piece, names, types, fmt, tz) if inline else None
            if text is None:
                text = (_kernel_text(piece, names, types, fmt, tz) if inline and not deferred_pending()
                        else await asyncio.to_thread(_kernel_text, piece, names, types, fmt, tz))
            yield text


def render_text(batch: pa.RecordBatch, names: list[str], types: list[DataType], fmt: str, tz: str) -> bytes:
    """Rows of one batch in a text format (every row ends with ``\\n``)."""
    if batch.num_rows == 0:
        return b""
    few = render_few_ints(batch, names, types, fmt, tz)
    return few if few is not None else _kernel_text(batch, names, types, fmt, tz)


def _kernel_text(batch: pa.RecordBatch, names: list[str], types: list[DataType], fmt: str, tz: str) -> bytes:
    """:func:`render_text` of a non-empty batch with Arrow's compute kernels."""
    style = _style(fmt)
    cols = [column_text(dt.to_user_arrow(batch.column(i), tz), style) for i, dt in enumerate(types)]
    if style == "json":
        pieces: list[pa.Array | pa.Scalar] = []
        for i, (name, col) in enumerate(zip(names, cols, strict=True)):
            pieces.append(pa.scalar(("{" if i == 0 else ",") + json.dumps(name) + ":", pa.binary()))
            pieces.append(col)
        pieces.append(pa.scalar("}\n", pa.binary()))
        rows = pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.binary()))
    else:
        sep = pa.scalar(b"\t" if style == "tsv" else b",", pa.binary())
        line = cols[0] if len(cols) == 1 else pc.binary_join_element_wise(*cols, sep)
        rows = pc.binary_join_element_wise(line, pa.scalar(b"\n", pa.binary()), pa.scalar(b"", pa.binary()))
    return concat_binary(rows)


#: a result of at most this many rows of integers (``SELECT count()``, ``SELECT 1``) is written in Python
FEW_ROWS = 16


def _style(fmt: str) -> Style:
    return "json" if fmt == "JSONEachRow" else "csv" if fmt.startswith("CSV") else "tsv"


def render_few_ints(batch: pa.RecordBatch, names: list[str], types: list[DataType], fmt: str,
                    tz: str) -> bytes | None:
    """:func:`render_text` of a batch of at most :data:`FEW_ROWS` rows of integer columns without nulls, else
    None (no compute kernel needed: cheap enough for the event loop)."""
    if not 0 < batch.num_rows <= FEW_ROWS:
        return None
    user = [dt.to_user_arrow(batch.column(i), tz) for i, dt in enumerate(types)]
    if not all(_plain_ints(a) for a in user):
        return None
    return _few_int_rows(user, names, _style(fmt))


def _plain_ints(arr: pa.Array | pa.ChunkedArray) -> bool:
    return bool(pa.types.is_integer(arr.type)) and arr.null_count == 0


def _few_int_rows(cols: list[pa.Array | pa.ChunkedArray], names: list[str], style: Style) -> bytes:
    """:func:`render_text` of a few rows of integer columns without nulls, with the same bytes: ``count()``,
    the query a replicating daemon is asked most, then needs no compute kernel (pyarrow.compute stays
    unloaded, see replicad.memory)."""
    values = [[str(v) for v in c.to_pylist()] for c in cols]
    if style == "json":
        quoted = [c.type.bit_width == 64 for c in cols]
        keys = [("{" if i == 0 else ",") + json.dumps(n) + ":" for i, n in enumerate(names)]
        rows = ["".join(k + (f'"{v}"' if q else v) for k, q, v in zip(keys, quoted, row, strict=True)) + "}\n"
                for row in zip(*values, strict=True)]
    else:
        sep = "\t" if style == "tsv" else ","
        rows = [sep.join(row) + "\n" for row in zip(*values, strict=True)]
    return "".join(rows).encode()


def concat_binary(arr: pa.Array) -> bytes:
    """All values of a null-free binary array, concatenated (straight from its data buffer)."""
    if len(arr) == 0:
        return b""
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    if bufs[2] is None or end == start:
        return b""
    return bytes(bufs[2].slice(start, end - start).to_pybytes())


# ---- one column as text ----------------------------------------------------------------------------------


def column_text(arr: pa.Array | pa.ChunkedArray, style: Style) -> pa.Array:
    """Render every value of ``arr`` (user Arrow) as ClickHouse text in ``style``; no nulls in the result."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    null_text = {"tsv": "\\N", "csv": "\\N", "json": "null", "quoted": "NULL"}[style]
    if pa.types.is_null(t):
        return pa.array([null_text.encode()] * len(arr), pa.binary())
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        out = _list_text(arr, style)
    elif _is_stringish(t):
        out = _string_text(arr.cast(pa.binary()), style)
    elif pa.types.is_floating(t):
        out = _float_text(arr, style)
    elif pa.types.is_integer(t):
        out = arr.cast(pa.string()).cast(pa.binary())
        if style == "json" and t.bit_width == 64:
            out = _wrap(out, '"', '"')
    elif pa.types.is_boolean(t):
        out = pc.if_else(arr, pa.scalar(b"1"), pa.scalar(b"0"))
    elif pa.types.is_decimal(t):
        out = _decimal_text(arr)
    elif pa.types.is_timestamp(t) or pa.types.is_date(t):
        out = _datetime_text(arr)
        out = _string_text(out, style)
    else:
        out = _string_text(arr.cast(pa.string()).cast(pa.binary()), style)
    if arr.null_count:
        out = pc.if_else(arr.is_null(), pa.scalar(null_text.encode(), pa.binary()), out)
    return out


def _decimal_text(arr: pa.Array) -> pa.Array:
    """Decimals with all their scale's digits; Arrow writes small ones (0 at scale 10) as ``0E-10``."""
    text = arr.cast(pa.string())
    sci = pc.fill_null(pc.match_substring(text, "E"), False)
    if pc.any(sci).as_py():
        scale = arr.type.scale
        fixed = pa.array([format(v, f".{scale}f") for v in arr.filter(sci).to_pylist()], pa.string())
        text = pc.replace_with_mask(text, sci, fixed)
    return text.cast(pa.binary())


def _is_stringish(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _wrap(arr: pa.Array, left: str, right: str) -> pa.Array:
    return pc.binary_join_element_wise(pa.scalar(left.encode(), pa.binary()), arr,
                                       pa.scalar(right.encode(), pa.binary()), pa.scalar(b"", pa.binary()))


def _replace_all(arr: pa.Array, pairs: tuple[tuple[str, str], ...]) -> pa.Array:
    for old, new in pairs:
        if pc.any(pc.match_substring(arr, old)).as_py():
            arr = pc.replace_substring(arr, old, new)
    return arr


def _string_text(arr: pa.Array, style: Style) -> pa.Array:
    arr = pc.fill_null(arr, b"") if arr.null_count else arr
    if style == "tsv":
        return _replace_all(arr, _TSV_ESCAPES)
    if style == "quoted":
        return _wrap(_replace_all(arr, _TSV_ESCAPES), "'", "'")
    if style == "csv":
        return _wrap(_replace_all(arr, (('"', '""'),)), '"', '"')
    out = _replace_all(arr, _JSON_ESCAPES)
    if pc.any(pc.match_substring_regex(out, _JSON_CONTROL)).as_py():  # rare control characters
        out = pa.array([_json_control(v) for v in out.to_pylist()], pa.binary())
    return _wrap(out, '"', '"')


def _json_control(v: bytes) -> bytes:
    return b"".join(bytes([b]) if b >= 0x20 else f"\\u{b:04X}".encode() for b in v)


def _float_text(arr: pa.Array, style: Style) -> pa.Array:
    text = arr.cast(pa.string())
    exp = pc.fill_null(pc.match_substring(text, "e"), False)
    if pc.any(exp).as_py():  # rare: re-spell exponent forms the way ClickHouse does
        fixed = pa.array([None if v is None else clickhouse_float(v) for v in text.filter(exp).to_pylist()],
                         pa.string())
        text = pc.replace_with_mask(text, exp, fixed)
    text = text.cast(pa.binary())
    if style == "json":  # ClickHouse writes non-finite floats as null in JSON
        finite = pc.is_finite(arr)
        text = pc.if_else(pc.fill_null(finite, True), text, pa.scalar(b"null", pa.binary()))
    return text


def clickhouse_float(shortest: str) -> str:
    """Re-spell a shortest round-trip float text as ClickHouse does (double-conversion ToShortest with
    decimal notation for decimal exponents in [-6, 21), otherwise ``<digits>e<exp>`` without ``+``)."""
    if "e" not in shortest:
        return shortest
    mantissa, _, exp_text = shortest.partition("e")
    sign = "-" if mantissa.startswith("-") else ""
    mantissa = mantissa.lstrip("-")
    int_part, _, frac = mantissa.partition(".")
    digits = (int_part + frac).lstrip("0").rstrip("0") or "0"
    point = len(int_part) + int(exp_text) - (len(int_part) - len(int_part.lstrip("0")))
    n = len(digits)
    exponent = point - 1
    if -6 <= exponent < 21:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        if point >= n:
            return sign + digits + "0" * (point - n)
        return f"{sign}{digits[:point]}.{digits[point:]}"
    return f"{sign}{digits[0]}{'.' + digits[1:] if n > 1 else ''}e{exponent}"


def _datetime_text(arr: pa.Array) -> pa.Array:
    if pa.types.is_date(arr.type):
        return arr.cast(pa.date32()).cast(pa.string()).cast(pa.binary())
    unit = arr.type.unit
    fmt = "%Y-%m-%d %H:%M:%S" if unit == "s" else "%Y-%m-%d %H:%M:%S.%f"
    return pc.strftime(arr, format=fmt).cast(pa.binary())


def _list_text(arr: pa.Array, style: Style) -> pa.Array:
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    if pa.types.is_large_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    inner_style: Style = "json" if style == "json" else "quoted"
    values = column_text(arr.values, inner_style)
    offsets = arr.offsets
    if arr.null_count:  # arrays are not Nullable in ClickHouse; render a null list as empty
        arr = pc.if_else(arr.is_null(), pa.scalar([], arr.type), arr)
        values = column_text(arr.values, inner_style)
        offsets = arr.offsets
    rebuilt = pa.ListArray.from_arrays(offsets, values)
    out = _wrap(pc.binary_join(rebuilt, pa.scalar(b",", pa.binary())), "[", "]")
    if style == "csv":
        out = _wrap(pc.replace_substring(out, '"', '""'), '"', '"')
    return out


def _tsv_escape_text(s: str) -> str:
    for old, new in _TSV_ESCAPES:
        s = s.replace(old, new)
    return s


# ---- ArrowStream -----------------------------------------------------------------------------------------


async def render_arrow(result: QueryResult, names: list[str], types: list[DataType],
                       tz: str, *, file: bool = False) -> AsyncIterator[bytes]:
    """Rows as Arrow IPC (columns in their user Arrow form): the stream format, or with ``file`` the file
    format (its footer written at the end)."""
    sink = io.BytesIO()
    writer: pa_ipc.RecordBatchStreamWriter | None = None
    new_writer = pa_ipc.new_file if file else pa_ipc.new_stream

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
            writer = new_writer(sink, user.schema)
        writer.write_batch(user)
        yield drain()
    if writer is None:  # no rows: the schema alone
        empty = convert(pa.RecordBatch.from_arrays([pa.array([], dt.arrow_type) for dt in types],
                                                   names=names))
        writer = new_writer(sink, empty.schema)
    writer.close()
    yield drain()

