"""Cross-check the type codecs against ClickHouse 26 (chdb, in process).

ClickHouse's ``Native`` format writes each column with the same bulk serialization as a part's ``.bin``
streams, concatenated in stream order (Nullable: null map, then values; LowCardinality: keys version, then
per-block index headers with additional keys), except that Array sizes are cumulative offsets there.  So:

* ClickHouse -> us: ClickHouse casts SQL literals and writes Native; we decode the column bytes and compare
  with ``to_storage`` of the same values, and re-encode to the same bytes.
* us -> ClickHouse: we serialize, wrap the bytes in a Native block, and let ClickHouse read the file and
  print it as TSV.

Canonical type names are compared with ClickHouse's ``toTypeName``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from replicad.datatypes import DataType, parse_type
from replicad.model.varint import encode_varuint

chdb = pytest.importorskip("chdb")

# (type, SQL array literal of the values, the same values as user input for to_storage, expected TSV)
CASES: list[tuple[str, str, list[Any]]] = [
    ("Int8", "[-128, 0, 127]", [-128, 0, 127]),
    ("Int16", "[-32768, 1, 32767]", [-32768, 1, 32767]),
    ("Int32", "[-2147483648, 2147483647]", [-(2**31), 2**31 - 1]),
    ("Int64", "[-9223372036854775808, 9223372036854775807]", [-(2**63), 2**63 - 1]),
    ("UInt8", "[0, 255]", [0, 255]),
    ("UInt16", "[0, 65535]", [0, 65535]),
    ("UInt32", "[0, 4294967295]", [0, 2**32 - 1]),
    ("UInt64", "[0, 18446744073709551615]", [0, 2**64 - 1]),
    ("Float32", "[-1.5, 0, 3.25]", [-1.5, 0.0, 3.25]),
    ("Float64", "[-1.5e300, 0.1, 1e-300]", [-1.5e300, 0.1, 1e-300]),
    ("Date", "['1970-01-01', '2026-11-22', '2149-06-06']", ["1970-01-01", "2026-11-22", "2149-06-06"]),
    (
        "DateTime",
        "['1970-01-01 00:00:00', '2026-11-22 10:00:00', '2106-02-07 06:28:15']",
        ["1970-01-01 00:00:00", "2026-11-22 10:00:00", "2106-02-07 06:28:15"],
    ),
    ("DateTime('Asia/Tokyo')", "['2026-11-22 10:00:00']", ["2026-11-22 10:00:00"]),
    # a time in the spring-forward gap and an ambiguous autumn time, read as ClickHouse reads them
    (
        "DateTime('Europe/Berlin')",
        "['2026-03-29 02:30:00', '2026-10-25 02:30:00', '2026-01-01 00:00:00']",
        ["2026-03-29 02:30:00", "2026-10-25 02:30:00", "2026-01-01 00:00:00"],
    ),
    (
        "String",
        "['', 'hello', 'é€😀', repeat('x', 200), '\\0\\t\\n']",
        ["", "hello", "é€😀", "x" * 200, "\0\t\n"],
    ),
    ("FixedString(3)", "['', 'ab', 'abc']", ["", "ab", "abc"]),
    (
        "UUID",
        "['00000000-0000-0000-0000-000000000001', '01234567-89ab-cdef-0123-456789abcdef']",
        ["00000000-0000-0000-0000-000000000001", "01234567-89ab-cdef-0123-456789abcdef"],
    ),
    ("Enum8('b' = -2, 'a' = 1, 'c\\'' = 127)", "['a', 'b', 'c\\'']", ["a", "b", "c'"]),
    ("Enum16('x' = -32768, 'y' = 32767)", "['y', 'x']", ["y", "x"]),
    ("Decimal(9, 2)", "['123.45', '-0.01', '9999999.99']", ["123.45", "-0.01", "9999999.99"]),
    ("Decimal(18, 4)", "['-12345678901234.5678', '0']", ["-12345678901234.5678", "0"]),
    (
        "Decimal(38, 10)",
        "['-9999999999999999999999999999.9999999999', '1.5']",
        ["-9999999999999999999999999999.9999999999", "1.5"],
    ),
    ("Nullable(Int32)", "[7, NULL, -1]", [7, None, -1]),
    ("Nullable(String)", "[NULL, 'a', '']", [None, "a", ""]),
    ("Array(String)", "[['a', 'bc'], [], ['']]", [["a", "bc"], [], [""]]),
    ("Array(Array(Nullable(Int8)))", "[[[1, NULL], []], [], [[NULL]]]", [[[1, None], []], [], [[None]]]),
    ("LowCardinality(String)", "['a', 'b', 'a', '']", ["a", "b", "a", ""]),
    ("LowCardinality(Nullable(String))", "['a', NULL, '', 'a']", ["a", None, "", "a"]),
]


def _user_input(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except OverflowError:  # UInt64 beyond Int64
        return pa.array(values, pa.uint64())


def _query(sql: str, fmt: str) -> bytes:
    return bytes(chdb.query(sql, fmt).bytes())


def _read_varuint(data: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _native_column(data: bytes) -> tuple[str, int, bytes]:
    """(type name, rows, column bytes) of a one-column, one-block Native stream."""
    ncols, pos = _read_varuint(data, 0)
    nrows, pos = _read_varuint(data, pos)
    assert ncols == 1
    name_len, pos = _read_varuint(data, pos)
    pos += name_len
    type_len, pos = _read_varuint(data, pos)
    type_name = data[pos : pos + type_len].decode()
    return type_name, nrows, data[pos + type_len :]


def _native_block(t: DataType, rows: int, column: bytes) -> bytes:
    name = t.name.encode()
    return encode_varuint(1) + encode_varuint(rows) + b"\x01c" + encode_varuint(len(name)) + name + column


def _sizes_to_offsets(t: DataType, bufs: dict[str, bytes]) -> dict[str, bytes]:
    out = dict(bufs)
    for s in t.substreams():
        if s.startswith(".size"):
            out[s] = np.cumsum(np.frombuffer(bufs[s], "<u8"), dtype="<u8").tobytes()
    return out


def _split_native(t: DataType, native: bytes, rows: int) -> dict[str, bytes]:
    """A Native column's bytes per our substream (Array sizes still as cumulative offsets)."""
    out: dict[str, bytes] = {}
    pos = 0
    count = rows
    for s in t.substreams():
        if s.startswith(".size"):
            out[s] = native[pos : pos + 8 * count]
            count = int(np.frombuffer(native, "<u8", count=count, offset=pos)[-1]) if count else 0
            pos += len(out[s])
        elif s == ".null":
            out[s] = native[pos : pos + count]
            pos += count
        elif s == ".dict":
            assert native[pos : pos + 8] == struct.pack("<Q", 1)  # keys serialization version
            out[s] = b""
            pos += 8
        else:
            out[s] = native[pos:]
    return out


