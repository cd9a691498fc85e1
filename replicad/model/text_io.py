"""ClickHouse's text-format primitives used by the ZooKeeper znode records (IO/ReadHelpers, IO/WriteHelpers).

The znode texts are built with ClickHouse's ``WriteBuffer << …`` idioms, whose meanings are:

* a plain ``String`` is written raw and read back up to the next TAB or LF (``readString``);
* ``escape`` writes ``writeEscapedString`` (``\\b \\f \\n \\r \\t \\0 \\\\ \\'`` are escaped) and reads
  with ``readEscapedString`` (also ``\\xHH``, ``\\N`` = nothing, ``\\a \\e \\v``; ``\\<other>`` = that char);
* ``quote`` wraps the escaped text in single quotes; a vector of strings is ``['a','b']``;
* integers are decimal with an optional sign; ``LocalDateTime`` is ``YYYY-MM-DD hh:mm:ss`` in the server
  time zone.

Everything works on bytes (sizes inside ALTER_METADATA entries are byte counts); decoded fields are ``str``
with ``surrogateescape`` so arbitrary bytes survive a parse / print round trip.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import TypeVar
from zoneinfo import ZoneInfo

from replicad.errors import ZnodeFormatError

K = TypeVar("K")
V = TypeVar("V")

_ENC = "utf-8"
_ERRORS = "surrogateescape"

_ESCAPE_MAP = {
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\0": "\\0",
    "\\": "\\\\",
    "'": "\\'",
}
_ESCAPE_RE = re.compile("[\b\f\n\r\t\0\\\\']")
_UNESCAPE = {
    ord("a"): b"\a",
    ord("b"): b"\b",
    ord("e"): b"\x1b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
    ord("0"): b"\0",
}
_DATETIME_RE = re.compile(rb"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
_INT_RE = re.compile(rb"[-+]?\d+")
_UUID_RE = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def decode(b: bytes) -> str:
    return b.decode(_ENC, _ERRORS)


def encode(s: str) -> bytes:
    return s.encode(_ENC, _ERRORS)


def escape(s: str) -> str:
    """``writeEscapedString`` (quote character ``'``)."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPE_MAP[m.group(0)], s)


def quote(s: str) -> str:
    """``writeQuoted(String)``: ``'`` + escaped + ``'``."""
    return "'" + escape(s) + "'"


def quote_list(items: tuple[str, ...] | list[str]) -> str:
    """``writeQuoted(std::vector<String>)``: ``['a','b']``."""
    return "[" + ",".join(quote(x) for x in items) + "]"


def check_raw(value: str, what: str) -> str:
    """Fields written raw (part names, replica names) must not contain the TAB/LF that end them on reading."""
    if "\n" in value or "\t" in value:
        raise ZnodeFormatError(f"{what} {value!r} contains a TAB or LF and cannot be written as text")
    return value


@lru_cache(maxsize=32)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def format_datetime(unix_seconds: int, tz: str = "UTC") -> str:
    """``LocalDateTime(t)`` in time zone ``tz``; 0 means "now", as ClickHouse's writers do."""
    if not unix_seconds:
        unix_seconds = int(time.time())
    return datetime.fromtimestamp(unix_seconds, _zone(tz)).strftime("%Y-%m-%d %H:%M:%S")


def parse_datetime(text: bytes, tz: str = "UTC") -> int:
    m = _DATETIME_RE.fullmatch(text)
    if m is None:
        raise ZnodeFormatError(f"Cannot parse date-time {decode(text)!r}: expected YYYY-MM-DD hh:mm:ss")
    y, mo, d, h, mi, s = (int(g) for g in m.groups())
    if y == 0 and mo == 0 and d == 0:
        return 0
    try:
        return int(datetime(y, mo, d, h, mi, s, tzinfo=_zone(tz)).timestamp())
    except ValueError as e:
        raise ZnodeFormatError(f"Cannot parse date-time {decode(text)!r}: {e}") from None


class TextReader:
    """A cursor over a znode's bytes with ReadBuffer-like operations; errors name the record and offset."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes | str, what: str) -> None:
        self.data = encode(data) if isinstance(data, str) else bytes(data)
        self.pos = 0
        self.what = what

    # -- errors -------------------------------------------------------------------------------------------
    def error(self, message: str) -> ZnodeFormatError:
        snippet = self.data[self.pos : self.pos + 40]
        return ZnodeFormatError(
            f"Cannot parse {self.what}: {message} at offset {self.pos} (before {snippet!r})"
        )

    # -- primitives -----------------------------------------------------------------------------------------
    def eof(self) -> bool:
        return self.pos >= len(self.data)

    def peek(self, s: bytes) -> bool:
        return self.data.startswith(s, self.pos)

    def check(self, s: bytes) -> bool:
        """``checkString``: skip ``s`` if it is next."""
        if self.data.startswith(s, self.pos):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: bytes) -> None:
        """``assertString``."""
        if not self.check(s):
            raise self.error(f"expected {s!r}")

    def expect_eof(self) -> None:
        if not self.eof():
            raise self.error("unexpected trailing data")

    def _field_end(self) -> int:
        data, pos = self.data, self.pos
        ends = [i for i in (data.find(b"\t", pos), data.find(b"\n", pos)) if i >= 0]
        return min(ends) if ends else len(data)

    def raw_bytes(self) -> bytes:
        """``readString``: everything up to (not including) the next TAB or LF."""
        end = self._field_end()
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def raw(self) -> str:
        return decode(self.raw_bytes())

    def _unescape(self, stops: tuple[int, ...]) -> tuple[bytes, int, bool]:
        """The bytes from ``pos`` up to the first unescaped byte of ``stops`` (or the end), backslash escapes
        resolved: (bytes, where it stopped: a stop byte or the end, whether the data ended inside an escape).
        """
        data = self.data
        out = bytearray()
        pos = self.pos
        n = len(data)
        while pos < n:
            c = data[pos]
            if c in stops:
                return bytes(out), pos, False
            if c != 0x5C:
                out.append(c)
                pos += 1
                continue
            pos += 1
            if pos >= n:
                return bytes(out), pos, True
            e = data[pos]
            if e == ord("x"):
                out += self._hex_escape(pos)
                pos += 3
            elif e == ord("N"):
                pos += 1
            else:
                out += _UNESCAPE.get(e, bytes([e]))
                pos += 1
        return bytes(out), pos, False

    def escaped(self) -> str:
        """``readEscapedString``: up to the next unescaped TAB or LF."""
        out, self.pos, dangling = self._unescape((0x09, 0x0A))
        if dangling:
            raise self.error("cannot parse escape sequence")
        return decode(out)

    def _hex_escape(self, pos: int) -> bytes:
        """The byte of a ``\\xHH`` escape whose ``x`` is at ``pos``."""
        hex2 = self.data[pos + 1 : pos + 3]
        if len(hex2) == 2 and all(c in b"0123456789abcdefABCDEF" for c in hex2):
            return bytes.fromhex(decode(hex2))
        self.pos = pos
        raise self.error("bad \\x escape")

    def quoted(self) -> str:
        """``readQuotedString`` (single quotes, backslash escapes)."""
        if not self.check(b"'"):
            raise self.error("expected opening quote")
        out, pos, _dangling = self._unescape((0x27,))
        if pos < len(self.data):  # at the closing quote
            self.pos = pos + 1
            return decode(out)
        self.pos = pos
        raise self.error("expected closing quote")

    def quoted_list(self) -> tuple[str, ...]:
        """``readQuoted(std::vector<String>)``: ``['a','b']``."""
        self.expect(b"[")
        items: list[str] = []
        while not self.eof() and not self.peek(b"]"):
            if items:
                self.expect(b",")
            items.append(self.quoted())
        self.expect(b"]")
        return tuple(items)

    def integer(self) -> int:
        """``readIntText``: optional sign and at least one digit."""
        m = _INT_RE.match(self.data, self.pos)
        if m is None:
            raise self.error("expected an integer")
        self.pos = m.end()
        return int(m.group(0))

    def unsigned(self) -> int:
        value = self.integer()
        if value < 0:
            raise self.error(f"expected a non-negative integer, got {value}")
        return value

    def boolean(self) -> bool:
        """``readBoolText``-compatible: ``0``/``1`` (modern servers may also print ``true``/``false``)."""
        for token, value in ((b"1", True), (b"0", False), (b"true", True), (b"false", False)):
            if self.check(token):
                return value
        raise self.error("expected a boolean (0 or 1)")

    def uuid(self) -> str:
        m = _UUID_RE.match(self.data, self.pos)
        if m is None:
            raise self.error("expected a UUID")
        self.pos = m.end()
        return decode(m.group(0)).lower()

    def datetime(self, tz: str) -> int:
        chunk = self.data[self.pos : self.pos + 19]
        value = parse_datetime(chunk, tz)
        self.pos += 19
        return value

    def take(self, n: int) -> bytes:
        """``readStrict``: exactly ``n`` bytes."""
        if self.pos + n > len(self.data):
            raise self.error(f"expected {n} more bytes, only {len(self.data) - self.pos} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def line(self) -> bytes:
        """Everything up to the next LF (not consumed)."""
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            end = len(self.data)
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def counted_pairs(self, read_key: Callable[[], K], read_value: Callable[[], V]) -> list[tuple[K, V]]:
        """``N\n`` then N lines ``<key>\t<value>\n`` (the block numbers of a mutation, a quorum's parts)."""
        count = self.unsigned()
        self.expect(b"\n")
        pairs: list[tuple[K, V]] = []
        for _ in range(count):
            key = read_key()
            self.expect(b"\t")
            pairs.append((key, read_value()))
            self.expect(b"\n")
        return pairs
