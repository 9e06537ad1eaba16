"""CloudEvents SQL (CESQL 1.0) filters over an event's attributes, on the SQL92 filter engine.

CESQL's lexer is here; its tokens go to ``core.sql_filter``'s parser and evaluator, which share
CESQL's grammar for what Sluice supports:

- attribute names (``type``, ``source``, extensions: lowercase letters and digits), string
  literals in ``'...'`` or ``"..."`` (``\\'`` and ``\\"`` escape the quote), integers, TRUE, FALSE;
- ``=``, ``!=``, ``<>``, ``<``, ``<=``, ``>``, ``>=`` (an attribute compared with an integer is read
  as a number, with TRUE/FALSE as a boolean), AND, OR, NOT, parentheses;
- ``x [NOT] IN ('a', 'b')`` (strings);
- ``EXISTS x``;
- ``x [NOT] LIKE 'p'`` where the pattern has no ``_`` and ``%`` only at its start and/or end
  (``'com.example.%'``, ``'%.created'``, ``'%sensor%'``); ``\\%`` and ``\\_`` match themselves.

Refused with InvalidArgument naming the feature: functions (ABS, LENGTH, CONCAT, LOWER, UPPER,
...), arithmetic (``+ - * / %`` between values), XOR, other LIKE patterns, and a bare attribute
used as a boolean (write ``flag = TRUE``).

Evaluation is SQL's three-valued logic: a missing attribute or a value that does not convert
makes its comparison unknown, and an event passes only when the whole expression is true.
CESQL instead makes such a comparison false and then refuses the event because an error
occurred; the two agree except that ``missing = 'x' OR type = 'y'`` passes an event of type
``y`` here. Test presence with ``EXISTS``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from .errors import BadFilter, InvalidArgument
from .sql_filter import Token, compile_tokens

MAX_SQL_LENGTH = 2048
INT32 = 2**31

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>\d+(?:\.\d*)?)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><>|!=|>=|<=|[=<>(),+\-*/%])
""", re.VERBOSE | re.DOTALL)
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "TRUE", "FALSE"})
_REFUSED = {
    "XOR": "XOR is not supported; write (a OR b) AND NOT (a AND b)",
}
_IDENTIFIER = re.compile(r"[a-z0-9]+")
_HINT = ("; write conditions such as \"type = 'com.example.created' AND "
         "(source LIKE '/sensors/%' OR EXISTS subject)\"")


def _error(position: int, what: str) -> InvalidArgument:
    return InvalidArgument(f"CloudEvents SQL filter error at position {position}: {what}{_HINT}")


def _unquote(text: str) -> str:
    quote = text[0]
    return re.sub(r"\\(.)", lambda m: m.group(1) if m.group(1) in (quote, "\\") else m.group(0),
                  text[1:-1])


def _lex(expression: str) -> list[Token]:
    """CESQL tokens as raw ``Token``s; kinds: number, string, name, keyword, op."""
    raw: list[Token] = []
    position = 0
    while position < len(expression):
        match = _TOKEN.match(expression, position)
        if match is None:
            raise _error(position + 1, f"unexpected character {expression[position]!r}")
        kind, text = match.lastgroup or "", match.group()
        at = position + 1
        if kind == "number":
            if "." in text:
                raise _error(at, f"{text} is not an integer; CloudEvents SQL has integers only")
            if int(text) >= INT32:
                raise _error(at, f"{text} is larger than a 32-bit integer")
            raw.append(Token(kind, text, float(text), at))
        elif kind == "string":
            raw.append(Token(kind, text, _unquote(text), at))
        elif kind == "name":
            upper = text.upper()
            kind = "keyword" if upper in _KEYWORDS | {"LIKE", "EXISTS", "XOR"} else "name"
            raw.append(Token(kind, upper if kind == "keyword" else text, None, at))
        elif kind == "op":
            raw.append(Token(kind, text, text, at))
        position = match.end()
    return raw


