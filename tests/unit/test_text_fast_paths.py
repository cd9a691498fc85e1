"""Insert text fast paths give what the general paths give: plain-digit integers, plain ASCII floats, TSV
blocks without any backslash (no unescaping), the zero-date prefix test."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.datatypes import numeric as types_numeric
from replicad.datatypes import parse_type
from replicad.datatypes.base import BadValue
from replicad.errors import BadInputError
from replicad.server.formats import InputSpec, parse_body
from replicad.server.text_values import zero_dates


def outcome(type_name: str, arr: pa.Array) -> Any:
    try:
        return parse_type(type_name).convert(arr, "UTC").to_pylist()
    except BadValue as e:
        return ("error", e.row, e.value, e.reason)


int_text = st.one_of(
    st.integers(-(2**65), 2**65).map(str),
    st.sampled_from(["", " 1", "+7", "-0", "1 ", "0x10", "٣", "007", "18446744073709551615",
                     "18446744073709551616", "255", "256", "-1", "1e3", "1.0"]),
)


@given(st.lists(int_text | st.none(), max_size=20), st.sampled_from(["UInt8", "Int8", "UInt64", "Int64",
                                                                    "Nullable(UInt32)", "DateTime"]))
@settings(max_examples=300, deadline=None)
def test_integers_match_general_path(values: list[str | None], type_name: str) -> None:
    arr = pa.array([None if v is None else v.encode() for v in values], pa.binary())
    fast = outcome(type_name, arr)
    with patch.object(types_numeric, "_plain_digits", lambda a: None):  # the general path only
        slow = outcome(type_name, arr)
    assert fast == slow


float_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(width=32).map(lambda f: f"{f:.6g}"),
    st.sampled_from(["inf", "-Inf", "+INF", "nan", "NaN", " 1.5", "1.5 ", "", "1e400", "-0", "0x1p3", "1,5",
                     "١", "1_0", ".5", "5.", "+.5e-3"]),
)


@given(st.lists(float_text | st.none(), max_size=20), st.sampled_from(["Float32", "Float64",
                                                                      "Nullable(Float64)"]))
@settings(max_examples=200, deadline=None)
def test_floats_match_general_path(values: list[str | None], type_name: str) -> None:
    arr = pa.array([None if v is None else v.encode() for v in values], pa.binary())
    fast = outcome(type_name, arr)
    with patch.object(types_numeric, "_plain_ascii", lambda a, forbidden: None):
        slow = outcome(type_name, arr)
    assert repr(fast) == repr(slow)  # repr: NaN == NaN


def test_invalid_utf8_integer_is_rejected() -> None:
    expected = ("error", 1, "0xff", "is not valid UTF-8 text for UInt8")
    assert outcome("UInt8", pa.array([b"1", b"\xff"])) == expected


class Body:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    async def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + (n if n > 0 else 1 << 20)]
        self.pos += len(out)
        return out


async def parse_tsv(data: bytes, columns: list[tuple[str, Any]], block_bytes: int) -> list[pa.RecordBatch]:
    spec = InputSpec(format="TSV", columns=columns, explicit_columns=False, read_block_bytes=block_bytes)
    parsed = await parse_body(Body(data), spec, 1 << 30)
    return [b async for b in parsed.batches]


def test_tsv_blocks_with_and_without_escapes() -> None:
    cols = [("s", parse_type("String")), ("n", parse_type("Nullable(String)")),
            ("a", parse_type("Array(String)")), ("d", parse_type("DateTime"))]
    plain = b"".join(b"plain%d\tx\t['a']\t2024-01-01 00:00:00\n" % i for i in range(200))
    escaped = b"tab\\there\t\\N\t['b\\'c']\t0000-00-00 00:00:00\n"
    data = plain + escaped + plain
    for block_bytes in (64, 1 << 20):  # many blocks (most without a backslash) / one block
        batches = asyncio.run(parse_tsv(data, cols, block_bytes))
        table = pa.Table.from_batches(batches)
        assert table.num_rows == 401
        row = {c: table.column(c)[200].as_py() for c in table.column_names}
        assert row == {"s": b"tab\there", "n": None, "a": [b"b'c"], "d": row["d"]}
        assert table.column("d").cast(pa.int64())[200].as_py() == 0
        assert table.column("s")[0].as_py() == b"plain0" and table.column("n")[0].as_py() == b"x"


def test_tsv_null_in_plain_column_still_refused() -> None:
    cols = [("s", parse_type("String")), ("u", parse_type("UInt8"))]
    with pytest.raises(BadInputError, match="row 2"):
        asyncio.run(parse_tsv(b"a\t1\n\\N\t2\n", cols, 1 << 20))


@pytest.mark.parametrize("value,expected", [
    (b"0000-00-00", b"E"), (b"0000-00-00 00:00:00", b"E"), (b"0000-00-00 00:00:01", b"0000-00-00 00:00:01"),
    (b"0000-00-001", b"0000-00-001"), (b"2024-01-01", b"2024-01-01"),
])
def test_zero_dates(value: bytes, expected: bytes) -> None:
    out = zero_dates(pa.array([value, b"2024-01-01", None]), "E")
    assert out.to_pylist() == [expected, b"2024-01-01", None]


@pytest.mark.parametrize("scan_bytes", [0, 1 << 16])
def test_zero_dates_searched_or_tested_alike(scan_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The small-buffer search and the compute prefix test agree, on slices too (a zero date outside the
    slice is still in the buffer searched)."""
    from replicad.server import text_values

    monkeypatch.setattr(text_values, "ZERO_DATE_SCAN_BYTES", scan_bytes)
    arr = pa.array([b"0000-00-00", b"2024-01-01", None, b"2024-01-02", b"0000-00-00 00:00:00", b""])
    assert zero_dates(arr, "E").to_pylist() == [b"E", b"2024-01-01", None, b"2024-01-02", b"E", b""]
    assert zero_dates(arr.slice(1, 3), "E").to_pylist() == [b"2024-01-01", None, b"2024-01-02"]
    assert zero_dates(arr.slice(3, 2), "E").to_pylist() == [b"2024-01-02", b"E"]
    assert zero_dates(pa.array(["0000-00-00", "2024-01-01"]), "E").to_pylist() == ["E", "2024-01-01"]
    empty = pa.array([b"", b""])
    assert zero_dates(empty, "E").to_pylist() == [b"", b""]


