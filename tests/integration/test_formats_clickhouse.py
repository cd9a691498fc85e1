"""Our input parsers and output renderers against a real ClickHouse 18.16 server.

ClickHouse writes a table in every text format; we parse each answer, and render what we parsed in every
format: the bytes must equal ClickHouse's own output.  Then we insert our rendering into ClickHouse and
read it back unchanged.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from replicad.devtools.clickhouse import ClickHouseServer
from replicad.server.formats import InputSpec, parse_body
from replicad.server.output_formats import render
from replicad.service import QueryResult
from replicad.storage.types import DataType, parse_type

pytestmark = [pytest.mark.integration, pytest.mark.clickhouse]
TZ = "Europe/Moscow"
COLUMNS = [("s", "String"), ("fs", "FixedString(4)"), ("u64", "UInt64"), ("i64", "Int64"), ("i8", "Int8"),
           ("u16", "UInt16"), ("f32", "Float32"), ("f64", "Float64"), ("d", "Date"), ("dt", "DateTime")]
TEXT_FORMATS = ["TabSeparated", "TabSeparatedWithNames", "CSV", "CSVWithNames", "JSONEachRow"]
ONE_THREAD = {"max_threads": 1}  # Log tables read with several threads return rows in varying order


@pytest.fixture(scope="module")
def ch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    server = ClickHouseServer(tmp_path_factory.mktemp("ch-formats"), timezone=TZ)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _sql_string(b: bytes) -> str:
    return "'" + "".join(f"\\x{c:02x}" for c in b) + "'"


def _rows(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    specials = [b"", b"\t", b"\n", b"\\", b"'", b'"', b"\\N", b"\0", b"a,b", b"\r\n", "ж€😀".encode(),
                b"\x01\x1f", b"/", b"[1,2]", b" lead", b"trail "]
    floats = ["0.1", "-0.", "1e20", "1e21", "1e-5", "2.5e-10", "123456.789", "inf", "-inf", "nan", "1e300",
              "3"]
    out = []
    for i in range(n):
        s = rnd.choice(specials) + bytes(rnd.randrange(32, 127) for _ in range(rnd.randrange(4))) + \
            rnd.choice(specials)
        fs = bytes(rnd.randrange(256) for _ in range(rnd.randrange(5)))
        out.append(", ".join([
            _sql_string(s), f"toFixedString({_sql_string(fs)}, 4)",
            str(rnd.choice([0, 1, 2**63, 2**64 - 1, rnd.randrange(2**64)])),
            str(rnd.choice([-2**63, -1, 0, 2**63 - 1, rnd.randrange(-2**63, 2**63)])),
            str(rnd.randrange(-128, 128)), str(rnd.randrange(65536)),
            f"toFloat32({rnd.choice([*floats[:8], '16777216', '0.3'])})", rnd.choice(floats),
            f"toDate({rnd.randrange(0, 40000)})", f"toDateTime({rnd.choice([0, 1, rnd.randrange(2**31)])})",
        ]))
        if i % 7 == 0:  # the DST switch days of the server time zone
            out[-1] = out[-1].rsplit(", toDateTime", 1)[0] + ", toDateTime('2011-03-27 03:00:00')"
    return out


class Body:
    def __init__(self, data: bytes, chunk: int = 997) -> None:
        self.data, self.pos, self.chunk = data, 0, chunk

    async def read(self, n: int = -1) -> bytes:
        size = self.chunk if n < 0 else min(n, self.chunk)
        out = self.data[self.pos:self.pos + size]
        self.pos += len(out)
        return out


def _types() -> list[tuple[str, DataType]]:
    return [(n, parse_type(t)) for n, t in COLUMNS]


async def _parse(fmt: str, data: bytes, block_rows: int = 50) -> pa.Table:
    spec = InputSpec(format=fmt, columns=_types(), explicit_columns=False, block_rows=block_rows, tz=TZ,
                     read_block_bytes=4096)
    parsed = await parse_body(Body(data), spec, 1 << 30)
    batches = [b async for b in parsed.batches]
    assert all(b.num_rows == block_rows for b in batches[:-1])
    table = pa.Table.from_batches(batches)
    return table.select([n for n, _ in COLUMNS])


async def _render(table: pa.Table, fmt: str) -> bytes:
    return b"".join([c async for c in render(QueryResult.from_table(_types(), table), fmt, TZ)])


@pytest.fixture(scope="module")
def filled(ch: ClickHouseServer) -> ClickHouseServer:
    ch.query("CREATE TABLE fmt (" + ", ".join(f"{n} {t}" for n, t in COLUMNS) + ") ENGINE = Log")
    rows = _rows(300, seed=1816)
    for i in range(0, len(rows), 100):
        ch.query("INSERT INTO fmt VALUES " + ", ".join(f"({r})" for r in rows[i:i + 100]))
    return ch


def _modern_zero_dates(data: bytes) -> bytes:
    # 18.16 prints the zero DateTime/Date as 0000-00-00 00:00:00 / 0000-00-00; we print the epoch in the
    # server time zone like modern ClickHouse (and read both spellings).
    return data.replace(b"0000-00-00 00:00:00", b"1970-01-01 03:00:00").replace(b"0000-00-00", b"1970-01-01")


def test_parse_clickhouse_output_and_render_it_back_identically(filled: ClickHouseServer) -> None:
    outputs = {fmt: filled.query_bytes(f"SELECT * FROM fmt FORMAT {fmt}", settings=ONE_THREAD)
               for fmt in TEXT_FORMATS}
    assert b"0000-00-00" in outputs["TabSeparated"]  # the zero date is in the data
    reference = asyncio.run(_parse("TabSeparated", outputs["TabSeparated"]))
    assert reference.num_rows == 300
    for fmt in TEXT_FORMATS:
        parsed = asyncio.run(_parse(fmt, outputs[fmt]))
        # JSON has no NaN/inf (ClickHouse writes null, we read the default 0): compare the rest
        if fmt == "JSONEachRow":
            parsed = parsed.drop_columns(["f32", "f64"])
            expected = reference.drop_columns(["f32", "f64"])
        else:
            expected = reference
        assert same(parsed, expected), fmt
        ours = asyncio.run(_render(reference, fmt))
        theirs = _modern_zero_dates(outputs[fmt])
        assert ours == theirs, (fmt, _first_difference(ours, theirs))


def test_clickhouse_reads_what_we_write(filled: ClickHouseServer) -> None:
    tsv = filled.query_bytes("SELECT * FROM fmt FORMAT TabSeparated", settings=ONE_THREAD)
    table = asyncio.run(_parse("TabSeparated", tsv))
    filled.query("CREATE TABLE fmt_back AS fmt")
    for fmt in ("TabSeparated", "CSV", "JSONEachRow"):
        filled.query("TRUNCATE TABLE fmt_back")
        filled.query_bytes(f"INSERT INTO fmt_back FORMAT {fmt}", data=asyncio.run(_render(table, fmt)))
        back = filled.query_bytes("SELECT * FROM fmt_back FORMAT TabSeparated", settings=ONE_THREAD)
        if fmt == "JSONEachRow":  # NaN/inf become null → 0 in ClickHouse as well
            back_t = asyncio.run(_parse("TabSeparated", back)).drop_columns(["f32", "f64"])
            assert same(back_t, table.drop_columns(["f32", "f64"]))
        else:
            assert back == tsv, (fmt, _first_difference(back, tsv))


def same(a: pa.Table, b: pa.Table) -> bool:
    """Table equality where NaN equals NaN."""
    if a.schema != b.schema or a.num_rows != b.num_rows:
        return False
    for x, y in zip(a.columns, b.columns, strict=True):
        x, y = x.combine_chunks(), y.combine_chunks()
        if pa.types.is_floating(x.type):
            nan_x, nan_y = pc.is_nan(x), pc.is_nan(y)
            if not nan_x.equals(nan_y) or not x.filter(pc.invert(nan_x)).equals(y.filter(pc.invert(nan_y))):
                return False
        elif not x.equals(y):
            return False
    return True


def _first_difference(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            lo = max(0, i - 60)
            return f"at byte {i}: ours {a[lo:i + 40]!r} vs ClickHouse {b[lo:i + 40]!r}"
    return f"lengths {len(a)} vs {len(b)}"


def test_date_time_text_uses_the_server_time_zone(ch: ClickHouseServer) -> None:
    ch.query("CREATE TABLE tz (dt DateTime) ENGINE = Log")
    ch.query_bytes("INSERT INTO tz FORMAT TSV", data=b"2026-11-22 12:00:00\n")
    unix = int(ch.query("SELECT toUInt32(dt) FROM tz").strip())
    cols = [("dt", parse_type("DateTime"))]
    spec = InputSpec(format="TSV", columns=cols, explicit_columns=False, tz=TZ)

    async def go() -> int:
        parsed = await parse_body(Body(b"2026-11-22 12:00:00\n"), spec, 1 << 20)
        batch = await anext(parsed.batches)
        return int(batch.column(0).cast(pa.int64())[0].as_py())

    assert asyncio.run(go()) == unix


@pytest.mark.parametrize("fmt", ["TabSeparated", "CSV", "JSONEachRow"])
def test_unknown_setting_and_error_format_match(ch: ClickHouseServer, fmt: str, tmp_path: Path) -> None:
    # ClickHouse 18.16 error bodies start with "Code: <n>, e.displayText() = DB::Exception: ..."; ours with
    # "Code: <n>. DB::Exception: ..." (the modern spelling).  The codes must agree.
    from replicad.devtools.clickhouse import ClickHouseError

    with pytest.raises(ClickHouseError) as exc:
        ch.query_bytes(f"SELECT 1 FORMAT {fmt}", settings={"no_such_setting_xyz": 1})
    assert exc.value.code == 115


COMPLEX = [("ns", "Nullable(String)"), ("ni", "Nullable(Int32)"), ("au", "Array(UInt8)"),
           ("as_", "Array(String)"),
           ("e", "Enum8('a' = 1, 'b\\'q' = -2, 'c d' = 3)"), ("dec", "Decimal(9, 2)"), ("u", "UUID"),
           ("an", "Array(Nullable(Int8))"), ("aa", "Array(Array(String))"), ("ad", "Array(Date)")]


def _complex_rows(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    words = [b"", b"x", b"it's", b"a,b", b"[1]", b"\\", b"\t\n", b"NULL", "ж".encode(), b'"q"']

    def s() -> str:
        return _sql_string(rnd.choice(words) + rnd.choice(words))

    out = []
    for _ in range(n):
        out.append(", ".join([
            rnd.choice(["NULL", s()]), rnd.choice(["NULL", str(rnd.randrange(-2**31, 2**31))]),
            "[" + ",".join(str(rnd.randrange(256)) for _ in range(rnd.randrange(4))) + "]",
            "[" + ",".join(s() for _ in range(rnd.randrange(4))) + "]",
            rnd.choice(["'a'", "'b\\'q'", "'c d'"]), f"{rnd.randrange(-10**6, 10**6) / 100:.2f}",
            f"'{uuid_text(rnd)}'",
            "[" + ",".join(rnd.choice(["NULL", str(rnd.randrange(-128, 128))])
                           for _ in range(rnd.randrange(4))) + "]",
            "[" + ",".join("[" + ",".join(s() for _ in range(rnd.randrange(3))) + "]"
                           for _ in range(rnd.randrange(3))) + "]",
            "[" + ",".join(f"toDate({rnd.randrange(1, 40000)})" for _ in range(rnd.randrange(3))) + "]",
        ]))
    return out


def uuid_text(rnd: random.Random) -> str:
    h = f"{rnd.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def test_complex_types_match_clickhouse(ch: ClickHouseServer) -> None:
    types = [(n, parse_type(t)) for n, t in COMPLEX]
    ch.query("CREATE TABLE fmt_complex (" + ", ".join(f"{n} {t}" for n, t in COMPLEX) + ") ENGINE = Log")
    ch.query("INSERT INTO fmt_complex VALUES " + ", ".join(f"({r})" for r in _complex_rows(200, seed=7)))

    async def parse(fmt: str, data: bytes) -> pa.Table:
        spec = InputSpec(format=fmt, columns=types, explicit_columns=False, block_rows=64, tz=TZ,
                         read_block_bytes=2048)
        parsed = await parse_body(Body(data), spec, 1 << 30)
        return pa.Table.from_batches([b async for b in parsed.batches])

    async def rend(table: pa.Table, fmt: str) -> bytes:
        return b"".join([c async for c in render(QueryResult.from_table(types, table), fmt, TZ)])

    reference = None
    for fmt in TEXT_FORMATS:
        theirs = ch.query_bytes(f"SELECT * FROM fmt_complex FORMAT {fmt}", settings=ONE_THREAD)
        table = asyncio.run(parse(fmt, theirs))
        assert table.num_rows == 200
        reference = reference or table
        assert same(table, reference), fmt
        ours = asyncio.run(rend(table, fmt))
        assert ours == theirs, (fmt, _first_difference(ours, theirs))
