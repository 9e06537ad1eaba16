"""SQL92 property filters, the subset RocketMQ documents, evaluated broker-side per message.

Grammar (keywords are case-insensitive)::

    expr       := or
    or         := and ("OR" and)*
    and        := not ("AND" not)*
    not        := "NOT" not | predicate
    predicate  := "(" expr ")" | TRUE | FALSE
                | operand [ cmp operand
                          | [NOT] BETWEEN operand AND operand
                          | [NOT] IN "(" string ("," string)* ")"
                          | IS [NOT] NULL
                          | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string ]
    operand    := property | number | string | TRUE | FALSE | NULL | "-" number
    cmp        := "=" | "<>" | "!=" | ">" | ">=" | "<" | "<="

A property is a message's user property by name; ``TAGS`` is its tag. Property values are
strings: compared with a number they are read as numbers, with TRUE/FALSE as booleans, and a
value that does not convert makes the comparison unknown. Logic is three-valued, as in SQL: a
missing property (NULL) makes a comparison unknown, and a message passes only when the whole
expression is true.

Cost is bounded for an untrusted subscriber: an expression is at most ``MAX_EXPRESSION_LENGTH``
characters, ``MAX_NODES`` operations and ``MAX_DEPTH`` levels of nesting, and ``IN`` is a set
lookup. There is no ``LIKE``: no pattern is ever compiled from a subscriber's text, so no
expression takes more than linear time in the sizes of a message's properties.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .errors import BadFilter

MAX_EXPRESSION_LENGTH = 4096
MAX_NODES = 256
MAX_DEPTH = 32

TAGS = "TAGS"
"""The identifier naming the message's tag."""

Value = str | float | bool | None
Evaluate = Callable[[str, Mapping[str, str]], bool | None]
"""A compiled (sub)expression: (tag, properties) -> True, False or None (unknown)."""

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE",
                       "CONTAINS", "STARTSWITH", "ENDSWITH"})
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$.]*)
  | (?P<op><>|!=|>=|<=|[=<>(),-])
