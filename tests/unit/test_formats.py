"""Input formats (streamed, re-cut into insert blocks) and output formats, incl. property round trips."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicad.datatypes import DataType, parse_type
from replicad.errors import BadInputError, BodyTooLargeError, ReplicadError
from replicad.server.formats import InputSpec, parse_body
from replicad.server.output_formats import column_text, render
from replicad.server.text_values import parse_array_text, tsv_unescape
from replicad.service import QueryResult

T = parse_type
EVENTS = [("d", T("Date")), ("ts", T("DateTime")), ("user_id", T("UInt64")), ("kind", T("String"))]


def maybe_type(text: str) -> DataType:
    try:
        return parse_type(text)
    except ReplicadError:
        pytest.skip(f"type {text} is not implemented yet")


class Body:
    """An async body that hands out ``chunk`` bytes at a time (like a network stream)."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        self.data, self.pos, self.chunk = data, 0, chunk
        self.reads = 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        size = self.chunk if n < 0 else min(n, self.chunk)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out


async def parse(fmt: str, data: bytes, columns: Sequence[tuple[str, DataType]] = EVENTS, *,
                explicit: bool = False, block_rows: int = 1 << 20, chunk: int = 7, limit: int = 1 << 30,
                read_block_bytes: int = 4 << 20, tz: str = "UTC", skip_unknown: bool = False
                ) -> tuple[list[str], list[pa.RecordBatch]]:
    spec = InputSpec(format=fmt, columns=columns, explicit_columns=explicit, block_rows=block_rows, tz=tz,
                     read_block_bytes=read_block_bytes, skip_unknown_fields=skip_unknown)
    parsed = await parse_body(Body(data, chunk), spec, limit)
    return parsed.columns, [b async for b in parsed.batches]


def rows(batches: list[pa.RecordBatch]) -> dict[str, list[object]]:
    return pa.Table.from_batches(batches).to_pydict() if batches else {}


EXPECTED = {
    "d": [dt.date(2020, 1, 2), dt.date(2020, 1, 3)],
    "ts": [dt.datetime(2020, 1, 2, 3, 4, 5), dt.datetime(2020, 1, 3, 0, 0, 0)],
    "user_id": [5, 18446744073709551615],
    "kind": [b"a\tb\\", b'x"y\nz'],
}


@pytest.mark.parametrize("fmt,data", [
    ("TabSeparated", b"2020-01-02\t2020-01-02 03:04:05\t5\ta\\tb\\\\\n"
                     b"2020-01-03\t2020-01-03 00:00:00\t18446744073709551615\tx\"y\\nz\n"),
    ("TSV", b"2020-01-02\t2020-01-02 03:04:05\t5\ta\\tb\\\\\n"
            b"2020-01-03\t2020-01-03 00:00:00\t18446744073709551615\tx\"y\\nz"),  # no final newline
    ("CSV", b'2020-01-02,"2020-01-02 03:04:05",5,"a\tb\\"\n'
            b'"2020-01-03",2020-01-03 00:00:00,18446744073709551615,"x""y\nz"\n'),
    ("JSONEachRow", b'{"d":"2020-01-02","ts":"2020-01-02 03:04:05","user_id":5,"kind":"a\\tb\\\\"}\n'
                    b'{"kind":"x\\"y\\nz","user_id":"18446744073709551615","d":"2020-01-03",'
                    b'"ts":"2020-01-03 00:00:00"}\n'),
])
async def test_text_formats(fmt: str, data: bytes) -> None:
    names, batches = await parse(fmt, data)
    assert names == ["d", "ts", "user_id", "kind"]
    assert rows(batches) == EXPECTED
    assert batches[0].schema.types == [pa.date32(), pa.timestamp("s"), pa.uint64(), pa.binary()]


