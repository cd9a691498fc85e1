"""Array text fields (TSV/CSV inserts): the C splitter of one-level literals (``replicad.native._arraytext``)
against the reference parser (``parse_array_text(..., native=False)``): the same element texts for every
well-formed literal, the same error (row and message) for every malformed one, on random input."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.server.text_values import parse_array_text

_text = st.text(alphabet=st.sampled_from(list("ab ,'\"\\[]xé\t\n0N")), max_size=6)
_rows = st.lists(st.lists(_text, max_size=4), min_size=1, max_size=30)


def _literal(items: list[str], spaced: bool) -> bytes:
    sep = ", " if spaced else ","
    quoted = ("'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'" for s in items)
    return ("[" + sep.join(quoted) + "]").encode()


def _outcome(arr: pa.Array, type_name: str, native: bool) -> object:
    try:
        return parse_array_text(arr, type_name, native=native).to_pylist()
    except ValueError as e:
        return ("error", *e.args)


def _same(rows: list[bytes | None], type_name: str = "Array(String)") -> object:
    arr = pa.array(rows, pa.binary())
    fast = _outcome(arr, type_name, True)
    assert fast == _outcome(arr, type_name, False)
    if len(rows) > 2:  # a slice (non-zero offset into the buffers) too
        sliced = arr.slice(1, len(rows) - 2)
        assert _outcome(sliced, type_name, True) == _outcome(sliced, type_name, False)
    return fast


@settings(deadline=None)
@given(_rows, st.booleans())
def test_any_strings_come_back_exactly(rows: list[list[str]], spaced: bool) -> None:
    arr = pa.array([_literal(r, spaced) for r in rows], pa.binary())
    got = parse_array_text(arr, "Array(String)").to_pylist()
    assert got == [[s.encode() for s in r] for r in rows]
    assert got == parse_array_text(arr, "Array(String)", native=False).to_pylist()


# pieces of array literals, well-formed and not: random sequences of them make valid literals, truncated
# ones, unbalanced quotes and brackets, stray text, nesting, escapes at the end of the field …
_piece = st.sampled_from(["[", "]", ",", " ", "'", '"', "\\", "\\'", "\\x41", "\\x4", "\\xg1", "\\t", "''",
                          "NULL", "1", "-2.5", "ab", "é", "\t", "\n", "\r", "[]", "x"])
_field = st.lists(_piece, max_size=12).map(lambda ps: "".join(ps).encode())
_wrapped = _field.map(lambda f: b"[" + f + b"]")


@settings(deadline=None, max_examples=400)
@given(st.lists(st.one_of(_field, _wrapped, st.none()), min_size=1, max_size=8))
@example([b"[1,2", b"[]"])
@example([b"['a'] x"])
@example([b"['\\x41\\x4'"])
@example([b"[[1],[2]]", None])
@example([None, b"[NULL, 'NULL' ,x]", b" [ ] "])
def test_random_fields_agree_with_the_reference(rows: list[bytes | None]) -> None:
    _same(rows)


@settings(deadline=None, max_examples=150)
@given(st.lists(st.one_of(_wrapped, st.none()), min_size=1, max_size=8),
       st.sampled_from(["Array(UInt32)", "Array(Nullable(Int64))", "Array(Array(String))"]))
def test_other_element_types_agree_with_the_reference(rows: list[bytes | None], type_name: str) -> None:
    _same(rows, type_name)


@settings(deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-2**40, 2**40)), max_size=5)),
                min_size=1, max_size=40), st.booleans())
def test_numbers_and_nulls(rows: list[list[int | None] | None], spaced: bool) -> None:
    sep = " , " if spaced else ","
    texts = [None if r is None else f"[{sep.join('NULL' if x is None else str(x) for x in r)}]".encode()
             for r in rows]
    want = [None if r is None else [None if x is None else str(x).encode() for x in r] for r in rows]
    assert _same(texts, "Array(Nullable(Int64))") == want


@pytest.mark.parametrize("text,row", [
    (b"[1,2", 1), (b"['a'] x", 1), (b"['a'", 1), (b"[,]", 1), (b"['a\\']", 1), (b"1", 1), (b"", 1),
    (b"[1 2]", 1), (b"[1,]", 1), (b"]", 1), (b"[\"a]", 1),
])
def test_malformed_rows_name_their_row(text: bytes, row: int) -> None:
    arr = pa.array([b"[1]", text, b"[2]"], pa.binary())
    with pytest.raises(ValueError) as info:
        parse_array_text(arr, "Array(String)")
    assert info.value.args[0] == row
    assert "cannot parse array" in info.value.args[1]


def test_large_column_and_slices() -> None:
    rows = [b"[" + b",".join(b"'w%d'" % j for j in range(i % 5)) + b"]" for i in range(100_000)]
    arr = pa.array(rows, pa.binary())
    got = parse_array_text(arr, "Array(String)")
    assert got.to_pylist()[:3] == [[], [b"w0"], [b"w0", b"w1"]]
    assert len(got.flatten()) == sum(i % 5 for i in range(100_000))
    assert parse_array_text(arr.slice(99_999), "Array(String)").to_pylist() == [[b"w0", b"w1", b"w2", b"w3"]]
