"""Table-level ZooKeeper texts: the ``metadata`` znode, the ``columns`` znode (ColumnsDescription) and the
NamesAndTypesList text of a part's ``columns.txt`` / ``parts/<p>/columns``.

Written exactly as ClickHouse 18.16 writes them; parsed from 18.16 and from modern ClickHouse (extra
``metadata`` lines ``ttl:``, ``indices:``, ``projections:``, ``granularity bytes:``, ``constraints:``,
``merge parameters format version:`` ...; ``COMMENT``/``CODEC``/``TTL`` column parts).  The ``columns``
znode escapes type names and default expressions (``Enum8(\\'a\\' = 1)``); NamesAndTypesList does not.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from replicad.errors import MetadataMismatchError, ZnodeFormatError
from replicad.sql.expressions_ast import Parser, format_list
from replicad.sql.expressions_lexer import escape, quote_string, unescape, unquote

# ---- metadata znode ----------------------------------------------------------------------------------

_HEAD = ["metadata format version: 1", "date column: ", "sampling expression: ", "index granularity: ",
         "mode: ", "sign column: ", "primary key: "]
_OPTIONAL = [  # (line prefix, field) in the order ClickHouse writes and reads them
    ("sorting key: ", "sorting_key"), ("ttl: ", "ttl_table"), ("indices: ", "skip_indices"),
    ("projections: ", "projections"), ("granularity bytes: ", "index_granularity_bytes"),
    ("constraints: ", "constraints"), ("merge parameters format version: ", "merge_params_version"),
    ("version column: ", "version_column"), ("is_deleted column: ", "is_deleted_column"),
    ("columns to sum: ", "columns_to_sum"), ("graphite hash: ", "graphite_params_hash"),
]
_INT_FIELDS = {"index_granularity", "merging_params_mode", "data_format_version", "index_granularity_bytes",
               "merge_params_version"}
_EXPRESSION_FIELDS = {"sampling_expression", "primary_key", "partition_key", "sorting_key", "ttl_table"}
_FIELD_NAMES = {  # the words ClickHouse's METADATA_MISMATCH messages use
    "date_column": "date index column", "sampling_expression": "sample expression",
    "index_granularity": "index granularity", "merging_params_mode": "mode of merge operation",
    "sign_column": "sign column", "primary_key": "primary key", "data_format_version": "data format version",
    "partition_key": "partition key expression", "sorting_key": "sorting key expression", "ttl_table": "TTL",
    "skip_indices": "skip indices", "projections": "projections",
    "index_granularity_bytes": "index granularity bytes (adaptive granularity)", "constraints": "constraints",
    "merge_params_version": "merge parameters format version", "version_column": "version column",
    "is_deleted_column": "is_deleted column", "columns_to_sum": "sum columns",
    "graphite_params_hash": "graphite params",
}


def normalize_expression_list(text: str) -> str:
    """Re-format an expression list the 18.16 way, so that texts written by other ClickHouse versions
    (``a + b * 2`` vs ``a + (b * 2)``) compare equal when they mean the same; unparsable text is kept."""
    if not text.strip():
        return ""
    try:
        p = Parser(text)
        nodes = p.expression_list()
        p.expect_end()
    except Exception:
        return text
    return format_list(nodes)


@dataclass(frozen=True)
class MetadataDiff:
    field: str
    local: str
    zookeeper: str

    def message(self) -> str:
        what = _FIELD_NAMES.get(self.field, self.field)
        return (f"Existing table metadata in ZooKeeper differs in {what}. "
                f"Stored in ZooKeeper: {self.zookeeper}, local: {self.local}")


@dataclass(frozen=True)
class TableMetadata:
    """The table ``metadata`` znode (ReplicatedMergeTreeTableMetadata)."""

    date_column: str = ""
    sampling_expression: str = ""
    index_granularity: int = 8192
    merging_params_mode: int = 0
    sign_column: str = ""
    primary_key: str = ""
    data_format_version: int = 1
    partition_key: str = ""
    sorting_key: str = ""
    # written by modern ClickHouse only
    ttl_table: str = ""
    skip_indices: str = ""
    projections: str = ""
    index_granularity_bytes: int = 0
    constraints: str = ""
    merge_params_version: int = 0  # 0: the line is absent (legacy)
    version_column: str = ""
    is_deleted_column: str = ""
    columns_to_sum: str = ""
    graphite_params_hash: str = ""

    def to_text(self) -> str:
        """The znode text; with only 18.16 fields set this is byte-identical to 18.16's."""
        out = [f"metadata format version: 1\ndate column: {self.date_column}\n"
               f"sampling expression: {self.sampling_expression}\n"
               f"index granularity: {self.index_granularity}\n"
               f"mode: {self.merging_params_mode}\nsign column: {self.sign_column}\n"
               f"primary key: {self.primary_key}\n"]
        if self.data_format_version >= 1:
            out.append(f"data format version: {self.data_format_version}\n"
                       f"partition key: {self.partition_key}\n")
        for prefix, name in _OPTIONAL:
            value = getattr(self, name)
            if name in ("version_column", "is_deleted_column", "columns_to_sum", "graphite_params_hash") and (
                self.merge_params_version < 2
            ):
                continue
            if value not in ("", 0):
                out.append(f"{prefix}{value}\n")
        return "".join(out)

    @classmethod
    def parse(cls, text: str | bytes) -> TableMetadata:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        values: dict[str, object] = {}
        head_fields = ["", "date_column", "sampling_expression", "index_granularity", "merging_params_mode",
                       "sign_column", "primary_key"]
        if len(lines) < len(_HEAD):
            raise ZnodeFormatError(f"table metadata is truncated: {text!r}")
        for line, prefix, name in zip(lines, _HEAD, head_fields, strict=False):
            if not line.startswith(prefix) or (not name and line != prefix):
                raise ZnodeFormatError(f"table metadata: expected {prefix!r}, got {line!r}")
            if name:
                values[name] = line[len(prefix):]
        rest = lines[len(_HEAD):]
        values["data_format_version"] = 0
        if rest and rest[0].startswith("data format version: "):
            values["data_format_version"] = rest.pop(0)[len("data format version: "):]
        if int(str(values["data_format_version"])) >= 1:
            if not rest or not rest[0].startswith("partition key: "):
                raise ZnodeFormatError("table metadata: missing 'partition key:' line")
            values["partition_key"] = rest.pop(0)[len("partition key: "):]
        for prefix, name in _OPTIONAL:  # ClickHouse reads these in order and ignores what follows
            if rest and rest[0].startswith(prefix):
                values[name] = rest.pop(0)[len(prefix):]
        try:
            typed = {k: int(str(v)) if k in _INT_FIELDS else v for k, v in values.items()}
        except ValueError as e:
            raise ZnodeFormatError(f"table metadata: bad number: {e}") from None
        return cls(**typed)  # type: ignore[arg-type]

    def differences(self, from_zk: TableMetadata) -> list[MetadataDiff]:
        """Fields in which this (local) metadata differs from ``from_zk``; key expressions are compared
        after re-formatting both sides (as modern ClickHouse does), everything else literally."""
        diffs = []
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(from_zk, f.name)
            if f.name in _EXPRESSION_FIELDS:
                equal = normalize_expression_list(mine) == normalize_expression_list(theirs)
            elif f.name == "merge_params_version":
                equal = True  # a format marker, not a property of the table
            else:
                equal = mine == theirs
            if not equal:
                diffs.append(MetadataDiff(f.name, str(mine), str(theirs)))
        return diffs

    def check_equal(self, from_zk: TableMetadata) -> None:
        """Raise MetadataMismatchError naming the first differing field (ClickHouse's message)."""
        diffs = self.differences(from_zk)
        if diffs:
            raise MetadataMismatchError("; ".join(d.message() for d in diffs))

    def with_changes(self, **changes: object) -> TableMetadata:
        return replace(self, **changes)  # type: ignore[arg-type]


