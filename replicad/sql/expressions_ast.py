"""ClickHouse expression syntax trees: parser and ``formatAST`` printer (as ClickHouse 18.16 prints them).

The grammar mirrors ClickHouse's (lowest to highest precedence): ternary ``?:``, ``OR``, ``AND``, ``NOT``,
``IS [NOT] NULL``, comparisons (``= == != <> < > <= >= [NOT] LIKE [GLOBAL] [NOT] IN``), ``BETWEEN``,
``||``, ``+ -``, ``INTERVAL``, ``* / %``, unary minus, ``.N`` / ``[i]``, and elements (parenthesised
expressions and tuples, array literals, literals, ``CAST(x AS T)``, ``CASE``, function calls, ``*``,
identifiers).  Operators become function nodes (``a + b`` -> ``plus(a, b)``), exactly like ClickHouse,
so that :func:`format_ast` reproduces the texts ClickHouse writes into ZooKeeper (``metadata`` keys,
column defaults, mutation commands): operators infix, operands of operators parenthesised when they are
operators themselves (``(a = 1) AND (b = 2)``), ``modulo(x, 3)`` printed ``x % 3``, ``tuple(a, b)``
printed ``(a, b)``, floats printed ``1.`` / ``1e-7``, identifiers back-quoted only when needed.
"""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass

from replicad.errors import SyntaxError_
from replicad.sql.expressions_lexer import T, Token, back_quote_if_needed, quote_string, tokenize, unquote

# ---- nodes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    """A constant: ``kind`` is the ClickHouse Field kind: null, uint, int, float, string or array."""

    value: object  # None | int | float | str | tuple[Literal, ...]
    kind: str
    alias: str | None = None


@dataclass(frozen=True)
class Identifier:
    name: str  # full dotted name
    parts: tuple[str, ...] = ()
    alias: str | None = None


@dataclass(frozen=True)
class Function:
    name: str
    args: tuple[Node, ...]
    params: tuple[Node, ...] | None = None
    alias: str | None = None


@dataclass(frozen=True)
class Asterisk:
    alias: str | None = None


Node = Literal | Identifier | Function | Asterisk

_BINARY_OPERATORS = {
    "multiply": " * ", "divide": " / ", "modulo": " % ", "plus": " + ", "minus": " - ",
    "notEquals": " != ", "lessOrEquals": " <= ", "greaterOrEquals": " >= ", "less": " < ",
    "greater": " > ", "equals": " = ", "like": " LIKE ", "notLike": " NOT LIKE ", "in": " IN ",
    "notIn": " NOT IN ", "globalIn": " GLOBAL IN ", "globalNotIn": " GLOBAL NOT IN ",
}
_COMPARISONS = [
    ("==", "equals"), ("!=", "notEquals"), ("<>", "notEquals"), ("<=", "lessOrEquals"),
    (">=", "greaterOrEquals"), ("<", "less"), (">", "greater"), ("=", "equals"), ("LIKE", "like"),
    ("NOT LIKE", "notLike"), ("IN", "in"), ("NOT IN", "notIn"), ("GLOBAL IN", "globalIn"),
    ("GLOBAL NOT IN", "globalNotIn"),
]
_INTERVAL_UNITS = {"SECOND": "toIntervalSecond", "MINUTE": "toIntervalMinute", "HOUR": "toIntervalHour",
                   "DAY": "toIntervalDay", "WEEK": "toIntervalWeek", "MONTH": "toIntervalMonth",
                   "YEAR": "toIntervalYear"}
_ALIAS_RESTRICTED = {"FROM", "FINAL", "SAMPLE", "ARRAY", "LEFT", "RIGHT", "INNER", "FULL", "CROSS", "JOIN",
                     "GLOBAL", "ANY", "ALL", "ON", "USING", "PREWHERE", "WHERE", "GROUP", "WITH", "HAVING",
                     "ORDER", "LIMIT", "SETTINGS", "FORMAT", "UNION", "INTO", "OFFSET", "ASC", "DESC"}


# ---- formatting --------------------------------------------------------------------------------------


