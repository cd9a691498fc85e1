"""Random rows for part-format tests, as storage Arrow *and* as ClickHouse TabSeparated text.

``make_rows(columns, n, seed)`` returns (table, tsv): the same values twice, so that a part written by
replicad from ``table`` can be compared with what ClickHouse stores after ``INSERT ... FORMAT TSV``.
Column ``k`` (UInt64, unique, ascending) is the sort key; ``d`` (Date) the partition column.
Per-row Python here is fine: this is test data generation, not a hot path.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

# (name, ClickHouse type) of a table that uses every supported type
ALL_TYPES: list[tuple[str, str]] = [
    ("k", "UInt64"),
    ("d", "Date"),
    ("ts", "DateTime"),
    ("i8", "Int8"),
    ("i16", "Int16"),
    ("i32", "Int32"),
    ("i64", "Int64"),
    ("u8", "UInt8"),
    ("u16", "UInt16"),
    ("u32", "UInt32"),
    ("f32", "Float32"),
    ("f64", "Float64"),
    ("s", "String"),
    ("fs", "FixedString(5)"),
    ("uid", "UUID"),
    ("e8", "Enum8('a' = 1, 'b' = 2, 'c' = -3)"),
    ("e16", "Enum16('x' = -1000, 'y' = 1000)"),
    ("dec9", "Decimal(9, 2)"),
    ("dec18", "Decimal(18, 4)"),
    ("dec38", "Decimal(38, 10)"),
    ("ni", "Nullable(Int32)"),
    ("ns", "Nullable(String)"),
    ("au", "Array(UInt16)"),
    ("as_", "Array(String)"),
    ("lc", "LowCardinality(String)"),
]


def supported(type_text: str) -> bool:
    from replicad.datatypes import parse_type
    from replicad.errors import ReplicadError

    try:
        parse_type(type_text)
    except ReplicadError:
        return False
    return True


#: LowCardinality is used only once the types module implements it (see test_low_cardinality_supported)
LOW_CARDINALITY = supported("LowCardinality(String)")
if not LOW_CARDINALITY:
    ALL_TYPES = [c for c in ALL_TYPES if not c[1].startswith("LowCardinality")]

_ENUM_RE = re.compile(r"'((?:[^'\\]|\\.)*)'\s*=\s*(-?\d+)")

Gen = Callable[[np.random.Generator, int], tuple[list[str], pa.Array]]


def tsv_escape(b: bytes) -> str:
    s = b.decode("utf-8")
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def quoted(b: bytes) -> str:
    s = b.decode("utf-8")
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\t", "\\t").replace("\n", "\\n") + "'"


_ALPHABET = [*"abcdefghijklmnopqrstuvwxyz0123456789 _-'\\\t\n", "é", "ж", "😀"]


def random_strings(rng: np.random.Generator, n: int, max_len: int = 20, long_every: int = 0) -> list[bytes]:
    out = []
    for i in range(n):
        ln = int(rng.integers(0, max_len + 1))
        if long_every and i % long_every == 0:
            ln = 3000
        out.append("".join(_ALPHABET[j] for j in rng.integers(0, len(_ALPHABET), ln)).encode())
    return out


def _ints(bits: int, signed: bool) -> Gen:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    at = pa.int64() if signed else pa.uint64()
    target = {8: pa.int8, 16: pa.int16, 32: pa.int32, 64: pa.int64}[bits]() if signed else \
        {8: pa.uint8, 16: pa.uint16, 32: pa.uint32, 64: pa.uint64}[bits]()

    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        dtype = np.int64 if signed else np.uint64
        vals = [int(x) for x in rng.integers(lo, hi, n, endpoint=True, dtype=dtype)]
        vals[:2] = [lo, hi][: min(2, n)]
        return [str(v) for v in vals], pa.array(vals, at).cast(target)

    return gen


def _floats(single: bool) -> Gen:
    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        vals = [float(x) / 8 for x in rng.integers(-(1 << 20), 1 << 20, n)]
        return [repr(v) for v in vals], pa.array(vals, pa.float32() if single else pa.float64())

    return gen


def _date(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
    days = [int(x) for x in rng.integers(19754, 19754 + 29, n)]  # February 2024: one partition
    dates = [dt.date(1970, 1, 1) + dt.timedelta(days=d) for d in days]
    return [d.isoformat() for d in dates], pa.array(dates, pa.date32())


def _datetime(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
    # 18.16 parses DateTime text only up to its DateLUT's end (2105); stay within the 21st century
    secs = [int(x) for x in rng.integers(0, 4102444799, n, endpoint=True)]
    text = [dt.datetime.fromtimestamp(s, dt.UTC).strftime("%Y-%m-%d %H:%M:%S") for s in secs]
    return text, pa.array(secs, pa.int64()).cast(pa.timestamp("s"))


def _string(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
    vals = random_strings(rng, n, long_every=997)
    return [tsv_escape(v) for v in vals], pa.array(vals, pa.binary())


def _fixed(size: int) -> Gen:
    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        lens = rng.integers(0, size + 1, n)
        vals = [bytes(rng.integers(97, 123, int(ln)).astype(np.uint8)) for ln in lens]
        return [v.decode() for v in vals], pa.array([v.ljust(size, b"\0") for v in vals], pa.binary(size))

    return gen


def _uuid(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
    vals = [uuid.UUID(bytes=bytes(rng.integers(0, 256, 16).astype(np.uint8))) for _ in range(n)]
    return [str(u) for u in vals], pa.array([u.bytes for u in vals], pa.binary(16))


def _enum(type_text: str, bits: int) -> Gen:
    items = [(name, int(code)) for name, code in _ENUM_RE.findall(type_text)]

    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        pick = [items[int(i)] for i in rng.integers(0, len(items), n)]
        at = pa.int8() if bits == 8 else pa.int16()
        return [name for name, _ in pick], pa.array([c for _, c in pick], at)

    return gen


def _decimal(precision: int, scale: int) -> Gen:
    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        limit = 10 ** min(precision, 18) - 1
        raw = [int(x) for x in rng.integers(-limit, limit, n, endpoint=True)]
        extra = precision - 18
        while extra > 0:  # more digits, at most 9 at a time (numpy draws are int64)
            step = min(extra, 9)
            low = rng.integers(0, 10**step, n)
            raw = [r * 10**step + (int(x) if r >= 0 else -int(x)) for r, x in zip(raw, low, strict=True)]
            extra -= step
        vals = [decimal.Decimal(r).scaleb(-scale) for r in raw]
        return [str(v) for v in vals], pa.array(vals, pa.decimal128(precision, scale))

    return gen


def _nullable(inner: Gen) -> Gen:
    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        text, arr = inner(rng, n)
        nulls = rng.random(n) < 0.3
        text = ["\\N" if z else t for t, z in zip(text, nulls, strict=True)]
        values = [None if z else v for v, z in zip(arr.to_pylist(), nulls, strict=True)]
        return text, pa.array(values, arr.type)

    return gen


def _array(inner_type: str) -> Gen:
    def gen(rng: np.random.Generator, n: int) -> tuple[list[str], pa.Array]:
        lens = [int(x) for x in rng.integers(0, 5, n)]
        total = sum(lens)
        if inner_type == "String":
            items: list[Any] = random_strings(rng, total, max_len=8)
            rendered = [quoted(v) for v in items]
            at: pa.DataType = pa.binary()
        else:
            items = [int(x) for x in rng.integers(0, 65536, total)]
            rendered = [str(v) for v in items]
            at = pa.uint16()
        text, values, pos = [], [], 0
        for ln in lens:
            text.append("[" + ",".join(rendered[pos:pos + ln]) + "]")
            values.append(items[pos:pos + ln])
            pos += ln
        return text, pa.array(values, pa.list_(at))

    return gen


def generator(type_text: str) -> Gen:
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", type_text)
    assert m, type_text
    head, args = m.group(1), m.group(2)
    simple: dict[str, Gen] = {
        "Int8": _ints(8, True), "Int16": _ints(16, True), "Int32": _ints(32, True), "Int64": _ints(64, True),
        "UInt8": _ints(8, False), "UInt16": _ints(16, False), "UInt32": _ints(32, False),
        "UInt64": _ints(64, False), "Float32": _floats(True), "Float64": _floats(False), "Date": _date,
        "DateTime": _datetime, "String": _string, "UUID": _uuid,
    }
    if head in simple:
        return simple[head]
    if head == "FixedString":
        return _fixed(int(args))
    if head in ("Enum8", "Enum16"):
        return _enum(type_text, 8 if head == "Enum8" else 16)
    if head == "Decimal":
        p, s = (int(x) for x in args.split(","))
        return _decimal(p, s)
    if head == "Nullable":
        return _nullable(generator(args))
    if head == "Array":
        return _array(args)
    if head == "LowCardinality":
        return _string
    raise ValueError(type_text)


def make_rows(columns: list[tuple[str, str]], n: int, seed: int = 0) -> tuple[pa.Table, bytes]:
    """``n`` rows for ``columns`` (``k`` must be UInt64: it becomes 0..n-1, the sort key)."""
    rng = np.random.default_rng(seed)
    texts: list[list[str]] = []
    arrays: list[pa.Array] = []
    for name, type_text in columns:
        if name == "k":
            vals = list(range(n))
            texts.append([str(v) for v in vals])
            arrays.append(pa.array(vals, pa.uint64()))
            continue
        text, arr = generator(type_text)(rng, n)
        texts.append(text)
        arrays.append(arr)
    tsv = "".join("\t".join(row) + "\n" for row in zip(*texts, strict=True)).encode() if n else b""
    return pa.Table.from_arrays(arrays, names=[c for c, _ in columns]), tsv


def ddl_columns(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"`{n}` {t}" for n, t in columns)