# ---- columns znode ------------------------------------------------------------------------------------

DEFAULT_KINDS = ("DEFAULT", "MATERIALIZED", "ALIAS", "EPHEMERAL")
_KIND_ORDER = {"": 0, "DEFAULT": 0, "EPHEMERAL": 0, "MATERIALIZED": 1, "ALIAS": 2}


def _read_back_quoted(line: str) -> tuple[str, int]:
    """Parse a back-quoted name at the start of ``line``; return (name, index after it)."""
    if not line.startswith("`"):
        raise ZnodeFormatError(f"expected a back-quoted column name: {line!r}")
    i = 1
    while i < len(line):
        if line[i] == "\\":
            i += 2
            continue
        if line[i] == "`":
            return unquote(line[: i + 1]), i + 1
        i += 1
    raise ZnodeFormatError(f"unterminated column name: {line!r}")


@dataclass(frozen=True)
class ColumnDescription:
    name: str
    type: str  # canonical type text, unescaped
    default_kind: str = ""  # DEFAULT / MATERIALIZED / ALIAS / EPHEMERAL, or ""
    default_expression: str = ""  # formatted expression text, unescaped
    comment: str = ""
    extras: tuple[str, ...] = ()  # modern parts kept verbatim (unescaped): CODEC(...), TTL ..., SETTINGS ...

    @property
    def is_physical(self) -> bool:
        """Stored in parts (ordinary, DEFAULT and MATERIALIZED columns; not ALIAS/EPHEMERAL)."""
        return self.default_kind not in ("ALIAS", "EPHEMERAL")

    def to_line(self) -> str:
        out = f"{quote_string(self.name, '`')} {escape(self.type)}"
        if self.default_kind:
            out += f"\t{self.default_kind}\t{escape(self.default_expression)}"
        if self.comment:
            out += ("" if self.default_kind else "\t") + "\t" + escape(quote_string(self.comment))
        for extra in self.extras:
            out += "\t" + escape(extra)
        return out + "\n"

    @classmethod
    def parse_line(cls, line: str) -> ColumnDescription:
        name, pos = _read_back_quoted(line)
        if line[pos : pos + 1] != " ":
            raise ZnodeFormatError(f"expected a space after the column name: {line!r}")
        parts = line[pos + 1 :].split("\t")
        type_text = unescape(parts[0])
        kind, expr, comment, extras = "", "", "", []
        i = 1
        while i < len(parts):
            part = unescape(parts[i])
            if part in DEFAULT_KINDS and i + 1 < len(parts):
                kind, expr = part, unescape(parts[i + 1])
                i += 2
                continue
            if part.startswith("'"):
                comment = unquote(part)
            elif part.startswith("COMMENT "):
                comment = unquote(part[len("COMMENT "):].strip())
            elif part:
                extras.append(part)
            i += 1
        return cls(name, type_text, kind, expr, comment, tuple(extras))


