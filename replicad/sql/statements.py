"""The statements of replicad's HTTP API (INTERFACE.md), parsed into frozen dataclasses.

``parse_statement(sql)`` returns one of :class:`Insert`, :class:`Select`, :class:`CreateTable`,
:class:`DropTable`, :class:`Alter`, :class:`Optimize`, :class:`Truncate`, :class:`SystemSyncReplica`.
Mutation commands print themselves as ClickHouse 18.16 writes them into ``mutations/NNNNNNNNNN``
(``DELETE WHERE x = 2``); :func:`parse_mutation_commands` reads such a command list back.
Partition specs (``202611``, ``(202611, 5)``, ``'2026-11-22'``, ``ID 'xxx'``) resolve to partition IDs
with the table's partition key types, as ClickHouse's getPartitionIDFromQuery does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal as TypingLiteral

import pyarrow as pa

from replicad.errors import ReplicadError, SyntaxError_
from replicad.model.part_info import is_valid_partition_id
from replicad.sql.ddl import TableDef, parse_create_table_body
from replicad.sql.expressions import Context, Expr
from replicad.sql.expressions_ast import (
    Asterisk,
    Function,
    Identifier,
    Literal,
    Node,
    Parser,
    column_name,
    format_ast,
    format_list,
)
from replicad.sql.expressions_lexer import T, back_quote_if_needed, quote_string
from replicad.sql.partition import partition_id_at
from replicad.storage.types import DataType

INVALID_PARTITION_VALUE = 248


@dataclass(frozen=True)
class TableRef:
    database: str | None
    name: str

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.name}" if self.database else self.name


# ---- partition specs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionSpec:
    """``PARTITION <value>`` or ``PARTITION ID '<id>'``."""

    id: str | None = None
    value: Node | None = None

    @property
    def fields(self) -> tuple[Node, ...]:
        if self.value is None:
            return ()
        if isinstance(self.value, Function) and self.value.name == "tuple" and self.value.params is None:
            return self.value.args
        return (self.value,)

    def to_text(self) -> str:
        if self.id is not None:
            return f"ID {quote_string(self.id)}"
        assert self.value is not None
        return format_ast(self.value)

    def resolve(self, key_types: list[DataType], tz: str = "UTC") -> str:
        """The partition ID this spec names, for a table whose partition key has ``key_types``."""
        if self.id is not None:
            if not is_valid_partition_id(self.id):
                raise SyntaxError_(f"Invalid partition ID {self.id[:200]!r}: partition IDs are made of "
                                   "letters, digits and '-'", code=INVALID_PARTITION_VALUE)
            return self.id
        values = self.fields
        if len(values) != len(key_types):
            raise SyntaxError_(f"Wrong number of fields in the partition expression: {len(values)}, "
                               f"must be: {len(key_types)}", code=INVALID_PARTITION_VALUE)
        arrays = []
        ctx = Context(1, tz, pa.table({"_": pa.array([0], pa.uint8())}), {})
        for node, dt in zip(values, key_types, strict=True):
            try:
                v = ctx.evaluate(node)
                user = pa.array([v.const.value]) if v.const is not None and v.const.kind != "null" else v.arr
                arrays.append(v.arr if v.dtype.name == dt.name else dt.to_storage(user, "partition", tz))
            except ReplicadError as e:
                raise SyntaxError_(f"Could not parse partition value {format_ast(node)} as {dt.name}: {e}",
                                   code=INVALID_PARTITION_VALUE) from None
        return partition_id_at(key_types, arrays, 0)


def _partition_spec(p: Parser) -> PartitionSpec:
    if p.at_words("ID") and p.peek().kind is T.STRING:
        p.advance()
        return PartitionSpec(id=p.string_literal())
    return PartitionSpec(value=p.expression())


# ---- statements -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Insert:
    table: TableRef
    columns: tuple[str, ...] | None
    format: str  # "Values" for INSERT ... VALUES
    data: bytes  # inline data that followed the FORMAT line in the query text (may be empty)
    settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SelectItem:
    expr: Expr | None  # None for *
    alias: str | None = None

    @property
    def name(self) -> str:
        """Output column name: the alias, else ClickHouse's column name of the expression."""
        if self.alias is not None:
            return self.alias
        return "*" if self.expr is None else column_name(self.expr.node)


