"""ClickHouse data types: ``parse_type(text) -> DataType`` and ``escape_for_file_name``.

The classes live in ``types_*.py`` helpers; this module is the public entry point::

    t = parse_type("Nullable(Decimal(9, 2))")
    t.name            # canonical text for columns.txt
    t.arrow_type      # storage Arrow type
    t.substreams()    # ['.null', '']
    bufs = t.serialize(arr); t.deserialize(bufs, len(arr))

Accepted syntax: the 18.16 type names (case-sensitive) with any whitespace, ``DateTime('tz')``,
``Enum8('a' = 1, ...)`` / ``Enum16`` (and ``Enum(...)``, picking the width; values may be omitted),
``Decimal(P, S)``, ``Decimal(P)``, ``Decimal32/64/128(S)``, ``Nullable(T)``, ``Array(T)``,
``LowCardinality(String)``, and the case-insensitive SQL aliases ClickHouse knows (``INT``, ``BIGINT``,
``VARCHAR``, ``DOUBLE``, ...), which canonicalise to the ClickHouse name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from replicad.datatypes.base import (
    FIELD_ARRAY,
    FIELD_DECIMAL32,
    FIELD_DECIMAL64,
    FIELD_DECIMAL128,
    FIELD_FLOAT64,
    FIELD_INT64,
    FIELD_NULL,
    FIELD_STRING,
    FIELD_TUPLE,
    FIELD_UINT64,
    FIELD_UINT128,
    DataType,
)
from replicad.datatypes.composite import ArrayType, NullableType
from replicad.datatypes.dates import DateTimeType, DateType
from replicad.datatypes.decimals import DecimalType
from replicad.datatypes.enums import EnumType
from replicad.datatypes.lowcard import LowCardinalityType
from replicad.datatypes.numeric import FLOAT_TYPES, INT_TYPES, FloatType, IntType
from replicad.datatypes.strings import FixedStringType, StringType
from replicad.datatypes.uuids import UUIDType
from replicad.errors import SyntaxError_

__all__ = [
    "FIELD_ARRAY",
    "FIELD_DECIMAL32",
    "FIELD_DECIMAL64",
    "FIELD_DECIMAL128",
    "FIELD_FLOAT64",
    "FIELD_INT64",
    "FIELD_NULL",
    "FIELD_STRING",
    "FIELD_TUPLE",
    "FIELD_UINT64",
    "FIELD_UINT128",
    "ArrayType",
    "DataType",
    "DateTimeType",
    "DateType",
    "DecimalType",
    "EnumType",
    "FixedStringType",
    "FloatType",
    "IntType",
    "LowCardinalityType",
    "NullableType",
    "StringType",
    "TypeSyntaxError",
    "UUIDType",
    "escape_for_file_name",
    "parse_type",
    "unescape_for_file_name",
]


class TypeSyntaxError(SyntaxError_):
    """Unparsable or unsupported type text."""

    code = 50  # UNKNOWN_TYPE


# ---- file names ---------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def escape_for_file_name(name: str) -> str:
    """ClickHouse escapeForFileName: bytes outside ``[A-Za-z0-9_]`` become ``%XX`` (upper-case hex).
    Cached: a merge or a read names every column's files once per granule batch."""
    out = []
    for b in name.encode("utf-8"):
        c = chr(b)
        if c.isascii() and (c.isalnum() or c == "_"):
            out.append(c)
        else:
            out.append(f"%{b:02X}")
    return "".join(out)


