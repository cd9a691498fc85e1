"""``CREATE TABLE`` for (Replicated)MergeTree: parse, validate, and derive the ZooKeeper texts.

Accepted::

    CREATE TABLE [IF NOT EXISTS] [db.]t [ON CLUSTER c] (col [Type] [DEFAULT|MATERIALIZED|ALIAS expr]
        [COMMENT 'text'], ...)
    ENGINE = ReplicatedMergeTree('zk_path', 'replica') | MergeTree[()]
    [PARTITION BY expr] [ORDER BY expr] [PRIMARY KEY expr] [SAMPLE BY expr] [SETTINGS k = v, ...]

The pre-2018 engine-argument syntax (``MergeTree(date, (key), 8192)``) and other MergeTree families are
rejected with a clear message.  Key clauses are kept as ClickHouse formats them; ``metadata_text()`` /
``columns_text()`` give the znode texts 18.16 writes for this DDL (verified against a live 18.16, see
tests/fixtures/ch18_metadata.json): the ``sorting key:`` line appears whenever PRIMARY KEY is given,
and typed DEFAULT expressions whose own type differs get wrapped in ``CAST(expr, 'Type')`` like 18.16 does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from replicad.datatypes import DataType, parse_type
from replicad.errors import ReplicadError, SyntaxError_
from replicad.sql.expressions import Expr, empty_table
from replicad.sql.expressions_ast import (
    Function,
    Literal,
    Node,
    Parser,
    column_name,
    format_ast,
    format_list,
    key_expression_list,
    referenced_columns,
)
from replicad.sql.expressions_lexer import T, back_quote_if_needed, quote_string
from replicad.sql.partition import PartitionKey
from replicad.sql.table_metadata import (
    ColumnDescription,
    ColumnsDescription,
    NamesAndTypesList,
    TableMetadata,
)

BAD_ARGUMENTS = 36
UNKNOWN_IDENTIFIER = 47
ILLEGAL_COLUMN = 44
UNKNOWN_STORAGE = 56

_SUPPORTED_ENGINES = ("MergeTree", "ReplicatedMergeTree")
_OTHER_FAMILIES = ("Collapsing", "Summing", "Aggregating", "Replacing", "Graphite", "VersionedCollapsing")


def ddl_error(msg: str, code: int = BAD_ARGUMENTS) -> SyntaxError_:
    return SyntaxError_(msg, code=code)


@dataclass(frozen=True)
class ColumnDef:
    """One column: ``type_text`` as written (or the deduced type for ``x DEFAULT expr`` without a type),
    ``default_expression`` as ClickHouse stores it (formatted, possibly wrapped in CAST)."""

    name: str
    type_text: str
    default_kind: str = ""
    default_expression: str = ""
    comment: str = ""

    @property
    def type(self) -> DataType:
        return parse_type(self.type_text)

    @property
    def is_physical(self) -> bool:
        return self.default_kind != "ALIAS"

    def description(self) -> ColumnDescription:
        return ColumnDescription(self.name, self.type.name, self.default_kind, self.default_expression,
                                 self.comment)


@dataclass(frozen=True)
class TableDef:
    database: str | None
    name: str
    columns: tuple[ColumnDef, ...]
    engine: str
    zk_path: str | None  # unexpanded ({shard}, {replica} macros kept)
    replica_name: str | None
    partition_by: str | None
    order_by: str
    primary_key: str | None
    sample_by: str | None
    settings: dict[str, str] = field(default_factory=dict)
    if_not_exists: bool = False
    on_cluster: str | None = None
    ddl: str = ""

    @property
    def replicated(self) -> bool:
        return self.engine.startswith("Replicated")

    @property
    def index_granularity(self) -> int:
        return int(self.settings.get("index_granularity", "8192"))

    @cached_property
    def types(self) -> dict[str, DataType]:
        """Types of all columns (ALIAS included), by name."""
        return {c.name: c.type for c in self.columns}

    @cached_property
    def physical_types(self) -> dict[str, DataType]:
        return {c.name: c.type for c in self.columns if c.is_physical}

    @cached_property
    def partition_key(self) -> PartitionKey:
        return PartitionKey.parse(self.partition_by)

    @cached_property
    def sorting_key(self) -> list[Expr]:
        """ORDER BY as an expression list (what rows are sorted by)."""
        return [Expr(n) for n in _key_nodes(self.order_by)]

    @cached_property
    def primary_key_expressions(self) -> list[Expr]:
        """PRIMARY KEY (default: ORDER BY) as an expression list (what primary.idx stores)."""
        key = self.primary_key if self.primary_key is not None else self.order_by
        return [Expr(n) for n in _key_nodes(key)]

    def metadata(self) -> TableMetadata:
        sorting = format_list(_key_nodes(self.order_by))
        primary = format_list(_key_nodes(self.primary_key)) if self.primary_key is not None else sorting
        return TableMetadata(
            sampling_expression=self.sample_by or "",
            index_granularity=self.index_granularity,
            primary_key=primary,
            partition_key=self.partition_key.text,
            sorting_key=sorting if self.primary_key is not None else "",
        )

    def metadata_text(self) -> str:
        """The table ``metadata`` znode as 18.16 writes it."""
        return self.metadata().to_text()

    def columns_description(self) -> ColumnsDescription:
        return ColumnsDescription(tuple(c.description() for c in self.columns))

    def columns_text(self) -> str:
        """The ``columns`` znode as 18.16 writes it."""
        return self.columns_description().to_text()

    def names_and_types(self) -> NamesAndTypesList:
        """The physical columns as a part's ``columns.txt`` lists them."""
        return self.columns_description().names_and_types()

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.name}" if self.database else self.name


