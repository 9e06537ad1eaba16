"""The AMQP front end: one adapter per accepted wire, one timer for them all, and AMQP's
source for core's client directory (``sluice client list|show|kick``).

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterator
from functools import partial
from typing import Any

from core.clients import ClientView
from core.errors import NotFound
from core.model import Principal
from core.named_queues import NamedQueues
from core.service import Broker
from core.traffic import ClientCounters, Traffic
from core.untrusted import DenialLog
from core.vhost_permissions import Right, VhostPermissions
from core.vhosts import QueueSettings, VirtualHosts

from .access import QUEUE
from .adapter import PROTOCOL, AmqpAdapter, Wire
from .alarms import Alarms
from .consumers import Consumers
from .dead_letters import DeadLetters
from .direct_reply import DirectReplies
from .options import AmqpOptions
from .queue_limits import QueueLimits
from .reason_codes import ReplyCode
from .topic_bindings import SubjectBindings, check_binding

log = logging.getLogger(__name__)

SWEEP_S = 1.0
"""How often every connection's timeouts and heartbeats are checked."""
KICK_TEXT = "closed by an administrator"
SHUTDOWN_TEXT = "broker forced connection closure with reason 'shutdown'"
VHOST_DELETED_TEXT = "vhost deleted"
PERMISSION_REVOKED_TEXT = "the user's permission on the vhost was cleared"


