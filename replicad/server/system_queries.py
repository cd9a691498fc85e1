"""The queries clients send about the server rather than a table, answered as ClickHouse answers them.

* ``SELECT <items> [FORMAT f]`` without FROM: constants and expressions replicad's evaluator knows, plus
  the zero-argument server functions clients ask for at connect time — ``version()``, ``timezone()`` /
  ``serverTimezone()``, ``currentDatabase()``, ``currentUser()`` / ``user()``, ``hostName()``,
  ``uptime()``, ``now()``, ``today()`` — each item optionally ``AS alias``;
* ``SELECT … FROM system.settings | system.one [WHERE] [ORDER BY] [LIMIT]`` (also ``count()``);
* ``DESC[RIBE] [TABLE] [db.]t``: ClickHouse's columns ``name, type, default_type, default_expression,
  comment, codec_expression, ttl_expression``.

``version()`` answers :data:`SERVER_VERSION`: replicad stores and replicates data as ClickHouse 18.16 does
and serves that feature set, so a client that gates features on the server version (``min_version``)
only uses what replicad can serve; 18.16 predates ``client_protocol_version`` (replicad answers Native
as protocol 0) and modern types (DateTime64, JSON, Variant …).

``system.settings`` lists only what replicad honours per query — the query-level settings of
``replicad.settings`` and ``enable_http_compression`` — because clients (clickhouse-connect) send the
settings it lists as writable and skip the others.
"""

from __future__ import annotations

import datetime as _dt
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from replicad import settings as settings_table
from replicad.config import Config
from replicad.datatypes import DataType, parse_type
from replicad.errors import SyntaxError_, UnknownTableError
from replicad.memory import deferred_loaded
from replicad.server import auth
from replicad.server.routing import mask, strip_comments
from replicad.service import Catalog, QueryResult, TableName
from replicad.sql.expressions import compile_expression
from replicad.sql.table_metadata import ColumnsDescription

#: what ``version()`` answers (see the module docstring)
SERVER_VERSION = "18.16.1"
#: statements longer than this are never system queries (they go the usual way)
MAX_TEXT = 16384
UNKNOWN_TABLE = 60

_STRING = parse_type("String")
_UINT8 = parse_type("UInt8")


@dataclass(frozen=True)
class ServerContext:
    config: Config
    database: str
    started_at: float  # time.monotonic() at start


@dataclass(frozen=True)
class Answer:
    result: QueryResult
    format: str | None


# ---- recognising the statement -----------------------------------------------------------------------------


def _mask(sql: str) -> str:
    """``sql`` with quoted text (as NULs) and everything inside parentheses (as spaces) blanked; an
    unterminated quote is blanked to the end (the statement then goes the usual way, which refuses it)."""
    return mask(sql, "\0", strict=False)


def _clean(text: str) -> str:
    """``text`` without comments (``--`` to the line end, ``/* … */``), outer blanks and a final ``;``."""
    return strip_comments(text).strip().rstrip(";").strip()


_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z][A-Za-z0-9_]*)\s*$", re.IGNORECASE)
_SETTINGS = re.compile(r"\bSETTINGS\s+[A-Za-z_]\w*\s*=", re.IGNORECASE)
_SYSTEM_FROM = re.compile(r"\bFROM\s+system\s*\.\s*([A-Za-z_]\w*)\s*", re.IGNORECASE)
_CLAUSE = re.compile(r"\b(WHERE|ORDER\s+BY|LIMIT|GROUP\s+BY|HAVING|PREWHERE)\b", re.IGNORECASE)
_DESCRIBE = re.compile(r"(?:DESC|DESCRIBE)\s+(?:TABLE\s+)?((?:`[^`]+`|[A-Za-z_][\w$]*)"
                       r"(?:\s*\.\s*(?:`[^`]+`|[A-Za-z_][\w$]*))?)\s*$", re.IGNORECASE)


def _split_format(sql: str) -> tuple[str, str | None]:
    masked = _mask(sql)
    m = _FORMAT.search(masked)
    fmt = None
    if m:
        fmt = m.group(1)
        sql, masked = sql[:m.start()].rstrip(), masked[:m.start()].rstrip()
    s = _SETTINGS.search(masked)
    if s:
        sql = sql[:s.start()].rstrip()
    return sql, fmt