@dataclass(frozen=True)
class OrderItem:
    expr: Expr
    descending: bool = False
    nulls_first: bool | None = None  # None: ClickHouse's default (NULLs last)


@dataclass(frozen=True)
class Select:
    table: TableRef
    items: tuple[SelectItem, ...]
    is_count: bool = False  # SELECT count() FROM t
    where: Expr | None = None
    order_by: tuple[OrderItem, ...] = ()
    limit: int | None = None
    offset: int = 0
    format: str | None = None
    final: bool = False
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def star(self) -> bool:
        return any(i.expr is None for i in self.items)


@dataclass(frozen=True)
class CreateTable:
    table_def: TableDef

    @property
    def table(self) -> TableRef:
        return TableRef(self.table_def.database, self.table_def.name)


@dataclass(frozen=True)
class DropTable:
    table: TableRef
    if_exists: bool = False
    on_cluster: str | None = None


@dataclass(frozen=True)
class Truncate:
    table: TableRef
    if_exists: bool = False
    on_cluster: str | None = None


@dataclass(frozen=True)
class Optimize:
    table: TableRef
    partition: PartitionSpec | None = None
    final: bool = False
    deduplicate: bool = False
    on_cluster: str | None = None


@dataclass(frozen=True)
class SystemSyncReplica:
    table: TableRef


@dataclass(frozen=True)
class SystemCommand:
    """``SYSTEM DROP REPLICA 'r' FROM TABLE t``, ``SYSTEM RESTART REPLICA t``,
    ``SYSTEM STOP|START FETCHES|MERGES [t]`` (no table: every table)."""

    action: TypingLiteral["DROP REPLICA", "RESTART REPLICA", "STOP FETCHES", "START FETCHES", "STOP MERGES",
                          "START MERGES"]
    table: TableRef | None
    replica: str | None = None


@dataclass(frozen=True)
class MutationCommand:
    kind: TypingLiteral["DELETE", "UPDATE"]
    predicate: Expr
    assignments: tuple[tuple[str, Expr], ...] = ()

    def to_text(self) -> str:
        """One command as 18.16 formats it in a mutation entry (``DELETE WHERE x = 2``), unescaped."""
        if self.kind == "DELETE":
            return f"DELETE WHERE {self.predicate.text}"
        sets = ", ".join(f"{back_quote_if_needed(c)} = {e.text}" for c, e in self.assignments)
        return f"UPDATE {sets} WHERE {self.predicate.text}"

    @property
    def columns(self) -> list[str]:
        """Columns read by the command (predicate and assigned expressions)."""
        out = list(self.predicate.columns)
        for _c, e in self.assignments:
            out.extend(x for x in e.columns if x not in out)
        return out


@dataclass(frozen=True)
class PartitionCommand:
    kind: TypingLiteral["DROP", "DETACH"]
    partition: PartitionSpec

    def to_text(self) -> str:
        return f"{self.kind} PARTITION {self.partition.to_text()}"


@dataclass(frozen=True)
class DetachedCommand:
    """``ATTACH PART 'p'`` / ``ATTACH PARTITION p`` (from ``detached/``), ``DROP DETACHED PART 'p'`` /
    ``DROP DETACHED PARTITION p``: exactly one of ``part`` and ``partition`` is set."""

    kind: TypingLiteral["ATTACH", "DROP DETACHED"]
    part: str | None = None
    partition: PartitionSpec | None = None

    def to_text(self) -> str:
        if self.part is not None:
            return f"{self.kind} PART {quote_string(self.part)}"
        assert self.partition is not None
        return f"{self.kind} PARTITION {self.partition.to_text()}"


AlterCommand = MutationCommand | PartitionCommand | DetachedCommand


def format_commands(commands: list[MutationCommand] | tuple[MutationCommand, ...]) -> str:
    """The one-line command list (``cmd1, cmd2 ``, trailing space) of a mutation entry, unescaped."""
    return "".join(c.to_text() + ("," if i + 1 < len(commands) else "") + " " for i, c in enumerate(commands))


