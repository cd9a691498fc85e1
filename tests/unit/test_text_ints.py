"""Integer text columns (TSV/CSV/JSON-as-text inserts): the C parser of plain decimal texts
(``replicad.native._textints`` via ``numeric.plain_integers``) against Python's own reading of the same texts,
and the types' conversion with it against a model (the value, or a rejection naming the first bad row)."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.datatypes import parse_type
from replicad.datatypes.base import BadValue
from replicad.datatypes.numeric import plain_integers

_digits = st.text(alphabet="0123456789", min_size=1, max_size=22)
# 8 digits and more are checked and parsed eight at a time: one bad byte anywhere in such a text
_spoiled = st.tuples(st.text(alphabet="0123456789", min_size=8, max_size=20), st.integers(0, 19),
                     st.sampled_from([":", "/", " ", "x", "\x7f", "\xb0", "\u0660", "-", "+"])).map(
    lambda t: t[0][:t[1] % len(t[0])] + t[2] + t[0][t[1] % len(t[0]) + 1:])
_texts = st.one_of(_digits, _digits.map(lambda d: "-" + d), st.text(alphabet="0123456789-+ x", max_size=6),
                   st.integers(-2**64, 2**64).map(str), _spoiled)


def _model(text: str, target: pa.DataType) -> int | None:
    signed, bits = pa.types.is_signed_integer(target), target.bit_width
    if not re.fullmatch(r"-?[0-9]+" if signed else r"[0-9]+", text):
        return None
    v = int(text)
    lo, hi = (-2**(bits - 1), 2**(bits - 1) - 1) if signed else (0, 2**bits - 1)
    return v if lo <= v <= hi else None


_TARGETS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


@settings(deadline=None, max_examples=500)
@given(st.lists(st.one_of(st.none(), _texts, st.integers(-2**16, 2**16).map(str)), min_size=1, max_size=20),
       st.sampled_from(_TARGETS), st.integers(0, 3))
@example(["18446744073709551615", "0", None], pa.uint64(), 0)
@example(["-9223372036854775808", "9223372036854775807"], pa.int64(), 0)
@example(["9223372036854775808"], pa.int64(), 0)
@example(["-128", "127", "255"], pa.int8(), 0)
@example(["-0", "007"], pa.int32(), 0)
def test_plain_integers_match_python(texts: list[str | None], target: pa.DataType, cut: int) -> None:
    arr = pa.array([None if t is None else t.encode() for t in texts], pa.binary())
    arr = arr.slice(min(cut, len(texts)))
    rows = arr.to_pylist()
    want = [None if t is None else _model(t.decode(), target) for t in rows]
    got = plain_integers(arr, target)
    if not len(arr):
        assert got is None  # nothing to parse: the general path
    elif any(w is None and t is not None for w, t in zip(want, rows, strict=True)):
        assert got is None
    else:
        assert got is not None and got.type == target and got.to_pylist() == want


@settings(deadline=None, max_examples=300)
@given(st.lists(st.one_of(st.none(), _texts), min_size=1, max_size=20),
       st.sampled_from(["UInt8", "UInt32", "UInt64", "Int8", "Int32", "Int64"]))
def test_int_conversion_from_text(texts: list[str | None], type_name: str) -> None:
    dt = parse_type(f"Nullable({type_name})")
    arr = pa.array([None if t is None else t.encode() for t in texts], pa.binary())
    lo, hi = dt.inner.min, dt.inner.max  # type: ignore[attr-defined]
    model = []
    for t in texts:
        s = None if t is None else t.strip()
        ok = s is None or re.fullmatch(r"[+-]?[0-9]+", s) is not None
        model.append(None if s is None else int(s) if ok else "bad")
    # texts that are no integer are reported before values out of range
    bad = [i for i, v in enumerate(model) if v == "bad"] or \
        [i for i, v in enumerate(model) if isinstance(v, int) and not lo <= v <= hi]
    if bad:
        with pytest.raises(BadValue) as info:
            dt.convert(arr, "UTC")
        assert info.value.row == bad[0]
    else:
        assert dt.convert(arr, "UTC").to_pylist() == model
