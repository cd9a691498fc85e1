"""``Array(String)`` text fields (TSV/CSV inserts): the vectorised path for simple quoted lists and the
literal parser for everything else both give back exactly the strings that were written."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from replicad.server import text_values
from replicad.server.text_values import parse_array_text

_text = st.text(alphabet=st.sampled_from(list("ab ,'\\[]xé")), max_size=6)
_rows = st.lists(st.lists(_text, max_size=4), min_size=1, max_size=30)


def _literal(items: list[str], spaced: bool) -> bytes:
    sep = ", " if spaced else ","
    quoted = ("'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'" for s in items)
    return ("[" + sep.join(quoted) + "]").encode()


@settings(deadline=None)
@given(_rows, st.booleans())
def test_any_strings_come_back_exactly(rows: list[list[str]], spaced: bool) -> None:
    arr = pa.array([_literal(r, spaced) for r in rows], pa.binary())
    got = parse_array_text(arr, "Array(String)").to_pylist()
    assert got == [[s.encode() for s in r] for r in rows]


@settings(deadline=None)
@given(st.lists(st.lists(st.text(alphabet="abc xyz0", max_size=5), max_size=4), min_size=1, max_size=30),
       st.booleans())
def test_simple_lists_take_the_vectorised_path(rows: list[list[str]], spaced: bool) -> None:
    arr = pa.array([_literal(r, spaced) for r in rows] + [None], pa.binary())
    fast = text_values._flat_quoted(arr)
    assert fast is not None
    assert fast.to_pylist() == [[s.encode() for s in r] for r in rows] + [None]
    assert parse_array_text(arr, "Array(String)").to_pylist() == fast.to_pylist()