def format_float(x: float) -> str:
    """ClickHouse's FieldVisitorToString for Float64: shortest round-trip digits, ``1.`` for integral
    values, exponent form outside 1e-6 .. 1e21 (``1e-7``, ``1e21``, ``1.5e30``)."""
    if math.isnan(x):
        return "nan" if math.copysign(1.0, x) > 0 else "-nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return sign + "0."
    t = decimal.Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    exponent = int(t.exponent)
    point = len(digits) + exponent  # position of the decimal point relative to the digits
    if -6 < point <= 21:
        if point <= 0:
            return sign + "0." + "0" * (-point) + digits
        if point >= len(digits):
            return sign + digits + "0" * (point - len(digits)) + "."
        return sign + digits[:point] + "." + digits[point:]
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}e{point - 1}"


def format_literal_value(lit: Literal) -> str:
    if lit.kind == "null":
        return "NULL"
    if lit.kind in ("uint", "int"):
        return str(lit.value)
    if lit.kind == "float":
        assert isinstance(lit.value, float)
        return format_float(lit.value)
    if lit.kind == "string":
        assert isinstance(lit.value, str)
        return quote_string(lit.value)
    assert isinstance(lit.value, tuple)
    inner = ", ".join(format_literal_value(e) for e in lit.value)
    return f"({inner})" if lit.kind == "tuple" else f"[{inner}]"


def format_ast(node: Node, need_parens: bool = False) -> str:
    """One-line ``formatAST`` of ``node`` as ClickHouse 18.16 prints it."""
    body = _format_without_alias(node, need_parens)
    if node.alias is None:
        return body
    text = f"{body} AS {back_quote_if_needed(node.alias)}"
    return f"({text})" if need_parens else text


def format_list(nodes: tuple[Node, ...] | list[Node]) -> str:
    return ", ".join(format_ast(n) for n in nodes)


def _format_without_alias(node: Node, need_parens: bool) -> str:
    if isinstance(node, Literal):
        return format_literal_value(node)
    if isinstance(node, Identifier):
        if len(node.parts) > 1:
            return ".".join(back_quote_if_needed(p) for p in node.parts)
        return back_quote_if_needed(node.name)
    if isinstance(node, Asterisk):
        return "*"
    return _format_function(node, need_parens)


def _format_function(f: Function, need_parens: bool) -> str:
    args = f.args
    if f.params is None:
        if len(args) == 1 and f.name in ("negate", "not"):
            op = "-" if f.name == "negate" else "NOT "
            space = " " if f.name == "negate" and isinstance(args[0], Literal) else ""
            return op + space + format_ast(args[0], True)
        if len(args) == 2:
            infix = _BINARY_OPERATORS.get(f.name)
            if infix is not None:
                text = format_ast(args[0], True) + infix + format_ast(args[1], True)
                return f"({text})" if need_parens else text
            if f.name == "arrayElement":
                return f"{format_ast(args[0], True)}[{format_ast(args[1], True)}]"
            if f.name == "tupleElement" and isinstance(args[1], Literal) and args[1].kind == "uint":
                return f"{format_ast(args[0], True)}.{format_ast(args[1], True)}"
        if len(args) >= 2 and f.name in ("and", "or"):
            text = (" AND " if f.name == "and" else " OR ").join(format_ast(a, True) for a in args)
            return f"({text})" if need_parens else text
        if f.name == "array":
            return "[" + format_list(args) + "]"
        if len(args) >= 2 and f.name == "tuple":
            return "(" + format_list(args) + ")"
    params = f"({format_list(f.params)})" if f.params is not None else ""
    return f"{f.name}{params}({format_list(args)})"


def column_name(node: Node) -> str:
    """ClickHouse's ``getColumnName``: the expression's default column name (``plus(a, 1)``)."""
    if node.alias is not None:
        return node.alias
    if isinstance(node, Literal):
        return format_literal_value(node)
    if isinstance(node, Identifier):
        return node.name
    if isinstance(node, Asterisk):
        return "*"
    params = "(" + ", ".join(column_name(p) for p in node.params) + ")" if node.params is not None else ""
    return f"{node.name}{params}(" + ", ".join(column_name(a) for a in node.args) + ")"


def referenced_columns(node: Node) -> list[str]:
    """Names of the identifiers used in ``node``, in order of first appearance."""
    out: list[str] = []

    def walk(n: Node) -> None:
        if isinstance(n, Identifier):
            if n.name not in out:
                out.append(n.name)
        elif isinstance(n, Function):
            for a in n.args:
                walk(a)

    walk(node)
    return out


