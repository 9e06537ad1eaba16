"""A topic trie: which subscriptions match a hierarchical subject, in a syntax the adapter gives.

Subjects and filters are levels joined by a separator; a filter level may be the single-level
wildcard or the multi-level wildcard, which matches zero or more levels. ``TopicSyntax`` says
which characters those are and where the multi-level wildcard may stand, so one trie serves
MQTT (``/``, ``+``, ``#`` last only, ``$`` topics hidden from leading wildcards) and AMQP topic
exchanges (``.``, ``*``, ``#`` anywhere: ``a.#.b``). The syntax also owns filter validation
and the matching of one filter against one subject, so adapters never write either again.

Matching walks only the branches the subject's levels select, so its cost grows with the
subject's depth and the number of matching wildcard branches, not with the number of unrelated
subscriptions. It is iterative and visits each (trie node, subject depth) pair at most once, so
neither a deep subject nor a chain of ``#`` levels can exhaust the stack or take exponential
time; filters and subjects deeper than ``MAX_LEVELS`` are refused with InvalidArgument.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from .errors import InvalidArgument
from .untrusted import clip

MAX_LEVELS = 1024
"""Most levels a filter or subject may have. Adapters cap lower (MQTT: ``max_topic_levels``);
this bound keeps core safe on its own."""


@dataclass(frozen=True)
class TopicSyntax:
    """How an adapter writes subjects and filters: the level separator, the two wildcards, and
    two rules (MQTT: ``TopicSyntax("/", "+", "#", multi_last=True, dollar_hidden=True)``;
    AMQP topic exchanges: ``TopicSyntax(".", "*", "#")``)."""

    separator: str
    single: str
    multi: str
    multi_last: bool = False
    """The multi-level wildcard may only be a filter's last level (MQTT), not anywhere (AMQP)."""
    dollar_hidden: bool = False
    """A wildcard in a filter's first level does not match a first level starting with ``$``
    (MQTT's ``$SYS/...``); a filter must name such a level literally."""

    def levels(self, text: str) -> list[str]:
        """A subject or filter split into its levels."""
        return text.split(self.separator)

    def check_filter(self, text: str) -> list[str]:
        """The levels of filter ``text``; InvalidArgument unless it is well formed (not empty,
        at most ``MAX_LEVELS`` levels, wildcards occupying whole levels, the multi-level one
        last where the syntax says so)."""
        if not text:
            raise InvalidArgument("a topic filter must not be empty")
        levels = self.levels(text)
        self.check_levels(levels, text)
        return levels

    def check_levels(self, levels: Sequence[str], text: str = "") -> None:
        """InvalidArgument unless ``levels`` form a well-formed filter (``text`` names it)."""
        check_depth(levels, "filter")
        single, multi, last = self.single, self.multi, len(levels) - 1
        for position, level in enumerate(levels):
            if level == multi:
                if self.multi_last and position != last:
                    raise InvalidArgument(f"'{multi}' must be the last level of filter "
                                          f"{clip(text or self.separator.join(levels))}")
            elif level != single and (single in level or multi in level):
                raise InvalidArgument(f"a wildcard must occupy a whole level in filter "
                                      f"{clip(text or self.separator.join(levels))}")

    def is_wildcard(self, level: str) -> bool:
        """Whether filter level ``level`` is one of the two wildcards."""
        return level == self.single or level == self.multi

    def matches(self, topic_filter: str, subject: str) -> bool:
        """Whether ``subject`` matches the well-formed filter ``topic_filter``, for checking a
        single filter (a trie matches many at once)."""
        if self.single not in topic_filter and self.multi not in topic_filter:
            return topic_filter == subject
        return self.levels_match(self.levels(topic_filter), self.levels(subject))

    def covers(self, pattern: Sequence[str], topic_filter: Sequence[str]) -> bool:
        """Whether every subject filter levels ``topic_filter`` can match is matched by filter
        levels ``pattern`` (for a syntax whose multi-level wildcard comes last)."""
        if self.hides(pattern, topic_filter):
            return False
        single, multi = self.single, self.multi
        for position, level in enumerate(pattern):
            if level == multi:
                return True
            if position >= len(topic_filter):
                return False
            wanted = topic_filter[position]
            if wanted == multi:
                return False
            if level != single and (wanted == single or level != wanted):
                return False
        return len(pattern) == len(topic_filter)

    def overlaps(self, first: Sequence[str], second: Sequence[str]) -> bool:
        """Whether some subject matches both filter levels (multi-level wildcard last)."""
        single, multi = self.single, self.multi
        for position in range(min(len(first), len(second))):
            a, b = first[position], second[position]
            if a == multi or b == multi:
                return True
            if a != single and b != single and a != b:
                return False
        if len(first) == len(second):
            return True
        longer = first if len(first) > len(second) else second
        return longer[min(len(first), len(second))] == multi  # ``a/#`` also matches ``a``

    def levels_match(self, pattern: Sequence[str], subject: Sequence[str]) -> bool:
        """Whether filter levels ``pattern`` match subject levels ``subject``."""
        if self.hides(pattern, subject):
            return False
        single, multi = self.single, self.multi
        if multi not in pattern[:-1]:  # no ``#`` before the last level: one linear pass
            for position, wanted in enumerate(pattern):
                if wanted == multi:
                    return True
                if position >= len(subject) or (wanted != single and wanted != subject[position]):
                    return False
            return len(pattern) == len(subject)
        # positions in ``pattern`` reachable after consuming each subject level; ``#`` may
        # consume zero or more levels, so this is linear in len(pattern) x len(subject)
        reach = _close({0}, pattern, multi)
        for level in subject:
            step = set()
            for position in reach:
                if position < len(pattern):
                    wanted = pattern[position]
                    if wanted == multi:
                        step.add(position)
                    elif wanted == single or wanted == level:
                        step.add(position + 1)
            reach = _close(step, pattern, multi)
            if not reach:
                return False
        return len(pattern) in reach

    def hides(self, pattern: Sequence[str], subject: Sequence[str]) -> bool:
        """Whether the syntax hides ``subject`` from ``pattern``: a ``$`` first level against a
        wildcard first level, when ``dollar_hidden``."""
        return (self.dollar_hidden and bool(subject) and bool(pattern)
                and subject[0].startswith("$") and self.is_wildcard(pattern[0]))


