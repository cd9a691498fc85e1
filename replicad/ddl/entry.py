"""The texts of ClickHouse's distributed DDL queue (18.16, format version 1).

* a task ``query-NNNNNNNNNN``: ``version: 1\\nquery: <escaped>\\nhosts: ['<id>',…]\\ninitiator: <id>\\n``;
* a host id: ``escapeForFileName(host) + ":" + port`` (``127%2E0%2E0%2E1:9000``); the readable form
  ``host:port`` names the ``shards/<…>`` nodes;
* a status ``finished/<id>``: ``<code>\\n<escaped message>`` (success is exactly ``0\\n``).

18.16's reader is strict (an extra line, a missing final LF or another version is an error); so is this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicad.datatypes import escape_for_file_name, unescape_for_file_name
from replicad.errors import ReplicadError
from replicad.model.text_io import escape
from replicad.sql.expressions_lexer import unescape

CANNOT_PARSE_INPUT = 27
UNKNOWN_FORMAT_VERSION = 287
_27, _287 = CANNOT_PARSE_INPUT, UNKNOWN_FORMAT_VERSION


class EntryFormatError(ReplicadError):
    """A task 18.16 could not read either (code 27 or 287, as 18.16 reports it)."""


def host_id(host: str, port: int) -> str:
    return f"{escape_for_file_name(host)}:{port}"


def split_host_id(text: str) -> tuple[str, int]:
    """``(host, port)`` of a host id (escaped or not); ValueError when there is no ``:port``."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"bad host id {text!r}")
    return unescape_for_file_name(host), int(port)


def readable(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class DDLEntry:
    query: str
    hosts: tuple[str, ...]  # host ids, as listed
    initiator: str = ""

    def to_bytes(self) -> bytes:
        hosts = ",".join("'" + escape(h) + "'" for h in self.hosts)
        text = f"version: 1\nquery: {escape(self.query)}\nhosts: [{hosts}]\ninitiator: {self.initiator}\n"
        return text.encode("utf-8", "surrogateescape")

    @classmethod
    def parse(cls, data: bytes) -> DDLEntry:
        text = data.decode("utf-8", "surrogateescape")
        lines = text.split("\n")
        if not lines[0].startswith("version: "):
            raise EntryFormatError("Cannot parse input: expected version: before: " + text[:60],
                                   code=CANNOT_PARSE_INPUT)
        version = lines[0][len("version: "):]
        if version != "1":
            raise EntryFormatError(f"Unknown DDLLogEntry format version: {version}", code=_287)
        if not text.endswith("\n"):
            raise EntryFormatError("Cannot parse input: expected \\n at end of stream.", code=_27)
        body = lines[1:-1]
        if len(body) < 2 or not body[0].startswith("query: ") or not body[1].startswith("hosts: "):
            raise EntryFormatError("Cannot parse input: expected query: and hosts: lines", code=_27)
        query = unescape(body[0][len("query: "):])
        hosts = _parse_hosts(body[1][len("hosts: "):])
        initiator = ""
        rest = body[2:]
        if rest and rest[0].startswith("initiator: "):
            initiator = rest.pop(0)[len("initiator: "):]
        if rest:
            raise EntryFormatError(f"Cannot parse input: expected eof before: {escape(rest[0])}\\n",
                                   code=CANNOT_PARSE_INPUT)
        return cls(query, hosts, initiator)


def _parse_hosts(text: str) -> tuple[str, ...]:
    if not (text.startswith("[") and text.endswith("]")):
        raise _bad_hosts(text)
    inner = text[1:-1]
    out: list[str] = []
    i = 0
    while i < len(inner):
        if inner[i] != "'":
            raise _bad_hosts(text)
        j = i + 1
        while j < len(inner) and inner[j] != "'":
            j += 2 if inner[j] == "\\" else 1
        if j >= len(inner):
            raise _bad_hosts(text)
        out.append(unescape(inner[i + 1:j]))
        i = j + 1
        if i < len(inner):
            if inner[i] != ",":
                raise EntryFormatError(f"Cannot parse input: bad hosts list {text[:100]!r}",
                                       code=CANNOT_PARSE_INPUT)
            i += 1
    return tuple(out)


def _bad_hosts(text: str) -> EntryFormatError:
    return EntryFormatError(f"Cannot parse input: bad hosts list {text[:100]!r}", code=_27)


# ---- statuses -----------------------------------------------------------------------------------------


def status_text(code: int, message: str = "") -> bytes:
    return f"{code}\n{escape(message)}".encode("utf-8", "surrogateescape")


def exception_message(code: int, text: str, *, before_execution: bool = False) -> str:
    """18.16's message for an exception (``Code: N, e.displayText() = DB::Exception: …``)."""
    msg = f"Code: {code}, e.displayText() = DB::Exception: {text}, e.what() = DB::Exception"
    return "An error occured before execution: " + msg if before_execution else msg


def parse_status(data: bytes) -> tuple[int, str]:
    """``(code, message)``; an unreadable status is ``(-1, "Cannot obtain error message")`` as in 18.16."""
    text = data.decode("utf-8", "replace")
    code, sep, message = text.partition("\n")
    try:
        return int(code), unescape(message) if sep else ""
    except ValueError:
        return -1, "Cannot obtain error message"