def key_expression_list(node: Node | None) -> tuple[Node, ...]:
    """ClickHouse's extractKeyExpressionList: ``tuple(a, b)`` -> ``(a, b)``; ``x`` -> ``(x,)``; None -> ()."""
    if node is None:
        return ()
    if isinstance(node, Function) and node.name == "tuple" and node.params is None:
        return node.args
    return (node,)


# ---- parsing -----------------------------------------------------------------------------------------


def _parse_number(text: str, negative: bool) -> Literal | None:
    """ClickHouse's ParserNumber: strtod, then an exact UInt64/Int64 when strtoull reads the same text."""
    low = text.lower()
    try:
        if low.startswith("0x"):
            fv = float.fromhex(text)
        elif low.startswith("0b"):
            return None  # strtod stops after the 0: ClickHouse 18.16 rejects 0b literals
        else:
            fv = float(text)
    except (ValueError, OverflowError):
        return None
    if math.isinf(fv) or (fv == 0 and any(c in "123456789" for c in low.split("e")[0].replace("0x", ""))):
        return None  # ERANGE
    iv: int | None = None
    if low.startswith("0x"):
        if all(c in "0123456789abcdef" for c in low[2:]) and low[2:]:
            iv = int(low[2:], 16)
    elif low.isdigit():
        if len(low) > 1 and low[0] == "0":
            octal = low[1:]
            iv = int(octal, 8) if all(c in "01234567" for c in octal) else None
        else:
            iv = int(low)
    if iv is not None and iv < 2**64 and (not negative or iv <= 2**63):
        if negative:
            return Literal(-iv, "int")
        return Literal(iv, "uint")
    return Literal(-fv if negative else fv, "float")