def _offsets_to_sizes(t: DataType, bufs: dict[str, bytes]) -> dict[str, bytes]:
    out = dict(bufs)
    for s in t.substreams():
        if s.startswith(".size"):
            offsets = np.frombuffer(bufs[s], "<u8")
            out[s] = np.diff(offsets, prepend=np.uint64(0)).astype("<u8").tobytes()
    return out


@pytest.mark.parametrize(("type_text", "sql_values", "values"), CASES, ids=[c[0] for c in CASES])
def test_clickhouse_native_bytes_decode(type_text: str, sql_values: str, values: list[Any]) -> None:
    t = parse_type(type_text)
    data = _query(f"SELECT CAST(x AS {type_text}) AS c FROM (SELECT arrayJoin({sql_values}) AS x)", "Native")
    type_name, rows, column = _native_column(data)
    assert (
        type_name == t.name.split("(")[0] if type_text.startswith("DateTime(") else t.name
    )  # Native drops tz
    assert rows == len(values)
    theirs = _split_native(t, column, rows)
    expected = t.to_storage(_user_input(values), "c", tz="UTC")
    got = t.deserialize(_offsets_to_sizes(t, theirs), rows)
    assert got.equals(expected), (got, expected)
    if "LowCardinality" not in type_text:  # Native LowCardinality uses per-block keys, parts use dictionaries
        assert _sizes_to_offsets(t, t.serialize(expected)) == theirs


def _native_from_ours(t: DataType, arr: pa.Array) -> bytes:
    if "LowCardinality" in t.name:
        # a Native LowCardinality column: keys version, then one block with additional keys only
        ser = t.serialize(arr)
        keys = ser[".dict"]  # our stand-alone dictionary: UInt64 n + keys
        header = ser[""][:8]
        flags = struct.unpack("<Q", header)[0] & 0xFF | 0x200  # HasAdditionalKeys, no global dictionary
        return struct.pack("<QQ", 1, flags) + keys + ser[""][8:]
    bufs = _sizes_to_offsets(t, t.serialize(arr))
    return b"".join(bufs.get(s, b"") for s in t.substreams())