async def test_with_names_formats_map_columns_by_header() -> None:
    names, batches = await parse("CSVWithNames", b'kind,user_id\n"a",1\nb,2\n')
    assert names == ["kind", "user_id"] and rows(batches) == {"kind": [b"a", b"b"], "user_id": [1, 2]}
    names, batches = await parse("TSVWithNames", b"user_id\tkind\n3\tc\n")
    assert names == ["user_id", "kind"] and rows(batches) == {"user_id": [3], "kind": [b"c"]}
    with pytest.raises(BadInputError, match="Unknown column nope"):
        await parse("CSVWithNames", b"nope\n1\n")
    names, _ = await parse("CSVWithNames", b"nope,kind\n1,x\n", skip_unknown=True)
    assert names == ["kind"]


async def test_explicit_column_list() -> None:
    cols = [("kind", T("String")), ("user_id", T("UInt64"))]
    names, batches = await parse("TSV", b"x\t7\n", cols, explicit=True)
    assert names == ["kind", "user_id"] and rows(batches) == {"kind": [b"x"], "user_id": [7]}
    with pytest.raises(BadInputError, match="missing in the input") as exc:
        await parse("CSVWithNames", b"kind\nx\n", cols, explicit=True)
    assert exc.value.code == 16


async def test_json_defaults_for_missing_fields_and_nulls() -> None:
    _, batches = await parse("JSONEachRow", b'{"user_id": 1}\n{"kind": null, "user_id": null}\n\n')
    assert rows(batches) == {"d": [dt.date(1970, 1, 1)] * 2, "ts": [dt.datetime(1970, 1, 1)] * 2,
                             "user_id": [1, 0], "kind": [b"", b""]}
    with pytest.raises(BadInputError, match="Unknown field") as exc:
        await parse("JSONEachRow", b'{"user_id": 1, "zzz": 2}\n')
    assert exc.value.code == 117
    _, batches = await parse("JSONEachRow", b'{"user_id": 1, "zzz": 2}\n', skip_unknown=True)
    assert rows(batches)["user_id"] == [1]


async def test_json_quoted_64bit_integers_take_the_vectorised_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """ClickHouse writes (U)Int64 and wider as JSON strings (output_format_json_quote_64bit_integers=1) and
    narrower integers as numbers: such a body is read by pyarrow, not row by row (20x the CPU)."""
    import replicad.server.formats as formats

    cols = [("k", T("UInt64")), ("i", T("Int64")), ("u", T("UInt8")), ("a", maybe_type("Array(UInt64)")),
            ("s", T("String"))]
    body = (b'{"k":"18446744073709551615","i":"-9223372036854775808","u":255,"a":["1","2"],"s":"x"}\n'
            b'{"k":"0","i":"7","u":0,"a":[],"s":"y"}\n')
    expected = {"k": [18446744073709551615, 0], "i": [-9223372036854775808, 7], "u": [255, 0],
                "a": [[1, 2], []], "s": [b"x", b"y"]}

    def no_slow_path(*args: object, **kwargs: object) -> list[pa.Array]:
        raise AssertionError("row-by-row JSON path taken")

    with monkeypatch.context() as m:
        m.setattr(formats, "_json_slow", no_slow_path)
        # numbers first (blocks of 64 bytes: one row each), then quoted: the parser switches and back
        mixed_blocks = (b'{"k":5,"i":-1,"u":1,"a":[3],"s":"z"}\n' + body
                        + b'{"k":6,"i":-2,"u":2,"a":[],"s":"w"}\n')
        _, batches = await parse("JSONEachRow", mixed_blocks, cols, read_block_bytes=64)
        got = rows(batches)
        assert got["k"] == [5, *expected["k"], 6] and got["a"] == [[3], *expected["a"], []]
        _, batches = await parse("JSONEachRow", body, cols)
        assert rows(batches) == expected
    # one block that spells the same column both ways still parses (row by row)
    _, batches = await parse("JSONEachRow", b'{"k":"1","u":1}\n{"k":2,"u":"3"}\n', cols)
    assert rows(batches)["k"] == [1, 2] and rows(batches)["u"] == [1, 3]
    with pytest.raises(BadInputError, match="column k"):
        await parse("JSONEachRow", b'{"k":"-1"}\n', cols)


