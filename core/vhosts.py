"""Virtual hosts: isolated namespaces of AMQP exchanges, queues and bindings, kept across restarts.

Each virtual host has an ``ExchangeGraph`` (``core.exchanges``) and its queues. Durable objects
are written to the metadata database (one row each, settings as JSON) before they are answered,
and restored by ``load`` at start; transient ones, and exclusive queues, live in memory only and
are gone after a restart, as in RabbitMQ. A binding is durable when both its ends are.

Every AMQP queue is a named queue of core (``named_queue``), so its messages are entries over
the one commit log. Each declaration of a queue is a new incarnation (kept in its durable row),
so a queue deleted and declared again under the same name starts empty; rows written before
incarnations existed keep the named queue their name alone gave. No authorization here: the
adapter decides first, on domain names.
Runs on the event loop; metadata writes go to a thread.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .equivalence import check_equivalent
from .errors import AccessDenied, AlreadyExists, InvalidArgument, NotFound, ResourceLocked
from .exchanges import (DELAY_HEADER, Binding, BindingLimits, Destination, ExchangeGraph,
                        frozen_arguments)
from .metadata import MetadataRepository
from .queue_features import check as check_features
from .queue_features import target
from .untrusted import clip

DEFAULT_VHOST = "/"
TOPIC_EXCHANGE = "amq.topic"
"""The exchange whose queue bindings are mirrored to a ``TopicMirror``."""
MAX_NAME_BYTES = 255
"""Longest exchange, queue or virtual host name (AMQP's shortstr)."""


@dataclass(frozen=True)
class QueueSettings:
    """A queue as declared. ``owner`` is the connection an exclusive queue belongs to."""

    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    incarnation: str = ""
    """Tells this declaration's entries from those of an earlier queue of the same name."""

    def same_declaration(self, other: QueueSettings) -> bool:
        """Whether ``other`` redeclares this queue alike (RabbitMQ compares these)."""
        return self.described() == other.described()

    def described(self) -> dict[str, Any]:
        """What a redeclaration must repeat, by the names RabbitMQ gives them."""
        return {"durable": self.durable, "exclusive": self.owner is not None,
                "auto_delete": self.auto_delete, **self.arguments}


@dataclass
class VirtualHost:
    """One namespace: its exchanges and bindings, and its queues."""

    name: str
    limits: BindingLimits = BindingLimits()
    queues: dict[str, QueueSettings] = field(default_factory=dict)
    graph: ExchangeGraph = field(init=False)

    def __post_init__(self) -> None:
        self.graph = ExchangeGraph(self.queues.__contains__, self.name, self.limits)

    def queue(self, name: str) -> QueueSettings:
        """The queue ``name``; NotFound (AMQP 404) if there is none."""
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {clip(name)} in vhost {clip(self.name)}")
        return queue

    def named(self, name: str) -> str:
        """The named queue holding the entries of queue ``name`` as declared now; NotFound."""
        return named_queue(self.name, name, self.queue(name).incarnation)


def locked_text(queue: str, vhost: str) -> str:
    """Why another connection's exclusive queue is refused (RabbitMQ's words)."""
    return (f"cannot obtain exclusive access to locked queue {clip(queue)} in vhost "
            f"{clip(vhost)}. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.")


@functools.lru_cache(maxsize=4096)  # a pure hash, asked for by every publish it routes
def named_queue(vhost: str, queue: str, incarnation: str = "") -> str:
    """The core named queue holding the entries of one incarnation of an AMQP queue (the
    empty incarnation: a queue declared before incarnations existed)."""
    key = f"{vhost}\0{queue}" + (f"\0{incarnation}" if incarnation else "")
    digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    return f"%SYS%amqp.q.{digest}"


def check_amqp_name(name: str, what: str) -> str:
    """``name`` if it fits AMQP's shortstr (at most 255 UTF-8 bytes); InvalidArgument if not."""
    if len(name.encode()) > MAX_NAME_BYTES:
        raise InvalidArgument(f"a {what} name may have at most {MAX_NAME_BYTES} bytes")
    return name


class TopicMirror(Protocol):
    """Told of every queue binding of ``amq.topic`` (``VirtualHosts.mirror_topic_bindings``):
    the AMQP adapter binds the subject filter each key stands for in core's fan-out, so
    messages of every protocol reach the queue. Must not raise."""

    def bound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        """``queue`` of ``vhost`` (named queue ``named``) is bound to ``amq.topic`` with
        ``routing_key`` (may repeat)."""

    def unbound(self, vhost: str, queue: str, named: str, routing_key: str) -> None:
        """The last such binding is gone."""


class VirtualHosts:
    """Every virtual host of the broker, restored from and written to the metadata database."""

    def __init__(self, metadata: MetadataRepository,
                 limits: BindingLimits = BindingLimits()) -> None:
        self._metadata = metadata
        self._limits = limits
        self._vhosts: dict[str, VirtualHost] = {}
        self._mirror: TopicMirror | None = None

    def mirror_topic_bindings(self, mirror: TopicMirror) -> None:
        """Tell ``mirror`` of every queue binding of ``amq.topic`` there is now (the durable
        ones restored at start), and from now on of each one added or gone."""
        self._mirror = mirror
        for name, host in self._vhosts.items():
            for queue, key in _topic_pairs(host):
                mirror.bound(name, queue, host.named(queue), key)

    # --- start -------------------------------------------------------------------------

    def load(self, rows: list[tuple[str, str, str, str]]) -> None:
        """Rebuild from the metadata rows (``MetadataRepository.topology``): virtual hosts
        first, then exchanges, queues and bindings, in time linear in their number. Bindings
        are restored even beyond the binding limits (made before a limit was lowered)."""
        order = {"vhost": 0, "exchange": 1, "queue": 2, "binding": 3}
        for vhost, kind, name, spec in sorted(rows, key=lambda r: order.get(r[1], 4)):
            settings = json.loads(spec)
            host = self._vhosts.get(vhost)
            if host is None:
                host = self._vhosts[vhost] = VirtualHost(vhost, self._limits)
            if kind == "vhost":
                continue
            if kind == "exchange":
                host.graph.declare(name, settings["type"], durable=True,
                                   auto_delete=settings["auto_delete"],
                                   internal=settings["internal"], arguments=settings["arguments"])
            elif kind == "queue":
                host.queues[name] = QueueSettings(name, True, settings["auto_delete"],
                                                  settings["arguments"],
                                                  incarnation=settings.get("incarnation", ""))
            elif kind == "binding":
                destination = Destination(settings["destination"], settings["to_exchange"])
                host.graph.bind(settings["source"], destination, settings["routing_key"],
                                dict(settings["arguments"]), limited=False)

    async def ensure_default(self) -> bool:
        """Create ``/`` on first start, as RabbitMQ does; whether it was created now."""
        if DEFAULT_VHOST in self._vhosts:
            return False
        await self.create(DEFAULT_VHOST)
        return True

    # --- virtual hosts -----------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._vhosts)

    def get(self, name: str) -> VirtualHost:
        """The virtual host ``name``; NotFound if there is none."""
        host = self._vhosts.get(name)
        if host is None:
            raise NotFound(f"no virtual host {clip(name)}; an administrator creates it "
                           "(`sluice vhost create NAME`)")
        return host

    async def create(self, name: str) -> VirtualHost:
        """Create a virtual host; AlreadyExists if there is one of that name."""
        check_amqp_name(name, "virtual host")
        if not name:
            raise InvalidArgument("a virtual host needs a name")
        if name in self._vhosts:
            raise AlreadyExists(f"virtual host {clip(name)} exists already")
        await asyncio.to_thread(self._metadata.put_topology, name, "vhost", "", "{}")
        return self._vhosts.setdefault(name, VirtualHost(name, self._limits))

    async def delete(self, name: str) -> list[str]:
        """Delete a virtual host and everything in it; the named queues it held (for the
        caller to forget)."""
        host = self.get(name)
        await asyncio.to_thread(self._metadata.delete_topology, name)
        del self._vhosts[name]
        if self._mirror is not None:
            for queue, key in _topic_pairs(host):
                self._mirror.unbound(name, queue, host.named(queue), key)
        return [host.named(queue) for queue in host.queues]

    # --- exchanges -----------------------------------------------------------------------

    async def declare_exchange(self, vhost: str, name: str, kind: str, *, durable: bool = True,
                               auto_delete: bool = False, internal: bool = False,
                               arguments: Mapping[str, Any] | None = None,
                               passive: bool = False) -> None:
        """Declare an exchange (``core.exchanges.ExchangeGraph.declare``), stored if durable."""
        check_amqp_name(name, "exchange")
        graph = self.get(vhost).graph
        new = not passive and name not in graph
        exchange = graph.declare(name, kind, durable=durable, auto_delete=auto_delete,
                                 internal=internal, arguments=arguments, passive=passive)
        if new and durable:
            spec = {"type": exchange.kind, "auto_delete": auto_delete,
                    "internal": internal, "arguments": exchange.arguments}
            try:
                await asyncio.to_thread(self._metadata.put_topology, vhost, "exchange", name,
                                        _json(spec))
            except BaseException:
                graph.delete(name)
                raise

    async def delete_exchange(self, vhost: str, name: str, *, if_unused: bool = False) -> None:
        """Delete an exchange and its bindings (from metadata too)."""
        host = self.get(vhost)
        gone = host.graph.delete(name, if_unused=if_unused)
        if gone is not None:
            self._unmirror(vhost, host, gone)
            await asyncio.to_thread(self._metadata.delete_topology, vhost, "exchange", name)
            await self._forget_bindings(vhost, gone)

    # --- queues --------------------------------------------------------------------------

    async def declare_queue(self, vhost: str, settings: QueueSettings, *,
                            passive: bool = False, connection: str | None = None) -> QueueSettings:
        """Declare a queue (an empty name asks for a server-named one) and return it as it is.

        A redeclaration must match (PreconditionFailed, 406); another connection's exclusive
        queue is ResourceLocked (405); ``passive`` only checks that the queue exists.
        ``connection`` names the declaring connection (default: ``settings.owner``), which may
        use its own exclusive queues whatever ``settings`` says.
        """
        host = self.get(vhost)
        name = check_amqp_name(settings.name, "queue") or _server_name()
        existing = host.queues.get(name)
        if existing is not None and existing.owner not in (None, connection or settings.owner):
            raise ResourceLocked(locked_text(name, vhost))
        if passive:
            return host.queue(name)
        check_features(name, vhost, settings.arguments, durable=settings.durable,
                       exclusive=settings.owner is not None, auto_delete=settings.auto_delete)
        if existing is not None:
            if not existing.same_declaration(settings):
                check_equivalent("queue", name, vhost, settings.described(),
                                 existing.described())
            return existing
        if name.startswith("amq.") and settings.name:
            raise AccessDenied(f"queue name {clip(name)} contains reserved prefix 'amq.*'")
        queue = QueueSettings(name, settings.durable, settings.auto_delete,
                              dict(settings.arguments), settings.owner, os.urandom(8).hex())
        if queue.durable and queue.owner is None:
            spec = {"auto_delete": queue.auto_delete, "arguments": queue.arguments,
                    "incarnation": queue.incarnation}
            await asyncio.to_thread(self._metadata.put_topology, vhost, "queue", name,
                                    _json(spec))
        host.queues[name] = queue
        return queue

    async def delete_queue(self, vhost: str, name: str) -> str:
        """Delete a queue and its bindings (in time linear in its own bindings); the named
        queue that held its entries."""
        host = self.get(vhost)
        named = host.named(name)
        del host.queues[name]
        gone = host.graph.queue_deleted(name)
        self._unmirror(vhost, host, gone, {name: named})
        await asyncio.to_thread(self._metadata.delete_topology, vhost, "queue", name)
        await self._forget_bindings(vhost, gone)
        return named

    # --- bindings ------------------------------------------------------------------------

    async def bind(self, vhost: str, source: str, destination: Destination, routing_key: str,
                   arguments: Mapping[str, Any] | None = None) -> None:
        """Bind; stored when the source exchange and the destination are both durable.
        PreconditionFailed beyond the binding limits (``core.exchanges.BindingLimits``)."""
        host = self.get(vhost)
        args = dict(arguments or {})
        added = host.graph.bind(source, destination, routing_key, args)
        if added and self._mirror is not None and source == TOPIC_EXCHANGE \
                and not destination.is_exchange:
            self._mirror.bound(vhost, destination.name, host.named(destination.name),
                               routing_key)
        if added and self._durable(host, source, destination):
            binding = Binding(source, destination, routing_key, frozen_arguments(args))
            await asyncio.to_thread(self._metadata.put_topology, vhost, "binding",
                                    _binding_key(binding), _json(_binding_spec(binding, args)))

    async def unbind(self, vhost: str, source: str, destination: Destination, routing_key: str,
                     arguments: Mapping[str, Any] | None = None) -> None:
        """Remove a binding (from metadata too)."""
        host = self.get(vhost)
        gone = host.graph.unbind(source, destination, routing_key, dict(arguments or {}))
        self._unmirror(vhost, host, gone)
        await self._forget_bindings(vhost, gone)

    def delay_of(self, vhost: str, exchange: str, headers: Mapping[str, Any] | None) -> int:
        """Milliseconds a publish to ``exchange`` waits: its ``x-delay`` header when the
        exchange is an ``x-delayed-message`` one and the header a positive integer, else 0."""
        if not headers or DELAY_HEADER not in headers:
            return 0
        host = self.get(vhost)
        if exchange not in host.graph or not host.graph.get(exchange).delayed:
            return 0
        delay = headers[DELAY_HEADER]
        if isinstance(delay, bool) or not isinstance(delay, (int, float, str)):
            return 0
        try:
            return max(0, int(delay))
        except ValueError:
            return 0

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: Mapping[str, Any] | None = None, priority: int | None = None) -> list[str]:
        """The named queues a client's publish reaches (``ExchangeGraph.route``); in a
        priority queue, the level of ``priority`` (``core.queue_features``)."""
        host = self.get(vhost)
        queues = host.graph.route(exchange, routing_key, headers)
        return [target(host.named(queue), host.queues[queue].arguments, priority)
                for queue in sorted(queues)]

    def _unmirror(self, vhost: str, host: VirtualHost, gone: list[Binding],
                  deleted: Mapping[str, str] | None = None) -> None:
        """Tell the mirror of the ``amq.topic`` queue bindings in ``gone`` that left no other
        binding with their key to their queue (``deleted``: the named queue of a queue just
        deleted)."""
        if self._mirror is None:
            return
        topic = host.graph.get(TOPIC_EXCHANGE)
        told: set[tuple[str, str]] = set()
        for binding in gone:
            destination, key = binding.destination, binding.routing_key
            if binding.source != TOPIC_EXCHANGE or destination.is_exchange \
                    or (destination.name, key) in told or topic.leads(destination, key):
                continue
            told.add((destination.name, key))  # told once, whatever its bindings' arguments
            named = (deleted or {}).get(destination.name) or host.named(destination.name)
            self._mirror.unbound(vhost, destination.name, named, key)

    def _durable(self, host: VirtualHost, source: str, destination: Destination) -> bool:
        if not host.graph.get(source).durable:
            return False
        if destination.is_exchange:
            return host.graph.get(destination.name).durable
        queue = host.queues[destination.name]
        return queue.durable and queue.owner is None

    async def _forget_bindings(self, vhost: str, gone: list[Binding]) -> None:
        """Delete the rows of bindings that went, in one transaction."""
        if gone:
            await asyncio.to_thread(self._metadata.delete_topology_rows, vhost, "binding",
                                    [_binding_key(binding) for binding in gone])