""", re.VERBOSE)


class Token(NamedTuple):
    kind: str
    """``number``, ``string``, ``name``, ``keyword``, ``op`` or ``end``."""
    text: str
    value: Any
    position: int
    """1-based character position in the expression."""


def _tokens(expression: str) -> list[Token]:
    out: list[Token] = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise _error(position + 1, f"unexpected character {expression[position]!r}")
        kind, text = match.lastgroup or "", match.group()
        if kind == "number":
            out.append(Token(kind, text, float(text), position + 1))
        elif kind == "string":
            out.append(Token(kind, text, text[1:-1].replace("''", "'"), position + 1))
        elif kind == "name" and text.upper() in _KEYWORDS:
            out.append(Token("keyword", text.upper(), None, position + 1))
        elif kind != "space":
            out.append(Token(kind, text, text, position + 1))
        position = match.end()
    out.append(Token("end", "end of expression", None, len(expression) + 1))
    return out


def _error(position: int, what: str) -> BadFilter:
    return BadFilter(f"SQL92 filter error at position {position}: {what}; write comparisons "
                     "such as \"a > 5 AND (TAGS IN ('TagA', 'TagB') OR b IS NOT NULL)\"")


class _Operand(NamedTuple):
    """A property (``name`` set) or a literal (``value``)."""

    name: str | None
    value: Value


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0
        self.nodes = 0

    def peek(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def accept(self, *texts: str) -> Token | None:
        token = self.peek()
        if token.kind in ("keyword", "op") and token.text in texts:
            self.at += 1
            return token
        return None

    def expect(self, text: str, after: str) -> None:
        if self.accept(text) is None:
            token = self.peek()
            raise _error(token.position, f"expected {text} {after}, found {token.text!r}")

    def node(self, depth: int) -> None:
        """Count one operation at nesting ``depth`` (parentheses and NOTs) against the limits."""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _error(self.peek().position, f"the expression has more than {MAX_NODES} operations")
        if depth > MAX_DEPTH:
            raise _error(self.peek().position, f"the expression nests deeper than {MAX_DEPTH} levels")

    def parse(self) -> Evaluate:
        result = self.disjunction(0)
        token = self.peek()
        if token.kind != "end":
            raise _error(token.position, f"unexpected {token.text!r}; join conditions with AND or OR")
        return result

    def disjunction(self, depth: int) -> Evaluate:
        return self._joined(depth, "OR", self.conjunction, True)

    def conjunction(self, depth: int) -> Evaluate:
        return self._joined(depth, "AND", self.negation, False)

    def _joined(self, depth: int, keyword: str, operand: Callable[[int], Evaluate],
                decisive: bool) -> Evaluate:
        """Operands joined by ``keyword``: OR (``decisive`` True) or AND."""
        terms = [operand(depth)]
        while self.accept(keyword):
            self.node(depth)
            terms.append(operand(depth))
        return terms[0] if len(terms) == 1 else _junction(terms, decisive)

    def negation(self, depth: int) -> Evaluate:
        self.node(depth)
        if self.accept("NOT"):
            return _not(self.negation(depth + 1))
        return self.predicate(depth)

    def predicate(self, depth: int) -> Evaluate:
        if self.accept("("):
            inner = self.disjunction(depth + 1)
            self.expect(")", "to close the parenthesis")
            return inner
        left = self.operand()
        negated = self.accept("NOT") is not None
        token = self.peek()
        if negated and not (token.kind == "keyword" and token.text in
                            ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH")):
            raise _error(token.position, "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT")
        if self.accept("BETWEEN"):
            low = self.operand()
            self.expect("AND", "between the bounds of BETWEEN")
            high = self.operand()
            test = _junction([_compare(left, ">=", low), _compare(left, "<=", high)], False)
        elif self.accept("IN"):
            test = self.membership(left)
        elif self.accept("IS"):
            wanted = self.accept("NOT") is None
            self.expect("NULL", "after IS")
            return _is_null(left, wanted)
        elif token.kind == "keyword" and token.text in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
            self.take()
            test = _text_test(left, token.text, self.string_literal(token.text))
        elif token.kind == "op" and token.text in _COMPARISONS:
            self.take()
            return _compare(left, token.text, self.operand())
        elif left.name is None and isinstance(left.value, bool):
            return _constant(left.value)
        else:
            raise _error(token.position, f"expected a comparison after {_describe(left)}, "
                         f"found {token.text!r}")
        return _not(test) if negated else test

    def operand(self) -> _Operand:
        token = self.take()
        if token.kind == "name":
            return _Operand(token.text, None)
        if token.kind in ("number", "string"):
            return _Operand(None, token.value)
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            return _Operand(None, token.text == "TRUE")
        if token.kind == "keyword" and token.text == "NULL":
            return _Operand(None, None)
        if token.kind == "op" and token.text == "-" and self.peek().kind == "number":
            return _Operand(None, -self.take().value)
        raise _error(token.position, f"expected a property name or a value, found {token.text!r}")

    def string_literal(self, after: str) -> str:
        token = self.take()
        if token.kind != "string":
            raise _error(token.position, f"{after} takes a quoted string such as 'abc', "
                         f"found {token.text!r}")
        return token.value

    def membership(self, left: _Operand) -> Evaluate:
        self.expect("(", "after IN")
        items = {self.string_literal("IN")}
        while self.accept(","):
            items.add(self.string_literal("IN"))
        self.expect(")", "to close the IN list")
        return _in(left, frozenset(items))


def _describe(operand: _Operand) -> str:
    return operand.name if operand.name is not None else repr(operand.value)


def _getter(operand: _Operand) -> Callable[[str, Mapping[str, str]], Value]:
    name = operand.name
    if name is None:
        value = operand.value
        return lambda tag, properties: value
    if name == TAGS:
        return lambda tag, properties: tag or None
    return lambda tag, properties: properties.get(name)


def _as_number(value: Value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def _as_bool(value: Value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        return True if lowered == "true" else False if lowered == "false" else None
    return None


_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b, "<>": lambda a, b: a != b, "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
}


def _compare(left: _Operand, op: str, right: _Operand) -> Evaluate:
    """Both sides read as numbers when either is a numeric literal, as booleans when either is
    TRUE/FALSE, else as strings (only = and <> compare strings)."""
    literal_kinds = {type(o.value) for o in (left, right) if o.name is None}
    if type(None) in literal_kinds:
        return lambda tag, properties: None  # anything compared with NULL is unknown
    if float in literal_kinds:
        convert: Callable[[Value], Any] = _as_number
    elif bool in literal_kinds:
        convert = _as_bool
        if op not in ("=", "<>", "!="):
            raise BadFilter(f"SQL92 filter error: {op} does not compare booleans; use = or <>")
    else:
        convert = _as_string
        if op not in ("=", "<>", "!="):
            raise BadFilter(f"SQL92 filter error: {op} compares numbers; compare "
                            f"{_describe(left)} with a number, or strings with = or <>")
    get_left, get_right, test = _getter(left), _getter(right), _COMPARISONS[op]

    def compare(tag: str, properties: Mapping[str, str]) -> bool | None:
        a, b = convert(get_left(tag, properties)), convert(get_right(tag, properties))
        if a is None or b is None:
            return None
        return test(a, b)
    return compare


def _as_string(value: Value) -> str | None:
    return value if isinstance(value, str) else None


def _in(left: _Operand, items: frozenset[str]) -> Evaluate:
    get = _getter(left)

    def member(tag: str, properties: Mapping[str, str]) -> bool | None:
        value = get(tag, properties)
        return None if not isinstance(value, str) else value in items
    return member


def _text_test(left: _Operand, kind: str, text: str) -> Evaluate:
    get = _getter(left)
    method = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith, "ENDSWITH": str.endswith}[kind]

    def test(tag: str, properties: Mapping[str, str]) -> bool | None:
        value = get(tag, properties)
        return None if not isinstance(value, str) else method(value, text)
    return test


def _is_null(left: _Operand, wanted: bool) -> Evaluate:
    get = _getter(left)
    return lambda tag, properties: (get(tag, properties) is None) is wanted


def _constant(value: bool) -> Evaluate:
    return lambda tag, properties: value


def _not(inner: Evaluate) -> Evaluate:
    def negate(tag: str, properties: Mapping[str, str]) -> bool | None:
        result = inner(tag, properties)
        return None if result is None else not result
    return negate


def _junction(terms: list[Evaluate], decisive: bool) -> Evaluate:
    """AND (``decisive`` False) or OR (True) in three-valued logic: a term equal to
    ``decisive`` decides; otherwise any unknown term makes the result unknown."""
    def evaluate(tag: str, properties: Mapping[str, str]) -> bool | None:
        unknown = False
        for term in terms:
            result = term(tag, properties)
            if result is decisive:
                return decisive
            unknown |= result is None
        return None if unknown else not decisive
    return evaluate


def compile_sql92(expression: str) -> Evaluate:
    """Compile ``expression``; BadFilter, naming the position, if it is malformed or too large."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise BadFilter(f"SQL92 filter is {len(expression)} characters long; the limit is "
                        f"{MAX_EXPRESSION_LENGTH}")
    if not expression.strip():
        raise BadFilter("SQL92 filter is empty; write a condition such as \"a > 5\"")
    return _Parser(_tokens(expression)).parse()


def compile_tokens(tokens: list[Token]) -> Evaluate:
    """Compile an expression another dialect's lexer read into this grammar's tokens (ending
    with an ``end`` token); BadFilter, naming the position, if it is malformed or too large."""
    return _Parser(tokens).parse()