def _key_nodes(text: str | None) -> tuple[Node, ...]:
    if text is None:
        return ()
    p = Parser(text)
    node = p.expression()
    p.expect_end()
    return key_expression_list(node)


# ---- parsing -------------------------------------------------------------------------------------------


def _type_text(p: Parser) -> str:
    """Raw text of a type (identifier with balanced parentheses), straight from the source."""
    start = p.tok
    if start.kind not in (T.WORD, T.QUOTED_ID):
        raise p.error("column type")
    p.advance()
    end = start.end
    if p.tok.is_punct("("):
        depth = 0
        while True:
            t = p.advance()
            if t.kind is T.END:
                raise p.error("')' closing the type arguments")
            if t.is_punct("("):
                depth += 1
            elif t.is_punct(")"):
                depth -= 1
                if depth == 0:
                    end = t.end
                    break
    return p.text[start.start : end]


_COLUMN_STOP = ("DEFAULT", "MATERIALIZED", "ALIAS", "COMMENT", "CODEC", "TTL")


@dataclass
class _RawColumn:
    name: str
    type_text: str | None
    kind: str = ""
    expr: Node | None = None
    comment: str = ""


def _column(p: Parser) -> _RawColumn:
    if p.tok.is_word("INDEX", "CONSTRAINT", "PROJECTION") and p.peek().kind in (T.WORD, T.QUOTED_ID):
        raise ddl_error(f"{p.tok.text.upper()} definitions are not supported (ClickHouse 18.16 has none)")
    name = p.identifier()
    type_text = None
    if not (p.tok.is_punct(",") or p.tok.is_punct(")") or p.tok.is_word(*_COLUMN_STOP)):
        type_text = _type_text(p)
    col = _RawColumn(name, type_text)
    for kind in ("DEFAULT", "MATERIALIZED", "ALIAS"):
        if p.accept_words(kind):
            col.kind, col.expr = kind, p.expression()
            break
    if p.accept_words("COMMENT"):
        col.comment = p.string_literal()
    if p.tok.is_word("CODEC", "TTL"):
        raise ddl_error(f"column {p.tok.text.upper()} is not supported (ClickHouse 18.16 has none)")
    if col.type_text is not None:
        col.type_text = _normalize_type_text(col.type_text)
    if col.type_text is None and col.expr is None:
        raise p.error(f"a type for column {name}")
    return col


