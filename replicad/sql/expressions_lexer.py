"""Tokenizer for ClickHouse SQL text (the subset replicad parses: DDL, statements, expressions).

Token kinds follow ClickHouse's lexer: bare words, numbers, string literals, quoted identifiers and
punctuation.  Whitespace and comments (``--`` to end of line, ``/* ... */``) are skipped.  Every token
keeps its source span, so callers can slice the original text (DDL keeps user text verbatim).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from replicad.errors import SyntaxError_


class T(Enum):
    WORD = "word"
    NUMBER = "number"
    STRING = "string"
    QUOTED_ID = "quoted identifier"
    PUNCT = "punctuation"
    END = "end of query"


@dataclass(frozen=True, slots=True)
class Token:
    kind: T
    text: str  # the source text of the token
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind is T.WORD and self.text.upper() in words

    def is_punct(self, *ps: str) -> bool:
        return self.kind is T.PUNCT and self.text in ps


_PUNCT3 = ("<=>",)
_PUNCT2 = ("->", "<=", ">=", "!=", "<>", "==", "||", "::")
_PUNCT1 = "()[]{},;.*+-/%?:=<>@"


def _is_word_start(c: str) -> bool:
    return c == "_" or (c.isascii() and c.isalpha()) or not c.isascii()


def _is_word_char(c: str) -> bool:
    return c == "_" or (c.isascii() and c.isalnum()) or not c.isascii()


def _error(text: str, pos: int, msg: str) -> SyntaxError_:
    snippet = text[pos : pos + 40]
    return SyntaxError_(f"Syntax error at position {pos} ({snippet!r}): {msg}")


def _scan_number(text: str, i: int) -> int:
    n = len(text)
    j = i
    hexadecimal = False
    if text.startswith(("0x", "0X", "0b", "0B"), j) and j + 2 < n:
        hexadecimal = text[j + 1] in "xX"
        j += 2
        while j < n and (text[j] in "0123456789abcdefABCDEF" if hexadecimal else text[j] in "01"):
            j += 1
    else:
        while j < n and text[j].isdigit():
            j += 1
    if j < n and text[j] == ".":
        j += 1
        while j < n and (text[j] in "0123456789abcdefABCDEF" if hexadecimal else text[j].isdigit()):
            j += 1
    if j + 1 < n and text[j] in ("pP" if hexadecimal else "eE"):
        k = j + 1
        if text[k] in "+-":
            k += 1
        if k < n and text[k].isdigit():
            j = k
            while j < n and text[j].isdigit():
                j += 1
    if j < n and _is_word_char(text[j]):
        raise _error(text, i, "wrong number")
    return j


def _scan_quoted(text: str, i: int, quote: str) -> int:
    """End index (exclusive) of a quoted token starting at ``i``: backslash escapes and doubled quotes."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == quote:
            if j + 1 < n and text[j + 1] == quote:
                j += 2
                continue
            return j + 1
        j += 1
    raise _error(text, i, f"unterminated {quote}-quoted token")


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens; the list always ends with a ``T.END`` token."""
    out: list[Token] = []
    n = len(text)
    i = 0
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise _error(text, i, "unterminated comment")
            i = j + 2
            continue
        if c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit() and not _after_dot_access(out)):
            j = _scan_number(text, i)
            out.append(Token(T.NUMBER, text[i:j], i, j))
            i = j
            continue
        if _is_word_start(c) or c == "$":
            j = i + 1
            while j < n and (_is_word_char(text[j]) or text[j] == "$"):
                j += 1
            out.append(Token(T.WORD, text[i:j], i, j))
            i = j
            continue
        if c == "'":
            j = _scan_quoted(text, i, "'")
            out.append(Token(T.STRING, text[i:j], i, j))
            i = j
            continue
        if c in "`\"":
            j = _scan_quoted(text, i, c)
            out.append(Token(T.QUOTED_ID, text[i:j], i, j))
            i = j
            continue
        for p in (*_PUNCT3, *_PUNCT2):
            if text.startswith(p, i):
                out.append(Token(T.PUNCT, p, i, i + len(p)))
                i += len(p)
                break
        else:
            if c in _PUNCT1:
                out.append(Token(T.PUNCT, c, i, i + 1))
                i += 1
            else:
                raise _error(text, i, f"unexpected character {c!r}")
    out.append(Token(T.END, "", n, n))
    return out


def _after_dot_access(out: list[Token]) -> bool:
    """``t.1`` is tuple access, not the number ``.1``: a number may not start with '.' after an operand."""
    if not out:
        return False
    last = out[-1]
    return last.kind in (T.WORD, T.QUOTED_ID, T.NUMBER, T.STRING) or last.is_punct(")", "]")


_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "0": "\0", "a": "\a", "v": "\v",
            "e": "\x1b"}


def unquote(token_text: str) -> str:
    """Value of a quoted token (``'it''s'``, ``'a\\tb'``, `` `x` ``), like readQuotedStringWithSQLStyle."""
    quote = token_text[0]
    body = token_text[1:-1]
    out: list[str] = []
    i = 0
    n = len(body)
    while i < n:
        c = body[i]
        if c == "\\" and i + 1 < n:
            nxt = body[i + 1]
            if nxt == "x" and i + 3 < n and _is_hex(body[i + 2 : i + 4]):
                out.append(chr(int(body[i + 2 : i + 4], 16)))
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        if c == quote and i + 1 < n and body[i + 1] == quote:
            out.append(quote)
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in s)


def quote_string(s: str, quote: str = "'") -> str:
    """ClickHouse's writeQuoted / writeBackQuotedString: backslash escapes for specials and the quote."""
    return quote + escape(s, quote) + quote


_ESCAPE_MAP = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0", "\\": "\\\\"}


def escape(s: str, quote: str = "'") -> str:
    """ClickHouse's writeAnyEscapedString<quote> (also ``escape`` of text formats with quote ``'``)."""
    if not any(ch in s for ch in "\b\f\n\r\t\0\\" + quote):
        return s
    return "".join(_ESCAPE_MAP.get(ch, "\\" + ch if ch == quote else ch) for ch in s)


def unescape(s: str) -> str:
    """Inverse of :func:`escape` (ClickHouse's readEscapedString)."""
    if "\\" not in s:
        return s
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(_ESCAPES.get(s[i + 1], s[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_bare_identifier(name: str) -> bool:
    """True if ClickHouse prints ``name`` without backquotes (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    if not name or not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        return False
    return all(ch.isascii() and (ch.isalnum() or ch == "_") for ch in name)


def back_quote_if_needed(name: str) -> str:
    return name if is_bare_identifier(name) else quote_string(name, "`")