async def answer(text: str, ctx: ServerContext, catalog: Callable[[], Awaitable[Catalog]]) -> Answer | None:
    """The answer to a system query, or None when ``text`` is not one (it then goes the usual way)."""
    if len(text) > MAX_TEXT:
        return None
    sql = _clean(text)
    head = sql[:9].upper()
    if head.startswith(("DESC ", "DESC\t", "DESC\n", "DESCRIBE")):
        body, fmt = _split_format(sql)
        m = _DESCRIBE.fullmatch(body)
        if not m:
            return None
        name = TableName.parse(re.sub(r"\s*\.\s*", ".", m.group(1)), ctx.database)
        await deferred_loaded()  # the answers are evaluated here, on the loop (replicad.memory)
        return Answer(await describe(name, ctx, catalog), fmt)
    if not head.startswith("SELECT"):
        return None
    body, fmt = _split_format(sql)
    masked = _mask(body)
    if not re.search(r"\bFROM\b", masked, re.IGNORECASE):
        await deferred_loaded()
        return Answer(select_constants(body[6:], ctx), fmt)
    m = _SYSTEM_FROM.search(masked)
    if not m:
        return None
    await deferred_loaded()
    return Answer(select_system(_system_select(body, masked, m), ctx), fmt)


# ---- SELECT without FROM -----------------------------------------------------------------------------------


def _server_functions(ctx: ServerContext) -> dict[str, Callable[[], tuple[pa.Array, DataType]]]:
    tz = ctx.config.timezone
    access = auth.CURRENT.get()

    def text(v: str) -> Callable[[], tuple[pa.Array, DataType]]:
        return lambda: (pa.array([v.encode()], pa.binary()), _STRING)

    def uptime() -> tuple[pa.Array, DataType]:
        dt = parse_type("UInt32")
        return pa.array([int(time.monotonic() - ctx.started_at)], dt.arrow_type), dt

    def now() -> tuple[pa.Array, DataType]:
        return pa.array([int(time.time())], pa.int64()).cast(pa.timestamp("s")), parse_type("DateTime")

    def today() -> tuple[pa.Array, DataType]:
        import zoneinfo

        day = _dt.datetime.now(zoneinfo.ZoneInfo(tz)).date()
        return pa.array([day], pa.date32()), parse_type("Date")

    user = access.user if access is not None else "default"
    return {
        "version": text(SERVER_VERSION), "timezone": text(tz), "servertimezone": text(tz),
        "currentdatabase": text(ctx.database), "currentuser": text(user), "user": text(user),
        "hostname": text(socket.gethostname()), "uptime": uptime, "now": now, "today": today,
    }


_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*\)")
_ALIAS = re.compile(r"\s+AS\s+(`[^`]+`|\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*)\s*$", re.IGNORECASE)


def _items(body: str) -> list[str]:
    masked = _mask(body)
    items, last = [], 0
    for i, c in enumerate(masked):
        if c == ",":
            items.append(body[last:i].strip())
            last = i + 1
    items.append(body[last:].strip())
    return items


def select_constants(body: str, ctx: ServerContext) -> QueryResult:
    """``SELECT item, …`` over one row: server functions, constants, expressions."""
    functions = _server_functions(ctx)
    one = pa.table({"dummy": pa.array([0], pa.uint8())})
    columns: list[tuple[str, DataType]] = []
    arrays: list[pa.Array] = []
    for item in _items(body):
        if not item:
            raise SyntaxError_(f"Syntax error: empty item in SELECT {body[:100]!r}")
        alias = None
        m = _ALIAS.search(_mask(item))
        if m:
            alias = m.group(1).strip("`\"")
            item = item[:m.start()].strip()
        call = _CALL.fullmatch(item)
        if call and call.group(1).lower() in functions:
            arr, dt = functions[call.group(1).lower()]()
            name = f"{call.group(1)}()"
        else:
            expr = compile_expression(item)
            arr, dt = expr.evaluate(one, {"dummy": _UINT8}, ctx.config.timezone)
            name = expr.text
        columns.append((alias or name, dt))
        arrays.append(arr)
    table = pa.Table.from_arrays(arrays, names=[n for n, _ in columns])
    return QueryResult.from_table(columns, table)