def parse_column_definition(p: Parser) -> tuple[str, str]:
    """One column definition of ``ALTER … ADD|MODIFY COLUMN`` as CREATE TABLE text (name, type, default,
    comment: re-formatted), for :func:`render_create_table` and a re-parse that validates it."""
    c = _column(p)
    return c.name, _render_raw(c)


def _render_raw(c: _RawColumn) -> str:
    out = back_quote_if_needed(c.name)
    if c.type_text is not None:
        out += f" {c.type_text}"
    if c.kind and c.expr is not None:
        out += f" {c.kind} {format_ast(c.expr)}"
    if c.comment:
        out += f" COMMENT {quote_string(c.comment)}"
    return out


def with_comment(definition: str, comment: str) -> str:
    """A column definition (as :func:`parse_column_definition` writes it) with its comment replaced
    (``''`` removes it): what ``COMMENT COLUMN`` changes."""
    c = _column(Parser(definition))
    c.comment = comment
    return _render_raw(c)


def column_definition(c: ColumnDef) -> str:
    """A resolved column as CREATE TABLE text (its default as stored, so a re-parse keeps it unchanged)."""
    return _definition(c.name, c.type_text, c.default_kind, c.default_expression, c.comment)


def description_definition(c: ColumnDescription) -> str:
    """A ``columns`` znode line as CREATE TABLE text (how a replica adopts columns another one wrote)."""
    return _definition(c.name, c.type, c.default_kind, c.default_expression, c.comment)


def _definition(name: str, type_text: str, default_kind: str, default_expression: str, comment: str) -> str:
    out = f"{back_quote_if_needed(name)} {type_text}"
    if default_kind:
        out += f" {default_kind} {default_expression}"
    if comment:
        out += f" COMMENT {quote_string(comment)}"
    return out


_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def render_create_table(table: TableDef, columns: list[str]) -> str:
    """``table``'s CREATE statement (macros unexpanded, IF NOT EXISTS / ON CLUSTER dropped) with ``columns``
    (CREATE TABLE column texts) instead of its own: the DDL a replica persists after an ALTER."""
    name = back_quote_if_needed(table.name)
    if table.database:
        name = f"{back_quote_if_needed(table.database)}.{name}"
    out = f"CREATE TABLE {name}\n(\n    " + ",\n    ".join(columns) + "\n)\n"
    if table.replicated:
        out += (f"ENGINE = ReplicatedMergeTree({quote_string(table.zk_path or '')}, "
                f"{quote_string(table.replica_name or '')})\n")
    else:
        out += "ENGINE = MergeTree\n"
    for clause, value in (("PARTITION BY", table.partition_by), ("ORDER BY", table.order_by),
                          ("PRIMARY KEY", table.primary_key), ("SAMPLE BY", table.sample_by)):
        if value is not None:
            out += f"{clause} {value}\n"
    if table.settings:
        out += "SETTINGS " + ", ".join(f"{k} = {v if _NUMBER.fullmatch(v) else quote_string(v)}"
                                       for k, v in table.settings.items()) + "\n"
    return out


def _normalize_type_text(text: str) -> str:
    """Re-print type text with ClickHouse's quoting (``'it''s'`` -> ``'it\\'s'``) where it parses as an
    expression; other type texts (named tuples ...) are kept as written."""
    try:
        p = Parser(text)
        node = p.element()
        p.expect_end()
    except SyntaxError_:
        return text
    return format_ast(node)


def _literal_text(node: Node) -> str:
    if isinstance(node, Literal):
        return str(node.value) if node.kind == "string" else format_ast(node)
    return format_ast(node)


def parse_create_table(sql: str) -> TableDef:
    """Parse and validate a CREATE TABLE statement (SyntaxError_ with a clear message otherwise)."""
    p = Parser(sql)
    p.expect_words("CREATE")
    p.accept_words("TEMPORARY")
    p.expect_words("TABLE")
    return parse_create_table_body(p, sql)


