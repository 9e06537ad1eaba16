"""Exchanges and bindings of one virtual host: where a message published to an exchange goes.

The routing rules are RabbitMQ's (AMQP 0-9-1 with its extensions), so applications moving off
RabbitMQ see the same queues receive the same messages:

- ``direct``: bindings whose key equals the routing key; ``fanout``: every binding; ``topic``:
  binding keys are ``.``-separated words where ``*`` is one word and ``#`` zero or more, anywhere
  (one trie per exchange, ``core.routing``); ``headers``: the binding's arguments against the
  message headers, ``x-match`` ``all`` (the default) or ``any``, and their ``-with-x`` forms,
  which also compare ``x-`` arguments.
- The default exchange (``""``) routes to the queue named by the routing key; every queue is
  bound to it implicitly and nothing else may bind to it.
- Exchange-to-exchange bindings are followed to any depth, each exchange once per message, so a
  cycle ends; a message that reaches no queue through an exchange with an ``alternate-exchange``
  goes on through that one.
- The predeclared ``amq.direct``, ``amq.fanout``, ``amq.topic``, ``amq.headers`` and
  ``amq.match`` exist in every virtual host and cannot be deleted or redeclared differently.

Everything here is in memory and pure: declaring, binding and routing change nothing on disk.
Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .equivalence import check_equivalent
from .errors import AccessDenied, InvalidArgument, NotFound, PreconditionFailed
from .routing import TopicSyntax, TopicTrie
from .untrusted import clip

TOPIC_SYNTAX = TopicSyntax(".", "*", "#")
"""Binding keys of topic exchanges: ``.`` words, ``*`` one word, ``#`` zero or more anywhere."""

DEFAULT_EXCHANGE = ""
ALTERNATE_EXCHANGE = "alternate-exchange"
MAX_CACHED_ROUTES = 4096
"""Routes (exchange, routing key) an ``ExchangeGraph`` remembers; beyond this it starts over."""


class ExchangeType(enum.Enum):
    """The exchange types AMQP 0-9-1 and RabbitMQ define."""

    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


_TYPE_NAMES = frozenset(t.value for t in ExchangeType)
DELAYED_EXCHANGE = "x-delayed-message"
"""The exchange type of RabbitMQ's delayed-message plugin; ``x-delayed-type`` names how it routes."""
DELAYED_TYPE_ARGUMENT = "x-delayed-type"
DELAY_HEADER = "x-delay"
"""Milliseconds a message published to a delayed exchange waits before it reaches its queues."""

PREDECLARED: dict[str, ExchangeType] = {
    "amq.direct": ExchangeType.DIRECT, "amq.fanout": ExchangeType.FANOUT,
    "amq.topic": ExchangeType.TOPIC, "amq.headers": ExchangeType.HEADERS,
    "amq.match": ExchangeType.HEADERS,
}


@dataclass(frozen=True)
class Destination:
    """Where a binding leads: a queue or another exchange."""

    name: str
    is_exchange: bool = False


