"""ClickHouse text-format values → Arrow arrays the types can convert (``DataType.convert`` reads text).

* :func:`tsv_unescape` — TabSeparated escaping (``\\t``, ``\\\\``, ``\\xHH`` …; the field ``\\N`` is NULL);
* :func:`parse_array_text` — array literals as ClickHouse writes them inside TSV/CSV (``[1,2]``,
  ``['a','it\\'s']``, ``[1,NULL]``, ``[[1],[]]``) into (nested) ``list<binary>`` of element texts;
* :func:`zero_dates` — 18.16's zero Date/DateTime spelling ``0000-00-00[ 00:00:00]``;
* :func:`json_kind` / :func:`text_kind` — the Arrow shapes used to read a column's JSON / text values.
Escaping is vectorised; one-level array literals are split in C, nested ones by a small parser.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from replicad.errors import BadInputError
from replicad.native import _arraytext

_LETTER_ESCAPES = (("\\t", "\t"), ("\\n", "\n"), ("\\r", "\r"), ("\\0", "\0"), ("\\b", "\b"), ("\\f", "\f"),
                   ("\\a", "\a"), ("\\v", "\v"), ("\\e", "\x1b"))
_UNESCAPE = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f", "a": "\a", "v": "\v",
             "e": "\x1b"}
_HEX_DIGITS = b"0123456789abcdefABCDEF"


def base_type(type_name: str) -> str:
    """The type without ``Nullable(…)`` / ``LowCardinality(…)`` wrappers."""
    name = type_name.strip()
    while name.startswith(("Nullable(", "LowCardinality(")) and name.endswith(")"):
        name = name[name.index("(") + 1:-1].strip()
    return name


def array_element(type_name: str) -> str | None:
    name = base_type(type_name)
    return name[len("Array("):-1].strip() if name.startswith("Array(") and name.endswith(")") else None


_WIDE_INTS = frozenset({"UInt64", "Int64", "UInt128", "Int128", "UInt256", "Int256"})


def json_kind(type_name: str, quoted_ints: bool = False) -> pa.DataType:
    """The JSON value type pyarrow is told to expect for a column; ``quoted_ints``: integers of 64 bits and
    more given as JSON strings (``"k":"123"``), as ClickHouse writes them."""
    element = array_element(type_name)
    if element is not None:
        return pa.list_(json_kind(element, quoted_ints))
    name = base_type(type_name)
    if quoted_ints and name in _WIDE_INTS:
        return pa.string()
    if name.startswith("UInt"):
        return pa.uint64()
    if name.startswith("Int"):
        return pa.int64()
    if name.startswith("Float"):
        return pa.float64()
    return pa.string()  # strings, dates, date-times, UUIDs, enums, decimals: JSON strings


def text_kind(type_name: str) -> pa.DataType:
    """Values as text: ``binary`` for scalars, nested ``list<…binary>`` for arrays."""
    element = array_element(type_name)
    return pa.list_(text_kind(element)) if element is not None else pa.binary()


# ---- TabSeparated escaping -----------------------------------------------------------------------------


def tsv_unescape(arr: pa.Array) -> pa.Array:
    """ClickHouse TabSeparated unescaping of a binary column; the field ``\\N`` becomes NULL."""
    if not pa.types.is_binary(arr.type):
        arr = arr.cast(pa.binary())
    if not pc.any(pc.match_substring(arr, "\\")).as_py():
        return arr
    nulls = pc.equal(arr, b"\\N")
    if pc.any(nulls).as_py():  # a Nullable column whose only backslashes are its NULLs: nothing to unescape
        without = pc.if_else(nulls, pa.scalar(None, pa.binary()), arr)
        if not pc.any(pc.match_substring(without, "\\")).as_py():
            return without
    parts = pc.split_pattern(arr, "\\\\")  # left to right, like the escape parser: `\\` is one backslash
    flat = parts.flatten()
    for esc, ch in _LETTER_ESCAPES:
        flat = pc.replace_substring(flat, esc, ch)
    if pc.any(pc.match_substring(flat, "\\x")).as_py():
        flat = pa.array([_hex_unescape(v) for v in flat.to_pylist()], pa.binary())  # rare: \xHH escapes
    flat = pc.replace_substring_regex(flat, r"\\(.)", r"\1")  # any other escaped character stands for itself
    rebuilt = pa.ListArray.from_arrays(parts.offsets, flat)
    out = pc.binary_join(rebuilt, b"\\")
    if pc.any(nulls).as_py():
        out = pc.if_else(nulls, pa.scalar(None, pa.binary()), out)
    return out


def _hex_unescape(v: bytes | None) -> bytes | None:
    if v is None or b"\\x" not in v:
        return v
    out, i = bytearray(), 0
    while i < len(v):
        if v[i:i + 2] == b"\\x" and len(v) >= i + 4:
            try:
                out.append(int(v[i + 2:i + 4], 16))
                i += 4
                continue
            except ValueError:
                pass
        out.append(v[i])
        i += 1
    return bytes(out)


_ZERO_DATE = b"0000-00-00"
#: a text column's data buffer up to this size is searched for the zero date with one bytes search (the
#: two compute calls of the prefix test cost ~15 µs, a 100-row block's search well under one)
ZERO_DATE_SCAN_BYTES = 1 << 16


def zero_dates(arr: pa.Array, epoch: str) -> pa.Array:
    """ClickHouse 18.16 writes the zero Date/DateTime as ``0000-00-00[ 00:00:00]``: read it as ``epoch``."""
    buffers = arr.buffers()
    data = buffers[2] if len(buffers) == 3 else None
    if data is not None and data.size <= ZERO_DATE_SCAN_BYTES and _ZERO_DATE not in data.to_pybytes():
        return arr  # a small block's text searched at once: no compute call
    if not pc.any(pc.starts_with(arr, "0000-00-00")).as_py():  # a literal prefix test is much cheaper
        return arr
    zero = pc.fill_null(pc.match_substring_regex(arr, r"^0000-00-00( 00:00:00)?$"), False)
    value = epoch if pa.types.is_string(arr.type) else epoch.encode()
    return pc.if_else(zero, pa.scalar(value, arr.type), arr)


# ---- array literals --------------------------------------------------------------------------------------


def parse_array_text(arr: pa.Array, type_name: str, *, native: bool = True) -> pa.Array:
    """``[…]`` texts → (nested) list arrays of element texts (``None`` for ``NULL``); nulls stay null.

    One-level arrays are split in C (:mod:`replicad.native._arraytext`); nested ones, and every row the C
    parser does not accept, go through :func:`_literal` (``native=False``: all rows do, the reference).
    Raises ``ValueError(row, message)`` for a malformed literal (row relative to ``arr``).
    """
    element = array_element(type_name)
    if element is None:
        raise ValueError(0, f"{type_name} is not an array type")
    if not pa.types.is_binary(arr.type):
        arr = arr.cast(pa.binary())
    if native and array_element(element) is None:
        got = _split_flat(arr)
        if got is not None:
            return got
    return _parse_rows(arr, type_name)


def _split_flat(arr: pa.Array) -> pa.Array | None:
    """A binary column of one-level literals as ``list<binary>``; None when some row needs the general
    parser (nested brackets), ValueError(row, message) when a row is malformed."""
    if not len(arr):
        return pa.array([], pa.list_(pa.binary()))
    validity, offsets, data = arr.buffers()
    if data is None:  # every row null or empty
        data = pa.py_buffer(b"")
    got = _arraytext.split_flat(offsets, data, validity, arr.offset, len(arr))
    if isinstance(got, int):
        _literals(arr.slice(got, 1), row0=got)  # raises for a malformed row
        return None  # the row is fine for the general parser (a nested literal)
    list_offsets, elem_offsets, elem_data, elem_validity, count = got
    values = pa.Array.from_buffers(pa.binary(), count, [
        None if elem_validity is None else pa.py_buffer(elem_validity), pa.py_buffer(elem_offsets),
        pa.py_buffer(elem_data)])
    list_type, row_offsets = pa.list_(pa.binary()), pa.py_buffer(list_offsets)
    if not arr.null_count:
        return pa.Array.from_buffers(list_type, len(arr), [None, row_offsets], children=[values])
    return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(arr) + 1, [None, row_offsets]),
                                    values, type=list_type, mask=arr.is_null())


def _parse_rows(arr: pa.Array, type_name: str) -> pa.Array:
    """The reference parser, row by row."""
    values = _literals(arr)
    try:
        return pa.array(values, text_kind(type_name))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(0, f"array nesting does not match {type_name}: {e}") from None


def _literals(arr: pa.Array, row0: int = 0) -> list[Any]:
    """Each row's literal as (nested) lists of element texts (``row0``: the first row's number in errors)."""
    values: list[Any] = []
    for row, v in enumerate(arr.to_pylist()):
        if v is None:
            values.append(None)
            continue
        try:
            parsed, end = _literal(v, _skip_ws(v, 0))
            if _skip_ws(v, end) != len(v) or not isinstance(parsed, list):
                raise ValueError("unexpected text after the array")
        except (ValueError, IndexError) as e:
            raise ValueError(row0 + row, f"cannot parse array {v[:80]!r}: {e}") from None
        values.append(parsed)
    return values


def _skip_ws(s: bytes, i: int) -> int:
    while i < len(s) and s[i] in b" \t\r\n":
        i += 1
    return i


def _literal(s: bytes, i: int) -> tuple[Any, int]:
    c = s[i:i + 1]
    if c == b"[":
        items: list[Any] = []
        i = _skip_ws(s, i + 1)
        if s[i:i + 1] == b"]":
            return items, i + 1
        while True:
            item, i = _literal(s, _skip_ws(s, i))
            items.append(item)
            i = _skip_ws(s, i)
            sep = s[i:i + 1]
            if sep == b"]":
                return items, i + 1
            if sep != b",":
                raise ValueError(f"expected ',' or ']' at position {i}")
            i += 1
    if c in (b"'", b'"'):
        return _quoted(s, i)
    j = i
    while j < len(s) and s[j:j + 1] not in (b",", b"]", b"[") and s[j] not in b" \t\r\n":
        j += 1
    word = s[i:j]
    if not word:
        raise ValueError(f"expected a value at position {i}")
    return (None if word == b"NULL" else word), j


def _quoted(s: bytes, i: int) -> tuple[bytes, int]:
    quote = s[i]
    out = bytearray()
    j = i + 1
    while j < len(s):
        ch = s[j]
        if ch == 0x5C and j + 1 < len(s):  # backslash
            nxt = chr(s[j + 1])
            if nxt == "x" and j + 3 < len(s) and all(c in _HEX_DIGITS for c in s[j + 2:j + 4]):
                out.append(int(s[j + 2:j + 4], 16))
                j += 4
                continue
            out += _UNESCAPE.get(nxt, nxt).encode("latin-1") if nxt in _UNESCAPE else bytes([s[j + 1]])
            j += 2
        elif ch == quote:
            if j + 1 < len(s) and s[j + 1] == quote:  # doubled quote
                out.append(quote)
                j += 2
                continue
            return bytes(out), j + 1
        else:
            out.append(ch)
            j += 1
    raise ValueError("unterminated quoted string")


def check_array_rows(arr: pa.Array, type_name: str, column: str, row0: int) -> pa.Array:
    """:func:`parse_array_text` with errors as BadInputError naming the column and the 1-based row."""
    try:
        return parse_array_text(arr, type_name)
    except ValueError as e:
        row, message = e.args if len(e.args) == 2 else (0, str(e))
        raise BadInputError(f"Cannot parse input: column {column}, row {row0 + int(row) + 1}: {message}") \
            from None