def parse_create_table_body(p: Parser, sql: str) -> TableDef:
    """The rest of CREATE TABLE after ``CREATE TABLE`` (shared with the statement parser)."""
    if_not_exists = p.accept_words("IF", "NOT", "EXISTS")
    parts = p.compound_identifier()
    if len(parts) > 2:
        raise ddl_error(f"bad table name {'.'.join(parts)!r}")
    database, name = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    on_cluster = None
    if p.accept_words("ON", "CLUSTER"):
        on_cluster = p.string_literal() if p.tok.kind is T.STRING else p.identifier()
    if p.tok.is_word("AS"):
        raise ddl_error("CREATE TABLE ... AS is not supported: give the column list")
    p.expect_punct("(")
    raw_columns = [_column(p)]
    while p.accept_punct(","):
        raw_columns.append(_column(p))
    p.expect_punct(")")

    p.expect_words("ENGINE")
    p.accept_punct("=")
    engine = p.identifier()
    engine_args: tuple[Node, ...] = ()
    if p.accept_punct("("):
        engine_args = p.expression_list()
        p.expect_punct(")")

    clauses: dict[str, Node] = {}
    settings: dict[str, str] = {}
    while not p.at_end():
        for words, key in ((("PARTITION", "BY"), "partition_by"), (("PRIMARY", "KEY"), "primary_key"),
                           (("ORDER", "BY"), "order_by"), (("SAMPLE", "BY"), "sample_by")):
            if p.at_words(*words):
                if key in clauses:
                    raise ddl_error(f"{' '.join(words)} is given twice")
                p.accept_words(*words)
                clauses[key] = p.expression()
                break
        else:
            if p.accept_words("SETTINGS"):
                while True:
                    setting = p.identifier()
                    p.expect_punct("=")
                    settings[setting] = _literal_text(p.expression())
                    if not p.accept_punct(","):
                        break
                break
            if p.tok.is_word("TTL"):
                raise ddl_error("table TTL is not supported (ClickHouse 18.16 has none)")
            raise p.error("PARTITION BY, ORDER BY, PRIMARY KEY, SAMPLE BY or SETTINGS")
    p.expect_end()

    zk_path, replica = _engine(engine, engine_args)
    if "order_by" not in clauses:
        raise ddl_error("You must provide an ORDER BY expression in the table definition. "
                        "If you don't want this table to be sorted, use ORDER BY tuple()")
    columns = _resolve_columns(raw_columns)
    text = {k: format_ast(v) for k, v in clauses.items()}
    table = TableDef(database, name, columns, engine, zk_path, replica, text.get("partition_by"),
                     text["order_by"], text.get("primary_key"), text.get("sample_by"), settings,
                     if_not_exists, on_cluster, sql)
    _validate_keys(table, clauses)
    return table


def _engine(engine: str, args: tuple[Node, ...]) -> tuple[str | None, str | None]:
    family = engine.removeprefix("Replicated").removesuffix("MergeTree")
    if engine not in _SUPPORTED_ENGINES:
        if engine.endswith("MergeTree") and family in _OTHER_FAMILIES:
            raise ddl_error(f"Engine {engine} is not supported: only MergeTree and ReplicatedMergeTree",
                            UNKNOWN_STORAGE)
        raise ddl_error(f"Unknown or unsupported table engine {engine}: "
                        "only MergeTree and ReplicatedMergeTree",
                        UNKNOWN_STORAGE)
    replicated = engine == "ReplicatedMergeTree"
    wanted = 2 if replicated else 0
    if len(args) > wanted:
        usage = "'zk_path', 'replica'" if replicated else ""
        raise ddl_error(
            f"{engine}({format_list(args)}) is the old engine-argument syntax, "
            "which replicad does not support; "
            f"write {engine}({usage}) PARTITION BY ... ORDER BY ..."
        )
    if len(args) < wanted:
        raise ddl_error(f"{engine} needs 2 arguments: ('zk_path', 'replica')")
    if not replicated:
        return None, None
    values = []
    for what, node in zip(("Path in ZooKeeper", "Replica name"), args, strict=True):
        if not (isinstance(node, Literal) and node.kind == "string"):
            raise ddl_error(f"{what} must be a string literal")
        values.append(str(node.value))
    if not values[1]:
        raise ddl_error("No replica name given")
    return values[0], values[1]