# ---- system tables -----------------------------------------------------------------------------------------


def _type_name(d: settings_table.SettingDef) -> str:
    if d.kind is str:
        return "String"
    if d.kind is float:
        return "Float"
    return "Bool" if d.check is not None and d.check(2) is not None and d.check(1) is None \
        and d.check(0) is None else "UInt64"


def settings_rows(ctx: ServerContext) -> tuple[list[tuple[str, DataType]], pa.Table]:
    """``system.settings``: the settings replicad honours per query, with their effective values."""
    access = auth.CURRENT.get()
    readonly = 1 if access is not None and access.readonly == 1 else 0
    rows: list[tuple[str, str, int, str, str]] = []
    for d in settings_table.SETTINGS.values():
        if d.scope is not settings_table.SettingScope.QUERY:
            continue
        value = ctx.config.setting(d.name)
        rows.append((d.name, str(value), int(value != d.default), d.description, _type_name(d)))
    rows.append(("enable_http_compression", "0", 0, "compress the answer with a method the client's "
                 "Accept-Encoding names (lz4, zstd, gzip, deflate)", "Bool"))
    n = len(rows)
    columns = [("name", _STRING), ("value", _STRING), ("changed", _UINT8), ("description", _STRING),
               ("min", parse_type("Nullable(String)")), ("max", parse_type("Nullable(String)")),
               ("readonly", _UINT8), ("type", _STRING)]
    table = pa.table({
        "name": pa.array([r[0].encode() for r in rows], pa.binary()),
        "value": pa.array([r[1].encode() for r in rows], pa.binary()),
        "changed": pa.array([r[2] for r in rows], pa.uint8()),
        "description": pa.array([r[3].encode() for r in rows], pa.binary()),
        "min": pa.nulls(n, pa.binary()),
        "max": pa.nulls(n, pa.binary()),
        "readonly": pa.array([readonly] * n, pa.uint8()),
        "type": pa.array([r[4].encode() for r in rows], pa.binary()),
    })
    return columns, table


def _one(ctx: ServerContext) -> tuple[list[tuple[str, DataType]], pa.Table]:
    return [("dummy", _UINT8)], pa.table({"dummy": pa.array([0], pa.uint8())})


SYSTEM_TABLES: dict[str, Callable[[ServerContext], tuple[list[tuple[str, DataType]], pa.Table]]] = {
    "settings": settings_rows,
    "one": _one,
}


def _system_table(name: TableName, ctx: ServerContext) -> tuple[list[tuple[str, DataType]], pa.Table]:
    make = SYSTEM_TABLES.get(name.table)
    if make is None:
        raise UnknownTableError(f"Table {name} doesn't exist.", code=UNKNOWN_TABLE)
    return make(ctx)


def _system_select(body: str, masked: str, m: re.Match[str]) -> SystemSelect:
    """``SELECT items FROM system.t [WHERE …] [ORDER BY …] [LIMIT n [OFFSET m] | LIMIT m, n]``."""
    clauses: dict[str, str] = {}
    marks = list(_CLAUSE.finditer(masked, m.end()))
    if masked[m.end():marks[0].start() if marks else len(masked)].strip():
        raise SyntaxError_(f"Syntax error: unexpected text after the table in {body[:200]!r}")
    for i, c in enumerate(marks):
        key = re.sub(r"\s+", " ", c.group(1).upper())
        if key in clauses or key in ("GROUP BY", "HAVING", "PREWHERE"):
            raise SyntaxError_(f"{key} is not supported here", code=48)
        clauses[key] = body[c.end():marks[i + 1].start() if i + 1 < len(marks) else len(body)].strip()
    limit, offset = None, 0
    if "LIMIT" in clauses:
        lm = re.fullmatch(r"(\d+)\s*(?:,\s*(\d+)|OFFSET\s+(\d+))?", clauses["LIMIT"], re.IGNORECASE)
        if not lm:
            raise SyntaxError_(f"Syntax error: LIMIT expects a number: {body[:200]!r}")
        if lm.group(2) is not None:
            offset, limit = int(lm.group(1)), int(lm.group(2))
        else:
            limit, offset = int(lm.group(1)), int(lm.group(3) or 0)
    items = _items(body[6:m.start()])
    order = []
    for key in _items(clauses.get("ORDER BY", "")) if "ORDER BY" in clauses else []:
        km = re.fullmatch(r"(.*?)(?:\s+(ASC|DESC))?", key, re.IGNORECASE | re.S)
        assert km is not None
        order.append((km.group(1), (km.group(2) or "").upper() == "DESC"))
    return SystemSelect(TableName("system", m.group(1)), None if items == ["*"] else items,
                        clauses.get("WHERE"), order, limit, offset)