@dataclass(frozen=True)
class ColumnsDescription:
    """The ``columns`` znode: ``columns format version: 1\\n<N> columns:\\n`` + one line per column,
    ordinary columns first, then MATERIALIZED, then ALIAS (ClickHouse's order)."""

    columns: tuple[ColumnDescription, ...]

    def ordered(self) -> list[ColumnDescription]:
        return sorted(self.columns, key=lambda c: _KIND_ORDER.get(c.default_kind, 0))

    def to_text(self) -> str:
        cols = self.ordered()
        return f"columns format version: 1\n{len(cols)} columns:\n" + "".join(c.to_line() for c in cols)

    @classmethod
    def parse(cls, text: str | bytes) -> ColumnsDescription:
        lines = _column_lines(text)
        return cls(tuple(ColumnDescription.parse_line(line) for line in lines))

    def physical(self) -> list[ColumnDescription]:
        return [c for c in self.ordered() if c.is_physical]

    def names_and_types(self) -> NamesAndTypesList:
        return NamesAndTypesList(tuple((c.name, c.type) for c in self.physical()))

    def get(self, name: str) -> ColumnDescription | None:
        return next((c for c in self.columns if c.name == name), None)

    def differences(self, from_zk: ColumnsDescription) -> list[str]:
        """Human-readable differences between these (local) columns and ``from_zk``'s: missing or extra
        columns, order, types, defaults (expressions compared after re-formatting) and comments."""
        mine, theirs = self.ordered(), from_zk.ordered()
        out = []
        names, zk_names = [c.name for c in mine], [c.name for c in theirs]
        out += [f"column {n!r} is missing locally" for n in zk_names if n not in names]
        out += [f"column {n!r} is not in ZooKeeper" for n in names if n not in zk_names]
        if not out and names != zk_names:
            out.append(f"column order differs: local {names}, ZooKeeper {zk_names}")
        for c in mine:
            z = from_zk.get(c.name)
            if z is None:
                continue
            if c.type != z.type:
                out.append(f"column {c.name!r}: type {c.type} locally, {z.type} in ZooKeeper")
            if c.default_kind != z.default_kind or normalize_expression_list(c.default_expression) != (
                normalize_expression_list(z.default_expression)
            ):
                out.append(f"column {c.name!r}: default {c.default_kind} {c.default_expression!r} locally, "
                           f"{z.default_kind} {z.default_expression!r} in ZooKeeper")
            if c.comment != z.comment or c.extras != z.extras:
                out.append(f"column {c.name!r}: comment/codec/TTL differ")
        return out


def _column_lines(text: str | bytes) -> list[str]:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    head = "columns format version: 1\n"
    if not text.startswith(head):
        raise ZnodeFormatError(f"columns text must start with {head!r}: {text[:60]!r}")
    body = text[len(head):]
    count_text, sep, rest = body.partition(" columns:\n")
    if not sep or not count_text.isdigit():
        raise ZnodeFormatError(f"bad columns header: {text[:80]!r}")
    lines = rest.split("\n")
    if lines[-1] != "":
        raise ZnodeFormatError("columns text must end with a newline")
    lines.pop()
    if len(lines) != int(count_text):
        raise ZnodeFormatError(f"columns text announces {count_text} columns but has {len(lines)}")
    return lines


@dataclass(frozen=True)
class NamesAndTypesList:
    """A part's ``columns.txt`` and the ``parts/<p>/columns`` znode (type names unescaped)."""

    columns: tuple[tuple[str, str], ...]

    def to_text(self) -> str:
        body = "".join(f"{quote_string(n, '`')} {t}\n" for n, t in self.columns)
        return f"columns format version: 1\n{len(self.columns)} columns:\n{body}"

    @classmethod
    def parse(cls, text: str | bytes) -> NamesAndTypesList:
        out = []
        for line in _column_lines(text):
            name, pos = _read_back_quoted(line)
            if line[pos : pos + 1] != " ":
                raise ZnodeFormatError(f"expected a space after the column name: {line!r}")
            out.append((name, line[pos + 1 :]))
        return cls(tuple(out))

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.columns]