def unescape_for_file_name(name: str) -> str:
    """Inverse of :func:`escape_for_file_name`."""
    raw = bytearray()
    i = 0
    while i < len(name):
        if name[i] == "%" and  re.fullmatch(r"[0-9A-Fa-f]{2}", name[i + 1:i + 3]):
            raw.append(int(name[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(name[i].encode("utf-8"))
            i += 1
    return raw.decode("utf-8", errors="surrogateescape")


# ---- the type-text parser -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeNode:
    """Parsed type text: ``name(args)``; an arg is a TypeNode, an int, a str, or a (str, int) pair."""

    name: str
    args: tuple[object, ...] | None


_TOKEN = re.compile(
    r"\s*(?:(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>[+-]?\d+)|(?P<str>'(?:[^'\\]|\\.)*')|(?P<punct>[(),=]))",
    re.S,
)

_UNESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "0": "\0", "a": "\a", "v": "\v",
              "e": "\x1b"}


def unquote(text: str) -> str:
    """``'...'`` with ClickHouse backslash escapes -> str."""
    body = text[1:-1]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x" and re.fullmatch(r"[0-9A-Fa-f]{2}", body[i + 2:i + 4]):
                out.append(chr(int(body[i + 2:i + 4], 16)))
                i += 4
                continue
            out.append(_UNESCAPES.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise TypeSyntaxError(f"cannot parse type {text!r} at position {pos}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, kind: str | None = None, value: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (kind and tok[0] != kind) or (value and tok[1] != value):
            want = value or kind or "token"
            raise TypeSyntaxError(f"cannot parse type {self.text!r}: expected {want}")
        self.i += 1
        return tok[1]

    def node(self) -> TypeNode:
        name = self.take("ident")
        tok = self.peek()
        if tok is None or tok[1] != "(":
            return TypeNode(name, None)
        self.take(value="(")
        args: list[object] = []
        if self.peek() == ("punct", ")"):
            self.take(value=")")
            return TypeNode(name, ())
        while True:
            args.append(self.arg())
            sep = self.take("punct")
            if sep == ")":
                return TypeNode(name, tuple(args))
            if sep != ",":
                raise TypeSyntaxError(f"cannot parse type {self.text!r}: unexpected {sep!r}")

    def arg(self) -> object:
        tok = self.peek()
        if tok is None:
            raise TypeSyntaxError(f"cannot parse type {self.text!r}: unexpected end")
        if tok[0] == "num":
            self.i += 1
            return int(tok[1])
        if tok[0] == "str":
            self.i += 1
            s = unquote(tok[1])
            if self.peek() == ("punct", "="):
                self.i += 1
                return (s, int(self.take("num")))
            return s
        return self.node()

    def parse(self) -> TypeNode:
        n = self.node()
        if self.peek() is not None:
            raise TypeSyntaxError(f"cannot parse type {self.text!r}: trailing text")
        return n


_SQL_ALIASES = {
    "tinyint": "Int8", "int1": "Int8", "byte": "Int8", "smallint": "Int16", "int2": "Int16",
    "int": "Int32", "integer": "Int32", "int4": "Int32", "bigint": "Int64", "int8": "Int64",
    "float": "Float32", "real": "Float32", "float4": "Float32", "double": "Float64", "float8": "Float64",
    "char": "String", "varchar": "String", "text": "String", "tinytext": "String", "mediumtext": "String",
    "longtext": "String", "blob": "String", "tinyblob": "String", "mediumblob": "String",
    "longblob": "String", "bytea": "String", "binary": "FixedString", "timestamp": "DateTime",
    "dec": "Decimal", "numeric": "Decimal", "fixed": "Decimal",
}


def _no_args(node: TypeNode) -> None:
    if node.args is not None:
        raise TypeSyntaxError(f"type {node.name} takes no arguments")


def _int_arg(node: TypeNode, i: int) -> int:
    if node.args is None or len(node.args) <= i or not isinstance(node.args[i], int):
        raise TypeSyntaxError(f"type {node.name} needs an integer argument")
    v = node.args[i]
    assert isinstance(v, int)
    return v


def _type_arg(node: TypeNode) -> TypeNode:
    if node.args is None or len(node.args) != 1 or not isinstance(node.args[0], TypeNode):
        raise TypeSyntaxError(f"type {node.name} needs exactly one type argument")
    return node.args[0]


def build(node: TypeNode) -> DataType:
    name = node.name
    if name not in _BUILDERS and name.lower() in _SQL_ALIASES:
        canon = _SQL_ALIASES[name.lower()]
        if canon in ("String", "Int8", "Int16", "Int32", "Int64", "Float32", "Float64"):
            node = TypeNode(canon, None)  # VARCHAR(255), INT(11), FLOAT(24) ...: the length is ignored
        else:
            node = TypeNode(canon, node.args)
        name = canon
    builder = _BUILDERS.get(name)
    if builder is None:
        raise TypeSyntaxError(f"unknown or unsupported data type {name!r}")
    return builder(node)


def _simple(t: DataType) -> Callable[[TypeNode], DataType]:
    def b(node: TypeNode) -> DataType:
        _no_args(node)
        return t

    return b


def _datetime(node: TypeNode) -> DataType:
    if node.args is None or node.args == ():
        return DateTimeType()
    if len(node.args) != 1 or not isinstance(node.args[0], str):
        raise TypeSyntaxError("DateTime takes one time-zone argument: DateTime('Europe/Moscow')")
    tz = node.args[0]
    try:
        import zoneinfo

        zoneinfo.ZoneInfo(tz)
    except Exception:
        raise TypeSyntaxError(f"unknown time zone {tz!r}") from None
    return DateTimeType(tz)


def _fixed_string(node: TypeNode) -> DataType:
    if node.args is None or len(node.args) != 1:
        raise TypeSyntaxError("FixedString takes one argument: FixedString(N)")
    n = _int_arg(node, 0)
    if not 0 < n <= 0xFFFFFF:
        raise TypeSyntaxError(f"FixedString size {n} is out of range")
    return FixedStringType(n)


def _enum(bits: int | None) -> Callable[[TypeNode], DataType]:
    def b(node: TypeNode) -> DataType:
        if not node.args:
            raise TypeSyntaxError(f"{node.name} needs at least one 'name' = value pair")
        pairs: list[tuple[str, int]] = []
        for i, a in enumerate(node.args):
            if isinstance(a, tuple):
                pairs.append((str(a[0]), int(a[1])))
            elif isinstance(a, str) and bits is None:  # Enum('a', 'b'): values 1, 2, ...
                pairs.append((a, i + 1))
            else:
                raise TypeSyntaxError(f"{node.name} arguments must be 'name' = value pairs")
        width = bits
        if width is None:
            width = 8 if all(-128 <= v <= 127 for _, v in pairs) else 16
        try:
            return EnumType(width, pairs)
        except ValueError as e:
            raise TypeSyntaxError(str(e)) from None

    return b


def _decimal(fixed_precision: int | None) -> Callable[[TypeNode], DataType]:
    def b(node: TypeNode) -> DataType:
        args = node.args or ()
        if fixed_precision is not None:
            if len(args) != 1:
                raise TypeSyntaxError(f"{node.name} takes one argument: the scale")
            precision, scale = fixed_precision, _int_arg(node, 0)
        else:
            if not 1 <= len(args) <= 2:
                raise TypeSyntaxError("Decimal takes (precision[, scale])")
            precision = _int_arg(node, 0)
            scale = _int_arg(node, 1) if len(args) == 2 else 0
        try:
            return DecimalType(precision, scale)
        except ValueError as e:
            raise TypeSyntaxError(str(e)) from None

    return b


def _nullable(node: TypeNode) -> DataType:
    try:
        return NullableType(build(_type_arg(node)))
    except ValueError as e:
        raise TypeSyntaxError(str(e)) from None


def _array(node: TypeNode) -> DataType:
    return ArrayType(build(_type_arg(node)))


def _low_cardinality(node: TypeNode) -> DataType:
    inner = build(_type_arg(node))
    if isinstance(inner, StringType):
        return LowCardinalityType(nullable=False)
    if isinstance(inner, NullableType) and isinstance(inner.inner, StringType):
        return LowCardinalityType(nullable=True)
    raise TypeSyntaxError(f"LowCardinality({inner.name}) is not supported (only String and Nullable(String))")


_BUILDERS: dict[str, Callable[[TypeNode], DataType]] = {}
for _t in [*INT_TYPES.values(), *FLOAT_TYPES.values(), DateType(), StringType(), UUIDType()]:
    _BUILDERS[_t.name] = _simple(_t)
_BUILDERS["DateTime"] = _datetime
_BUILDERS["FixedString"] = _fixed_string
_BUILDERS["Enum8"] = _enum(8)
_BUILDERS["Enum16"] = _enum(16)
_BUILDERS["Enum"] = _enum(None)
_BUILDERS["Decimal"] = _decimal(None)
_BUILDERS["Decimal32"] = _decimal(9)
_BUILDERS["Decimal64"] = _decimal(18)
_BUILDERS["Decimal128"] = _decimal(38)
_BUILDERS["Nullable"] = _nullable
_BUILDERS["Array"] = _array
_BUILDERS["LowCardinality"] = _low_cardinality


@lru_cache(maxsize=1024)
def parse_type(text: str) -> DataType:
    """Parse ClickHouse type text into a :class:`DataType` (TypeSyntaxError if unknown/invalid)."""
    return build(_Parser(text).parse())
