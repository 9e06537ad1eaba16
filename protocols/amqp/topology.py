"""The channel methods of this step mapped onto core's virtual hosts: exchange and queue
declare/delete, exchange-to-exchange and queue bindings, and basic.qos.

Each handler returns the method that answers (None under ``nowait``) or raises a core error,
which the adapter turns into a reply code (``errors.reply_code``). Declaring, deleting and
binding need an admin user for now; passive declares only a login. Runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from pamqp.base import Frame
from pamqp.commands import Exchange, Queue

from core.errors import AccessDenied, NotFound, PreconditionFailed, ResourceLocked
from core.exchanges import Destination
from core.model import Principal
from core.untrusted import clip
from core.queue_features import features, levels
from core.vhosts import QueueSettings, VirtualHosts

from . import queue_arguments
from .arguments import json_safe_table

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

    def check_binding(self, principal: Principal, source: str, routing_key: str) -> None:
        """AccessDenied unless ``principal`` may read what binding to ``source`` with
        ``routing_key`` would let it read from other protocols (``amq.topic``)."""


class Topology:
    """One connection's view of its virtual host: what it declared and may change."""

    def __init__(self, vhosts: VirtualHosts, vhost: str, principal: Principal,
                 connection_id: str, watch: QueueWatch) -> None:
        self.vhosts = vhosts
        self.watch = watch
        self.vhost = vhost
        self.principal = principal
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

    def _may_change(self, what: str) -> None:
        if not self.principal.admin:
            raise AccessDenied(f"user {clip(self.principal.user)} may not {what} (only "
                               "administrators may change AMQP topology for now)")

    def queue_name(self, channel: int, name: str) -> str:
        """An empty queue name means the channel's last declared queue (spec 1.7.2)."""
        return name or self._last_queue.get(channel, "")

    def _counts(self, name: str) -> tuple[int, int]:
        """(messages ready, consumers) of queue ``name``; nothing for a queue not there."""
        host = self.vhosts.get(self.vhost)
        queue = host.queues.get(name)
        if queue is None:
            return 0, 0
        return self.watch.counts(levels(host.named(name), features(queue.arguments).max_priority))

    def check_owner(self, name: str) -> None:
        queue = self.vhosts.get(self.vhost).queues.get(name)
        if queue is not None and queue.owner not in (None, self.connection_id):
            raise ResourceLocked(f"queue {clip(name)} is exclusive to another connection")

    # ---------------------------------------------------------------- exchanges

    async def _exchange_declare(self, channel: int, m: Exchange.Declare) -> Frame | None:
        if not m.passive:
            self._may_change(f"declare exchange {clip(m.exchange)}")
        await self.vhosts.declare_exchange(
            self.vhost, m.exchange, m.exchange_type, durable=m.durable,
            auto_delete=m.auto_delete, internal=m.internal,
            arguments=json_safe_table(m.arguments), passive=m.passive)
        return None if m.nowait else Exchange.DeclareOk()

    async def _exchange_delete(self, channel: int, m: Exchange.Delete) -> Frame | None:
        self._may_change(f"delete exchange {clip(m.exchange)}")
        await self.vhosts.delete_exchange(self.vhost, m.exchange, if_unused=m.if_unused)
        return None if m.nowait else Exchange.DeleteOk()

    async def _exchange_bind(self, channel: int, m: Exchange.Bind) -> Frame | None:
        self._may_change(f"bind exchange {clip(m.destination)}")
        self.watch.check_binding(self.principal, m.source, m.routing_key)
        await self.vhosts.bind(self.vhost, m.source, Destination(m.destination, True),
                               m.routing_key, json_safe_table(m.arguments))
        return None if m.nowait else Exchange.BindOk()

    async def _exchange_unbind(self, channel: int, m: Exchange.Unbind) -> Frame | None:
        self._may_change(f"unbind exchange {clip(m.destination)}")
        await self.vhosts.unbind(self.vhost, m.source, Destination(m.destination, True),
                                 m.routing_key, json_safe_table(m.arguments))
        return None if m.nowait else Exchange.UnbindOk()

    # ---------------------------------------------------------------- queues

    async def _queue_declare(self, channel: int, m: Queue.Declare) -> Frame | None:
        if not m.passive:
            self._may_change(f"declare queue {clip(m.queue)}")
        owner = self.connection_id if m.exclusive else None
        if not m.passive:
            queue_arguments.check(m.arguments, m.queue, self.vhost, durable=m.durable,
                                  exclusive=m.exclusive, auto_delete=m.auto_delete)
        settings = QueueSettings(m.queue, m.durable, m.auto_delete,
                                 json_safe_table(m.arguments), owner)
        queue = await self.vhosts.declare_queue(self.vhost, settings, passive=m.passive,
                                                connection=self.connection_id)
        if queue.owner == self.connection_id:
            self.exclusive.add(queue.name)
        self._last_queue[channel] = queue.name
        if not m.passive:  # a passive declare only looks: it is no use for x-expires
            self.watch.declared(self.vhost, queue)
        ready, consumers = self._counts(queue.name)
        return None if m.nowait else Queue.DeclareOk(queue.name, ready, consumers)

    async def _queue_delete(self, channel: int, m: Queue.Delete) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self._may_change(f"delete queue {clip(name)}")
        self.check_owner(name)
        ready, consumers = self._counts(name)
        if m.if_unused and consumers:
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(self.vhost)} in use")
        if m.if_empty and ready:
            raise PreconditionFailed(f"queue {clip(name)} in vhost {clip(self.vhost)} is not "
                                     "empty")
        try:
            self.watch.deleted(await self.vhosts.delete_queue(self.vhost, name))
        except NotFound:
            pass  # RabbitMQ answers delete-ok for a queue that is not there
        self.exclusive.discard(name)
        return None if m.nowait else Queue.DeleteOk(ready)

    async def _queue_bind(self, channel: int, m: Queue.Bind) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self._may_change(f"bind queue {clip(name)}")
        self.check_owner(name)
        self.watch.check_binding(self.principal, m.exchange, m.routing_key)
        await self.vhosts.bind(self.vhost, m.exchange, Destination(name), m.routing_key,
                               json_safe_table(m.arguments))
        return None if m.nowait else Queue.BindOk()

    async def _queue_unbind(self, channel: int, m: Queue.Unbind) -> Frame | None:
        name = self.queue_name(channel, m.queue)
        self._may_change(f"unbind queue {clip(name)}")
        self.check_owner(name)
        await self.vhosts.unbind(self.vhost, m.exchange, Destination(name), m.routing_key,
                                 json_safe_table(m.arguments))
        return Queue.UnbindOk()

    async def delete_exclusive(self) -> None:
        """Delete this connection's exclusive queues (it has closed)."""
        for name in sorted(self.exclusive):
            try:
                self.watch.deleted(await self.vhosts.delete_queue(self.vhost, name))
            except NotFound:
                pass
        self.exclusive.clear()


_HANDLERS: dict[type, Handler] = {
    Exchange.Declare: Topology._exchange_declare,
    Exchange.Delete: Topology._exchange_delete,
    Exchange.Bind: Topology._exchange_bind,
    Exchange.Unbind: Topology._exchange_unbind,
    Queue.Declare: Topology._queue_declare,
    Queue.Delete: Topology._queue_delete,
    Queue.Bind: Topology._queue_bind,
    Queue.Unbind: Topology._queue_unbind,
}
