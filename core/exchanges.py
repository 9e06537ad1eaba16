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

Bindings are indexed by exchange (for its type: by key, in a trie, or by header,
``core.headers_index``) and by destination, so binding, unbinding and routing cost the same
whatever else is bound, and deleting a queue or exchange costs time linear in its own bindings.
``BindingLimits`` bound how many one queue, exchange and virtual host may have.

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
from .headers_index import MATCH_ARGUMENT, MODES, HeadersIndex
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


@dataclass(frozen=True)
class BindingLimits:
    """Most bindings one queue, one exchange and one virtual host may have (``core``
    settings ``max_bindings_per_queue``, ``max_bindings_per_exchange`` and
    ``max_bindings_per_vhost``). An exchange counts the bindings from it and, separately, those
    to it."""

    per_queue: int = 10_000
    per_exchange: int = 10_000
    per_vhost: int = 100_000


@dataclass
class Exchange:
    """One exchange: its declared settings and its bindings, indexed for its type, so adding or
    removing one binding costs the same whatever the number of others."""

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
    _routes_to: dict[tuple[Destination, str], int] = field(default_factory=dict, repr=False)
    """Bindings per (destination, routing key): several may differ only by their arguments."""
    _destinations: dict[Destination, int] = field(default_factory=dict, repr=False)
    _by_key: dict[str, set[Destination]] = field(default_factory=dict, repr=False)
    _trie: TopicTrie = field(default_factory=lambda: TopicTrie(TOPIC_SYNTAX), repr=False)
    _headers: HeadersIndex[Destination] = field(default_factory=HeadersIndex, repr=False)

    @property
    def kind(self) -> str:
        """The type it was declared with."""
        return DELAYED_EXCHANGE if self.delayed else self.type.value

    @property
    def alternate(self) -> str | None:
        """The alternate exchange's name, if one is set."""
        value = self.arguments.get(ALTERNATE_EXCHANGE)
        return value if isinstance(value, str) and value else None

    @property
    def visited(self) -> int:
        """Headers rules examined by the last ``matches`` of a headers exchange."""
        return self._headers.visited

    def add(self, binding: Binding) -> bool:
        """Index ``binding``; False if the exchange had it already."""
        if binding in self.bindings:
            return False
        self.bindings.add(binding)
        destination, key = binding.destination, binding.routing_key
        count = self._routes_to.get((destination, key), 0)
        self._routes_to[destination, key] = count + 1
        self._destinations[destination] = self._destinations.get(destination, 0) + 1
        if self.type is ExchangeType.HEADERS:
            self._headers.add(binding.arguments, dict(binding.arguments), destination)
        elif not count:  # else the key leads there already, by a binding with other arguments
            self._index_key(destination, key)
        return True

    def remove(self, binding: Binding) -> bool:
        """Drop ``binding``; False if the exchange did not have it."""
        if binding not in self.bindings:
            return False
        self.bindings.discard(binding)
        destination, key = binding.destination, binding.routing_key
        _decrement(self._destinations, destination)
        last = _decrement(self._routes_to, (destination, key))
        if self.type is ExchangeType.HEADERS:
            self._headers.remove(binding.arguments, destination)
        elif last:
            self._unindex_key(destination, key)
        return True

    def _index_key(self, destination: Destination, key: str) -> None:
        if self.type is ExchangeType.TOPIC:
            self._trie.add(TOPIC_SYNTAX.levels(key), destination)
        elif self.type is ExchangeType.DIRECT:
            self._by_key.setdefault(key, set()).add(destination)

    def _unindex_key(self, destination: Destination, key: str) -> None:
        if self.type is ExchangeType.TOPIC:
            self._trie.remove(TOPIC_SYNTAX.levels(key), destination)
        elif self.type is ExchangeType.DIRECT:
            destinations = self._by_key.get(key, set())
            destinations.discard(destination)
            if not destinations:
                self._by_key.pop(key, None)

    def leads(self, destination: Destination, routing_key: str) -> bool:
        """Whether a binding with ``routing_key`` (any arguments) leads to ``destination``."""
        return (destination, routing_key) in self._routes_to

    def matches(self, routing_key: str, headers: Mapping[str, Any]) -> set[Destination]:
        """Where a message with ``routing_key`` and ``headers`` goes from here (one hop)."""
        if self.type is ExchangeType.DIRECT:
            return set(self._by_key.get(routing_key, ()))
        if self.type is ExchangeType.FANOUT:
            return set(self._destinations)
        if self.type is ExchangeType.TOPIC:
            return self._trie.match(TOPIC_SYNTAX.levels(routing_key))  # type: ignore[return-value]
        return self._headers.match(headers)

    def described(self) -> dict[str, Any]:
        """`settings` by the names RabbitMQ gives them, arguments by their own names."""
        return {"type": self.kind, "durable": self.durable,
                "auto_delete": self.auto_delete, "internal": self.internal, **self.arguments}