@dataclass(frozen=True)
class Alter:
    table: TableRef
    commands: tuple[AlterCommand, ...]
    on_cluster: str | None = None

    @property
    def mutation_commands(self) -> tuple[MutationCommand, ...]:
        return tuple(c for c in self.commands if isinstance(c, MutationCommand))

    @property
    def partition_commands(self) -> tuple[PartitionCommand, ...]:
        return tuple(c for c in self.commands if isinstance(c, PartitionCommand))

    def mutation_commands_text(self) -> str:
        """``commands:`` value of the mutation entry (unescaped; the entry writer escapes it)."""
        return format_commands(self.mutation_commands)


Statement = (Insert | Select | CreateTable | DropTable | Alter | Optimize | Truncate | SystemSyncReplica
             | SystemCommand)


# ---- parsing -------------------------------------------------------------------------------------------


def _table_ref(p: Parser) -> TableRef:
    parts = p.compound_identifier()
    if len(parts) > 2:
        raise SyntaxError_(f"bad table name {'.'.join(parts)!r}")
    return TableRef(parts[0], parts[1]) if len(parts) == 2 else TableRef(None, parts[0])


def _on_cluster(p: Parser) -> str | None:
    if p.accept_words("ON", "CLUSTER"):
        return p.string_literal() if p.tok.kind is T.STRING else p.identifier()
    return None


def _settings(p: Parser) -> dict[str, str]:
    out: dict[str, str] = {}
    while True:
        name = p.identifier()
        p.expect_punct("=")
        value = p.expression()
        is_string = isinstance(value, Literal) and value.kind == "string"
        out[name] = str(value.value) if is_string and isinstance(value, Literal) else format_ast(value)
        if not p.accept_punct(","):
            return out


def _unsigned(p: Parser, what: str) -> int:
    t = p.tok
    if t.kind is not T.NUMBER or not t.text.isdigit():
        raise p.error(what)
    p.advance()
    return int(t.text)


def parse_statement(sql: str) -> Statement:
    """Parse one API statement; SyntaxError_ (HTTP 400) with the position on anything else."""
    p = Parser(sql)
    t = p.tok
    if t.is_word("INSERT"):
        return _insert(p, sql)
    if t.is_word("SELECT"):
        return _select(p)
    if p.accept_words("CREATE"):
        p.accept_words("TEMPORARY")
        if not p.accept_words("TABLE"):
            raise p.error("TABLE (only CREATE TABLE is supported)")
        return CreateTable(parse_create_table_body(p, sql))
    if p.accept_words("DROP"):
        if not p.accept_words("TABLE"):
            raise p.error("TABLE (only DROP TABLE is supported)")
        if_exists = p.accept_words("IF", "EXISTS")
        table = _table_ref(p)
        cluster = _on_cluster(p)
        p.accept_words("NO", "DELAY") or p.accept_words("SYNC")
        p.expect_end()
        return DropTable(table, if_exists, cluster)
    if p.accept_words("TRUNCATE"):
        p.accept_words("TABLE")
        if_exists = p.accept_words("IF", "EXISTS")
        table = _table_ref(p)
        cluster = _on_cluster(p)
        p.expect_end()
        return Truncate(table, if_exists, cluster)
    if p.accept_words("OPTIMIZE"):
        p.expect_words("TABLE")
        table = _table_ref(p)
        cluster = _on_cluster(p)
        partition = _partition_spec(p) if p.accept_words("PARTITION") else None
        final = p.accept_words("FINAL")
        dedup = p.accept_words("DEDUPLICATE")
        p.expect_end()
        return Optimize(table, partition, final, dedup, cluster)
    if p.accept_words("SYSTEM"):
        return _system(p)
    if p.accept_words("ALTER"):
        p.expect_words("TABLE")
        table = _table_ref(p)
        cluster = _on_cluster(p)
        commands = [_alter_command(p)]
        while p.accept_punct(","):
            commands.append(_alter_command(p))
        p.expect_end()
        return Alter(table, tuple(commands), cluster)
    raise p.error("INSERT, SELECT, CREATE TABLE, DROP TABLE, ALTER TABLE, OPTIMIZE TABLE, TRUNCATE or SYSTEM")


