"""The text splitters' typed columns (``kinds``: (U)IntN, Date and DateTime read as their values while the
block is split, replicad/native/text_numbers.h) against the path they shortcut: the same storage Arrow for
every body, or the same error, whatever the fields hold (boundary and overflowing integers, signs, spaces,
zero and out-of-range dates, NULLs, empty fields, escapes, quotes, invalid UTF-8, huge fields), and a column
comes back typed only when every field is one the reference readers (``_textints``) accept in range."""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replicad.datatypes import DataType, parse_type
from replicad.errors import BadInputError
from replicad.native import _csvsplit, _jsonsplit, _textints, _tsvsplit
from replicad.server import formats
from replicad.server.formats import InputSpec, parse_body

T = parse_type
INT_KINDS = {b"B": (False, 8), b"H": (False, 16), b"I": (False, 32), b"Q": (False, 64),
             b"b": (True, 8), b"h": (True, 16), b"i": (True, 32), b"q": (True, 64)}

_FIELDS = [b"0", b"1", b"-1", b"+1", b" 1", b"1 ", b"007", b"-0", b"", b"\\N", b"NULL", b"1e3", b"1.0",
           b"0x10",
           b"127", b"128", b"-128", b"-129", b"255", b"256", b"32767", b"32768", b"65535", b"65536",
           b"2147483647", b"2147483648", b"-2147483648", b"-2147483649", b"4294967295", b"4294967296",
           b"9223372036854775807", b"9223372036854775808", b"-9223372036854775808", b"-9223372036854775809",
           b"18446744073709551615", b"18446744073709551616", b"99999999999999999999",
           b"123456789012345678901",
           b"1970-01-01", b"1970-01-02", b"1969-12-31", b"2149-06-06", b"2149-06-07", b"2024-02-29",
           b"2023-02-29", b"2024-13-01", b"2024-1-01", b"0000-00-00", b"1900-01-01", b"2299-12-31",
           b"2024-01-27 01:42:10", b"2024-01-27T01:42:10", b"2024-01-27 24:00:00", b"2024-01-27 23:59:60",
           b"1970-01-01 00:00:00", b"1970-01-01 00:00:01", b"1970-01-02 23:59:59", b"2106-02-07 06:28:15",
           b"2106-02-07 06:28:16", b"2106-02-05 06:28:15", b"0000-00-00 00:00:00", b"1969-12-31 23:59:59",
           b"2024-01-27 01:42", b"\xff\xfe", b"1\xe9", b"\xd9\xa1", b"a\\tb", b"\\\\"]
field = st.one_of(st.sampled_from(_FIELDS),
                  st.binary(max_size=12).map(lambda b: b.translate(None, b"\t\r\n")))


def _reference(kind: bytes, fields: Sequence[bytes]) -> list[int] | None:
    """The values of ``fields`` as the reference readers give them, or None when one is not of the kind."""
    arr = pa.array(list(fields), pa.binary())
    _, offsets, data = arr.buffers()
    data = data if data is not None else b""
    if kind in INT_KINDS:
        signed, bits = INT_KINDS[kind]
        got = _textints.parse(offsets, data, None, 0, len(fields), signed, bits)
        if isinstance(got, int):
            return None
        return pa.Array.from_buffers(pa.from_numpy_dtype(f"{'i' if signed else 'u'}{bits // 8}"), len(fields),
                                     [None, pa.py_buffer(got)]).to_pylist()
    days = _textints.dates(offsets, data, 0, len(fields), kind != b"D")
    if days is None:
        return None
    values = pa.Array.from_buffers(pa.int64(), len(fields), [None, pa.py_buffer(days)]).to_pylist()
    lo, hi = {b"D": (0, 0xFFFF), b"T": (0, 0xFFFFFFFF), b"t": (2 * 86400, 0xFFFFFFFF - 2 * 86400)}[kind]
    return values if all(lo <= v <= hi for v in values) else None