@dataclass(frozen=True)
class SystemSelect:
    table: TableName
    items: list[str] | None  # None: *
    where: str | None
    order_by: list[tuple[str, bool]]  # (expression, descending)
    limit: int | None
    offset: int


def select_system(q: SystemSelect, ctx: ServerContext) -> QueryResult:
    """A SELECT over a system table (small: evaluated at once)."""
    columns, table = _system_table(q.table, ctx)
    types = dict(columns)
    tz = ctx.config.timezone
    if q.where:
        table = table.filter(pa.array(compile_expression(q.where).mask(table, types, tz)))
    if q.items is not None and len(q.items) == 1 and re.fullmatch(r"count\s*\(\s*\*?\s*\)", q.items[0], re.I):
        counted = pa.table({"count()": pa.array([table.num_rows], pa.uint64())})
        return QueryResult.from_table([("count()", parse_type("UInt64"))], counted)
    if q.order_by:
        keys = pa.table({f"k{i}": compile_expression(k).evaluate(table, types, tz)[0]
                         for i, (k, _) in enumerate(q.order_by)})
        order = pc.sort_indices(keys, sort_keys=[(f"k{i}", "descending" if desc else "ascending")
                                                 for i, (_, desc) in enumerate(q.order_by)])
        table = table.take(order)
    if q.limit is not None or q.offset:
        table = table.slice(q.offset, q.limit)
    out_cols: list[tuple[str, DataType]] = []
    arrays: list[pa.Array] = []
    for item in q.items if q.items is not None else [n for n, _ in columns]:
        alias = None
        am = _ALIAS.search(_mask(item))
        if am:
            alias, item = am.group(1).strip("`\""), item[:am.start()].strip()
        if item.strip("`") in types:
            name = item.strip("`")
            arr, dt = table.column(name), types[name]
        else:
            expr = compile_expression(item)
            arr, dt = expr.evaluate(table, types, tz)
            name = expr.text
        out_cols.append((alias or name, dt))
        arrays.append(arr)
    return QueryResult.from_table(out_cols, pa.Table.from_arrays(arrays, names=[n for n, _ in out_cols]))


# ---- DESCRIBE TABLE ----------------------------------------------------------------------------------------

DESCRIBE_COLUMNS: Sequence[str] = ("name", "type", "default_type", "default_expression", "comment",
                                   "codec_expression", "ttl_expression")


async def describe(name: TableName, ctx: ServerContext, catalog: Callable[[], Awaitable[Catalog]]
                   ) -> QueryResult:
    if name.database == "system":
        cols, _ = _system_table(name, ctx)
        defaults: dict[str, tuple[str, str]] = {}
    else:
        table = (await catalog()).get(name)
        columns_text = getattr(getattr(table, "spec", None), "columns_text", None)
        if isinstance(columns_text, str):  # every column (ALIAS too) with its default and comment, as 18.16
            described = ColumnsDescription.parse(columns_text).ordered()
            rows = [(c.name, c.type, c.default_kind, c.default_expression, c.comment, "", "")
                    for c in described]
            return _describe_result(rows)
        cols = list(table.columns)
        schema_defaults = getattr(getattr(table, "schema", None), "defaults", ()) or ()
        defaults = {c: (str(kind).upper(), str(expr)) for c, kind, expr in schema_defaults}
    return _describe_result([(n, dt.name, *defaults.get(n, ("", "")), "", "", "") for n, dt in cols])


def _describe_result(rows: Sequence[tuple[str, ...]]) -> QueryResult:
    data = {c: pa.array([r[i].encode() for r in rows], pa.binary()) for i, c in enumerate(DESCRIBE_COLUMNS)}
    return QueryResult.from_table([(c, _STRING) for c in DESCRIBE_COLUMNS], pa.table(data))