class AmqpFrontend:
    """Everything AMQP the broker starts, feeds wires to and stops."""

    protocol = PROTOCOL

    def __init__(self, broker: Broker, vhosts: VirtualHosts, queues: NamedQueues,
                 options: AmqpOptions, permissions: VhostPermissions | None = None) -> None:
        """``permissions``: who may open and use which virtual host; without them only
        administrators may open one."""
        self.broker = broker
        self.vhosts = vhosts
        self.permissions = permissions or VhostPermissions(None)
        self.permissions.add_listener(self._permission_changed)
        self.consumers = Consumers(self._unused)
        self.replies = DirectReplies()
        self.traffic = Traffic()
        """What this protocol's clients did since start, for the metrics page."""
        self._named = queues
        self.queues = QueueLimits(queues, vhosts, DeadLetters(broker, vhosts),
                                  self.consumers.count, self.spawn, self.deleted)
        """Core's named queues with each AMQP queue's TTL, limits and dead-lettering."""
        self.options = options
        self.connection_options = options.connection_options(broker.config.max_message_bytes)
        """What each connection is built with: a body core would refuse is refused at its
        content header (406, as RabbitMQ refuses one above its max_message_size)."""
        self.denials = DenialLog(log)
        self.alarms = Alarms()
        self.max_connections = options.connection_limit()
        self._adapters: set[AmqpAdapter] = set()
        self._open: dict[str, AmqpAdapter] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweep: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind the subject filters of the queues bound to ``amq.topic`` (before anything can
        publish), take up the queues' limits, watch the store and memory for the resource
        alarms and start the timer that checks every connection."""
        self.vhosts.mirror_topic_bindings(SubjectBindings(self._named))
        for vhost in self.vhosts.names():
            for settings in list(self.vhosts.get(vhost).queues.values()):
                self.queues.register(vhost, settings, loaded=True)
        self.alarms.store_health(self.broker.watch_store(self.alarms.store_health))
        self.alarms.memory(self.broker.watch_memory(self.alarms.memory))
        self._sweep = asyncio.get_running_loop().create_task(self._sweeping())

    async def stop(self) -> None:
        """Close every connection (320) and stop the timer; wait for what they started."""
        if self._sweep is not None:
            self._sweep.cancel()
        for adapter in list(self._adapters):
            adapter.kick(ReplyCode.CONNECTION_FORCED, SHUTDOWN_TEXT)
        await asyncio.sleep(0)  # let the closes be written before the wires go
        for adapter in list(self._adapters):
            adapter.refuse_at_once()
        await self.settled(timeout=5)
        self.denials.flush()

    async def settled(self, timeout: float | None = None) -> None:
        """Wait for the tasks started so far (logins, methods, exclusive-queue deletes)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    def new_connection(self, wire: Wire) -> AmqpAdapter:
        """The adapter for a newly accepted wire; closed at once beyond ``max_connections``."""
        adapter = AmqpAdapter(self, wire)
        if len(self._adapters) >= self.max_connections:
            self.denials.denied(wire.peer.rpartition(":")[0], "admission",
                                "AMQP connection from %s closed at once: %d connections are "
                                "open (max_connections %d)", wire.peer, len(self._adapters),
                                self.max_connections)
            adapter.refuse_at_once()
        else:
            self._adapters.add(adapter)
        return adapter

    # ---------------------------------------------------------------- adapter.Host

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` as a task kept until it ends."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def opened(self, adapter: AmqpAdapter) -> None:
        self._open[adapter.id] = adapter
        self.alarms.add(adapter)

    def closed(self, adapter: AmqpAdapter) -> None:
        self._adapters.discard(adapter)
        self._open.pop(adapter.id, None)
        self.alarms.remove(adapter)

    # ---------------------------------------------------------------- topology.QueueWatch

    def counts(self, queues: tuple[str, ...]) -> tuple[int, int]:
        return sum(self.queues.ready(queue) for queue in queues), self.consumers.count(queues[-1])

    def declared(self, vhost: str, queue: QueueSettings) -> None:
        self.queues.register(vhost, queue)

    def deleted(self, queue: str) -> None:
        self.consumers.queue_deleted(queue)
        self.queues.forget(queue)

    def check_binding(self, principal: Principal, vhost: str, source: str,
                      routing_key: str) -> None:
        check_binding(self.broker, principal, vhost, source, routing_key)

    def _unused(self, vhost: str, name: str) -> None:
        """A queue lost its last consumer: an auto-delete one is deleted (as RabbitMQ does),
        an x-expires one starts counting its idle time."""
        try:
            host = self.vhosts.get(vhost)
        except NotFound:
            return  # its virtual host is gone, and the queue with it
        settings = host.queues.get(name)
        if settings is not None:
            self.queues.used(host.named(name))
        if settings is not None and settings.auto_delete:
            self.spawn(self._auto_delete(vhost, name))

    async def _auto_delete(self, vhost: str, name: str) -> None:
        try:
            if self.consumers.count(self.vhosts.get(vhost).named(name)):
                return  # consumed again before this ran
            self.deleted(await self.vhosts.delete_queue(vhost, name))
        except NotFound:
            pass  # deleted meanwhile (queue.delete, its exclusive connection closing)

    def purge(self, queues: tuple[str, ...]) -> int:
        return sum(self.queues.purge(queue) for queue in queues)

    def _permission_changed(self, user: str, vhost: str) -> None:
        """``user``'s permission on ``vhost`` changed: its connections there lose what it no
        longer allows, at once (RabbitMQ only checks later operations): without a permission
        they are closed (320), and consumers of queues it may no longer read are cancelled."""
        for adapter in list(self._open.values()):
            principal, topology, messages = adapter.principal, adapter.topology, adapter.messages
            if (principal is None or topology is None or messages is None
                    or principal.user != user or topology.vhost != vhost):
                continue
            if not self.permissions.may_open(principal, vhost):
                adapter.kick(ReplyCode.CONNECTION_FORCED, PERMISSION_REVOKED_TEXT)
            else:
                messages.cancel_unreadable(partial(topology.access.allows, Right.READ, QUEUE))

    # ---------------------------------------------------------------- core.vhost_admin.LiveVhosts

    def consumer_count(self, queue: str) -> int:
        return self.consumers.count(queue)

    def close_vhost(self, vhost: str) -> int:
        """Close every connection to ``vhost`` with 320, as RabbitMQ does when it is deleted."""
        closing = [a for a in self._open.values() if a.topology and a.topology.vhost == vhost]
        for adapter in closing:
            adapter.kick(ReplyCode.CONNECTION_FORCED, VHOST_DELETED_TEXT)
        return len(closing)

    def connections(self) -> list[dict[str, Any]]:
        return [{"id": a.id, "user": a.principal.user if a.principal else "", "peer": a.peer,
                 "connected_at_ms": a.connected_at_ms, **a.details()}
                for a in sorted(self._open.values(), key=lambda a: a.id)]

    def channels(self) -> list[dict[str, Any]]:
        rows = []
        for adapter in sorted(self._open.values(), key=lambda a: a.id):
            if adapter.messages is None or adapter.topology is None:
                continue
            for number in adapter.conn.channel_numbers:
                rows.append({"connection": adapter.id, "number": number,
                             "user": adapter.principal.user if adapter.principal else "",
                             "vhost": adapter.topology.vhost, "peer": adapter.peer,
                             **adapter.messages.channel_details(number)})
        return rows

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for adapter in list(self._adapters):
                try:
                    adapter.check_timeouts(now)
                except Exception:  # noqa: BLE001 - one connection's bug must not stop the timer
                    log.exception("AMQP timeout check of %s failed", adapter.peer)
                    adapter.refuse_at_once()
                    self.closed(adapter)

    # ---------------------------------------------------------------- core.clients.ClientSource

    def connected_count(self) -> int:
        return len(self._open)

    def clients(self) -> Iterator[ClientView]:
        """Every open connection (AMQP keeps nothing of a client once it is gone)."""
        for adapter in list(self._open.values()):
            user = adapter.principal.user if adapter.principal is not None else ""
            messages = adapter.messages
            consumed = messages.consumed() if messages is not None else ()
            details = adapter.details() | {"inflight": messages.unacked() if messages else 0}
            yield ClientView(PROTOCOL, adapter.id, user, adapter.peer, True,
                             adapter.connected_at_ms, consumed, details, adapter.counters)

    def counters(self) -> Iterator[ClientCounters]:
        """The counters of every open connection."""
        return (adapter.counters for adapter in self._open.values())

    def kick(self, client_id: str) -> bool:
        """Close ``client_id``'s connection with 320 CONNECTION_FORCED."""
        adapter = self._open.get(client_id)
        return adapter is not None and adapter.kick(ReplyCode.CONNECTION_FORCED, KICK_TEXT)
