"""Every AMQP consumer of every connection, by queue, and who of them may take messages now.

- exclusive consumers (basic.consume exclusive=true) keep a queue to themselves (403 else);
  a queue with a single active consumer takes none (403, as RabbitMQ);
- in a queue declared with ``x-single-active-consumer``, only the active consumer takes
  messages; when it goes, the first of the rest (highest ``x-priority``, then the earliest
  registered) takes over;
- otherwise a consumer takes messages only while no consumer of higher ``x-priority`` has room
  for them (prefetch, channel.flow, the wire), as RabbitMQ's consumer priorities do.

Runs on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from core.errors import AccessDenied, PreconditionFailed
from core.queue_features import field_type
from core.untrusted import clip


def consumer_priority(arguments: Mapping[str, Any] | None) -> int:
    """basic.consume's ``x-priority`` (0 without); PreconditionFailed (406) if not an integer."""
    value = (arguments or {}).get("x-priority", 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PreconditionFailed(f"invalid arg 'x-priority': expected integer, got "
                                 f"{field_type(value)}")
    return value


class Member(Protocol):
    """What the registry needs of a consumer (``consumer.Consumer``)."""

    queue: str
    queue_name: str
    vhost: str
    exclusive: bool
    single_active: bool
    priority: int

    def has_room(self) -> bool:
        """Whether it could take a message now."""

    def dispatch(self) -> None:
        """Take what it may."""

    def cancel_from_server(self) -> None:
        """Its queue is gone."""


class Consumers:
    """Consumers of every connection, by named queue, highest priority first.

    ``unused(vhost, queue name)`` is called when a queue's last consumer is cancelled (not
    when the queue itself went): an auto-delete queue goes then."""

    def __init__(self, unused: Callable[[str, str], None] = lambda vhost, name: None) -> None:
        self._by_queue: dict[str, list[Member]] = {}
        self._unused = unused
        self._active: dict[str, Member] = {}
        """The single active consumer of each queue declared with x-single-active-consumer."""

    def add(self, consumer: Member) -> None:
        """Register ``consumer``; AccessDenied (403) if it or one there is exclusive, or if it
        is exclusive on a queue with a single active consumer."""
        present = self._by_queue.get(consumer.queue, [])
        if (consumer.exclusive and consumer.single_active) or (
                present and (consumer.exclusive or any(c.exclusive for c in present))):
            raise AccessDenied(f"queue {clip(consumer.queue_name)} in vhost "
                               f"{clip(consumer.vhost)} in exclusive use")
        present = self._by_queue.setdefault(consumer.queue, present)
        present.append(consumer)
        present.sort(key=lambda c: -c.priority)  # stable: the earliest first among equals
        if consumer.single_active:
            self._active.setdefault(consumer.queue, consumer)

    def remove(self, consumer: Member) -> None:
        """Forget ``consumer``; the others of its queue take what it left."""
        present = self._by_queue.get(consumer.queue, [])
        if consumer not in present:
            return
        present.remove(consumer)
        if not present:
            del self._by_queue[consumer.queue]
            self._active.pop(consumer.queue, None)
            self._unused(consumer.vhost, consumer.queue_name)
            return
        if self._active.get(consumer.queue) is consumer:
            self._active[consumer.queue] = present[0]
        for other in list(present):
            other.dispatch()

    def count(self, queue: str) -> int:
        """Consumers of the named queue ``queue``."""
        return len(self._by_queue.get(queue, ()))

    def may_take(self, consumer: Member) -> bool:
        """Whether ``consumer`` may take messages now (single active, consumer priority)."""
        if consumer.single_active:
            return self._active.get(consumer.queue) is consumer
        present = self._by_queue.get(consumer.queue, ())
        if not present or present[0].priority <= consumer.priority:
            return True
        return not any(other.priority > consumer.priority and other.has_room()
                       for other in present)

    def filled(self, consumer: Member) -> None:
        """``consumer`` has no room left: consumers of lower priority may take what waits."""
        present = self._by_queue.get(consumer.queue, ())
        if present and present[-1].priority < consumer.priority:
            for other in list(present):
                if other.priority < consumer.priority:
                    other.dispatch()

    def queue_deleted(self, queue: str) -> None:
        """Cancel every consumer of ``queue`` (basic.cancel to clients that understand it)."""
        self._active.pop(queue, None)
        for consumer in list(self._by_queue.pop(queue, ())):
            consumer.cancel_from_server()