def _values(kind: bytes, buf: pa.Buffer, n: int) -> list[int]:
    if kind in INT_KINDS:
        signed, bits = INT_KINDS[kind]
        t = pa.from_numpy_dtype(f"{'i' if signed else 'u'}{bits // 8}")
    else:
        t = pa.int32() if kind == b"D" else pa.int64()
    return pa.Array.from_buffers(t, n, [None, buf]).to_pylist()


@settings(deadline=None, max_examples=500)
@given(st.sampled_from([*INT_KINDS, b"D", b"T", b"t"]), st.lists(field, min_size=1, max_size=12))
@example(b"Q", [b"18446744073709551615", b"18446744073709551616"])
@example(b"b", [b"-128", b"127"])
@example(b"T", [b"2106-02-07 06:28:15"])
@example(b"D", [b"2149-06-06", b"0000-00-00"])
@example(b"D", [b"2149-06-07"])
@example(b"D", [b"1969-12-31"])
@example(b"T", [b"2106-02-07 06:28:16"])
@example(b"T", [b"1969-12-31 23:59:59"])
@example(b"t", [b"1970-01-02 23:59:59"])
@example(b"t", [b"1970-01-03 00:00:00", b"2106-02-05 06:28:15"])
@example(b"t", [b"2106-02-05 06:28:16"])
@example(b"H", [b"65536"])
@example(b"h", [b"-32769"])
@example(b"i", [b"2147483648"])
@example(b"I", [b"4294967296"])
@example(b"q", [b"-9223372036854775809"])
@example(b"B", [b"1" * 1000])
def test_tsv_typed_column_is_the_reference_reading(kind: bytes, fields: list[bytes]) -> None:
    """Field 1 of a 3-field TSV block read as ``kind``: typed exactly when the reference reads every field
    (in range), with its values; else the texts, unchanged; the other columns are texts either way."""
    block = b"".join(b"x\t" + f + b"\ty%d\n" % i for i, f in enumerate(fields))
    got = _tsvsplit.split(block, 3, True, pa.allocate_buffer, b"s" + kind + b"s")
    assert got is not None
    want = _reference(kind, fields)
    offsets, data, backslash, empty = got[1]
    if want is None:
        assert offsets is not None
        texts = pa.Array.from_buffers(pa.binary(), len(fields), [None, offsets, data])
        texts.validate(full=True)
        assert texts.to_pylist() == fields
        assert backslash == any(b"\\" in f for f in fields) and empty == (b"" in fields)
    else:
        assert offsets is None and not backslash and not empty
        assert _values(kind, data, len(fields)) == want
    for c, expected in ((0, [b"x"] * len(fields)), (2, [b"y%d" % i for i in range(len(fields))])):
        o, d, _, _ = got[c]
        assert pa.Array.from_buffers(pa.binary(), len(fields), [None, o, d]).to_pylist() == expected


@settings(deadline=None, max_examples=500)
@given(st.sampled_from([*INT_KINDS, b"D", b"T"]), st.lists(st.tuples(field, st.sampled_from(["", '"'])),
                                                          min_size=1, max_size=12))
@example(b"I", [(b'4"2', '"')])
@example(b"D", [(b"\\N", ""), (b"1970-01-01", '"')])
def test_csv_typed_column_is_the_reference_reading(kind: bytes, fields: list[tuple[bytes, str]]) -> None:
    """The same for CSV, fields quoted or not: a quoted field with a "" pair or an unquoted \\N (NULL) is
    never read as a value."""
    out = io.StringIO()
    for text, (_, quote) in zip((f.decode("latin-1") for f, _ in fields), fields, strict=True):
        needs_quotes = quote or any(ch in text for ch in ',"\n\r')
        cell = '"' + text.replace('"', '""') + '"' if needs_quotes else text
        out.write(f"a,{cell},b\n")
    block = out.getvalue().encode("latin-1")
    got = _csvsplit.split(block, 3, b",", pa.allocate_buffer, b"s" + kind + b"s")
    plain = _csvsplit.split(block, 3, b",", pa.allocate_buffer)
    assert got is not None and plain is not None and got[1] == plain[1] == len(block)
    (o, d, v, _), (po, pd, pv, _) = got[0][1], plain[0][1]
    n = len(fields)
    texts = pa.Array.from_buffers(pa.binary(), n, [pv, po, pd]).to_pylist()
    doubled = any(q and b'"' in f for f, q in fields)
    want = None if None in texts or doubled else _reference(kind, texts)  # type: ignore[arg-type]
    if want is None:
        assert o is not None and pa.Array.from_buffers(pa.binary(), n, [v, o, d]).to_pylist() == texts
    else:
        assert o is None and v is None and _values(kind, d, n) == want


