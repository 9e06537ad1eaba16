"""Message-level consumption of a virtual host's queue by a consumer outside the AMQP adapter
(a push subscription), competing with the queue's AMQP consumers for its messages.

A queue is read as its AMQP consumers read it: the named queue of its current declaration
(``VirtualHost.named``), every priority level highest first, each message handed to one
consumer and hidden until it is settled or released (``core.named_queues``). Reading needs the
read right of the reader's permission on the virtual host (``core.vhost_permissions``; an
administrator may read any queue); a message whose subject an access rule denies the reader is
dropped from the queue, as the AMQP adapter does. Exclusive queues (one connection's), queues
with a single active consumer and stream queues cannot be read this way.

Reads go through the AMQP adapter's queue policies once the composition root hands them over
(``use``): then an expired message or one past its quorum queue's delivery limit is
dead-lettered (or dropped) rather than read, and byte lengths are kept, as for AMQP consumers.
Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from .acl import Withheld
from .errors import AccessDenied, InvalidArgument, NotFound
from .model import Delivery, Principal
from .named_queues import NamedQueues
from .queue_features import features, levels
from .service import Broker
from .untrusted import clip
from .vhost_permissions import Right, VhostPermissions
from .vhosts import VirtualHosts


class QueueAccess(Protocol):
    """What the reader does to named queues: ``NamedQueues`` itself, or the AMQP adapter's
    view of them that applies each queue's policies on the way."""

    def pop_first(self, queues: tuple[str, ...], max_messages: int, invisible_ms: int, *,
                  mark: bool = False, withheld: Withheld | None = None) -> list[Delivery]: ...

    def watch(self, queue: str) -> asyncio.Future[None]: ...

    def signal_any(self, queues: tuple[str, ...]) -> asyncio.Future[None]: ...

    def settle(self, queue: str, offset: int) -> None: ...

    def take(self, queue: str, offset: int, invisible_ms: int) -> None: ...

    def release(self, queue: str, offset: int) -> None: ...

    def ready(self, queue: str) -> int: ...

    def unsettled(self, queue: str) -> int: ...


class VhostQueueReader:
    """Pop, settle, hide and release the messages of virtual hosts' queues."""

    def __init__(self, broker: Broker, vhosts: VirtualHosts, permissions: VhostPermissions,
                 queues: NamedQueues) -> None:
        self._broker = broker
        self._vhosts = vhosts
        self._permissions = permissions
        self._queues: QueueAccess = queues

    def use(self, queues: QueueAccess) -> None:
        """Read through ``queues`` from now on (the AMQP adapter's, with the queues' TTL,
        delivery limits, byte lengths and dead-lettering)."""
        self._queues = queues

    def check(self, principal: Principal, vhost: str, queue: str) -> None:
        """Nothing if ``principal`` may read ``queue`` of ``vhost`` this way; NotFound when
        either is missing, AccessDenied without the read right, InvalidArgument for a queue
        that is not shared message by message."""
        if not self.readable(principal, vhost, queue):  # before existence: names do not leak
            raise AccessDenied(f"user {clip(principal.user)} may not read queue {clip(queue)} "
                               f"in vhost {clip(vhost)}: its permission's read expression must "
                               "match the queue (an administrator sets it with `sluice vhost "
                               "permit USER VHOST --read REGEX`)")
        settings = self._vhosts.get(vhost).queue(queue)
        kind = features(settings.arguments)
        why = ("is exclusive to the connection that declared it" if settings.owner is not None
               else "has a single active consumer (x-single-active-consumer)" if kind.single_active
               else "is a stream, read by offset" if kind.stream else "")
        if why:
            raise InvalidArgument(f"queue {clip(queue)} in vhost {clip(vhost)} {why}; only a "
                                  "queue shared by its consumers message by message can be read")

    def readable(self, principal: Principal, vhost: str, queue: str) -> bool:
        """Whether ``principal`` has the read right on ``queue`` of ``vhost`` now."""
        return self._permissions.allows(principal, vhost, Right.READ, queue)

    def levels(self, vhost: str, queue: str) -> tuple[str, ...]:
        """The named queues of ``queue`` as declared now, highest priority first; NotFound."""
        host = self._vhosts.get(vhost)
        settings = host.queue(queue)
        return levels(host.named(queue), features(settings.arguments).max_priority)

    def pop(self, principal: Principal, vhost: str, queue: str, max_messages: int,
            invisible_ms: int) -> list[Delivery]:
        """Up to ``max_messages`` of the queue, each hidden for ``invisible_ms`` unless settled
        or released (``Delivery.topic`` and ``queue_offset`` say where it is); ``check``'s
        errors first."""
        self.check(principal, vhost, queue)
        return self._queues.pop_first(self.levels(vhost, queue), max_messages, invisible_ms,
                                      withheld=self._broker.withheld_by_rules(principal))

    async def wait(self, vhost: str, queue: str, timeout_ms: int) -> None:
        """Return once the queue gets messages to pop (or one is released), or after
        ``timeout_ms``; NotFound."""
        names = self.levels(vhost, queue)
        signal = self._queues.watch(names[0]) if len(names) == 1 else self._queues.signal_any(names)
        try:  # not wait_for: Python 3.11's swallows a cancellation coming as the signal does
            await asyncio.wait((signal,), timeout=timeout_ms / 1000)
        finally:
            signal.cancel()

    def settle(self, delivery: Delivery) -> None:
        """The popped ``delivery`` is done: it leaves the queue."""
        self._queues.settle(delivery.topic, delivery.queue_offset)

    def hide(self, delivery: Delivery, invisible_ms: int) -> None:
        """Keep the popped ``delivery`` from every consumer for ``invisible_ms`` from now."""
        self._queues.take(delivery.topic, delivery.queue_offset, invisible_ms)

    def release(self, delivery: Delivery) -> None:
        """Hand the popped ``delivery`` out again now (to whichever consumer pops first)."""
        self._queues.release(delivery.topic, delivery.queue_offset)

    def depth(self, vhost: str, queue: str) -> int:
        """Messages of the queue not yet settled (waiting, and popped but unsettled); NotFound."""
        return sum(self._queues.ready(name) + self._queues.unsettled(name)
                   for name in self.levels(vhost, queue))

    def exists(self, vhost: str, queue: str) -> bool:
        """Whether ``queue`` of ``vhost`` is declared now."""
        try:
            self._vhosts.get(vhost).queue(queue)
        except NotFound:
            return False
        return True