def _decrement(counts: dict[Any, int], key: Any) -> bool:
    """Count one fewer of ``key``; whether that was the last."""
    left = counts[key] - 1
    if left:
        counts[key] = left
        return False
    del counts[key]
    return True


def check_headers_binding(arguments: Mapping[str, Any]) -> None:
    """InvalidArgument for an ``x-match`` value RabbitMQ refuses."""
    mode = arguments.get(MATCH_ARGUMENT, "all")
    if mode not in MODES:
        raise InvalidArgument(f"x-match must be all, any, all-with-x or any-with-x, not "
                              f"{clip(mode)}")


class ExchangeGraph:
    """The exchanges of one virtual host and their bindings.

    ``queue_exists`` answers whether a queue of this virtual host exists: the default exchange
    routes only to queues that do, and bindings need their destination queue to exist. Every
    binding is indexed by its destination too, so a queue or exchange deleted takes its own
    bindings away in time linear in their number, whatever the virtual host holds.
    """

    def __init__(self, queue_exists: Callable[[str], bool], vhost: str = "/",
                 limits: BindingLimits = BindingLimits()) -> None:
        self._queue_exists = queue_exists
        self.vhost = vhost
        """The virtual host's name, for error texts."""
        self.limits = limits
        self._exchanges: dict[str, Exchange] = {
            name: Exchange(name, kind) for name, kind in PREDECLARED.items()}
        self._exchanges[DEFAULT_EXCHANGE] = Exchange(DEFAULT_EXCHANGE, ExchangeType.DIRECT)
        self._routes: dict[tuple[str, str], frozenset[str]] = {}
        """Where a routing key goes from an exchange, for routes that reach no headers
        exchange (those depend on each message's headers); forgotten on every change of
        exchanges or bindings."""
        self._leading_to: dict[Destination, set[Binding]] = {}
        """Every binding, by where it leads."""
        self._count = 0
        self.visited = 0
        """Bindings removed by the last change, or headers rules examined by the last route
        (for tests and metrics)."""

    def __contains__(self, name: str) -> bool:
        return name in self._exchanges

    def __len__(self) -> int:
        """How many bindings there are."""
        return self._count

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

    def delete(self, name: str, *, if_unused: bool = False) -> list[Binding] | None:
        """Delete exchange ``name`` and every binding from or to it: the bindings that went
        (with those of auto-delete exchanges that lost their last one), None if it did not
        exist. The predeclared ones cannot be deleted (AccessDenied); ``if_unused`` refuses
        one that has bindings from it (PreconditionFailed)."""
        exchange = self._exchanges.get(name)
        if exchange is None:
            return None
        if name == DEFAULT_EXCHANGE or name in PREDECLARED:
            raise AccessDenied(f"the predeclared exchange {clip(name)} cannot be deleted")
        if if_unused and exchange.bindings:
            raise PreconditionFailed(f"exchange {clip(name)} in vhost {clip(self.vhost)} in use")
        self.visited = 0
        gone = [binding for binding in list(exchange.bindings) if self._remove(exchange, binding)]
        del self._exchanges[name]
        self._routes.clear()
        return gone + self._drop_bindings_to(Destination(name, is_exchange=True))

    def bind(self, source: str, destination: Destination, routing_key: str,
             arguments: Mapping[str, Any] | None = None, *, limited: bool = True) -> bool:
        """Bind ``destination`` to exchange ``source``; False if that binding existed.

        A new binding beyond the ``limits`` is PreconditionFailed (AMQP 406, as RabbitMQ
        answers a virtual host's limits); ``limited=False`` skips them, for bindings restored
        at start, which were within the limits in force when they were made."""
        exchange = self._bindable(source)
        self._check_destination(destination)
        args = dict(arguments or {})
        if exchange.type is ExchangeType.HEADERS:
            check_headers_binding(args)
        elif exchange.type is ExchangeType.TOPIC:
            TOPIC_SYNTAX.check_levels(TOPIC_SYNTAX.levels(routing_key), routing_key)
        binding = Binding(source, destination, routing_key, frozen_arguments(args))
        if binding in exchange.bindings:
            return False
        if limited:
            self._check_limits(exchange, destination)
        exchange.add(binding)
        self._leading_to.setdefault(destination, set()).add(binding)
        self._count += 1
        self._routes.clear()
        return True

    def unbind(self, source: str, destination: Destination, routing_key: str,
               arguments: Mapping[str, Any] | None = None) -> list[Binding]:
        """Remove a binding: the bindings that went (none if there was no such binding, its
        exchange included: RabbitMQ answers unbind-ok anyway; more when an auto-delete exchange
        went with its last binding, taking the bindings to it)."""
        if source != DEFAULT_EXCHANGE and source not in self._exchanges:
            return []
        exchange = self._bindable(source)
        binding = Binding(source, destination, routing_key,
                          frozen_arguments(dict(arguments or {})))
        self.visited = 0
        if not self._remove(exchange, binding):
            return []
        self._routes.clear()
        return [binding, *self._drop_exchange(exchange)]  # auto-delete: goes with its last binding

    def queue_deleted(self, queue: str) -> list[Binding]:
        """Drop every binding to ``queue`` (auto-delete exchanges left without bindings go,
        with the bindings to them): the bindings that went."""
        self._routes.clear()
        self.visited = 0
        return self._drop_bindings_to(Destination(queue))

    def bindings(self) -> list[Binding]:
        """Every explicit binding, sorted by source and destination."""
        found = [b for e in self._exchanges.values() for b in e.bindings]
        return sorted(found, key=lambda b: (b.source, b.destination.name, b.routing_key))

    def bindings_to(self, destination: Destination) -> set[Binding]:
        """The bindings leading to ``destination``."""
        return set(self._leading_to.get(destination, ()))

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
        self.visited = 0
        while pending:
            current = pending.pop()
            reached = False
            for destination in current.matches(routing_key, headers):
                if not destination.is_exchange:
                    reached = True
                    queues.add(destination.name)
                elif destination.name not in seen and destination.name in self._exchanges:
                    reached = True
                    seen.add(destination.name)
                    pending.append(self._exchanges[destination.name])
            if current.type is ExchangeType.HEADERS:
                by_headers = True
                self.visited += current.visited
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

    def _check_limits(self, exchange: Exchange, destination: Destination) -> None:
        """PreconditionFailed if one more binding from ``exchange`` to ``destination`` would
        pass a limit; the text names the setting to raise."""
        limits, vhost = self.limits, clip(self.vhost)
        if self._count >= limits.per_vhost:
            raise _limit_reached(f"vhost {vhost} has {self._count} bindings",
                                 limits.per_vhost, "max_bindings_per_vhost")
        if len(exchange.bindings) >= limits.per_exchange:
            raise _limit_reached(f"exchange {clip(exchange.name)} in vhost {vhost} has "
                                 f"{len(exchange.bindings)} bindings", limits.per_exchange,
                                 "max_bindings_per_exchange")
        leading = len(self._leading_to.get(destination, ()))
        kind = "exchange" if destination.is_exchange else "queue"
        limit = limits.per_exchange if destination.is_exchange else limits.per_queue
        if leading >= limit:
            raise _limit_reached(f"{kind} {clip(destination.name)} in vhost {vhost} is bound "
                                 f"{leading} times", limit, f"max_bindings_per_{kind}")

    def _remove(self, exchange: Exchange, binding: Binding) -> bool:
        """Take ``binding`` out of ``exchange`` and the destination index."""
        if not exchange.remove(binding):
            return False
        leading = self._leading_to[binding.destination]
        leading.discard(binding)
        if not leading:
            del self._leading_to[binding.destination]
        self._count -= 1
        self.visited += 1
        return True

    def _drop_bindings_to(self, destination: Destination) -> list[Binding]:
        """Remove every binding leading to ``destination``: the bindings that went, with those
        to auto-delete exchanges that lost their last binding and went too (a chain of them is
        followed without recursion)."""
        gone: list[Binding] = []
        pending = [destination]
        while pending:
            for binding in self._leading_to.get(pending.pop(), set()).copy():
                source = self._exchanges[binding.source]
                self._remove(source, binding)
                gone.append(binding)
                if self._goes_unbound(source):
                    del self._exchanges[source.name]
                    pending.append(Destination(source.name, is_exchange=True))
        return gone

    def _drop_exchange(self, exchange: Exchange) -> list[Binding]:
        """An auto-delete exchange lost its last binding: it goes, with the bindings to it."""
        if not self._goes_unbound(exchange):
            return []
        del self._exchanges[exchange.name]
        return self._drop_bindings_to(Destination(exchange.name, is_exchange=True))

    def _goes_unbound(self, exchange: Exchange) -> bool:
        """Whether ``exchange`` is an auto-delete one, still here, with no binding from it."""
        return (exchange.auto_delete and not exchange.bindings and exchange.name not in PREDECLARED
                and self._exchanges.get(exchange.name) is exchange)


def _limit_reached(state: str, limit: int, setting: str) -> PreconditionFailed:
    return PreconditionFailed(f"cannot bind: {state}, the limit (core.{setting}) is {limit}; "
                              "unbind or delete some first, or raise the setting")


def frozen_arguments(arguments: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Binding arguments as a hashable, order-independent value."""
    return tuple(sorted((k, _hashable(v)) for k, v in arguments.items()))


def _hashable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return frozen_arguments(value)
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value