_PLAIN_FLOAT = re.compile(rb"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_FLOAT_FIELDS = [b"0", b"-0", b"1.5", b"-2.25", b"1e3", b"1E-3", b"1e+3", b"1.", b".5", b"+1", b" 1", b"1 ",
                 b"inf", b"-inf", b"nan", b"NaN", b"1e308", b"1.8e308", b"1e-320", b"4.9e-324", b"2e-308",
                 b"3.4028235e38", b"3.5e38", b"0.1", b"0.30000000000000004",
                 b"123456789012345678901234567890", b"9007199254740993", b"1" * 70, b"1.0e", b"e5", b"--1",
                 b"0x10", b"1,5", b"", b"\\N", b"1e",
                 # Clinger's fast path and its edges (significand 2^53, exponent 22) against strtod's
                 b"9007199254740992", b"9007199254740992e-22", b"1e22", b"1e23", b"1e-22", b"1e-23",
                 b"123456789012345678e-3", b"0.000", b"-0e5", b"0e999999999999", b"00001.50000",
                 b"4503599627370497.5", b"1.7976931348623157e308", b"2.2250738585072014e-308"]
float_field = st.one_of(st.sampled_from(_FLOAT_FIELDS),
                        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()),
                        st.from_regex(_PLAIN_FLOAT, fullmatch=True).filter(lambda b: len(b) <= 64))


def _fast_path(field: bytes) -> bool:
    """Whether the splitter reads a plain float text (text_numbers.h): a significand of at most 19 digits
    after its leading zeros and at most 2^53, and a decimal exponent within -22..22, or a zero."""
    mantissa, _, exp = field.lstrip(b"-").lower().partition(b"e")
    whole, _, frac = mantissa.partition(b".")
    digits = (whole + frac).lstrip(b"0")
    if not digits:
        return True
    q = (int(exp) if exp else 0) - len(frac)
    return len(digits) <= 19 and int(digits) <= 2**53 and -22 <= q <= 22


@settings(deadline=None, max_examples=400)
@given(st.sampled_from([b"F", b"f"]), st.lists(float_field, min_size=1, max_size=12))
@example(b"f", [b"3.5e38"])
@example(b"F", [b"1e-320"])
@example(b"f", [b"1.0000000596046448"])  # a double rounding case: the nearest double, then float
@example(b"F", [b"9007199254740992", b"1e22", b"1e-22", b"0e999999999999"])  # the fast path's edges
def test_tsv_float_column_is_the_nearest_value(kind: bytes, fields: list[bytes]) -> None:
    """Float64/Float32 fields read as values exactly when every one is a plain decimal text of at most 64
    bytes (sign, digits, fraction, exponent) within the fast path, and then each is Python's (correctly
    rounded) float of it, rounded to float32 for Float32 as the general path does; else the texts."""
    block = b"".join(b"x\t" + f + b"\ty\n" for f in fields)
    got = _tsvsplit.split(block, 3, True, pa.allocate_buffer, b"s" + kind + b"s")
    assert got is not None
    offsets, data, _, _ = got[1]
    typed = all(_PLAIN_FLOAT.fullmatch(f) and len(f) <= 64 and _fast_path(f) for f in fields)
    if not typed:
        assert offsets is not None
        assert pa.Array.from_buffers(pa.binary(), len(fields), [None, offsets, data]).to_pylist() == fields
        return
    assert offsets is None
    want = np.array([float(f) for f in fields], np.float64)
    if kind == b"f":
        want = want.astype(np.float32)
    got_values = np.frombuffer(data, want.dtype, count=len(fields))
    assert got_values.tobytes() == want.tobytes()  # bit for bit: -0.0 too