def _alter_command(p: Parser) -> AlterCommand:
    if p.accept_words("DELETE"):
        p.expect_words("WHERE")
        return MutationCommand("DELETE", Expr(p.expression()))
    if p.accept_words("UPDATE"):
        assignments = [_assignment(p)]
        while p.accept_punct(","):
            assignments.append(_assignment(p))
        p.expect_words("WHERE")
        names = [c for c, _ in assignments]
        dup = next((c for c in names if names.count(c) > 1), None)
        if dup is not None:
            raise SyntaxError_(f"Multiple assignments in the single statement to column `{dup}`", code=30)
        return MutationCommand("UPDATE", Expr(p.expression()), tuple(assignments))
    if p.accept_words("ATTACH"):
        return _detached(p, "ATTACH")
    if p.accept_words("DROP", "DETACHED"):
        return _detached(p, "DROP DETACHED")
    for kind in ("DROP", "DETACH"):
        if p.at_words(kind, "PARTITION"):
            p.accept_words(kind, "PARTITION")
            return PartitionCommand("DROP" if kind == "DROP" else "DETACH", _partition_spec(p))
    raise p.error("DELETE WHERE, UPDATE, DROP PARTITION, DETACH PARTITION, ATTACH PART|PARTITION or "
                  "DROP DETACHED PART|PARTITION")


def _system(p: Parser) -> SystemSyncReplica | SystemCommand:
    if p.accept_words("SYNC", "REPLICA"):
        table = _table_ref(p)
        p.expect_end()
        return SystemSyncReplica(table)
    if p.accept_words("DROP", "REPLICA"):
        if p.tok.kind is not T.STRING:
            raise p.error("the replica name as a string")
        replica = p.string_literal()
        p.expect_words("FROM")
        p.expect_words("TABLE")
        table = _table_ref(p)
        p.expect_end()
        return SystemCommand("DROP REPLICA", table, replica)
    if p.accept_words("RESTART", "REPLICA"):
        table = _table_ref(p)
        p.expect_end()
        return SystemCommand("RESTART REPLICA", table)
    for verb in ("STOP", "START"):
        for what in ("FETCHES", "MERGES"):
            if p.accept_words(verb, what):
                target = None if p.tok.kind is T.END else _table_ref(p)
                p.expect_end()
                action: TypingLiteral["STOP FETCHES", "START FETCHES", "STOP MERGES", "START MERGES"] = \
                    f"{verb} {what}"  # type: ignore[assignment]
                return SystemCommand(action, target)
    raise p.error("SYNC REPLICA, DROP REPLICA, RESTART REPLICA, STOP|START FETCHES or STOP|START MERGES")


def _detached(p: Parser, kind: TypingLiteral["ATTACH", "DROP DETACHED"]) -> DetachedCommand:
    if p.accept_words("PART"):
        if p.tok.kind is not T.STRING:
            raise p.error("the part name as a string")
        return DetachedCommand(kind, part=p.string_literal())
    p.expect_words("PARTITION")
    return DetachedCommand(kind, partition=_partition_spec(p))


def _assignment(p: Parser) -> tuple[str, Expr]:
    name = p.identifier()
    p.expect_punct("=")
    return name, Expr(p.expression())


def parse_mutation_commands(text: str) -> list[MutationCommand]:
    """Parse the (unescaped) ``commands:`` text of a mutation entry back into commands."""
    p = Parser(text)
    commands = [_alter_command(p)]
    while p.accept_punct(","):
        commands.append(_alter_command(p))
    p.expect_end()
    out = []
    for c in commands:
        if not isinstance(c, MutationCommand):
            raise SyntaxError_(f"Unknown mutation command: {c.to_text()}")
        out.append(c)
    return out