@pytest.mark.parametrize(("type_text", "sql_values", "values"), CASES, ids=[c[0] for c in CASES])
def test_clickhouse_reads_our_bytes(
    tmp_path: Path, type_text: str, sql_values: str, values: list[Any]
) -> None:
    t = parse_type(type_text)
    arr = t.to_storage(_user_input(values), "c", tz="UTC")
    path = tmp_path / "ours.native"
    path.write_bytes(_native_block(t, len(arr), _native_from_ours(t, arr)))
    ours = _query(f"SELECT c FROM file('{path}', 'Native')", "TSV")
    theirs = _query(f"SELECT CAST(x AS {type_text}) AS c FROM (SELECT arrayJoin({sql_values}) AS x)", "TSV")
    assert ours == theirs


@pytest.mark.parametrize(
    "type_text", ["Decimal32(3)", "Decimal(5)", "Enum8('z' = 3, 'y' = -1)", "INT", "TEXT"]
)
def test_alias_names_match_clickhouse(type_text: str) -> None:
    data = _query(
        f"SELECT CAST(x AS {type_text}) AS c FROM (SELECT arrayJoin([1]) AS x)"
        if "Enum" not in type_text
        else f"SELECT CAST('z' AS {type_text}) AS c",
        "Native",
    )
    assert _native_column(data)[0] == parse_type(type_text).name


def test_low_cardinality_part_streams_match_clickhouse(tmp_path: Path) -> None:
    """A Wide part written by ClickHouse 26.9 with 18.16-compatible settings: our LowCardinality bulk
    serializer produces the same ``.dict.bin`` / ``.bin`` bytes, and we read its granules back."""
    from chdb import session

    from replicad.storage.compression import decompress_all

    s = session.Session(str(tmp_path / "chdb"))
    try:
        s.query(
            "CREATE TABLE default.t (k UInt32, s LowCardinality(String), n LowCardinality(Nullable(String))) "
            "ENGINE = MergeTree ORDER BY k SETTINGS index_granularity = 3, min_bytes_for_wide_part = 0, "
            "min_rows_for_wide_part = 0, index_granularity_bytes = 0, compress_marks = 0, "
            "compress_primary_key = 0, string_serialization_version = 'single_stream', "
            "serialization_info_version = 'basic', ratio_of_defaults_for_sparse_serialization = 1"
        )
        s.query(
            "INSERT INTO default.t SELECT number, ['a','b','c','d','e','f','g'][number % 7 + 1], "
            "if(number % 4 = 0, NULL, toString(number % 5)) FROM numbers(10)"
        )
        part = next((tmp_path / "chdb").rglob("all_1_1_0"))
        rows = {
            "s": [b"abcdefg"[i % 7 : i % 7 + 1] for i in range(10)],
            "n": [None if i % 4 == 0 else str(i % 5).encode() for i in range(10)],
        }
        for col, type_text in (("s", "LowCardinality(String)"), ("n", "LowCardinality(Nullable(String))")):
            t = parse_type(type_text)
            theirs = {sfx: decompress_all((part / f"{col}{sfx}.bin").read_bytes()) for sfx in t.substreams()}
            ser = t.bulk_serializer()  # type: ignore[attr-defined]
            ours = {sfx: b"" for sfx in t.substreams()}
            marks = []
            for chunk in (
                [ser.prefix()]
                + [ser.serialize(pa.array(rows[col][i : i + 3], pa.binary())) for i in range(0, 10, 3)]
                + [ser.suffix()]
            ):
                marks.append({k: len(v) for k, v in ours.items()})
                for k, v in chunk.items():
                    ours[k] += v
            assert ours == theirs
            # their granules, read from their marks (offset in the decompressed stream = 2nd UInt64)
            for g in range(4):
                bufs = {}
                for sfx in t.substreams():
                    mrk = np.frombuffer((part / f"{col}{sfx}.mrk").read_bytes(), "<u8").reshape(-1, 2)
                    start = int(mrk[g][1])
                    end = int(mrk[g + 1][1]) if sfx == "" and g < 3 else None
                    bufs[sfx] = theirs[sfx][start:end]
                want = rows[col][3 * g : 3 * g + 3]
                assert t.deserialize(bufs, len(want)).to_pylist() == want
    finally:
        s.close()