# ---- end to end: the typed path against the general one ------------------------------------------------

COLUMNS = [("u8", T("UInt8")), ("i16", T("Int16")), ("u64", T("UInt64")), ("i64", T("Int64")),
           ("d", T("Date")), ("ts", T("DateTime")), ("tk", T("DateTime('Asia/Kolkata')")),
           ("f64", T("Float64")), ("f32", T("Float32")), ("s", T("String"))]


class _Body:
    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.pos, self.chunk = data, 0, chunk

    async def read(self, n: int = -1) -> bytes:
        size = self.chunk if n < 0 else min(n, self.chunk)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out


async def _parse(fmt: str, data: bytes, columns: Sequence[tuple[str, DataType]], tz: str,
                 read_block_bytes: int) -> pa.Table | str:
    spec = InputSpec(format=fmt, columns=columns, explicit_columns=False, tz=tz,
                     read_block_bytes=read_block_bytes)
    try:
        parsed = await parse_body(_Body(data, 1 << 12), spec, 1 << 30)
        batches = [b async for b in parsed.batches]
    except BadInputError as e:
        return f"{e.code}: {e}"
    return pa.Table.from_batches(batches) if batches else "no rows"


def _both(fmt: str, data: bytes, columns: Sequence[tuple[str, DataType]] = COLUMNS, tz: str = "UTC",
          read_block_bytes: int = 4 << 20) -> tuple[pa.Table | str, pa.Table | str]:
    typed = asyncio.run(_parse(fmt, data, columns, tz, read_block_bytes))
    with pytest.MonkeyPatch.context() as mp:  # the general path: every column as texts
        mp.setattr(formats, "text_kinds", lambda width, *_: b"s" * width)
        general = asyncio.run(_parse(fmt, data, columns, tz, read_block_bytes))
    return typed, general


def _same(typed: pa.Table | str, general: pa.Table | str) -> None:
    if isinstance(general, str) or isinstance(typed, str):
        assert typed == general
    else:
        assert typed.schema == general.schema
        for name in typed.column_names:  # floats by their bits: NaN equals NaN only that way
            a, b = typed.column(name).combine_chunks(), general.column(name).combine_chunks()
            if pa.types.is_floating(a.type):
                assert a.is_null().equals(b.is_null()), name
                bits = f"u{a.type.byte_width}"
                a_bits, b_bits = (np.asarray(c.fill_null(0)).view(bits) for c in (a, b))
                assert np.array_equal(a_bits, b_bits), name
            else:
                assert a.equals(b), name


_CELLS = {
    "u8": [b"0", b"255", b"256", b"-1", b"+5", b"", b"\\N", b" 7"],
    "i16": [b"-32768", b"32767", b"32768", b"-0", b"12"],
    "u64": [b"18446744073709551615", b"18446744073709551616", b"9" * 25, b"1", b"1\xe9"],
    "i64": [b"-9223372036854775808", b"9223372036854775807", b"-9223372036854775809", b"-1"],
    "d": [b"2024-01-27", b"0000-00-00", b"1970-01-01", b"2149-06-06", b"2149-06-07", b"1969-12-31", b"",
          b"2024-02-30", b"17000"],
    "ts": [b"2024-01-27 01:42:10", b"0000-00-00 00:00:00", b"1970-01-01 00:00:00", b"2106-02-07 06:28:15",
           b"2106-02-07 06:28:16", b"2024-01-27T01:42:10", b"2024-01-27", b"1706319730", b""],
    "tk": [b"2024-01-27 01:42:10", b"1970-01-01 05:30:00", b"1970-01-01 05:29:59", b"1970-01-03 00:00:00",
           b"2106-02-07 11:58:15", b"2106-02-04 00:00:00"],
    "f64": [b"1.5", b"-0", b"1e3", b"inf", b"nan", b"1e400", b" 2", b"", b"0.1", b"1e-320", b"x"],
    "f32": [b"1.5", b"3.5e38", b"-3.4028235e38", b"1.0000000596046448", b"1e-50", b"-inf", b""],
    "s": [b"plain", b"tab\\there", b"", b"\xff\xfe", b'q"uote'],
}