def _topic_pairs(host: VirtualHost) -> set[tuple[str, str]]:
    """(queue, routing key) of every queue binding of ``amq.topic`` in ``host``."""
    return {(b.destination.name, b.routing_key) for b in host.graph.get(TOPIC_EXCHANGE).bindings
            if not b.destination.is_exchange}


def _server_name() -> str:
    """A queue name like RabbitMQ's ``amq.gen-...``."""
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _binding_key(binding: Binding) -> str:
    """A stable row name for a binding: its ends, key and arguments."""
    arguments = json.dumps(binding.arguments, sort_keys=True, default=str)
    return json.dumps([binding.source, binding.destination.name, binding.destination.is_exchange,
                       binding.routing_key, arguments])


def _binding_spec(binding: Binding, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"source": binding.source, "destination": binding.destination.name,
            "to_exchange": binding.destination.is_exchange, "routing_key": binding.routing_key,
            "arguments": arguments}


def _json(spec: Mapping[str, Any]) -> str:
    """Settings as JSON; InvalidArgument for values JSON cannot keep (the adapter turns AMQP
    field-table values into JSON-safe ones first)."""
    try:
        return json.dumps(spec, sort_keys=True)
    except TypeError as error:
        raise InvalidArgument(f"arguments cannot be stored: {error}") from None

