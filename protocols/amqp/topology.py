"""The channel methods of this step mapped onto core's virtual hosts: exchange and queue
declare/delete/purge, exchange-to-exchange and queue bindings.

Each handler returns the method that answers (None under ``nowait``) or raises a core error,
which the adapter turns into a reply code (``errors.reply_code``). Rights are RabbitMQ's
(``access.VhostAccess``): configure to declare or delete, write on the destination and read on
the source to bind, read to purge; passive declares need only the virtual host. As in RabbitMQ,
no method may name the default exchange ("") but a publish (403), and the ``amq.*`` exchanges
cannot be deleted (403). Runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pamqp.base import Frame
from pamqp.commands import Exchange, Queue

from core.errors import AccessDenied, NotFound, PreconditionFailed, ResourceLocked
from core.exchanges import DEFAULT_EXCHANGE, Destination
from core.model import Principal
from core.untrusted import clip
from core.queue_features import features, levels
from core.vhost_permissions import Right
from core.vhosts import QueueSettings, VirtualHosts, locked_text

from . import queue_arguments
from .access import EXCHANGE, QUEUE, VhostAccess
from .arguments import json_safe_table
from .frames import DeclareOk

Handler = Callable[[Any, int, Any], Awaitable[Frame | None]]


class QueueWatch(Protocol):
    """What the front end knows of a queue's messages and consumers."""

    def counts(self, queues: tuple[str, ...]) -> tuple[int, int]:
        """(messages ready, consumers) of the queue whose named queues (``levels``, its own
        last) are ``queues``."""

    def declared(self, vhost: str, queue: QueueSettings) -> None:
        """Queue ``queue`` of ``vhost`` was declared or redeclared."""

    def deleted(self, queue: str) -> None:
        """The named queue ``queue`` is gone: cancel its consumers, forget its state."""

    def check_binding(self, principal: Principal, vhost: str, source: str,
                      routing_key: str) -> None:
        """AccessDenied unless ``principal`` may read what binding to ``source`` of ``vhost`` with
        ``routing_key`` would let it read from other protocols (``amq.topic``)."""

    def purge(self, queues: tuple[str, ...]) -> int:
        """Settle every ready message of the named queues ``queues`` (a queue's levels); how
        many."""