def _insert(p: Parser, sql: str) -> Insert:
    p.expect_words("INSERT")
    p.expect_words("INTO")
    p.accept_words("TABLE")
    table = _table_ref(p)
    columns: tuple[str, ...] | None = None
    if p.accept_punct("("):
        names = [p.identifier()]
        while p.accept_punct(","):
            names.append(p.identifier())
        p.expect_punct(")")
        columns = tuple(names)
    settings = _settings(p) if p.accept_words("SETTINGS") else {}
    if p.tok.is_word("VALUES"):
        start = p.tok.end
        return Insert(table, columns, "Values", sql[start:].strip().encode("utf-8"), settings)
    p.expect_words("FORMAT")
    fmt = p.tok
    if fmt.kind is not T.WORD:
        raise p.error("format name")
    # data starts after the first newline, or after the whitespace following the format name
    pos = fmt.end
    while pos < len(sql) and sql[pos] in " \t\f":
        pos += 1
    if sql.startswith("\r", pos):
        pos += 1
    if sql.startswith("\n", pos):
        pos += 1
    return Insert(table, columns, fmt.text, sql[pos:].encode("utf-8"), settings)


def _select(p: Parser) -> Select:
    p.expect_words("SELECT")
    if p.tok.is_word("DISTINCT"):
        raise SyntaxError_("SELECT DISTINCT is not supported")
    nodes = list(p.expression_list(allow_empty=False, allow_bare_alias=True))
    p.expect_words("FROM")
    table = _table_ref(p)
    final = p.accept_words("FINAL")
    where = Expr(p.expression()) if p.accept_words("WHERE") else None
    if p.tok.is_word("GROUP", "HAVING", "JOIN", "UNION", "ARRAY", "PREWHERE", "SAMPLE"):
        raise SyntaxError_(f"{p.tok.text.upper()} is not supported by replicad's SELECT")
    order: list[OrderItem] = []
    if p.accept_words("ORDER", "BY"):
        while True:
            expr = Expr(p.expression())
            desc = p.accept_words("DESC") or p.accept_words("DESCENDING")
            if not desc:
                p.accept_words("ASC") or p.accept_words("ASCENDING")
            nulls: bool | None = None
            if p.accept_words("NULLS"):
                if p.accept_words("FIRST"):
                    nulls = True
                else:
                    p.expect_words("LAST")
                    nulls = False
            order.append(OrderItem(expr, desc, nulls))
            if not p.accept_punct(","):
                break
    limit, offset = None, 0
    if p.accept_words("LIMIT"):
        limit = _unsigned(p, "LIMIT count")
        if p.accept_punct(","):
            offset, limit = limit, _unsigned(p, "LIMIT count")
        elif p.accept_words("OFFSET"):
            offset = _unsigned(p, "OFFSET")
    fmt, settings = None, {}
    for _ in range(2):
        if p.accept_words("FORMAT"):
            fmt = p.identifier()
        elif p.accept_words("SETTINGS"):
            settings = _settings(p)
    p.expect_end()
    is_count = (len(nodes) == 1 and isinstance(nodes[0], Function) and nodes[0].name.lower() == "count"
                and (not nodes[0].args or nodes[0].args == (Asterisk(),)))
    items = []
    for n in nodes:
        if isinstance(n, Asterisk):
            items.append(SelectItem(None))
        elif isinstance(n, Function) and n.name.lower() == "count" and not is_count:
            raise SyntaxError_("count() is only supported alone: SELECT count() FROM t [WHERE ...]")
        else:
            items.append(SelectItem(Expr(_strip_alias(n)), n.alias))
    return Select(table, tuple(items), is_count, where, tuple(order), limit, offset, fmt, final, settings)


def _strip_alias(n: Node) -> Node:
    if isinstance(n, Identifier):
        return Identifier(n.name, n.parts)
    if isinstance(n, Function):
        return Function(n.name, n.args, n.params)
    if isinstance(n, Literal):
        return Literal(n.value, n.kind)
    return n


__all__ = [
    "Alter", "CreateTable", "DetachedCommand", "DropTable", "Insert", "MutationCommand", "Optimize",
    "OrderItem", "PartitionCommand", "PartitionSpec", "Select", "SelectItem", "Statement", "SystemCommand",
    "SystemSyncReplica", "TableRef",
    "Truncate", "format_commands", "format_list", "parse_mutation_commands", "parse_statement",
]
