"""The consumer registry: exclusive use, single active consumer with takeover, and consumer
priorities (a lower one takes only while every higher one is full)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.errors import AccessDenied, PreconditionFailed
from protocols.amqp.consumers import Consumers, consumer_priority


@dataclass(eq=False)
class Member:
    priority: int = 0
    single_active: bool = False
    exclusive: bool = False
    room: bool = True
    queue: str = "q"
    queue_name: str = "q"
    vhost: str = "/"
    dispatched: int = 0
    cancelled: bool = False

    def has_room(self) -> bool:
        return self.room

    def dispatch(self) -> None:
        self.dispatched += 1

    def cancel_from_server(self) -> None:
        self.cancelled = True


def test_a_single_active_consumer_is_handed_over_in_order():
    registry = Consumers()
    first, second, third = (Member(single_active=True) for _ in range(3))
    for member in (first, second, third):
        registry.add(member)
    assert [registry.may_take(m) for m in (first, second, third)] == [True, False, False]
    registry.remove(first)
    assert registry.may_take(second) and not registry.may_take(third)
    assert second.dispatched == 1, "the new active consumer is started"


def test_lower_priorities_take_only_while_higher_ones_are_full():
    registry = Consumers()
    low, high = Member(priority=0), Member(priority=5)
    registry.add(low)
    registry.add(high)
    assert registry.may_take(high) and not registry.may_take(low)
    high.room = False
    registry.filled(high)
    assert registry.may_take(low) and low.dispatched == 1


def test_exclusive_use_and_deleted_queues():
    registry = Consumers()
    registry.add(Member(exclusive=True))
    with pytest.raises(AccessDenied):
        registry.add(Member())
    other = Member(queue="r")
    registry.add(other)
    registry.queue_deleted("r")
    assert other.cancelled and registry.count("r") == 0


def test_a_queue_with_a_single_active_consumer_takes_no_exclusive_one():
    """As RabbitMQ: refused even as the queue's first consumer (403, "in exclusive use")."""
    registry = Consumers()
    with pytest.raises(AccessDenied, match="in exclusive use"):
        registry.add(Member(single_active=True, exclusive=True))
    assert registry.count("q") == 0
    registry.add(Member(single_active=True))
    assert registry.count("q") == 1


def test_consumer_priority_must_be_an_integer():
    assert consumer_priority(None) == 0 and consumer_priority({"x-priority": -3}) == -3
    with pytest.raises(PreconditionFailed):
        consumer_priority({"x-priority": "high"})
