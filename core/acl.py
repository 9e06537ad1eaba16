"""Access-control rules on subjects (MQTT topics): allow and deny, per user or for everyone.

Topic permissions (``core.auth``) grant rights on whole topics, which for MQTT is the first
topic level. Rules refine that below the first level, as Mosquitto's ``pattern`` lines and
EMQX's ACL do: a rule is a subject filter in the syntax the composition root gives core (MQTT's:
``+`` one level, ``#`` the rest; ``core.routing.TopicSyntax`` validates and matches it; a syntax
whose multi-level wildcard may stand anywhere is not supported here), the actions it covers
(publish, subscribe) and whether it allows or denies. ``%u`` in a pattern stands for the user
name and ``%c`` for the client id, so one rule for everyone confines each device::

    deny  everyone  devices/#        publish, subscribe
    allow everyone  devices/%c/#     publish, subscribe

How a decision is made (``decide``):

- For a subject (a PUBLISH, a will, a retained message, and each message delivered to a
  subscriber): the rules of the user and of everyone whose pattern matches it. The most
  specific one decides; between equally specific ones, deny wins. No rule matches: the topic
  permission on the subject's topic decides.
- For a subscription filter: the rules whose pattern covers the whole filter (every subject
  the filter can match). Again the most specific decides, and without one the topic
  permission does. Every message delivered through the subscription is then checked as a
  subject, so a deny rule narrower than the filter still holds.

Specificity: more literal levels first, then more levels, then no ``#``. A placeholder level
is literal once filled in. A placeholder is compared as a whole level: a client id holding
``/``, ``+`` or ``#`` never matches more than its own literal level, so it cannot widen a rule.

Readers that are not subscriptions (an AMQP queue, a native pop or pull, the admin API's reads)
were authorized on a topic or a queue by their own operation; for them only the rules speak
(``Users.rule_denies``): a message whose subject (``subject_of``) a rule denies to the reader is
withheld from it, and no rule means no objection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import InvalidArgument
from .model import ORIGIN_SUBJECT_PROPERTY, SUBJECT_PROPERTY, AclRule, Action, Delivery
from .routing import TopicSyntax

EVERYONE = "*"
"""The user name of rules that apply to every user."""
MAX_PATTERN_LENGTH = 1024
_RULE_ACTIONS = frozenset({Action.PUBLISH, Action.SUBSCRIBE})

Withheld = Callable[[Delivery], bool]
"""Whether a message must be withheld from one reader: a rule denies it its subject."""


def subject_of(delivery: Delivery) -> str:
    """The subject rules are decided on: the message's full subject (``sluice.subject``; a
    dead-letter copy's, the one it was sent with), else the topic it was sent to, as fan-out
    and MQTT subscribers see it."""
    properties = delivery.properties
    return (properties.get(SUBJECT_PROPERTY) or properties.get(ORIGIN_SUBJECT_PROPERTY)
            or delivery.home_topic or delivery.topic)


def check_rule(rule: AclRule, syntax: TopicSyntax) -> AclRule:
    """Return ``rule`` if it is well formed, else raise InvalidArgument saying what to fix."""
    pattern = rule.pattern
    if not pattern or len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidArgument(f"rule pattern must be 1-{MAX_PATTERN_LENGTH} characters")
    syntax.check_filter(pattern)
    if not rule.actions or not rule.actions <= _RULE_ACTIONS:
        raise InvalidArgument("a rule covers publish, subscribe or both")
    return rule


@dataclass(frozen=True, slots=True)
class _Compiled:
    levels: tuple[str, ...]
    specificity: tuple[int, int, int]
    allow: bool
    actions: frozenset[Action]


def _compile(rule: AclRule, user: str, client_id: str, syntax: TopicSyntax) -> _Compiled:
    levels = tuple(_fill(level, user, client_id, syntax) for level in syntax.levels(rule.pattern))
    literal = sum(1 for level in levels if not syntax.is_wildcard(level))
    return _Compiled(levels, (literal, len(levels), 0 if levels[-1] == syntax.multi else 1),
                     rule.allow, rule.actions)


def _fill(level: str, user: str, client_id: str, syntax: TopicSyntax) -> str:
    if "%" not in level:
        return level
    filled = level.replace("%u", user).replace("%c", client_id)
    # A filled-in level is a literal: one that would read as a wildcard or as nothing matches
    # no level at all (NUL never occurs in a subject).
    return "\0" + filled if not filled or syntax.is_wildcard(filled) else filled


class RuleSet:
    """The rules that apply to one user (its own and everyone's), ready to decide."""

    __slots__ = ("_rules", "_syntax")

    def __init__(self, rules: Iterable[AclRule], syntax: TopicSyntax) -> None:
        self._rules = tuple(rules)
        self._syntax = syntax

    def decide(self, action: Action, user: str, client_id: str, subject_or_filter: str,
               is_filter: bool = False) -> bool | None:
        """True/False if a rule decides ``action`` on the subject (or subscription filter);
        None when no rule applies and the topic permission decides."""
        syntax = self._syntax
        levels = syntax.levels(subject_or_filter)
        best: _Compiled | None = None
        for rule in self._rules:
            if action not in rule.actions:
                continue
            compiled = _compile(rule, user, client_id, syntax)
            if not (syntax.covers(compiled.levels, levels) if is_filter
                    else syntax.levels_match(compiled.levels, levels)):
                continue
            if (best is None or compiled.specificity > best.specificity
                    or (compiled.specificity == best.specificity and not compiled.allow)):
                best = compiled
        return None if best is None else best.allow
