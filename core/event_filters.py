"""CloudEvents Subscriptions API filters, compiled once into a test of an event's attributes.

A push subscription's ``filters`` is a list of filter objects, all of which must match. Each
object has exactly one dialect:

- ``{"exact": {"type": "com.example.created"}}``: the attribute equals the value;
- ``{"prefix": {"source": "/sensors/"}}``, ``{"suffix": {"subject": ".json"}}``: it starts
  or ends with the value. These three take exactly one attribute each, match case-sensitively,
  and an event without the attribute does not match;
- ``{"all": [f, ...]}``, ``{"any": [f, ...]}``: every / at least one nested filter matches;
- ``{"not": f}``: the nested filter does not match;
- ``{"sql": "type = 'x' AND ..."}``: a CloudEvents SQL expression (``core.cesql`` lists what
  of CESQL is supported).

Attributes are the event's context attributes and extensions as text; ``data`` is not visible.
Cost is bounded for an untrusted subscriber: at most ``MAX_DEPTH`` levels of nesting,
``MAX_NODES`` filter objects in all, values of at most ``MAX_VALUE_LENGTH`` characters and SQL
of at most ``core.cesql.MAX_SQL_LENGTH``. A bad filter raises InvalidArgument naming where it
is (``filters[0].all[1]``); a compiled filter never raises, whatever the attributes hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .cesql import compile_cesql
from .errors import InvalidArgument

MAX_DEPTH = 8
MAX_NODES = 256
MAX_VALUE_LENGTH = 4096

Test = Callable[[Mapping[str, str]], bool]
DIALECTS = ("exact", "prefix", "suffix", "all", "any", "not", "sql")
_ATTRIBUTE = re.compile(r"[a-z0-9]{1,64}")
_EXAMPLE = "{\"exact\": {\"type\": \"com.example.created\"}}"


class _Compiler:
    def __init__(self) -> None:
        self.nodes = 0

    def filter(self, spec: Any, where: str, depth: int) -> Test:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidArgument(f"{where}: the filters hold more than {MAX_NODES} filter "
                                  "objects; combine conditions in one sql filter")
        if depth > MAX_DEPTH:
            raise InvalidArgument(f"{where}: filters nest deeper than {MAX_DEPTH} levels")
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise InvalidArgument(f"{where}: a filter is an object with exactly one of "
                                  f"{', '.join(DIALECTS)}, such as {_EXAMPLE}")
        (dialect, argument), = spec.items()
        where = f"{where}.{dialect}" if isinstance(dialect, str) else where
        if dialect in ("exact", "prefix", "suffix"):
            return _attribute_test(dialect, argument, where)
        if dialect in ("all", "any"):
            return self.junction(dialect, argument, where, depth)
        if dialect == "not":
            inner = self.filter(argument, where, depth + 1)
            return lambda attributes: not inner(attributes)
        if dialect == "sql":
            try:
                return compile_cesql(argument)
            except InvalidArgument as error:
                raise InvalidArgument(f"{where}: {error}") from None
        raise InvalidArgument(f"{where}: unknown filter dialect {str(dialect)[:40]!r}; use one "
                              f"of {', '.join(DIALECTS)}")

    def junction(self, dialect: str, argument: Any, where: str, depth: int) -> Test:
        if not isinstance(argument, Sequence) or isinstance(argument, (str, bytes)) or not argument:
            raise InvalidArgument(f"{where}: {dialect} takes a non-empty list of filters, such as "
                                  f"{{\"{dialect}\": [{_EXAMPLE}]}}")
        tests = [self.filter(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(argument)]
        combine = all if dialect == "all" else any
        return lambda attributes: combine(test(attributes) for test in tests)


def _attribute_test(dialect: str, argument: Any, where: str) -> Test:
    if not isinstance(argument, Mapping) or len(argument) != 1:
        raise InvalidArgument(f"{where}: {dialect} takes exactly one attribute and its value, "
                              f"such as {{\"{dialect}\": {{\"type\": \"com.example.created\"}}}}")
    (name, value), = argument.items()
    if not isinstance(name, str) or not _ATTRIBUTE.fullmatch(name):
        raise InvalidArgument(f"{where}: {str(name)[:80]!r} is not an attribute name: attribute "
                              "names are 1 to 64 lowercase letters and digits")
    if not isinstance(value, str) or len(value) > MAX_VALUE_LENGTH:
        raise InvalidArgument(f"{where}.{name}: the value is a string of at most "
                              f"{MAX_VALUE_LENGTH} characters")
    compare = {"exact": str.__eq__, "prefix": str.startswith, "suffix": str.endswith}[dialect]

    def test(attributes: Mapping[str, str]) -> bool:
        found = attributes.get(name)
        return isinstance(found, str) and compare(found, value) is True
    return test


def compile_filters(filters: Sequence[Mapping[str, Any]]) -> Test:
    """One test for all of ``filters`` (an empty list passes every event); InvalidArgument, naming
    the bad filter's place, on a malformed, unknown or too large filter."""
    if not isinstance(filters, Sequence) or isinstance(filters, (str, bytes)):
        raise InvalidArgument(f"filters is a list of filter objects, such as [{_EXAMPLE}]")
    compiler = _Compiler()
    tests = [compiler.filter(spec, f"filters[{i}]", 1) for i, spec in enumerate(filters)]

    def matches(attributes: Mapping[str, str]) -> bool:
        text = {k: v for k, v in attributes.items() if isinstance(k, str) and isinstance(v, str)}
        return all(test(text) for test in tests)
    return matches