async def test_csv_empty_field_means_default() -> None:
    _, batches = await parse("CSV", b',,,\n2020-01-01,,7,""\n')
    assert rows(batches) == {"d": [dt.date(1970, 1, 1), dt.date(2020, 1, 1)],
                             "ts": [dt.datetime(1970, 1, 1)] * 2, "user_id": [0, 7], "kind": [b"", b""]}


async def test_errors_name_column_and_global_row() -> None:
    lines = b"".join(b"2020-01-01\t2020-01-01 00:00:00\t%d\tk\n" % i for i in range(7))
    bad = lines + b"2020-01-01\t2020-01-01 00:00:00\tminus one\tk\n"
    with pytest.raises(BadInputError) as exc:
        await parse("TSV", bad, block_rows=3, read_block_bytes=64)
    assert "column user_id, row 8" in str(exc.value) and "'minus one'" in str(exc.value)
    assert exc.value.code == 27 and exc.value.http_status == 400
    with pytest.raises(BadInputError, match="column user_id, row 1: NULL is not allowed"):
        await parse("TSV", b"2020-01-01\t2020-01-01 00:00:00\t\\N\tk\n")
    with pytest.raises(BadInputError, match="row 1: expected 4 tab-separated fields, got 2: column user_id"):
        await parse("TSV", b"1\t2\n")
    with pytest.raises(BadInputError, match="row 8: expected 4 tab-separated fields, got 5: 1 more field"):
        await parse("TSV", lines + b"2020-01-01\t2020-01-01 00:00:00\t1\tk\textra\n", read_block_bytes=64)
    with pytest.raises(BadInputError, match="row 2: invalid JSON"):
        await parse("JSONEachRow", b'{"user_id": 1}\n{"user_id": "2"\n{"user_id": 3}\n')
    unknown = r"Unknown field found while parsing JSONEachRow format: nope \(row 2\)"
    with pytest.raises(BadInputError, match=unknown):
        await parse("JSONEachRow", b'{"user_id": 1}\n{"user_id": 2, "nope": 1}\n')


async def test_unknown_format_and_body_limit() -> None:
    with pytest.raises(BadInputError) as exc:
        await parse("Values", b"(1)")
    assert exc.value.code == 73
    with pytest.raises(BodyTooLargeError) as tl:
        await parse("TSV", b"2020-01-01\t2020-01-01 00:00:00\t1\tk\n" * 100, limit=1000)
    assert tl.value.http_status == 413


async def test_body_is_streamed_not_buffered() -> None:
    line = b"2020-01-01\t2020-01-01 00:00:00\t1\tk\n"
    body = Body(line * 20000, chunk=4096)
    spec = InputSpec(format="TSV", columns=EVENTS, explicit_columns=False, block_rows=1000,
                     read_block_bytes=16384)
    parsed = await parse_body(body, spec, 1 << 30)
    first = await anext(parsed.batches)
    assert first.num_rows == 1000
    assert body.pos <= 5 * 16384  # only a few blocks (and one read ahead) of a 700 KB body were read so far
    rest = [b async for b in parsed.batches]
    assert sum(b.num_rows for b in rest) == 19000 and body.pos == len(line) * 20000


def _arrow_stream(table: pa.Table, max_chunksize: int = 2) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=max_chunksize)
    return sink.getvalue()