def _row(draw: st.DrawFn) -> list[bytes]:
    return [draw(st.sampled_from(_CELLS[n])) for n, _ in COLUMNS]


rows_strategy = st.lists(st.composite(lambda draw: _row(draw))(), min_size=1, max_size=30)


def _tsv_body(rows: list[list[bytes]], names: bool) -> bytes:
    head = ("\t".join(n for n, _ in COLUMNS) + "\n").encode() if names else b""
    return head + b"".join(b"\t".join(r) + b"\n" for r in rows)


def _csv_body(rows: list[list[bytes]], names: bool) -> bytes:
    def cell(b: bytes) -> bytes:
        if b == b"\\N":
            return b
        return b'"' + b.replace(b'"', b'""') + b'"' if (b"," in b or b'"' in b or not b.isdigit()) else b
    head = (",".join(f'"{n}"' for n, _ in COLUMNS) + "\n").encode() if names else b""
    return head + b"".join(b",".join(cell(c) for c in r) + b"\n" for r in rows)


def _json_body(rows: list[list[bytes]], names: bool) -> bytes:
    """One object a row: digits as JSON numbers, \\N as null, the rest as strings (non-ASCII escaped)."""
    del names
    lines = []
    for r in rows:
        fields = []
        for (n, _), cell in zip(COLUMNS, r, strict=True):
            text = cell.decode("latin-1")
            digits = _PLAIN_FLOAT.fullmatch(cell) is not None
            value = "null" if cell == b"\\N" else text if digits else json.dumps(text)
            fields.append(f'"{n}":{value}')
        lines.append("{" + ",".join(fields) + "}\n")
    return "".join(lines).encode()


def _render(fmt: str, rows: list[list[bytes]]) -> bytes:
    render = _json_body if fmt == "JSONEachRow" else _tsv_body if fmt.startswith("TSV") else _csv_body
    return render(rows, fmt.endswith("WithNames"))


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(rows_strategy, st.sampled_from(["TSV", "TSVWithNames", "CSV", "CSVWithNames", "JSONEachRow"]),
       st.sampled_from(["UTC", "Europe/Moscow"]), st.sampled_from([64, 4 << 20]))
@example([[b"0", b"-32768", b"1", b"-1", b"2024-01-27", b"2024-01-27 01:42:10", b"2024-01-27 01:42:10",
           b"nan", b"1.5", b"plain"]], "TSV", "UTC", 64)  # NaN: equal by its bits
def test_typed_path_gives_the_general_paths_rows_or_error(rows: list[list[bytes]], fmt: str, tz: str,
                                                          block_bytes: int) -> None:
    body = _render(fmt, rows)
    typed, general = _both(fmt, body, tz=tz, read_block_bytes=block_bytes)
    _same(typed, general)


def test_clean_rows_take_the_typed_path_and_match() -> None:
    """A body of well-formed rows (as ClickHouse renders them): every typed column read as values (the
    general path is not called for them) and the rows equal the general path's."""
    rows = [[b"%d" % (i % 256), b"%d" % (i - 500), b"%d" % (i * 7919), b"-%d" % i,
             b"2024-01-%02d" % (i % 28 + 1), b"2024-01-27 01:%02d:%02d" % (i % 60, i % 59),
             b"2024-03-31 02:%02d:00" % (i % 60), b"%d.%03d" % (i - 1500, i % 1000), b"%de-3" % i, b"s%d" % i]
            for i in range(3000)]
    for fmt in ("TSV", "CSV", "JSONEachRow"):
        body = _render(fmt, rows)
        typed, general = _both(fmt, body, tz="Europe/Berlin", read_block_bytes=8192)
        assert not isinstance(typed, str)
        _same(typed, general)
    kinds = formats.text_kinds(len(COLUMNS), range(len(COLUMNS)), [t for _, t in COLUMNS], "UTC")
    assert kinds == b"BhQqDTtFfs"
    got = _tsvsplit.split(_tsv_body(rows, False), len(COLUMNS), True, pa.allocate_buffer, kinds)
    assert got is not None and [o is None for o, _, _, _ in got] == [True] * 9 + [False]
    names = tuple(n.encode() for n, _ in COLUMNS)
    split = _jsonsplit.split(_json_body(rows, False), names, False, pa.allocate_buffer, kinds)
    assert split is not None and [o is None for o, _, _ in split] == [True] * 9 + [False]


