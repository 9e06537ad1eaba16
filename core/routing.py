"""A topic trie: which subscriptions match a hierarchical subject.

Subjects and filters are lists of levels (MQTT splits on ``/``, AMQP on ``.``; the adapter
splits). A filter level may be the single-level wildcard (MQTT ``+``, AMQP ``*``) or the
multi-level wildcard ``#``, which matches zero or more levels (MQTT allows it only as the last
level; AMQP anywhere). Matching walks
only the branches the subject's levels select, so its cost grows with the subject's depth and
the number of matching wildcard branches, not with the number of unrelated subscriptions.

Matching is iterative and visits each (trie node, subject depth) pair at most once, so neither a
deep subject nor a chain of AMQP ``#`` levels can exhaust the stack or take exponential time;
filters and subjects deeper than ``MAX_LEVELS`` are refused with InvalidArgument.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from .errors import InvalidArgument

MAX_LEVELS = 1024
"""Most levels a filter or subject may have. Adapters cap lower (MQTT: ``max_topic_levels``);
this bound keeps core safe on its own."""


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    values: set[Hashable] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not self.children and not self.values


class TopicTrie:
    """Subscriptions (any hashable value) stored under filters, matched against subjects."""

    def __init__(self, single: str = "+", multi: str = "#", *, multi_anywhere: bool = False,
                 protect_dollar: bool = False) -> None:
        """``multi_anywhere``: ``#`` may stand at any level (AMQP), not only the last (MQTT).
        ``protect_dollar``: wildcards in the first filter level skip subjects starting with ``$``."""
        self.single = single
        self.multi = multi
        self.multi_anywhere = multi_anywhere
        self.protect_dollar = protect_dollar
        self._root = _Node()
        self._count = 0
        self.visited = 0
        """Nodes visited by the last ``match`` (for tests and metrics)."""

    def __len__(self) -> int:
        return self._count

    def check_filter(self, levels: Sequence[str]) -> None:
        """Raise InvalidArgument unless ``levels`` is a well-formed filter."""
        check_depth(levels, "filter")
        for position, level in enumerate(levels):
            if level == self.multi and position != len(levels) - 1 and not self.multi_anywhere:
                raise InvalidArgument(f"'{self.multi}' must be the last level of a filter")
            if level not in (self.single, self.multi) and (self.single in level or self.multi in level):
                raise InvalidArgument(f"a wildcard must occupy a whole level, not {level!r}")

    def add(self, levels: Sequence[str], value: Hashable) -> bool:
        """Store ``value`` under filter ``levels``; return False if it was there already."""
        self.check_filter(levels)
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
        root, end, multi_key, single_key = self._root, len(subject), self.multi, self.single
        dollar_root = root if self.protect_dollar and subject and subject[0].startswith("$") else None
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