#: the bytes at the edges of printable ASCII and the forbidden ones, in short texts
_EDGE_TEXT = st.lists(st.sampled_from([b" ", b"!", b"~", b"\x7f", b"\x80", b"\xff", b"\t", b"\0", b"n", b"N",
                                       b"-", b"]", b"^", b"\\", b"5"]), max_size=4).map(b"".join)


@given(st.lists(st.binary(max_size=6) | _EDGE_TEXT | st.none(), max_size=12),
       st.sampled_from([b"", b"nN", b"-]\\^"]), st.integers(0, 3))
@settings(max_examples=300, deadline=None)
def test_plain_ascii_scanned_or_tested_alike(values: list[bytes | None], forbidden: bytes,
                                             start: int) -> None:
    """A small text column is checked by one bytes.translate, a big one with numpy: the same answer
    for every byte (space, controls, DEL, bytes >= 0x80, the forbidden ones), slices and NULLs included."""
    arr = pa.array([b"xx", b"y", b"z", *values], pa.binary()).slice(start)
    small = types_numeric._plain_ascii(arr, forbidden)
    with patch.object(types_numeric, "_SMALL_TEXT", -1):  # the numpy path only
        big = types_numeric._plain_ascii(arr, forbidden)
    assert (small is None) == (big is None)
    if small is not None and big is not None:
        assert small.equals(big)