def _resolve_columns(raw: list[_RawColumn]) -> tuple[ColumnDef, ...]:
    names = [c.name for c in raw]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ddl_error(f"Column {sorted(dupes)[0]!r} specified more than once")
    types: dict[str, DataType] = {}
    for c in raw:
        if c.type_text is not None:
            types[c.name] = parse_type(c.type_text)
        else:
            types[c.name] = parse_type("UInt8")  # placeholder while deducing, as ClickHouse does
    out = []
    for c in raw:
        if c.expr is None:
            assert c.type_text is not None
            out.append(ColumnDef(c.name, c.type_text, comment=c.comment))
            continue
        expr = Expr(c.expr)
        missing = [n for n in expr.columns if n not in types]
        if missing:
            raise ddl_error(f"Missing column {missing[0]!r} in the {c.kind} expression of column {c.name}",
                            UNKNOWN_IDENTIFIER)
        try:
            deduced = expr.evaluate(empty_table(types, expr.columns), types)[1]
        except ReplicadError as e:
            raise ddl_error(f"Cannot use the {c.kind} expression of column {c.name}: {e}") from None
        if c.type_text is None:
            types[c.name] = deduced
            out.append(ColumnDef(c.name, deduced.name, c.kind, expr.text, c.comment))
            continue
        declared = types[c.name]
        stored: Node = c.expr
        if deduced.name != declared.name:
            stored = Function("CAST", (c.expr, Literal(declared.name, "string")))
        out.append(ColumnDef(c.name, c.type_text, c.kind, format_ast(stored), c.comment))
    return tuple(out)


def _validate_keys(table: TableDef, clauses: dict[str, Node]) -> None:
    types = table.physical_types
    for key, node in clauses.items():
        for col in referenced_columns(node):
            if col not in types:
                clause = key.replace("_", " ").upper()
                raise ddl_error(f"Missing column {col!r} used in {clause}", UNKNOWN_IDENTIFIER)
    checks = [("Sorting", table.sorting_key), ("Primary", table.primary_key_expressions),
              ("Partition", table.partition_key.expressions)]
    for what, exprs in checks:
        for e in exprs:
            if not e.columns:
                raise ddl_error(f"{what} key cannot contain constants: {e.text}", ILLEGAL_COLUMN)
            try:
                dt = e.result_type(types)
            except ReplicadError as err:
                raise ddl_error(f"{what} key expression {e.text}: {err}") from None
            if dt.name.startswith("Nullable("):
                raise ddl_error(f"{what} key cannot contain nullable columns: {e.text}", ILLEGAL_COLUMN)
    sort_names = [column_name(n) for n in _key_nodes(table.order_by)]
    pk_names = [column_name(n) for n in _key_nodes(table.primary_key)] if table.primary_key else sort_names
    if len(pk_names) > len(sort_names) or pk_names != sort_names[: len(pk_names)]:
        raise ddl_error(f"Primary key must be a prefix of the sorting key: PRIMARY KEY {table.primary_key}, "
                        f"ORDER BY {table.order_by}")
    if table.sample_by is not None:
        sample = column_name(clauses["sample_by"])
        if sample not in pk_names:
            raise ddl_error(f"Sampling expression must be present in the primary key: {table.sample_by}")
    granularity = table.settings.get("index_granularity", "8192")
    if not granularity.isdigit() or int(granularity) == 0:
        raise ddl_error(f"index_granularity must be a positive integer, got {granularity!r}")
