"""The C splitter of CSV blocks (``replicad.native._csvsplit``) against pyarrow's CSV reader with the options
the CSV parser used before it: the same columns (values, NULLs, empties) whenever the C splitter answers; it
answers for the blocks such CSV writers make; a row cut inside a quoted field is left for the next block;
what it declines goes to pyarrow, whose answer stands.  And the CSV parser end to end: blocks cut anywhere."""

from __future__ import annotations

import asyncio
import csv
import io
import random

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.errors import BadInputError
from replicad.native import _csvsplit
from replicad.server.formats import InputSpec, parse_body


def _pyarrow(block: bytes, width: int, delim: str = ",") -> list[list[bytes | None]] | None:
    names = [f"c{i}" for i in range(width)]
    try:
        table = pa_csv.read_csv(
            io.BytesIO(block), read_options=pa_csv.ReadOptions(column_names=names, use_threads=False),
            parse_options=pa_csv.ParseOptions(delimiter=delim, quote_char='"', double_quote=True,
                                              escape_char=False, newlines_in_values=True),
            convert_options=pa_csv.ConvertOptions(column_types={c: pa.binary() for c in names},
                                                  null_values=["\\N"], strings_can_be_null=True,
                                                  quoted_strings_can_be_null=False, check_utf8=False))
    except pa.ArrowInvalid:
        return None
    return [table.column(i).to_pylist() for i in range(width)]


def _split(block: bytes, width: int, delim: bytes = b",") -> tuple[list[list[bytes | None]], int] | None:
    got = _csvsplit.split(block, width, delim, pa.allocate_buffer)
    if got is None:
        return None
    parts, used = got
    rows = parts[0][0].size // 4 - 1
    cols = []
    for o, d, v, has_empty in parts:
        a = pa.Array.from_buffers(pa.binary(), rows, [v, o, d])
        a.validate(full=True)
        values = a.to_pylist()
        assert has_empty == (b"" in values)
        assert bytes(d)[o.to_pybytes()[-4:] and int.from_bytes(o.to_pybytes()[-4:], "little"):] == b"\0" * 16
        cols.append(values)
    return cols, used


# no lone CR: csv.writer does not quote it when the line terminator is "\n"
values = st.one_of(st.just("\\N"), st.text(st.sampled_from('ab,"\n\t \\N;é'), max_size=8))


@settings(max_examples=400, deadline=None)
@given(rows=st.lists(st.lists(values, min_size=3, max_size=3), min_size=1, max_size=12),
       quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]),
       eol=st.sampled_from(["\n", "\r\n"]), delim=st.sampled_from([",", ";", "\t"]))
@example(rows=[["", "\\N", 'a"b']], quoting=csv.QUOTE_MINIMAL, eol="\n", delim=",")
def test_written_csv_matches_pyarrow(rows: list[list[str]], quoting: int, eol: str, delim: str) -> None:
    out = io.StringIO()
    csv.writer(out, quoting=quoting, lineterminator=eol, delimiter=delim).writerows(rows)
    block = out.getvalue().encode()
    got = _split(block, 3, delim.encode())
    expected = _pyarrow(block, 3, delim)
    assert got is not None, block  # what csv writers make is never declined
    assert got == (expected, len(block)), block


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80).map(lambda b: b.replace(b"\0", b"")), st.integers(1, 3))
@example(b'a,"b\nc",d\n', 3)
@example(b'"x""y",\\N,""\r\n1,2,3', 3)
def test_any_block_agrees_with_pyarrow_or_is_declined(block: bytes, width: int) -> None:
    # pyarrow drops a leading UTF-8 byte order mark and refuses a truncated one (b"\xef" alone); the C
    # splitter keeps those bytes as data (found by this test on main too: not a reference to follow)
    assume(not block.startswith(b"\xef"))
    got = _split(block, width)
    if got is None:
        return  # pyarrow decides
    cols, used = got
    if used < len(block):  # the rest is a row cut inside a quoted field
        assert block[used:].lstrip(b"\r\n")[:1] in (b'"', b"") or b'"' in block[used:]
    expected = _pyarrow(block[:used], width) if cols[0] else None
    if cols[0]:
        assert cols == expected, block


@pytest.mark.parametrize("block,width", [
    (b"a,b\n", 3), (b"a,b,c,d\n", 3),           # another number of fields
    (b'a,b"c,d\n', 3),                          # a quote inside an unquoted field
    (b'"a"x,b,c\n', 3),                         # text after a closing quote
    (b"", 3),
])
def test_declines(block: bytes, width: int) -> None:
    assert _split(block, width) is None


def test_a_row_cut_inside_quotes_is_left_for_the_next_block() -> None:
    block = b'1,"x"\n2,"multi\nline'
    cols, used = _split(block, 2) or ([], -1)
    assert cols == [[b"1"], [b"x"]] and block[used:] == b'2,"multi\nline'
    cols, used = _split(b'1,"ab""', 2) or ([], -1)  # a pair of quotes cut by the end
    assert used == 0 and cols == [[], []]


@pytest.mark.parametrize("block_bytes", [7, 16, 64, 1 << 20])
def test_parser_with_blocks_cut_anywhere(block_bytes: int) -> None:
    rnd = random.Random(block_bytes)
    rows = [[str(rnd.randrange(10**6)), rnd.choice(["a", 'q"uote', "multi\nline", "", "x,y", "\\N"])]
            for _ in range(300)]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    cols = [("n", parse_type("UInt32")), ("s", parse_type("Nullable(String)"))]

    async def go() -> dict[str, list[object]]:
        class Body:
            def __init__(self, data: bytes) -> None:
                self.data = data

            async def read(self, n: int = -1) -> bytes:
                out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
                return out

        spec = InputSpec(format="CSV", columns=cols, explicit_columns=False, block_rows=1 << 20, tz="UTC",
                         read_block_bytes=block_bytes)
        parsed = await parse_body(Body(out.getvalue().encode()), spec, 1 << 30)
        batches = [b async for b in parsed.batches]
        return pa.Table.from_batches(batches).to_pydict()

    got = asyncio.run(go())
    assert got["n"] == [int(r[0]) for r in rows]
    assert got["s"] == [None if r[1] == "\\N" else r[1].encode() for r in rows]


def test_unterminated_quote_is_an_error() -> None:
    async def go() -> None:
        class Body:
            data = b'1,"open\n2,x\n'

            async def read(self, n: int = -1) -> bytes:
                out, Body.data = Body.data, b""
                return out

        spec = InputSpec(format="CSV", columns=[("n", parse_type("UInt32")), ("s", parse_type("String"))],
                         explicit_columns=False, block_rows=1 << 20, tz="UTC")
        parsed = await parse_body(Body(), spec, 1 << 30)
        _ = [b async for b in parsed.batches]

    with pytest.raises(BadInputError, match="row 1: a quoted field is not closed"):
        asyncio.run(go())