async def test_arrow_stream_and_parquet_by_name() -> None:
    t = pa.table({"user_id": pa.array([1, 2, 3], pa.int64()), "kind": ["a", "b", "c"],
                  "ts": pa.array([0, 1, 2], pa.timestamp("s"))})
    names, batches = await parse("ArrowStream", _arrow_stream(t), block_rows=2)
    assert names == ["user_id", "kind", "ts"] and [b.num_rows for b in batches] == [2, 1]
    assert rows(batches)["user_id"] == [1, 2, 3] and batches[0].schema.field("user_id").type == pa.uint64()
    sink = io.BytesIO()
    pq.write_table(t, sink, row_group_size=2)
    names, batches = await parse("Parquet", sink.getvalue(), block_rows=10)
    assert names == ["user_id", "kind", "ts"] and rows(batches)["kind"] == [b"a", b"b", b"c"]
    bad = pa.table({"user_id": [-1]})
    with pytest.raises(BadInputError, match="column user_id, row 1"):
        await parse("ArrowStream", _arrow_stream(bad))
    with pytest.raises(BadInputError, match="Unknown column other"):
        await parse("Parquet", _parquet(pa.table({"other": [1]})))


def _parquet(t: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(t, sink)
    return sink.getvalue()


@pytest.mark.parametrize("raw,expected", [
    (b"plain", b"plain"), (b"\\N", None), (b"a\\\\N", b"a\\N"), (b"\\\\\\t", b"\\\t"), (b"\\x41\\x4a", b"AJ"),
    (b"\\q\\'\\\"", b"q'\""), (b"\\0\\b\\f\\r\\n", b"\0\b\f\r\n"), (b"x\\", b"x\\"),
])
def test_tsv_unescape_cases(raw: bytes, expected: bytes | None) -> None:
    assert tsv_unescape(pa.array([raw], pa.binary())).to_pylist() == [expected]


# ---- property tests: what we write, we read back ---------------------------------------------------------

BYTES = st.binary(max_size=40) | st.text(max_size=20).map(lambda s: s.encode())
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _roundtrip(fmt: str, values: list[bytes], nums: list[int], block_rows: int, chunk: int) -> None:
    cols = [("s", T("String")), ("n", T("Int64"))]
    table = pa.table({"s": pa.array(values, pa.binary()), "n": pa.array(nums, pa.int64())})
    out = asyncio.run(_render(cols, table, fmt))
    _, batches = asyncio.run(parse(fmt, out, cols, block_rows=block_rows, chunk=chunk, read_block_bytes=97))
    assert all(b.num_rows == block_rows for b in batches[:-1])
    got = rows(batches)
    assert got.get("s", []) == values and got.get("n", []) == nums


async def _render(cols: list[tuple[str, DataType]], table: pa.Table, fmt: str) -> bytes:
    return b"".join([c async for c in render(QueryResult.from_table(cols, table), fmt)])


@SETTINGS
@given(st.lists(st.tuples(BYTES, st.integers(-2**63, 2**63 - 1)), min_size=1, max_size=30),
       st.integers(1, 7), st.integers(1, 50))
def test_tsv_roundtrip(data: list[tuple[bytes, int]], block_rows: int, chunk: int) -> None:
    _roundtrip("TabSeparated", [d[0] for d in data], [d[1] for d in data], block_rows, chunk)


@SETTINGS
@given(st.lists(st.tuples(BYTES.filter(lambda b: b"\r" not in b), st.integers(-2**63, 2**63 - 1)),
                min_size=1, max_size=30), st.integers(1, 7), st.integers(1, 50))
def test_csv_roundtrip(data: list[tuple[bytes, int]], block_rows: int, chunk: int) -> None:
    _roundtrip("CSV", [d[0] for d in data], [d[1] for d in data], block_rows, chunk)


@SETTINGS
@given(st.lists(st.tuples(st.text(max_size=20).map(lambda s: s.encode()), st.integers(-2**63, 2**63 - 1)),
                min_size=1, max_size=30), st.integers(1, 7), st.integers(1, 50))
def test_json_roundtrip(data: list[tuple[bytes, int]], block_rows: int, chunk: int) -> None:
    _roundtrip("JSONEachRow", [d[0] for d in data], [d[1] for d in data], block_rows, chunk)


@SETTINGS
@given(st.lists(st.text(max_size=20), max_size=20))
def test_json_output_is_valid_json(values: list[str]) -> None:
    out = column_text(pa.array([v.encode() for v in values], pa.binary()), "json").to_pylist()
    assert [json.loads(v) for v in out] == values


@SETTINGS
@given(st.binary(max_size=3000), st.integers(1, 5), st.integers(1, 64))
def test_block_cut_is_independent_of_network_chunks(payload: bytes, block_rows: int, chunk: int) -> None:
    values = [payload[i:i + 37] for i in range(0, len(payload), 37)] or [b""]
    cols = [("s", T("String"))]
    body = asyncio.run(_render(cols, pa.table({"s": pa.array(values, pa.binary())}), "TSV"))
    _, a = asyncio.run(parse("TSV", body, cols, block_rows=block_rows, chunk=chunk, read_block_bytes=50))
    _, b = asyncio.run(parse("TSV", body, cols, block_rows=block_rows, chunk=4096))
    assert [x.num_rows for x in a] == [y.num_rows for y in b]
    assert all(x.equals(y) for x, y in zip(a, b, strict=True))


# ---- output: ClickHouse 18.16's renderings ---------------------------------------------------------------


async def test_output_matches_clickhouse_18_16() -> None:
    # The expected bytes were produced by a ClickHouse 18.16.1 server for the same row.
    cols = [("s", T("String")), ("u", T("UInt64")), ("i", T("Int64")), ("u32", T("UInt32")),
            ("fs", T("FixedString(3)")), ("f", T("Float64")), ("d", T("Date")), ("dt", T("DateTime"))]
    table = pa.table({"s": pa.array([b"it's \"q\""], pa.binary()), "u": pa.array([5], pa.uint64()),
                      "i": pa.array([-3], pa.int64()), "u32": pa.array([7], pa.uint32()),
                      "fs": pa.array([b"ab\0"], pa.binary(3)), "f": [float("inf")],
                      "d": pa.array([dt.date(2020, 1, 2)], pa.date32()),
                      "dt": pa.array([dt.datetime(2020, 1, 2, 3, 4, 5)], pa.timestamp("s"))})
    assert await _render(cols, table, "TSV") == \
        b"it\\'s \"q\"\t5\t-3\t7\tab\\0\tinf\t2020-01-02\t2020-01-02 03:04:05\n"
    assert await _render(cols, table, "CSV") == \
        b'"it\'s ""q""",5,-3,7,"ab\0",inf,"2020-01-02","2020-01-02 03:04:05"\n'
    assert await _render(cols, table, "JSONEachRow") == (
        b'{"s":"it\'s \\"q\\"","u":"5","i":"-3","u32":7,"fs":"ab\\u0000","f":null,"d":"2020-01-02",'
        b'"dt":"2020-01-02 03:04:05"}\n')
    assert await _render(cols, table, "TSVWithNames") == \
        b"s\tu\ti\tu32\tfs\tf\td\tdt\n" + await _render(cols, table, "TSV")


async def test_output_timezone_and_arrow_stream() -> None:
    cols = [("ts", T("DateTime")), ("n", T("UInt8"))]
    table = pa.table({"ts": pa.array([0], pa.timestamp("s")), "n": pa.array([1], pa.uint8())})
    out = b"".join([c async for c in render(QueryResult.from_table(cols, table), "TSV", "Europe/Moscow")])
    assert out == b"1970-01-01 03:00:00\t1\n"
    stream = await _render(cols, table, "ArrowStream")
    back = pa.ipc.open_stream(stream).read_all()
    assert back.column("n").to_pylist() == [1] and back.num_rows == 1
    empty = await _render(cols, table.slice(0, 0), "ArrowStream")
    assert pa.ipc.open_stream(empty).read_all().schema.names == ["ts", "n"]
    assert await _render(cols, table.slice(0, 0), "TSV") == b""


async def test_output_arrays_and_nullable() -> None:
    arr_t = maybe_type("Array(String)")
    null_t = maybe_type("Nullable(Int32)")
    cols = [("a", arr_t), ("n", null_t)]
    table = pa.table({"a": pa.array([[b"x", b"it's"], []], pa.list_(pa.binary())),
                      "n": pa.array([None, 5], pa.int32())})
    assert await _render(cols, table, "TSV") == b"['x','it\\'s']\t\\N\n[]\t5\n"
    assert await _render(cols, table, "CSV") == b"\"['x','it\\'s']\",\\N\n\"[]\",5\n"
    assert await _render(cols, table, "JSONEachRow") == b'{"a":["x","it\'s"],"n":null}\n{"a":[],"n":5}\n'


@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_clickhouse_float_spelling_round_trips(v: float) -> None:
    text = column_text(pa.array([v], pa.float64()), "tsv").to_pylist()[0].decode()
    assert float(text) == v
    assert "+" not in text and (("e" not in text) or not (1e-6 <= abs(v) < 1e21))


@pytest.mark.parametrize("value,text", [
    (1e20, "100000000000000000000"), (1e21, "1e21"), (1e-5, "0.00001"), (1e-7, "1e-7"), (2.5e-10, "2.5e-10"),
    (1e300, "1e300"), (123456.789, "123456.789"), (-3.5e25, "-3.5e25"), (1e15, "1000000000000000"),
])
def test_clickhouse_float_examples(value: float, text: str) -> None:
    # as ClickHouse 18.16 prints them (SELECT 1e20, 1e21, … FORMAT TSV)
    assert column_text(pa.array([value], pa.float64()), "tsv").to_pylist() == [text.encode()]


@pytest.mark.parametrize("text,type_name,expected", [
    (b"[1,2]", "Array(UInt8)", [b"1", b"2"]),
    (b"[]", "Array(UInt8)", []),
    (b" [ 1 , NULL ] ", "Array(Int8)", [b"1", None]),
    (b"['2020-01-01']", "Array(Date)", [b"2020-01-01"]),
    (b"[['a'],[],['b','c']]", "Array(Array(String))", [[b"a"], [], [b"b", b"c"]]),
    (b"['x','it\\'s\\t','a,b','[','q''q']", "Array(String)", [b"x", b"it's\t", b"a,b", b"[", b"q'q"]),
])
def test_array_literals(text: bytes, type_name: str, expected: object) -> None:
    got = parse_array_text(pa.array([text, None], pa.binary()), type_name).to_pylist()
    assert got == [expected, None]


@pytest.mark.parametrize("text", [b"[1,2", b"['a'] x", b"['a'", b"[,]"])
def test_array_literal_errors(text: bytes) -> None:
    with pytest.raises(ValueError):
        parse_array_text(pa.array([text], pa.binary()), "Array(String)")


async def test_arrays_in_text_formats() -> None:
    cols = [("a", maybe_type("Array(String)")), ("n", T("UInt8"))]
    _, batches = await parse("TSV", b"['x','it\\'s']\t1\n[]\t2\n\t3\n", cols)
    assert rows(batches) == {"a": [[b"x", b"it's"], [], []], "n": [1, 2, 3]}
    _, batches = await parse("CSV", b"\"['a,b']\",1\n", cols)
    assert rows(batches)["a"] == [[b"a,b"]]
    _, batches = await parse("JSONEachRow", b'{"a": ["x", "y"], "n": "7"}\n{"a": [], "n": 8}\n', cols)
    assert rows(batches) == {"a": [[b"x", b"y"], []], "n": [7, 8]}
    with pytest.raises(BadInputError, match="column a, row 2"):
        await parse("TSV", b"[]\t1\n['x'\t2\n", cols)
