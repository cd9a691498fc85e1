"""Routing parse of the statements the HTTP API accepts.

This is deliberately shallow: it finds the statement kind, the table, and the clauses the API itself
needs (INSERT's column list and FORMAT, SELECT's clauses and FORMAT).  Expressions stay text and are
compiled by the engine (``replicad.sql.expressions``); the full statement parse, when
``replicad.sql.statements.parse_statement`` accepts the text, travels along in ``Statement.parsed``.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass
from typing import Any

from replicad.errors import ReplicadError, SyntaxError_
from replicad.logging import get_logger
from replicad.service import OrderKey, SelectQuery, StatementKind, TableName

_IDENT = r"(?:`(?:[^`\\]|\\.)+`|[A-Za-z_][A-Za-z0-9_$]*)"
_TABLE = rf"{_IDENT}(?:\s*\.\s*{_IDENT})?"
log = get_logger(__name__)
_KEYWORDS = ("FROM", "WHERE", "ORDER BY", "LIMIT", "FORMAT", "SETTINGS", "GROUP BY", "HAVING", "PREWHERE")


@dataclass(frozen=True)
class InsertRoute:
    table: TableName
    columns: tuple[str, ...] | None
    format: str
    inline_data: str  # text after ``FORMAT <name>`` and one whitespace character (start of the data)


@dataclass(frozen=True)
class SelectRoute:
    query: SelectQuery
    is_count: bool
    format: str | None
    constant: str | None = None  # ``SELECT 1`` style queries without FROM
    offset: int = 0  # LIMIT … OFFSET: the API skips these rows; ``query.limit`` counts them too


@dataclass(frozen=True)
class StatementRoute:
    kind: StatementKind
    table: TableName
    if_exists: bool


Route = InsertRoute | SelectRoute | StatementRoute


def route(text: str, default_database: str = "default") -> Route:
    lead = text.lstrip()
    if lead[:6].upper() == "INSERT":  # no comment stripping: inline data may follow FORMAT
        return _insert(lead, default_database)
    sql = strip_comments(text).strip().rstrip(";").strip()
    head = sql[:40].upper()
    if head.startswith(("SELECT", "WITH")):
        return _select(sql, default_database)
    return _statement(sql, default_database)


def parse_full(text: str) -> Any:
    """``replicad.sql.statements.parse_statement(text)``: the full parse, whose syntax errors (SyntaxError_,
    HTTP 400 with the position) are the user's answer.  None when that parser is unavailable or broke."""
    try:
        fn = importlib.import_module("replicad.sql.statements").parse_statement
    except (ImportError, AttributeError):
        return None
    try:
        return fn(text)
    except ReplicadError:
        raise
    except RecursionError:
        raise SyntaxError_("Syntax error: the query is nested too deeply (maximum parse depth exceeded)",
                           code=167) from None
    except Exception as e:  # a bug in the full parser must not take down statements we can route
        log.warning("statement_parser_failed", error=f"{type(e).__name__}: {e}", sql=text[:200])
        return None


def select_from_parsed(parsed: Any, route_: SelectRoute, default_database: str) -> SelectRoute:
    """The route of a SELECT rebuilt from its full parse (expressions in ClickHouse's formatting).

    OFFSET is applied by the API, so ``SelectQuery.limit`` counts OFFSET + LIMIT rows."""
    if parsed is None or not hasattr(parsed, "items"):
        return route_
    db = parsed.table.database or default_database
    star = any(item.expr is None for item in parsed.items)
    columns = None if star else tuple(item.expr.text for item in parsed.items)
    offset = int(getattr(parsed, "offset", 0) or 0)
    limit = parsed.limit if parsed.limit is None else parsed.limit + offset
    q = SelectQuery(
        table=TableName(db, parsed.table.name),
        columns=columns,
        where=parsed.where.text if parsed.where is not None else None,
        order_by=tuple(OrderKey(o.expr.text, bool(o.descending)) for o in parsed.order_by),
        limit=limit,
        text=route_.query.text,
    )
    return SelectRoute(q, bool(parsed.is_count), parsed.format or route_.format, offset=offset)


def _syntax(msg: str, text: str) -> SyntaxError_:
    return SyntaxError_(f"Syntax error: {msg}: {text[:200]!r}")


