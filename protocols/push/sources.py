"""Where a push subscription's messages come from, and how it settles them: a topic read
through the subscription's own consumer group (``TopicSource``), or an AMQP queue shared with
the queue's AMQP consumers (``QueueSource``). Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib

from core.errors import AlreadyExists, SluiceError
from core.model import MAX_ATTEMPTS, SYSTEM, Action, Delivery, GroupConfig, Principal, RetryPolicy
from core.push_model import PushSubscription
from core.service import Broker
from core.vhost_queue_reader import VhostQueueReader

CLIENT_ID = "push"
POLL_WAIT_MS = 5_000


class TopicSource:
    """A topic popped by the group ``%PUSH%<name>``, which holds the subscription's position."""

    def __init__(self, broker: Broker, subscription: PushSubscription) -> None:
        self.broker = broker
        self.subscription = subscription

    def describe(self) -> str:
        return f"topic {self.subscription.topic!r}"

    async def prepare(self) -> None:
        """The group holding the position: FIFO for an ordered subscription; attempts are
        counted by the subscription, so the group itself never dead-letters."""
        config = GroupConfig(self.subscription.group, retry=RetryPolicy(max_attempts=MAX_ATTEMPTS),
                             fifo=self.subscription.ordered)
        with contextlib.suppress(AlreadyExists):
            await self.broker.create_group(SYSTEM, config)

    async def wait_to_exist(self, timeout_s: float) -> None:
        """Return once the topic takes its first message, or after ``timeout_s``."""
        await self.broker.wait_for_topic(self.subscription.topic, timeout_s)

    def refusal(self, principal: Principal) -> str:
        """Why the owner may not read the topic now ('' when it may)."""
        subscription = self.subscription
        if not self.broker.allowed(principal, Action.SUBSCRIBE, subscription.topic):
            return (f"user {subscription.owner!r} may no longer subscribe to topic "
                    f"{subscription.topic!r}; delivery resumes once it may")
        if subscription.subject_filter and not self.broker.filter_allowed(principal, subscription.subject_filter):
            return (f"user {subscription.owner!r} may no longer subscribe to "
                    f"{subscription.subject_filter!r}; delivery resumes once it may")
        return ""

    async def pop(self, principal: Principal, max_messages: int, invisible_ms: int) -> list[Delivery]:
        """Up to ``max_messages``, waiting up to ``POLL_WAIT_MS`` for the first."""
        return await self.broker.receive(SYSTEM, self.subscription.group, self.subscription.topic,
                                         CLIENT_ID, max_messages=max_messages,
                                         wait_ms=POLL_WAIT_MS, invisible_ms=invisible_ms)

    async def settle(self, message: Delivery, handle: str) -> None:
        await self.broker.ack(SYSTEM, self.subscription.group, self.subscription.topic, handle)

    async def hide(self, message: Delivery, handle: str, invisible_ms: int) -> str:
        """Keep ``message`` from being popped for ``invisible_ms``; its new handle."""
        return await self.broker.change_invisible(SYSTEM, self.subscription.group,
                                                  self.subscription.topic, handle, invisible_ms)

    async def retry_later(self, message: Delivery, handle: str, delay_ms: int) -> None:
        """Pop ``message`` again (as its next attempt) once ``delay_ms`` have passed."""
        await self.hide(message, handle, delay_ms)

    async def give_back(self, message: Delivery, handle: str) -> None:
        """Make ``message`` poppable again now."""
        await self.hide(message, handle, 0)

    def lag(self) -> int:
        """Messages of the topic the subscription has not settled yet; a queue it has not read
        from yet (a subscription paused before its first poll) counts whole, since a new
        subscription starts at the topic's earliest message."""
        positions = self.broker.lag(self.subscription.group)
        read = {q.queue_id for q in positions if q.topic == self.subscription.topic}
        queues = self.broker.describe_topic(self.subscription.topic).queues
        unread = sum(q.max_offset - q.min_offset for q in queues if q.queue_id not in read)
        return sum(q.lag for q in positions) + unread

    async def remove(self) -> None:
        """Delete the group that held the position."""
        with contextlib.suppress(SluiceError):
            await self.broker.delete_group(SYSTEM, self.subscription.group)


class QueueSource:
    """An AMQP queue (``vhost`` + ``queue``): the subscription is one more consumer of it, so
    each message goes either to it or to one of the queue's AMQP consumers. The queue holds the
    position: a settled message has left the queue."""

    def __init__(self, reader: VhostQueueReader, subscription: PushSubscription) -> None:
        self.reader = reader
        self.subscription = subscription

    def describe(self) -> str:
        return f"queue {self.subscription.queue!r} in vhost {self.subscription.vhost!r}"

    async def prepare(self) -> None:
        pass

    async def wait_to_exist(self, timeout_s: float) -> None:
        """Wait ``timeout_s`` before looking for the queue again (declared over AMQP)."""
        await asyncio.sleep(timeout_s)

    def refusal(self, principal: Principal) -> str:
        """Why the owner may not read the queue now ('' when it may)."""
        subscription = self.subscription
        if not self.reader.readable(principal, subscription.vhost, subscription.queue):
            return (f"user {subscription.owner!r} may no longer read {self.describe()}; "
                    "delivery resumes once it may")
        return ""

    async def pop(self, principal: Principal, max_messages: int, invisible_ms: int) -> list[Delivery]:
        """Up to ``max_messages``, waiting up to ``POLL_WAIT_MS`` for the first; NotFound while
        the queue is not declared."""
        vhost, queue = self.subscription.vhost, self.subscription.queue
        batch = self.reader.pop(principal, vhost, queue, max_messages, invisible_ms)
        if batch:
            return batch
        await self.reader.wait(vhost, queue, POLL_WAIT_MS)
        if self.refusal(principal):  # revoked meanwhile: the caller reports it
            return []
        return self.reader.pop(principal, vhost, queue, max_messages, invisible_ms)

    async def settle(self, message: Delivery, handle: str) -> None:
        self.reader.settle(message)

    async def hide(self, message: Delivery, handle: str, invisible_ms: int) -> str:
        self.reader.hide(message, invisible_ms)
        return handle

    async def retry_later(self, message: Delivery, handle: str, delay_ms: int) -> None:
        """Hide ``message`` for ``delay_ms``, then release it, which wakes the queue's
        consumers: the next attempt goes to whoever pops it first. It stays hidden a while
        longer in case the broker stops before the release (at-least-once); a release after
        the subscription stopped is what it should be, so it is never cancelled."""
        self.reader.hide(message, delay_ms + POLL_WAIT_MS)
        asyncio.get_running_loop().call_later(delay_ms / 1000, self.reader.release, message)

    async def give_back(self, message: Delivery, handle: str) -> None:
        self.reader.release(message)

    def lag(self) -> int:
        """Messages in the queue not settled yet (by any of its consumers)."""
        return self.reader.depth(self.subscription.vhost, self.subscription.queue)

    async def remove(self) -> None:
        pass


Source = TopicSource | QueueSource
