"""The bindings of one headers exchange, indexed by header so a publish examines only the
bindings that name one of its headers.

A binding's arguments are a *rule*: ``x-match`` ``all`` (the default) or ``any``, their
``-with-x`` forms, which also compare ``x-`` arguments, and the headers wanted, each with a value
or void (present with any value). Bindings with the same arguments share one rule, examined once
per publish whatever the number of queues it leads to.

- An ``any`` rule is filed under each header it names: a message reaches it through any of them.
- An ``all`` rule is filed under one of its headers, the one filed under the fewest rules when it
  was added: a message lacking that header cannot match it.
- An ``all`` rule naming no header matches every message (its bindings are always part of the
  route); an ``any`` rule naming none matches nothing and is filed nowhere.

A publish looks up each of its headers twice (with its value, and void) and examines the rules
found there, so its cost grows with its own headers and the rules that share them, not with the
exchange's bindings. Rules built so that many share headers with a message yet fail it are
bounded by the exchange's binding limit (``core.max_bindings_per_exchange``). Matching is
RabbitMQ's, and ``headers_match`` states it for one rule.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

Target = TypeVar("Target", bound=Hashable)

MATCH_ARGUMENT: Final = "x-match"
ANY_MODES: Final = frozenset({"any", "any-with-x"})
WITH_X_MODES: Final = frozenset({"all-with-x", "any-with-x"})
MODES: Final = ("all", "any", "all-with-x", "any-with-x")
PRESENT: Final = object()
"""Stands for a void argument in an index entry: the header present, with any value."""


@dataclass(eq=False)
class Rule(Generic[Target]):
    """One set of binding arguments, compiled; compared by identity."""

    any: bool
    wanted: tuple[tuple[str, Any], ...]
    """(header, value) pairs compared; a value of None asks only that the header be present."""
    targets: dict[Target, int] = field(default_factory=dict)
    """Where its bindings lead, with how many of them lead there."""
    entry: tuple[str, Any] | None = None
    """The index entry an ``all`` rule is filed under (None: it names no header)."""

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> Rule[Target]:
        """The rule of a binding's ``arguments`` (``x-match`` checked by the caller)."""
        mode = arguments.get(MATCH_ARGUMENT, "all")
        with_x = mode in WITH_X_MODES
        wanted = tuple((name, value) for name, value in arguments.items()
                       if name != MATCH_ARGUMENT and (with_x or not name.startswith("x-")))
        return cls(mode in ANY_MODES, wanted)

    def matches(self, headers: Mapping[str, Any]) -> bool:
        """Whether a message with ``headers`` is taken."""
        test = any if self.any else all
        return test(name in headers and (value is None or headers[name] == value)
                    for name, value in self.wanted)

    def entries(self) -> list[tuple[str, Any]]:
        """The index entries naming its headers."""
        return [(name, PRESENT if value is None else _hashable(value)) for name, value in self.wanted]


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether a headers-exchange binding with ``arguments`` takes a message with ``headers``."""
    return Rule.of(arguments).matches(headers)


class HeadersIndex(Generic[Target]):
    """Rules by the headers they name; ``match`` gives the targets a message reaches."""

    def __init__(self) -> None:
        self._rules: dict[Hashable, Rule[Target]] = {}
        """Rules by their frozen arguments."""
        self._filed: dict[tuple[str, Any], set[Rule[Target]]] = {}
        self._always: set[Rule[Target]] = set()
        self.visited = 0
        """Rules examined by the last ``match`` (for tests and metrics)."""

    def add(self, key: Hashable, arguments: Mapping[str, Any], target: Target) -> None:
        """A binding with ``arguments`` (frozen: ``key``) leads to ``target``."""
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = Rule.of(arguments)
            self._file(rule)
        rule.targets[target] = rule.targets.get(target, 0) + 1

    def remove(self, key: Hashable, target: Target) -> None:
        """One binding with arguments ``key`` to ``target`` is gone."""
        rule = self._rules.get(key)
        if rule is None or target not in rule.targets:
            return
        rule.targets[target] -= 1
        if not rule.targets[target]:
            del rule.targets[target]
        if not rule.targets:
            del self._rules[key]
            self._unfile(rule)

    def match(self, headers: Mapping[str, Any]) -> set[Target]:
        """Every target a message with ``headers`` reaches."""
        candidates = set(self._always)
        filed = self._filed
        for name, value in headers.items():
            for entry in ((name, PRESENT), (name, _hashable(value))):
                found = filed.get(entry)
                if found:
                    candidates |= found
        self.visited = len(candidates)
        targets: set[Target] = set()
        for rule in candidates:
            if rule.matches(headers):
                targets.update(rule.targets)
        return targets

    def _file(self, rule: Rule[Target]) -> None:
        entries = rule.entries()
        if rule.any:
            for entry in entries:
                self._filed.setdefault(entry, set()).add(rule)
        elif entries:
            rule.entry = min(entries, key=lambda e: len(self._filed.get(e, ())))
            self._filed.setdefault(rule.entry, set()).add(rule)
        else:
            self._always.add(rule)

    def _unfile(self, rule: Rule[Target]) -> None:
        entries: Iterable[tuple[str, Any]] = rule.entries() if rule.any else \
            ([rule.entry] if rule.entry is not None else [])
        for entry in entries:
            filed = self._filed.get(entry)
            if filed is not None:
                filed.discard(rule)
                if not filed:
                    del self._filed[entry]
        self._always.discard(rule)


_NOT_HASHABLE: Final = object()
"""The index entry of a header value no rule can equal (a table or an array: rules hold
frozen values, which never equal them)."""


def _hashable(value: Any) -> Any:
    """``value`` as an index entry's value: a byte array as the bytes it equals."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    try:
        hash(value)
    except TypeError:
        return _NOT_HASHABLE
    return value