class Topology:
    """One connection's view of its virtual host: what it declared and may change."""

    def __init__(self, vhosts: VirtualHosts, vhost: str, principal: Principal,
                 connection_id: str, watch: QueueWatch, access: VhostAccess) -> None:
        self.vhosts = vhosts
        self.watch = watch
        self.vhost = vhost
        self.principal = principal
        self.access = access
        """The user's rights on this virtual host."""
        self.connection_id = connection_id
        """Owner of the exclusive queues this connection declares."""
        self.exclusive: set[str] = set()
        """Exclusive queues of this connection, deleted when it closes."""
        self._last_queue: dict[int, str] = {}

    def handles(self, method: Frame) -> bool:
        """Whether ``method`` is one this step answers."""
        return type(method) in _HANDLERS

    async def answer(self, channel: int, method: Frame) -> Frame | None:
        """Carry out ``method`` on ``channel``; its answer, or None under ``nowait``."""
        return await _HANDLERS[type(method)](self, channel, method)

    def channel_closed(self, channel: int) -> None:
        """Forget what ``channel`` held."""
        self._last_queue.pop(channel, None)

    def queue_name(self, channel: int, name: str) -> str:
        """An empty queue name means the channel's last declared queue (spec 1.7.2)."""
        return name or self._last_queue.get(channel, "")

    def _counts(self, name: str) -> tuple[int, int]:
        """(messages ready, consumers) of queue ``name``; nothing for a queue not there."""
        if name not in self.vhosts.get(self.vhost).queues:
            return 0, 0
        return self.watch.counts(self._levels(name))

    def _levels(self, name: str) -> tuple[str, ...]:
        """The named queues of queue ``name`` (one per priority level, its own last);
        NotFound if there is none."""
        host = self.vhosts.get(self.vhost)
        return levels(host.named(name), features(host.queue(name).arguments).max_priority)

    def check_owner(self, name: str) -> None:
        queue = self.vhosts.get(self.vhost).queues.get(name)
        if queue is not None and queue.owner not in (None, self.connection_id):
            raise ResourceLocked(locked_text(name, self.vhost))

    # ---------------------------------------------------------------- exchanges

    async def _exchange_declare(self, channel: int, m: Exchange.Declare) -> Frame | None:
        _not_default(m.exchange)
        if not m.passive:
            self.access.check(Right.CONFIGURE, EXCHANGE, m.exchange)
        await self.vhosts.declare_exchange(
            self.vhost, m.exchange, m.exchange_type, durable=m.durable,
            auto_delete=m.auto_delete, internal=m.internal,
            arguments=json_safe_table(m.arguments), passive=m.passive)
        return None if m.nowait else Exchange.DeclareOk()

    async def _exchange_delete(self, channel: int, m: Exchange.Delete) -> Frame | None:
        _not_default(m.exchange)
        if m.exchange.startswith("amq."):  # whether it exists or not, as RabbitMQ
            raise AccessDenied(f"deletion of system exchange {clip(m.exchange)} in vhost "
                               f"{clip(self.vhost)} not allowed")
        self.access.check(Right.CONFIGURE, EXCHANGE, m.exchange)
        await self.vhosts.delete_exchange(self.vhost, m.exchange, if_unused=m.if_unused)
        return None if m.nowait else Exchange.DeleteOk()

    async def _exchange_bind(self, channel: int, m: Exchange.Bind) -> Frame | None:
        self._check_bind(m.source, m.destination, EXCHANGE)
        self.watch.check_binding(self.principal, self.vhost, m.source, m.routing_key)
        await self.vhosts.bind(self.vhost, m.source, Destination(m.destination, True),
                               m.routing_key, json_safe_table(m.arguments))
        return None if m.nowait else Exchange.BindOk()

    async def _exchange_unbind(self, channel: int, m: Exchange.Unbind) -> Frame | None:
        self._check_bind(m.source, m.destination, EXCHANGE)
        await self.vhosts.unbind(self.vhost, m.source, Destination(m.destination, True),
                                 m.routing_key, json_safe_table(m.arguments))
        return None if m.nowait else Exchange.UnbindOk()

    # ---------------------------------------------------------------- queues

    async def _queue_declare(self, channel: int, m: Queue.Declare) -> Frame | None:
        arguments = json_safe_table(m.arguments)
        if not m.passive and m.queue:
            self._check_declare(m.queue, arguments)
        owner = self.connection_id if m.exclusive else None
        if not m.passive:
            queue_arguments.check(m.arguments, m.queue, self.vhost, durable=m.durable,
                                  exclusive=m.exclusive, auto_delete=m.auto_delete)
            existing = self.vhosts.get(self.vhost).queues.get(m.queue)
            if existing is not None:
                queue_arguments.check_equivalent(existing.arguments, arguments, m.queue,
                                                 self.vhost)
        settings = QueueSettings(m.queue, m.durable, m.auto_delete, arguments, owner)
        queue = await self.vhosts.declare_queue(self.vhost, settings, passive=m.passive,
                                                connection=self.connection_id)
        if not m.passive and not m.queue:  # RabbitMQ checks the name it generated
            try:
                self._check_declare(queue.name, arguments)
            except Exception:
                self.watch.deleted(await self.vhosts.delete_queue(self.vhost, queue.name))
                raise
        if queue.owner == self.connection_id:
            self.exclusive.add(queue.name)
        self._last_queue[channel] = queue.name
        if not m.passive:  # a passive declare only looks: it is no use for x-expires
            self.watch.declared(self.vhost, queue)
        ready, consumers = self._counts(queue.name)
        return None if m.nowait else DeclareOk(queue.name, ready, consumers)

    async def _queue_delete(self, channel: int, m: Queue.Delete) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self.access.check(Right.CONFIGURE, QUEUE, name)
        self.check_owner(name)
        ready, consumers = self._counts(name)
        if m.if_unused and consumers:
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(self.vhost)} in use")
        if m.if_empty and ready:
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(self.vhost)} not empty")
        try:
            self.watch.deleted(await self.vhosts.delete_queue(self.vhost, name))
        except NotFound:
            pass  # RabbitMQ answers delete-ok for a queue that is not there
        self.exclusive.discard(name)
        return None if m.nowait else Queue.DeleteOk(ready)

    async def _queue_bind(self, channel: int, m: Queue.Bind) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self._check_bind(m.exchange, name, QUEUE)
        self.check_owner(name)
        self.watch.check_binding(self.principal, self.vhost, m.exchange, m.routing_key)
        await self.vhosts.bind(self.vhost, m.exchange, Destination(name), m.routing_key,
                               json_safe_table(m.arguments))
        return None if m.nowait else Queue.BindOk()

    async def _queue_unbind(self, channel: int, m: Queue.Unbind) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self._check_bind(m.exchange, name, QUEUE)
        self.check_owner(name)
        await self.vhosts.unbind(self.vhost, m.exchange, Destination(name), m.routing_key,
                                 json_safe_table(m.arguments))
        return Queue.UnbindOk()

    async def _queue_purge(self, channel: int, m: Queue.Purge) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self.access.check(Right.READ, QUEUE, name)
        self.vhosts.get(self.vhost).queue(name)
        self.check_owner(name)
        count = self.watch.purge(self._levels(name))
        return None if m.nowait else Queue.PurgeOk(count)

    def _check_bind(self, source: str, destination: str, kind: str) -> None:
        """RabbitMQ's rule for (un)binding: write on the destination, read on the source; the
        default exchange is neither (checked in RabbitMQ's order)."""
        self.access.check(Right.WRITE, kind, destination)
        if kind == EXCHANGE:
            _not_default(destination)
        _not_default(source)
        self.access.check(Right.READ, EXCHANGE, source)

    def _check_declare(self, name: str, arguments: dict[str, Any]) -> None:
        """Configure on the queue; a dead-letter exchange needs read on the queue and write on
        that exchange too (RabbitMQ's ``check_dlx``)."""
        self.access.check(Right.CONFIGURE, QUEUE, name)
        dead_letter = arguments.get("x-dead-letter-exchange")
        if isinstance(dead_letter, str):
            self.access.check(Right.READ, QUEUE, name)
            self.access.check(Right.WRITE, EXCHANGE, dead_letter)

    async def delete_exclusive(self) -> None:
        """Delete this connection's exclusive queues (it has closed)."""
        for name in sorted(self.exclusive):
            try:
                self.watch.deleted(await self.vhosts.delete_queue(self.vhost, name))
            except NotFound:
                pass
        self.exclusive.clear()


def _not_default(exchange: str) -> None:
    """AccessDenied (403) for the default exchange, in RabbitMQ's words."""
    if exchange == DEFAULT_EXCHANGE:
        raise AccessDenied("operation not permitted on the default exchange")


_HANDLERS: dict[type, Handler] = {
    Exchange.Declare: Topology._exchange_declare,
    Exchange.Delete: Topology._exchange_delete,
    Exchange.Bind: Topology._exchange_bind,
    Exchange.Unbind: Topology._exchange_unbind,
    Queue.Declare: Topology._queue_declare,
    Queue.Delete: Topology._queue_delete,
    Queue.Bind: Topology._queue_bind,
    Queue.Unbind: Topology._queue_unbind,
    Queue.Purge: Topology._queue_purge,
}