def _check(raw: list[Token]) -> None:
    """Refuse what the SQL92 engine does not evaluate, naming it."""
    for index, token in enumerate(raw):
        following = raw[index + 1] if index + 1 < len(raw) else None
        before = raw[index - 1] if index else None
        if token.kind == "name" and following is not None and following.text == "(":
            raise _error(token.position, f"function {token.text.upper()}() is not supported; "
                         "compare attributes directly (=, <>, <, >, IN, LIKE, EXISTS)")
        if token.kind == "name" and not _IDENTIFIER.fullmatch(token.text):
            raise _error(token.position, f"{token.text!r} is not an attribute name: attribute "
                         "names are lowercase letters and digits")
        if token.kind == "keyword" and token.text in _REFUSED:
            raise _error(token.position, _REFUSED[token.text])
        if token.kind == "op" and token.text in "+*/%":
            raise _error(token.position, f"arithmetic ({token.text}) is not supported")
        if token.text == "-" and token.kind == "op" and before is not None and (
                before.kind in ("name", "number", "string") or before.text in (")", "TRUE", "FALSE")):
            raise _error(token.position, "arithmetic (-) is not supported")


def _like(subject_negated: bool, pattern: Token) -> list[Token]:
    """The tokens replacing ``[NOT] LIKE 'pattern'``: =, <>, [NOT] STARTSWITH/ENDSWITH/CONTAINS."""
    if pattern.kind != "string":
        raise _error(pattern.position, "LIKE takes a quoted pattern such as 'com.example.%'")
    pieces = re.findall(r"\\.|.", pattern.value, re.DOTALL)
    leading = bool(pieces) and pieces[0] == "%"
    trailing = len(pieces) > int(leading) and pieces[-1] == "%"
    middle = pieces[int(leading):len(pieces) - int(trailing)]
    if any(piece in ("%", "_") for piece in middle):
        raise _error(pattern.position, f"LIKE pattern {pattern.value!r} is not supported: "
                     "only % at the start and/or end, and no _")
    literal = "".join(piece[-1] for piece in middle)
    text = Token("string", repr(literal), literal, pattern.position)
    at = pattern.position
    if not leading and not trailing:
        return [Token("op", "<>" if subject_negated else "=", None, at), text]
    test = "CONTAINS" if leading and trailing else "ENDSWITH" if leading else "STARTSWITH"
    negation = [Token("keyword", "NOT", None, at)] if subject_negated else []
    return [*negation, Token("keyword", test, None, at), text]


def _translate(raw: list[Token], length: int) -> list[Token]:
    """CESQL tokens rewritten into the SQL92 engine's: EXISTS and LIKE become its tests."""
    out: list[Token] = []
    index = 0
    while index < len(raw):
        token = raw[index]
        if token.kind == "keyword" and token.text == "EXISTS":
            name = raw[index + 1] if index + 1 < len(raw) else None
            if name is None or name.kind != "name":
                raise _error(token.position, "EXISTS takes an attribute name, as in EXISTS subject")
            out += [name, *(Token("keyword", word, None, token.position)
                            for word in ("IS", "NOT", "NULL"))]
            index += 2
            continue
        if token.kind == "keyword" and token.text == "LIKE":
            negated = bool(out) and out[-1].kind == "keyword" and out[-1].text == "NOT"
            if negated:
                out.pop()
            if index + 1 >= len(raw):
                raise _error(token.position, "LIKE takes a quoted pattern such as 'com.example.%'")
            out += _like(negated, raw[index + 1])
            index += 2
            continue
        out.append(token)
        index += 1
    return out + [Token("end", "end of expression", None, length + 1)]


def compile_cesql(expression: str) -> Callable[[Mapping[str, str]], bool]:
    """A test of an event's attributes; InvalidArgument, naming the position and the
    unsupported feature, for a malformed, unsupported or too large expression."""
    if not isinstance(expression, str):
        raise InvalidArgument("a CloudEvents SQL filter is a string, as in "
                              "{\"sql\": \"type = 'com.example.created'\"}")
    if len(expression) > MAX_SQL_LENGTH:
        raise InvalidArgument(f"CloudEvents SQL filter is {len(expression)} characters long; "
                              f"the limit is {MAX_SQL_LENGTH}")
    if not expression.strip():
        raise InvalidArgument("CloudEvents SQL filter is empty" + _HINT)
    raw = _lex(expression)
    _check(raw)
    try:
        evaluate = compile_tokens(_translate(raw, len(expression)))
    except BadFilter as error:
        detail = str(error).removeprefix("SQL92 filter error").split("; write comparisons")[0]
        detail = detail.replace("a property name", "an attribute name")
        raise InvalidArgument(f"CloudEvents SQL filter error{detail}{_HINT}") from None
    return lambda attributes: evaluate("", attributes) is True
