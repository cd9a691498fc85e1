"""The C splitter of JSONEachRow blocks (``replicad.native._jsonsplit``) against Python's ``json`` module:
whenever it answers, each column holds what the row-by-row reader hands the type converters (a string's
UTF-8 bytes, a number's text, ``1``/``0`` for booleans, no value for null or an omitted key); it answers for
every block of flat objects, and declines what only the general readers may judge (then their answer,
value or error, stands)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replicad.server.formats import _json_split

NAMES = ("a", "b", "long_name_c", "d")
KEYS = tuple(n.encode() for n in NAMES)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=12),
)


def _text(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return b"1" if v else b"0"
    if isinstance(v, str):
        return v.encode()
    return json.dumps(v).encode()  # a number's text as written (json.dumps writes repr for floats)


def _split(block: bytes, keys: tuple[bytes, ...] = KEYS, skip_unknown: bool = False
           ) -> list[list[bytes | None]] | None:
    got = _json_split(block, keys, skip_unknown)
    if got is None:
        return None
    for a in got:
        a.validate(full=True)
    return [a.to_pylist() for a in got]


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.dictionaries(st.sampled_from(NAMES), scalars), min_size=1, max_size=20),
       ascii_only=st.booleans(), seed=st.integers(0, 2**32))
@example(rows=[{"a": "x\"y\\z\n\t\u00e9\U0001f600/"}], ascii_only=True, seed=0)
@example(rows=[{}], ascii_only=False, seed=0)
def test_flat_objects_match_the_json_module(rows: list[dict[str, Any]], ascii_only: bool, seed: int) -> None:
    rng = random.Random(seed)
    lines = []
    for row in rows:
        items = list(row.items())
        rng.shuffle(items)  # any key order
        sep = rng.choice([(",", ":"), (", ", ": "), (" ,\t", " :  ")])
        lines.append(rng.choice(["", " ", "\t"]) + json.dumps(dict(items), ensure_ascii=ascii_only,
                                                                separators=sep))
    block = (rng.choice(["\n", "\r\n", "\n\n"]).join(lines) + rng.choice(["", "\n"])).encode()
    expected = [[_text(row.get(n)) for row in rows] for n in NAMES]
    assert _split(block) == expected


def test_raw_bytes_and_quoted_numbers_pass_through() -> None:
    # ClickHouse writes strings' bytes as they are (not UTF-8 validated) and 64-bit integers quoted
    block = b'{"a":"\xff\xfe","b":"18446744073709551615","d":-1.5e-3}\n'
    assert _split(block) == [[b"\xff\xfe"], [b"18446744073709551615"], [None], [b"-1.5e-3"]]


@pytest.mark.parametrize("block", [
    b'{"a":[1,2]}\n',                      # arrays: pyarrow's reader
    b'{"a":{"x":1}}\n',                    # objects
    b'{"a":1,"a":2}\n',                    # a key twice
    b'{"zz":1}\n',                         # unknown key
    b'{"a\\u0062":1}\n',                   # escaped key
    b'{"a":"x\ty"}\n',                     # raw control character in a string (invalid JSON)
    b'{"a":"\\ud800"}\n',                  # lone surrogate
    b'{"a":"\\q"}\n',                      # unknown escape
    b'{"a":1\n',                           # unterminated object
    b'{"a":"x}\n',                         # unterminated string
    b'{"a":1}{"a":2}x\n',                  # trailing junk
    b'[{"a":1}]\n',                        # not an object
    b'{"a":tru}\n',                        # bad literal
    b'{"a":1,}\n',                         # trailing comma
    b'{"a":01}\n',                         # not JSON numbers
    b'{"a":1.}\n',
    b'{"a":-}\n',
    b'{"a":1e}\n',
    b'{"a":1.2.3}\n',
    b'{"a":+1}\n',
    b'  \n\n',                             # no rows
    b'',
])
def test_declines_what_the_general_readers_judge(block: bytes) -> None:
    assert _split(block) is None


def test_unknown_scalar_keys_are_skipped_when_asked() -> None:
    block = b'{"zz":[1],"a":1}\n'
    assert _split(block, skip_unknown=True) is None  # a nested unknown value: the general readers
    block = b'{"zz":"q","a":1,"yy":null,"xx":true}\n{"b":"2"}\n'
    assert _split(block, skip_unknown=True) == [[b"1", None], [None, b"2"], [None, None], [None, None]]
    assert _split(block) is None


@given(st.binary(max_size=200))
@settings(max_examples=300, deadline=None)
@example(b'{"a":"\\u')
@example(b'{"a":"\\ud83d\\u')
@example(b'{"a":"\\ud83d\\ude0')
def test_hostile_blocks_never_crash(block: bytes) -> None:
    got = _split(block)
    if got is None:
        return
    # whatever it answers for, the json module reads the same way (raw bytes kept as ClickHouse does)
    lines = [line for line in block.splitlines() if line.strip()]
    rows = [json.loads(line.decode("utf-8", "surrogateescape")) for line in lines]
    assert all(isinstance(r, dict) for r in rows)
    assert [len(c) for c in got] == [len(rows)] * len(KEYS)


@pytest.mark.parametrize("which", ["json", "tsv"])
def test_no_stray_bytes_past_the_values(which: str) -> None:
    """The data buffers' slack is zeroed: allocator leftovers (other requests' bytes) and copied-ahead body
    bytes never ride along when a buffer is serialised whole (Arrow IPC writes it so)."""
    from replicad.native import _jsonsplit, _tsvsplit

    def dirty(n: int) -> bytearray:
        return bytearray(b"\xaa" * n)

    if which == "json":
        got = _jsonsplit.split(b'{"a":"xy","b":1}\n{"a":"z"}\n', KEYS, False, dirty)
        assert got is not None
        pairs = [(o, d) for o, d, _ in got]
    else:
        tsv = _tsvsplit.split(b"xy\t1\nz\t2\n", 2, True, dirty)
        assert tsv is not None
        pairs = [(t[0], t[1]) for t in tsv]
    for offsets, data in pairs:
        end = int.from_bytes(bytes(offsets)[-4:], "little")
        assert bytes(data)[end:] == b"\0" * (len(data) - end)