@dataclass(frozen=True)
class Binding:
    """One binding of an exchange, as declared."""

    source: str
    destination: Destination
    routing_key: str
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass
class Exchange:
    """One exchange: its declared settings and its bindings, indexed for its type."""

    name: str
    type: ExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    delayed: bool = False
    """Declared as ``x-delayed-message``: routes as ``type`` (its ``x-delayed-type``), and a
    publish with an ``x-delay`` header is held by core's timer that many milliseconds."""
    bindings: set[Binding] = field(default_factory=set)
    _by_key: dict[str, set[Destination]] = field(default_factory=dict, repr=False)
    _trie: TopicTrie = field(default_factory=lambda: TopicTrie(TOPIC_SYNTAX), repr=False)

    @property
    def kind(self) -> str:
        """The type it was declared with."""
        return DELAYED_EXCHANGE if self.delayed else self.type.value

    @property
    def alternate(self) -> str | None:
        """The alternate exchange's name, if one is set."""
        value = self.arguments.get(ALTERNATE_EXCHANGE)
        return value if isinstance(value, str) and value else None

    def add(self, binding: Binding) -> bool:
        """Index ``binding``; False if the exchange had it already."""
        if binding in self.bindings:
            return False
        if self.type is ExchangeType.TOPIC:
            self._trie.add(TOPIC_SYNTAX.levels(binding.routing_key), binding.destination)
        elif self.type is ExchangeType.DIRECT:
            self._by_key.setdefault(binding.routing_key, set()).add(binding.destination)
        self.bindings.add(binding)
        return True

    def remove(self, binding: Binding) -> bool:
        """Drop ``binding``; False if the exchange did not have it."""
        if binding not in self.bindings:
            return False
        self.bindings.discard(binding)
        same = [b for b in self.bindings if b.destination == binding.destination
                and b.routing_key == binding.routing_key]
        if not same:  # another binding with other arguments may lead there with this key
            if self.type is ExchangeType.TOPIC:
                self._trie.remove(TOPIC_SYNTAX.levels(binding.routing_key), binding.destination)
            elif self.type is ExchangeType.DIRECT:
                destinations = self._by_key.get(binding.routing_key, set())
                destinations.discard(binding.destination)
                if not destinations:
                    self._by_key.pop(binding.routing_key, None)
        return True

    def matches(self, routing_key: str, headers: Mapping[str, Any]) -> set[Destination]:
        """Where a message with ``routing_key`` and ``headers`` goes from here (one hop)."""
        if self.type is ExchangeType.DIRECT:
            return set(self._by_key.get(routing_key, ()))
        if self.type is ExchangeType.FANOUT:
            return {b.destination for b in self.bindings}
        if self.type is ExchangeType.TOPIC:
            return self._trie.match(TOPIC_SYNTAX.levels(routing_key))  # type: ignore[return-value]
        return {b.destination for b in self.bindings if headers_match(dict(b.arguments), headers)}

    def described(self) -> dict[str, Any]:
        """`settings` by the names RabbitMQ gives them, arguments by their own names."""
        return {"type": self.kind, "durable": self.durable,
                "auto_delete": self.auto_delete, "internal": self.internal, **self.arguments}


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether a headers-exchange binding with ``arguments`` takes a message with ``headers``."""
    mode = arguments.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    wanted = {k: v for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))}
    if mode in ("any", "any-with-x"):
        return any(k in headers and (v is None or headers[k] == v) for k, v in wanted.items())
    return all(k in headers and (v is None or headers[k] == v) for k, v in wanted.items())


def check_headers_binding(arguments: Mapping[str, Any]) -> None:
    """InvalidArgument for an ``x-match`` value RabbitMQ refuses."""
    mode = arguments.get("x-match", "all")
    if mode not in ("all", "any", "all-with-x", "any-with-x"):
        raise InvalidArgument(f"x-match must be all, any, all-with-x or any-with-x, not "
                              f"{clip(mode)}")


class ExchangeGraph:
    """The exchanges of one virtual host and their bindings.

    ``queue_exists`` answers whether a queue of this virtual host exists: the default exchange
    routes only to queues that do, and bindings need their destination queue to exist.
    """

    def __init__(self, queue_exists: Callable[[str], bool], vhost: str = "/") -> None:
        self._queue_exists = queue_exists
        self.vhost = vhost
        """The virtual host's name, for error texts."""
        self._exchanges: dict[str, Exchange] = {
            name: Exchange(name, kind) for name, kind in PREDECLARED.items()}
        self._exchanges[DEFAULT_EXCHANGE] = Exchange(DEFAULT_EXCHANGE, ExchangeType.DIRECT)
        self._routes: dict[tuple[str, str], frozenset[str]] = {}
        """Where a routing key goes from an exchange, for routes that reach no headers
        exchange (those depend on each message's headers); forgotten on every change of
        exchanges or bindings."""

    def __contains__(self, name: str) -> bool:
        return name in self._exchanges

    def get(self, name: str) -> Exchange:
        """The exchange ``name``; NotFound (AMQP 404) if there is none."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {clip(name)} in vhost {clip(self.vhost)}")
        return exchange

    def exchanges(self) -> list[Exchange]:
        """Every exchange, the predeclared ones included, sorted by name."""
        return sorted(self._exchanges.values(), key=lambda e: e.name)

    def declare(self, name: str, kind: str, *, durable: bool = True, auto_delete: bool = False,
                internal: bool = False, arguments: Mapping[str, Any] | None = None,
                passive: bool = False) -> Exchange:
        """Create exchange ``name``, or check that the existing one was declared alike.

        ``passive`` only checks that it exists (NotFound otherwise). A redeclaration with other
        settings is PreconditionFailed (406), an unknown type InvalidArgument (RabbitMQ >= 3.13
        answers 406 too), a new name starting with ``amq.`` AccessDenied (403).
        """
        existing = self._exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound(f"no exchange {clip(name)} in vhost {clip(self.vhost)}")
            return existing
        delayed = kind == DELAYED_EXCHANGE
        if delayed:
            kind = (arguments or {}).get(DELAYED_TYPE_ARGUMENT)
            if not isinstance(kind, str) or kind not in _TYPE_NAMES:
                raise PreconditionFailed("Invalid argument, 'x-delayed-type' must be an existing "
                                         "exchange type (direct, fanout, topic or headers)")
        try:
            exchange_type = ExchangeType(kind)
        except ValueError:
            raise InvalidArgument(f"unknown exchange type {clip(str(kind))}; Sluice has direct, "
                                  "fanout, topic, headers and x-delayed-message") from None
        wanted = Exchange(name, exchange_type, durable, auto_delete, internal,
                          dict(arguments or {}), delayed)
        if existing is not None:
            check_equivalent("exchange", name, self.vhost, wanted.described(),
                             existing.described())
            return existing
        if name == DEFAULT_EXCHANGE or name.startswith("amq."):
            raise AccessDenied(f"exchange name {clip(name)} contains reserved prefix 'amq.*'")
        self._routes.clear()  # it may be an alternate exchange named before it existed
        self._exchanges[name] = wanted
        return wanted

    def delete(self, name: str, *, if_unused: bool = False) -> bool:
        """Delete exchange ``name`` and every binding from or to it; False if it did not exist.
        The predeclared ones cannot be deleted (AccessDenied); ``if_unused`` refuses one that
        has bindings from it (PreconditionFailed)."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            return False
        if name == DEFAULT_EXCHANGE or name in PREDECLARED:
            raise AccessDenied(f"the predeclared exchange {clip(name)} cannot be deleted")
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange {clip(name)} in vhost {clip(self.vhost)} in use")
        del self._exchanges[name]
        self._routes.clear()
        self._drop_bindings_to(Destination(name, is_exchange=True))
        return True

    def bind(self, source: str, destination: Destination, routing_key: str,
             arguments: Mapping[str, Any] | None = None) -> bool:
        """Bind ``destination`` to exchange ``source``; False if that binding existed."""
        exchange = self._bindable(source)
        self._check_destination(destination)
        args = dict(arguments or {})
        if exchange.type is ExchangeType.HEADERS:
            check_headers_binding(args)
        elif exchange.type is ExchangeType.TOPIC:
            TOPIC_SYNTAX.check_levels(TOPIC_SYNTAX.levels(routing_key), routing_key)
        added = exchange.add(Binding(source, destination, routing_key, frozen_arguments(args)))
        if added:
            self._routes.clear()
        return added

    def unbind(self, source: str, destination: Destination, routing_key: str,
               arguments: Mapping[str, Any] | None = None) -> bool:
        """Remove a binding; False if there was none such, its exchange included (RabbitMQ
        answers unbind-ok anyway)."""
        if source != DEFAULT_EXCHANGE and source not in self._exchanges:
            return False
        exchange = self._bindable(source)
        removed = exchange.remove(Binding(source, destination, routing_key,
                                          frozen_arguments(dict(arguments or {}))))
        if removed:
            self._routes.clear()
        if removed and exchange.auto_delete and not exchange.bindings:
            self.delete(source)  # an auto-delete exchange goes with its last binding
        return removed

    def queue_deleted(self, queue: str) -> None:
        """Drop every binding to ``queue``; auto-delete exchanges left without bindings go."""
        self._routes.clear()
        self._drop_bindings_to(Destination(queue))

    def bindings(self) -> list[Binding]:
        """Every explicit binding, sorted by source and destination."""
        found = [b for e in self._exchanges.values() for b in e.bindings]
        return sorted(found, key=lambda b: (b.source, b.destination.name, b.routing_key))

    def route(self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None,
              *, by_client: bool = True) -> set[str]:
        """The queues a message published to ``exchange`` reaches (empty: unroutable).

        NotFound if the exchange does not exist; AccessDenied for a client publishing to an
        internal exchange (``by_client``). Exchange-to-exchange bindings and alternate
        exchanges are followed, each exchange at most once.
        """
        start = self.get(exchange)
        if by_client and start.internal:
            raise AccessDenied(f"exchange {clip(exchange)} is internal: clients cannot publish "
                               "to it")
        if start.name == DEFAULT_EXCHANGE:
            return {routing_key} if self._queue_exists(routing_key) else set()
        cached = self._routes.get((exchange, routing_key))
        if cached is not None:
            return set(cached)
        queues, by_headers = self._walk(start, routing_key, headers or {})
        if not by_headers:
            if len(self._routes) >= MAX_CACHED_ROUTES:
                self._routes.clear()
            self._routes[(exchange, routing_key)] = frozenset(queues)
        return queues

    def _walk(self, start: Exchange, routing_key: str,
              headers: Mapping[str, Any]) -> tuple[set[str], bool]:
        """(queues reached from ``start``, whether a headers exchange was on the way)."""
        queues: set[str] = set()
        seen = {start.name}
        pending = [start]
        by_headers = False
        while pending:
            current = pending.pop()
            by_headers = by_headers or current.type is ExchangeType.HEADERS
            reached = False
            for destination in current.matches(routing_key, headers):
                if not destination.is_exchange:
                    reached = True
                    queues.add(destination.name)
                elif destination.name not in seen and destination.name in self._exchanges:
                    reached = True
                    seen.add(destination.name)
                    pending.append(self._exchanges[destination.name])
            alternate = current.alternate
            if not reached and alternate and alternate not in seen and alternate in self._exchanges:
                seen.add(alternate)
                pending.append(self._exchanges[alternate])
        return queues, by_headers

    def _bindable(self, source: str) -> Exchange:
        if source == DEFAULT_EXCHANGE:
            raise AccessDenied("the default exchange takes no bindings: every queue is bound "
                               "to it by its name")
        return self.get(source)

    def _check_destination(self, destination: Destination) -> None:
        if destination.is_exchange:
            if destination.name == DEFAULT_EXCHANGE:
                raise AccessDenied("the default exchange cannot be bound to another exchange")
            self.get(destination.name)
        elif not self._queue_exists(destination.name):
            raise NotFound(f"no queue {clip(destination.name)} in vhost {clip(self.vhost)}")

    def _drop_bindings_to(self, destination: Destination) -> None:
        for exchange in list(self._exchanges.values()):
            for binding in [b for b in exchange.bindings if b.destination == destination]:
                exchange.remove(binding)
            if exchange.auto_delete and not exchange.bindings and exchange.name not in PREDECLARED:
                self._exchanges.pop(exchange.name, None)
                self._drop_bindings_to(Destination(exchange.name, is_exchange=True))


def frozen_arguments(arguments: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Binding arguments as a hashable, order-independent value."""
    return tuple(sorted((k, _hashable(v)) for k, v in arguments.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return frozen_arguments(value)
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value