def _table(text: str, default_database: str) -> TableName:
    try:
        return TableName.parse(re.sub(r"\s*\.\s*", ".", text), default_database)
    except ValueError as e:
        raise SyntaxError_(f"Syntax error: {e}") from None


def _unquote_ident(name: str) -> str:
    name = name.strip()
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "`\"":
        return name[1:-1]
    return name


def _insert(sql: str, db: str) -> InsertRoute:
    m = re.match(rf"INSERT\s+INTO\s+(?:TABLE\s+)?({_TABLE})\s*", sql, re.IGNORECASE)
    if not m:
        raise _syntax("expected INSERT INTO <table>", sql)
    table = _table(m.group(1), db)
    rest = sql[m.end():]
    columns = None
    if rest.startswith("("):
        close = _matching_paren(rest, 0)
        columns = tuple(_unquote_ident(c) for c in _split_top(rest[1:close], ","))
        if not all(columns):
            raise _syntax("empty column name in the INSERT column list", sql)
        rest = rest[close + 1:].lstrip()
    rest = re.sub(r"^SETTINGS\s+.*?(?=\bFORMAT\b)", "", rest, flags=re.IGNORECASE | re.S)
    fm = re.match(r"FORMAT\s+([A-Za-z][A-Za-z0-9_]*)", rest, re.IGNORECASE)
    if not fm:
        if re.match(r"VALUES\b", rest, re.IGNORECASE):
            raise SyntaxError_("INSERT … VALUES is not supported: send the data with FORMAT "
                               "(JSONEachRow, TSV, CSV, ArrowStream, Parquet)", code=73)
        raise _syntax("expected FORMAT <name> in INSERT", sql)
    data = rest[fm.end():]
    if data[:1].isspace():
        data = data[1:]
    return InsertRoute(table, columns, fm.group(1), data)


def _select(sql: str, db: str) -> SelectRoute:
    clauses = _clauses(sql)
    body = clauses.get("SELECT", "").strip()
    fmt = clauses.get("FORMAT", "").strip() or None
    if "FROM" not in clauses:
        if re.fullmatch(r"[-+]?\d+(\.\d+)?|'[^'\\]*'", body):
            return SelectRoute(SelectQuery(TableName(db, ""), text=sql), False, fmt, constant=body.strip("'"))
        raise _syntax("only SELECT … FROM <table> is supported", sql)
    for unsupported in ("GROUP BY", "HAVING", "PREWHERE"):
        if unsupported in clauses:
            raise SyntaxError_(f"{unsupported} is not supported by replicad", code=48)
    table = _table(clauses["FROM"].strip(), db)
    limit, offset = None, 0
    if "LIMIT" in clauses:
        lm = re.fullmatch(r"\s*(\d+)\s*(?:,\s*(\d+)\s*|OFFSET\s+(\d+)\s*)?", clauses["LIMIT"], re.IGNORECASE)
        if not lm:
            raise _syntax("LIMIT expects a number", sql)
        if lm.group(2) is not None:
            offset, limit = int(lm.group(1)), int(lm.group(2))
        else:
            limit, offset = int(lm.group(1)), int(lm.group(3) or 0)
        limit += offset
    order = tuple(_order_key(k) for k in _split_top(clauses.get("ORDER BY", ""), ",") if k)
    cols_text = [c.strip() for c in _split_top(body, ",")]
    is_count = len(cols_text) == 1 and re.fullmatch(r"count\s*\(\s*\*?\s*\)", cols_text[0], re.IGNORECASE)
    columns = None if cols_text == ["*"] else tuple(_unquote_ident(c) for c in cols_text)
    where = clauses.get("WHERE", "").strip() or None
    q = SelectQuery(table=table, columns=columns, where=where, order_by=order, limit=limit, text=sql)
    return SelectRoute(q, bool(is_count), fmt, offset=offset)


def _order_key(text: str) -> OrderKey:
    t = text.strip()
    m = re.match(r"(.*?)\s+(ASC|DESC)$", t, re.IGNORECASE | re.S)
    if m:
        return OrderKey(m.group(1).strip(), m.group(2).upper() == "DESC")
    return OrderKey(t)