def _close(positions: set[int], pattern: Sequence[str], multi: str) -> set[int]:
    """``positions`` plus every position reached by letting ``#`` levels match nothing."""
    out = set(positions)
    stack = list(positions)
    while stack:
        position = stack.pop()
        if position < len(pattern) and pattern[position] == multi and position + 1 not in out:
            out.add(position + 1)
            stack.append(position + 1)
    return out


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    values: set[Hashable] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.children and not self.values


class TopicTrie:
    """Subscriptions (any hashable value) stored under filters, matched against subjects."""

    def __init__(self, syntax: TopicSyntax) -> None:
        self.syntax = syntax
        self._root = _Node()
        self._count = 0
        self.visited = 0
        """Nodes visited by the last ``match`` (for tests and metrics)."""

    def __len__(self) -> int:
        return self._count

    def add(self, levels: Sequence[str], value: Hashable) -> bool:
        """Store ``value`` under filter ``levels``; return False if it was there already.
        InvalidArgument if the filter is malformed (``TopicSyntax.check_levels``)."""
        self.syntax.check_levels(levels)
        node = self._root
        for level in levels:
            node = node.children.setdefault(level, _Node())
        if value in node.values:
            return False
        node.values.add(value)
        self._count += 1
        return True

    def remove(self, levels: Sequence[str], value: Hashable) -> bool:
        """Remove ``value`` from filter ``levels``, pruning empty branches; False if absent."""
        path = [self._root]
        for level in levels:
            child = path[-1].children.get(level)
            if child is None:
                return False
            path.append(child)
        if value not in path[-1].values:
            return False
        path[-1].values.discard(value)
        self._count -= 1
        for parent, level, child in zip(reversed(path[:-1]), reversed(levels), reversed(path[1:])):
            if not child.is_empty():
                break
            del parent.children[level]
        return True

    def match(self, subject: Sequence[str]) -> set[Hashable]:
        """Every value whose filter matches the subject ``subject`` (a list of levels);
        InvalidArgument if it is deeper than ``MAX_LEVELS``."""
        check_depth(subject, "subject")
        found: set[Hashable] = set()
        syntax = self.syntax
        root, end, multi_key, single_key = self._root, len(subject), syntax.multi, syntax.single
        dollar_root = root if syntax.dollar_hidden and subject and subject[0].startswith("$") else None
        pending: list[tuple[_Node, int]] = [(root, 0)]
        # (id of a multi-level node, depth) pairs already queued: below several ``#`` levels
        # a node is reached at the same depth along many paths, and is walked once
        expanded: set[tuple[int, int]] = set()
        visited = 0
        while pending:
            node, depth = pending.pop()
            visited += 1
            wildcards = node is not dollar_root
            if wildcards and (multi := node.children.get(multi_key)) is not None:
                if multi.children:
                    for rest in range(depth, end + 1):
                        if (id(multi), rest) not in expanded:
                            expanded.add((id(multi), rest))
                            pending.append((multi, rest))
                else:
                    visited += 1
                    found |= multi.values
            if depth == end:
                found |= node.values
                continue
            if (exact := node.children.get(subject[depth])) is not None:
                pending.append((exact, depth + 1))
            if wildcards and (single := node.children.get(single_key)) is not None:
                pending.append((single, depth + 1))
        self.visited = visited
        return found

    def filters(self) -> Iterator[tuple[tuple[str, ...], Hashable]]:
        """Every (filter levels, value) pair stored."""
        stack: list[tuple[tuple[str, ...], _Node]] = [((), self._root)]
        while stack:
            prefix, node = stack.pop()
            for value in node.values:
                yield prefix, value
            stack.extend((prefix + (level,), child) for level, child in node.children.items())


def check_depth(levels: Sequence[str], what: str) -> None:
    """Raise InvalidArgument if ``levels`` has more than ``MAX_LEVELS`` levels."""
    if len(levels) > MAX_LEVELS:
        raise InvalidArgument(f"a {what} may have at most {MAX_LEVELS} levels, not {len(levels)}")
