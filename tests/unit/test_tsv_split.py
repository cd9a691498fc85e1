"""The C splitter of TabSeparated blocks (``replicad.native._tsvsplit``) against pyarrow's CSV reader with the
options the TSV parser used before it: the same columns whenever the C splitter answers, and it answers for
every block pyarrow reads; blocks with a line of another width are declined (and then refused by pyarrow)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.server.formats import _tsv_split


def _pyarrow(block: bytes, width: int) -> list[list[bytes]] | None:
    names = [f"c{i}" for i in range(width)]
    parse = pa_csv.ParseOptions(delimiter="\t", quote_char=False, escape_char=False,
                                ignore_empty_lines=width > 1)
    convert = pa_csv.ConvertOptions(column_types={c: pa.binary() for c in names}, null_values=[],
                                    strings_can_be_null=False, check_utf8=False)
    try:
        table = pa_csv.read_csv(io.BytesIO(block), read_options=pa_csv.ReadOptions(column_names=names),
                                parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid:
        return None
    return [table.column(i).to_pylist() for i in range(width)]


def _split(block: bytes, width: int) -> list[list[bytes]] | None:
    got = _tsv_split(block, width)
    if got is None:
        return None
    for a, escaped, empty in zip(*got, strict=True):
        a.validate(full=True)
        assert escaped == any(b"\\" in v for v in a.to_pylist())
        assert empty == any(v == b"" for v in a.to_pylist())  # False lets a column skip its defaults
    return [a.to_pylist() for a in got[0]]


_chars = st.sampled_from([b"a", b"\t", b"\n", b"\r", b"\r\n", b"\\", b"\\N", b"[1,'x']", b"\xe9", b" ", b""])
_block = st.lists(_chars, max_size=40).map(b"".join)


@settings(deadline=None, max_examples=600)
@given(_block, st.integers(1, 4))
@example(b"a\tb\r\nc\td\n", 2)
@example(b"a\tb\rc\td\n", 2)
@example(b"a\n\nb\n", 1)
@example(b"a\r\r\nb", 1)
@example(b"\n", 2)
@example(b"a\tb\n\t\n", 2)
@example(b"a\tb\nc\n", 2)
@example(b"a\tb\tc\n", 2)
def test_random_blocks_split_as_pyarrow_reads_them(block: bytes, width: int) -> None:
    want = _pyarrow(block, width)
    got = _split(block, width)
    if got is not None:
        assert got == want
    else:  # declined: pyarrow refuses the block too (or it is empty)
        assert want is None or not block


@settings(deadline=None)
@given(st.lists(st.lists(st.binary(max_size=8).map(lambda b: b.translate(None, b"\t\r\n")), min_size=3,
                         max_size=3), min_size=1, max_size=50), st.sampled_from([b"\n", b"\r\n"]))
def test_rows_of_fields(rows: list[list[bytes]], end: bytes) -> None:
    block = b"".join(b"\t".join(r) + end for r in rows)
    assert _split(block, 3) == [[r[i] for r in rows] for i in range(3)]


def test_large_block() -> None:
    block = b"".join(b"%d\tv%d\t\\N\n" % (i, i % 97) for i in range(200_000))
    got = _tsv_split(block, 3)
    assert got is not None and got[1] == [False, False, True]
    cols = got[0]
    assert [len(c) for c in cols] == [200_000] * 3
    for c in cols:
        c.validate(full=True)
    assert cols[0][199_999].as_py() == b"199999" and cols[1][5].as_py() == b"v5"
    assert cols[2][0].as_py() == b"\\N"


@pytest.mark.parametrize("block", [b"", b"a\tb\tc\n", b"a\n"])
def test_declined(block: bytes) -> None:
    assert _tsv_split(block, 2) is None