_STATEMENTS: tuple[tuple[str, StatementKind], ...] = (
    (rf"CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?({_TABLE})", StatementKind.CREATE_TABLE),
    (rf"DROP\s+TABLE\s+(IF\s+EXISTS\s+)?({_TABLE})", StatementKind.DROP_TABLE),
    (rf"TRUNCATE\s+(?:TABLE\s+)?(IF\s+EXISTS\s+)?({_TABLE})", StatementKind.TRUNCATE),
    (rf"OPTIMIZE\s+TABLE\s+()({_TABLE})", StatementKind.OPTIMIZE),
    (rf"SYSTEM\s+SYNC\s+REPLICA\s+()({_TABLE})", StatementKind.SYNC_REPLICA),
    (rf"SYSTEM\s+DROP\s+REPLICA\s+'(?:[^'\\]|\\.)*'\s+FROM\s+TABLE\s+()({_TABLE})",
     StatementKind.DROP_REPLICA),
    (rf"SYSTEM\s+RESTART\s+REPLICA\s+()({_TABLE})", StatementKind.RESTART_REPLICA),
    (rf"SYSTEM\s+(?:STOP|START)\s+FETCHES()(?:\s+({_TABLE}))?\s*$", StatementKind.FETCHES),
    (rf"SYSTEM\s+(?:STOP|START)\s+MERGES()(?:\s+({_TABLE}))?\s*$", StatementKind.MERGES),
)
_ALTERS: tuple[tuple[str, StatementKind], ...] = (
    (r"DELETE\s+WHERE\b", StatementKind.ALTER_DELETE),
    (r"UPDATE\b", StatementKind.ALTER_UPDATE),
    (r"DROP\s+PARTITION\b", StatementKind.DROP_PARTITION),
    (r"DETACH\s+PARTITION\b", StatementKind.DETACH_PARTITION),
    (r"ATTACH\s+PART(?:ITION)?\b", StatementKind.ATTACH),
    (r"DROP\s+DETACHED\s+PART(?:ITION)?\b", StatementKind.DROP_DETACHED),
    (r"(?:ADD|DROP|MODIFY|COMMENT)\s+COLUMN\b", StatementKind.ALTER_COLUMNS),
)


def _statement(sql: str, db: str) -> StatementRoute:
    for pattern, kind in _STATEMENTS:
        m = re.match(pattern, sql, re.IGNORECASE)
        if m:
            if m.group(2) is None:  # SYSTEM STOP|START FETCHES|MERGES without a table: every table
                return StatementRoute(kind, TableName(db, ""), False)
            return StatementRoute(kind, _table(m.group(2), db), bool(m.group(1)))
    m = re.match(rf"ALTER\s+TABLE\s+({_TABLE})\s+(?:ON\s+CLUSTER\s+(?:'(?:[^'\\]|\\.)*'|\S+)\s+)?", sql,
                 re.IGNORECASE)
    if m:
        rest = sql[m.end():]
        for pattern, kind in _ALTERS:
            if re.match(pattern, rest, re.IGNORECASE):
                return StatementRoute(kind, _table(m.group(1), db), False)
        raise SyntaxError_(f"unsupported ALTER: {rest[:80]!r} (supported: DELETE WHERE, UPDATE, "
                           "DROP PARTITION, DETACH PARTITION, ATTACH PART|PARTITION, DROP DETACHED "
                           "PART|PARTITION, ADD|DROP|MODIFY|COMMENT COLUMN)", code=48)
    word = sql.split(None, 1)[0].upper() if sql.split() else ""
    raise SyntaxError_(f"Syntax error: unsupported statement {word or '(empty)'}", code=62)


# ---- lexical helpers -----------------------------------------------------------------------------------


_QUOTES = re.compile("['\"`]")


def strip_comments(sql: str) -> str:
    """``sql`` without its comments (``--`` to the line end, ``/* … */`` as one space); quoted text kept."""
    if "--" not in sql and "/*" not in sql and not _QUOTES.search(sql):  # nothing to strip or check
        return sql
    return _strip_scan(sql)