class Parser:
    """Recursive-descent parser over a token list; statement parsers share one instance."""

    def __init__(self, text: str, tokens: list[Token] | None = None) -> None:
        self.text = text
        self.tokens = tokens if tokens is not None else tokenize(text)
        self.pos = 0

    # -- token helpers --
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        t = self.tokens[self.pos]
        if t.kind is not T.END:
            self.pos += 1
        return t

    def error(self, expected: str) -> SyntaxError_:
        t = self.tok
        found = "end of query" if t.kind is T.END else repr(self.text[t.start : t.start + 30])
        return SyntaxError_(f"Syntax error at position {t.start}: expected {expected}, found {found}")

    def at_words(self, *words: str) -> bool:
        return all(self.peek(i).is_word(w) for i, w in enumerate(words))

    def accept_words(self, *words: str) -> bool:
        if self.at_words(*words):
            self.pos += len(words)
            return True
        return False

    def expect_words(self, *words: str) -> None:
        if not self.accept_words(*words):
            raise self.error(" ".join(words))

    def accept_punct(self, p: str) -> bool:
        if self.tok.is_punct(p):
            self.pos += 1
            return True
        return False

    def expect_punct(self, p: str) -> None:
        if not self.accept_punct(p):
            raise self.error(repr(p))

    def at_end(self) -> bool:
        return self.tok.kind is T.END or (self.tok.is_punct(";") and self.peek().kind is T.END)

    def expect_end(self) -> None:
        self.accept_punct(";")
        if self.tok.kind is not T.END:
            raise self.error("end of query")

    def identifier(self) -> str:
        t = self.tok
        if t.kind is T.WORD:
            self.pos += 1
            return t.text
        if t.kind is T.QUOTED_ID:
            value = unquote(t.text)
            if not value:
                raise self.error("non-empty identifier")
            self.pos += 1
            return value
        raise self.error("identifier")

    def compound_identifier(self) -> tuple[str, ...]:
        parts = [self.identifier()]
        while self.tok.is_punct(".") and self.peek().kind in (T.WORD, T.QUOTED_ID):
            self.pos += 1
            parts.append(self.identifier())
        return tuple(parts)

    def string_literal(self) -> str:
        t = self.tok
        if t.kind is not T.STRING:
            raise self.error("string literal")
        self.pos += 1
        return unquote(t.text)

    # -- expressions --
    def expression(self) -> Node:
        cond = self._or()
        if self.accept_punct("?"):
            then = self._or()
            self.expect_punct(":")
            other = self._or()
            return Function("if", (cond, then, other))
        return cond

    def expression_with_alias(self, allow_bare_alias: bool = False) -> Node:
        node = self.expression()
        alias: str | None = None
        if self.accept_words("AS"):
            alias = self.identifier()
        elif allow_bare_alias and self.tok.kind in (T.WORD, T.QUOTED_ID):
            is_from = isinstance(node, Identifier) and node.name.upper() == "FROM"
            if not is_from and not (self.tok.kind is T.WORD and self.tok.text.upper() in _ALIAS_RESTRICTED):
                alias = self.identifier()
        if alias is not None:
            if isinstance(node, Asterisk):
                raise self.error("no alias after *")
            node = _with_alias(node, alias)
        return node

    def expression_list(self, allow_empty: bool = True, allow_bare_alias: bool = False) -> tuple[Node, ...]:
        items: list[Node] = []
        if not allow_empty or not (self.tok.is_punct(")") or self.tok.is_punct("]")):
            items.append(self.expression_with_alias(allow_bare_alias))
            while self.accept_punct(","):
                items.append(self.expression_with_alias(allow_bare_alias))
        return tuple(items)

    def _variadic(self, word: str, fname: str, sub: str) -> Node:
        parse = getattr(self, sub)
        node: Node = parse()
        args: list[Node] = []
        while self.accept_words(word):
            if not args:
                args.append(node)
            args.append(parse())
        return Function(fname, tuple(args)) if args else node

    def _or(self) -> Node:
        return self._variadic("OR", "or", "_and")

    def _and(self) -> Node:
        return self._variadic("AND", "and", "_not")

    def _not(self) -> Node:
        count = 0
        while self.tok.is_word("NOT"):
            self.pos += 1
            count += 1
        node = self._nullity()
        return Function("not", (node,)) if count % 2 else node

    def _nullity(self) -> Node:
        node = self._comparison()
        if self.accept_words("IS"):
            negate = self.accept_words("NOT")
            self.expect_words("NULL")
            return Function("isNotNull" if negate else "isNull", (node,))
        return node

    def _comparison(self) -> Node:
        node = self._between()
        while (fname := self._comparison_operator()) is not None:
            node = Function(fname, (node, self._between()))
        return node

    def _comparison_operator(self) -> str | None:
        for op, fname in _COMPARISONS:
            if self.accept_words(*op.split()) if op[0].isalpha() else self.accept_punct(op):
                return fname
        return None

    def _between(self) -> Node:
        subject = self._concat()
        if not self.accept_words("BETWEEN"):
            return subject
        left = self._concat()
        self.expect_words("AND")
        right = self._concat()
        return Function("and", (Function("greaterOrEquals", (subject, left)),
                                Function("lessOrEquals", (subject, right))))

    def _concat(self) -> Node:
        node = self._additive()
        args: list[Node] = []
        while self.accept_punct("||"):
            if not args:
                args.append(node)
            args.append(self._additive())
        return Function("concat", tuple(args)) if args else node

    def _additive(self) -> Node:
        node = self._interval()
        while True:
            if self.accept_punct("+"):
                node = Function("plus", (node, self._interval()))
            elif self.accept_punct("-"):
                node = Function("minus", (node, self._interval()))
            else:
                return node

    def _interval(self) -> Node:
        if not (self.tok.is_word("INTERVAL") and not self.peek().is_punct("(")):
            return self._multiplicative()
        self.pos += 1
        expr = self.expression_with_alias()
        unit = self.tok.text.upper() if self.tok.kind is T.WORD else ""
        if unit not in _INTERVAL_UNITS:
            raise self.error("interval unit (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR)")
        self.pos += 1
        return Function(_INTERVAL_UNITS[unit], (expr,))

    def _multiplicative(self) -> Node:
        node = self._unary_minus()
        while True:
            for op, fname in (("*", "multiply"), ("/", "divide"), ("%", "modulo")):
                if self.accept_punct(op):
                    node = Function(fname, (node, self._unary_minus()))
                    break
            else:
                return node

    def _unary_minus(self) -> Node:
        if self.tok.is_punct("-"):
            nxt = self.peek()
            if nxt.kind is T.NUMBER:
                lit = _parse_number(nxt.text, True)
                if lit is None:
                    raise self.error("number")
                self.pos += 2
                return lit
            self.pos += 1
            return Function("negate", (self._tuple_element(),))
        return self._tuple_element()

    def _tuple_element(self) -> Node:
        node = self._array_element()
        while self.tok.is_punct(".") and self.peek().kind is T.NUMBER and self.peek().text.isdigit():
            self.pos += 1
            node = Function("tupleElement", (node, Literal(int(self.advance().text), "uint")))
        return node

    def _array_element(self) -> Node:
        node = self.element()
        while self.accept_punct("["):
            index = self.expression_with_alias()
            self.expect_punct("]")
            node = Function("arrayElement", (node, index))
        return node

    def element(self) -> Node:
        t = self.tok
        if t.is_punct("("):
            self.pos += 1
            maybe_subquery = self.tok.is_word("SELECT", "WITH")
            try:
                items = self.expression_list(allow_empty=False)
                self.expect_punct(")")
            except SyntaxError_:
                if maybe_subquery:
                    raise SyntaxError_("subqueries are not supported") from None
                raise
            return items[0] if len(items) == 1 else Function("tuple", items)
        if t.is_punct("["):
            self.pos += 1
            items = self.expression_list()
            self.expect_punct("]")
            if all(isinstance(i, Literal) and i.alias is None for i in items) and items:
                return Literal(tuple(i for i in items if isinstance(i, Literal)), "array")
            return Function("array", items)
        if t.kind is T.NUMBER or (t.is_punct("+") and self.peek().kind is T.NUMBER):
            if t.is_punct("+"):
                self.pos += 1
            lit = _parse_number(self.tok.text, False)
            if lit is None:
                raise self.error("number")
            self.pos += 1
            return lit
        if t.kind is T.STRING:
            return Literal(self.string_literal(), "string")
        if t.is_word("NULL") and not self.peek().is_punct("("):
            self.pos += 1
            return Literal(None, "null")
        if t.is_punct("*"):
            self.pos += 1
            return Asterisk()
        if t.is_word("CAST") and self.peek().is_punct("("):
            cast = self._try_cast()
            if cast is not None:
                return cast
        if t.is_word("CASE"):
            return self._case()
        if t.kind in (T.WORD, T.QUOTED_ID):
            if self.peek().is_punct("("):
                return self._function()
            parts = self.compound_identifier()
            if self.tok.is_punct(".") and self.peek().is_punct("*"):
                raise SyntaxError_("qualified asterisks are not supported")
            return Identifier(".".join(parts), parts if len(parts) > 1 else ())
        raise self.error("expression")

    def _function(self) -> Node:
        name = self.identifier()
        self.expect_punct("(")
        distinct = self.accept_words("DISTINCT")
        args = self.expression_list()
        self.expect_punct(")")
        params: tuple[Node, ...] | None = None
        if self.accept_punct("("):
            if distinct:
                raise self.error("arguments without DISTINCT")
            params = args
            distinct = self.accept_words("DISTINCT")
            args = self.expression_list()
            self.expect_punct(")")
        return Function(name + ("Distinct" if distinct else ""), args, params)

    def _try_cast(self) -> Node | None:
        start = self.pos
        self.pos += 2
        expr = self.expression()
        if not self.accept_words("AS"):
            self.pos = start
            return None
        type_node = self.element()
        self.expect_punct(")")
        return Function("CAST", (expr, Literal(format_ast(type_node), "string")))

    def _case(self) -> Node:
        self.pos += 1
        subject: Node | None = None if self.tok.is_word("WHEN") else self.expression()
        args: list[Node] = [] if subject is None else [subject]
        while self.accept_words("WHEN"):
            args.append(self.expression())
            self.expect_words("THEN")
            args.append(self.expression())
        if len(args) < (3 if subject is not None else 2):
            raise self.error("WHEN")
        args.append(self.expression() if self.accept_words("ELSE") else Literal(None, "null"))
        self.expect_words("END")
        return Function("caseWithExpression" if subject is not None else "multiIf", tuple(args))


def _with_alias(node: Node, alias: str) -> Node:
    if isinstance(node, Literal):
        return Literal(node.value, node.kind, alias)
    if isinstance(node, Identifier):
        return Identifier(node.name, node.parts, alias)
    if isinstance(node, Function):
        return Function(node.name, node.args, node.params, alias)
    return node


def parse_expression(text: str) -> Node:
    """Parse one whole expression (no trailing text); SyntaxError_ otherwise."""
    p = Parser(text)
    node = p.expression()
    p.expect_end()
    return node