@pytest.mark.parametrize(("cells", "message"), [
    ({"u8": b"256"}, "column u8, row 2"),
    ({"u64": b"18446744073709551616"}, "column u64, row 2"),
    ({"u64": b"9" * 1_000_000}, "column u64, row 2"),  # a huge field
    ({"d": b"2149-06-07"}, "column d, row 2"),
    ({"ts": b"2106-02-07 06:28:16"}, "column ts, row 2"),
    ({"tk": b"1970-01-01 05:29:59"}, "column tk, row 2"),  # before 1970 in UTC
    ({"tk": b"2106-02-07 11:58:16"}, "column tk, row 2"),  # after 2106-02-07 06:28:15 UTC
    ({"u8": b"\\N"}, "column u8, row 2: NULL is not allowed"),
    ({"i16": b"1\xe9"}, "column i16, row 2"),
    ({"f64": b"1.5x"}, "column f64, row 2"),
    ({"f32": b"1e"}, "column f32, row 2"),
])
def test_bad_values_keep_their_errors(cells: dict[str, bytes], message: str) -> None:
    good = [b"1", b"2", b"3", b"4", b"2024-01-27", b"2024-01-27 01:42:10", b"2024-01-27 01:42:10", b"1.5",
            b"2.5", b"x"]
    bad = [cells.get(n, g) for (n, _), g in zip(COLUMNS, good, strict=True)]
    for fmt, render in (("TSV", _tsv_body), ("CSV", _csv_body), ("JSONEachRow", _json_body)):
        if fmt == "JSONEachRow" and b"\\N" in bad:
            continue  # a JSON null is the column's default (input_format_null_as_default)
        typed, general = _both(fmt, render([good, bad, good], False))
        assert isinstance(typed, str) and message in typed, typed
        assert typed == general


def test_hostile_blocks() -> None:
    """Truncated quotes, embedded tabs and line ends, a field of another width: declined or refused as the
    general path does, never a typed column from a misread field."""
    good = b"1\t2\t3\t4\t2024-01-27\t2024-01-27 01:42:10\t2024-01-27 01:42:10\tx\n"
    for body in (good + b"1\t2\t3\n", good + b"1\t2\t3\t4\t2024-01-27\t2024-01-27 01:42:10\t\t\tx\n",
                 good + b"1\t2\t3\t4\t2024-01-\n27\t2024-01-27 01:42:10\t2024-01-27 01:42:10\tx\n",
                 good * 3 + good[:-20]):
        typed, general = _both("TSV", body)
        _same(typed, general)
    cgood = b'1,2,3,4,"2024-01-27","2024-01-27 01:42:10","2024-01-27 01:42:10","x"\n'
    for body in (cgood + b'1,2,3,4,"2024-01-27,"2024-01-27 01:42:10","2024-01-27 01:42:10","x"\n',
                 cgood + b'1,2,3,4,"2024-01-27"x,"2024-01-27 01:42:10","2024-01-27 01:42:10","x"\n',
                 cgood + b'1,2,3,4,"2024-01-27\n","2024-01-27 01:42:10","2024-01-27 01:42:10","x"\n',
                 cgood + b'"1""",2,3,4,"2024-01-27","2024-01-27 01:42:10","2024-01-27 01:42:10","x"\n'):
        typed, general = _both("CSV", body)
        _same(typed, general)