def _strip_scan(sql: str) -> str:
    """:func:`strip_comments` past its fast path: one scan over quotes and comment markers."""
    out, i, n = [], 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = _skip_quoted(sql, i)
            out.append(sql[i:j])
            i = j
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _skip_quoted(s: str, i: int, strict: bool = True) -> int:
    """The index after the quoted text starting at ``s[i]``; an unterminated one is a syntax error, or with
    ``strict=False`` runs to the end."""
    q = s[i]
    j = i + 1
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == q:
            if j + 1 < len(s) and s[j + 1] == q:  # doubled quote
                j += 2
                continue
            return j + 1
        j += 1
    if not strict:
        return len(s)
    raise SyntaxError_(f"Syntax error: unterminated quoted text starting at {s[i:i + 40]!r}")


def mask(s: str, quoted: str = " ", *, strict: bool = True) -> str:
    """``s`` with quoted text (as ``quoted``) and parenthesised text (as spaces) blanked out, same length, for
    keyword search; an unterminated quote is a syntax error, or with ``strict=False`` blanked to the end."""
    out, i, depth = list(s), 0, 0
    while i < len(s):
        c = s[i]
        if c in "'\"`":
            j = min(_skip_quoted(s, i, strict), len(s))
            out[i:j] = quoted * (j - i)
            i = j
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth > 0:
            out[i] = " "
        i += 1
    return "".join(out)


def _matching_paren(s: str, start: int) -> int:
    depth, i = 0, start
    while i < len(s):
        c = s[i]
        if c in "'\"`":
            i = _skip_quoted(s, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise SyntaxError_(f"Syntax error: unbalanced parentheses in {s[:80]!r}")


def _split_top(s: str, sep: str) -> list[str]:
    masked = mask(s)
    parts, last = [], 0
    for i, c in enumerate(masked):
        if c == sep:
            parts.append(s[last:i].strip())
            last = i + 1
    parts.append(s[last:].strip())
    return parts


def _clauses(sql: str) -> dict[str, str]:
    """Top-level clauses of a SELECT: {"SELECT": cols, "FROM": …, "WHERE": …, "ORDER BY": …, …}."""
    masked = mask(sql)
    pattern = r"\b(" + "|".join(k.replace(" ", r"\s+") for k in ("SELECT", *_KEYWORDS)) + r")\b"
    marks = [(m.start(), m.end(), re.sub(r"\s+", " ", m.group(1).upper()))
             for m in re.finditer(pattern, masked, re.IGNORECASE)]
    out: dict[str, str] = {}
    for i, (_, end, kw) in enumerate(marks):
        stop = marks[i + 1][0] if i + 1 < len(marks) else len(sql)
        if kw in out:
            raise _syntax(f"{kw} given twice", sql)
        out[kw] = sql[end:stop]
    return out


#: statements longer than this are parsed every time (and not kept)
MAX_CACHED_TEXT = 4096


def _resolve(text: str, default_database: str) -> Route:
    r = route(text, default_database)
    if isinstance(r, SelectRoute) and r.constant is None:
        r = select_from_parsed(parse_full(text), r, default_database)
    return r


_resolve_cached = functools.lru_cache(maxsize=512)(_resolve)


def resolve(text: str, default_database: str = "default") -> Route:
    """:func:`route`, with a SELECT rebuilt from its full parse (:func:`select_from_parsed`).  Routes are
    immutable and depend on the text alone, so those of statements other than INSERT (whose text may carry
    the data) are kept in an LRU cache: pollers and dashboards send the same few queries again and again."""
    if len(text) > MAX_CACHED_TEXT or text.lstrip()[:6].upper() == "INSERT":
        return _resolve(text, default_database)
    return _resolve_cached(text, default_database)


def on_cluster_of(parsed: Any) -> str | None:
    """The ``ON CLUSTER`` name of a parsed statement (None: none); such a statement goes to the distributed
    DDL queue (replicad.ddl.service, imported when first needed)."""
    if parsed is None:
        return None
    table_def = getattr(parsed, "table_def", None)
    if table_def is not None:
        return getattr(table_def, "on_cluster", None)
    return getattr(parsed, "on_cluster", None)


def without_compute(r: InsertRoute | SelectRoute | StatementRoute) -> bool:
    """Whether a request needs no Arrow compute kernel: ``count()`` without WHERE, a constant, SYSTEM SYNC
    REPLICA (what a replicating daemon is asked); any other statement, SELECT or insert may."""
    if isinstance(r, SelectRoute):
        return r.constant is not None or (r.is_count and r.query.where is None)
    return isinstance(r, StatementRoute) and r.kind is StatementKind.SYNC_REPLICA
