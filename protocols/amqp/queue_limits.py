"""Messages leaving AMQP queues: TTL (x-message-ttl, a message's expiration), length limits
(x-max-length, x-max-length-bytes with x-overflow), quorum queues' delivery limit, unused
queues expiring (x-expires), and dead-lettering of what leaves (``dead_letters``).

`QueueLimits` stands between a connection's messages and core's named queues: it pops, settles
and releases like ``NamedQueues`` and applies each queue's `QueuePolicy` on the way. A queue
stays a view over the log: an expired or dropped message is settled in its queue (and
published again to the dead-letter exchange when the queue has one, settled once that copy is
stored); nothing is copied otherwise. Expired messages are never delivered: they are taken out
when a pop reaches them, and a timer expires a queue's head when no consumer does.
Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from core.acl import Withheld
from core.clock import now_ms
from core.errors import NotFound, PreconditionFailed, SluiceError
from core.history import HistoryPending
from core.interop import MQTT_EXPIRY_AT
from core.model import SUBJECT_PROPERTY, Delivery, OutgoingMessage
from core.named_queues import NamedQueues
from core.service import MAX_INVISIBLE_MS
from core.untrusted import clip
from core.vhosts import QueueSettings, VirtualHosts

from .dead_letters import DELIVERY_LIMIT, EXPIRED, MAXLEN, REJECTED, DeadLetter, DeadLetters
from .mapping import with_header
from .queue_arguments import MAX_EXPIRY_MS, QueuePolicy, policy
from .ready_bytes import ReadyBytes

log = logging.getLogger(__name__)

EXPIRATION_PROPERTY = "amqp.expiration"
SWEEP_BATCH = 256
"""Most expired messages one timer tick takes from a queue's head."""
_NO_POLICY = QueuePolicy()
_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_expiration(text: str | None) -> int | None:
    """A message's ``expiration`` in ms (None: none); PreconditionFailed (406) worded as
    RabbitMQ words it when it is not a string of a non-negative integer."""
    if text is None:
        return None
    shown = clip(text, 200)[1:-1]
    number = _INTEGER.match(text)
    if number is None:
        raise PreconditionFailed(f"invalid expiration '{shown}': no_integer")
    if number.end() < len(text):
        rest = clip(text[number.end():], 100)[1:-1]
        raise PreconditionFailed(f"invalid expiration '{shown}': {{leftover_string,\"{rest}\"}}")
    value = int(number.group())
    if value < 0:
        raise PreconditionFailed(f"invalid expiration '{shown}': {{value_negative,{value}}}")
    if value > MAX_EXPIRY_MS:
        raise PreconditionFailed(f"invalid expiration '{shown}': {{value_too_large,{value}}}")
    return value


def _noting(withheld: Withheld, into: list[Delivery]) -> Withheld:
    """``withheld`` that also collects each message it withholds into ``into``."""
    def check(delivery: Delivery) -> bool:
        if withheld(delivery):
            into.append(delivery)
            return True
        return False
    return check


def expires_at(policy_: QueuePolicy, properties: Mapping[str, str],
               stored_ms: int) -> int | None:
    """When a message stored at ``stored_ms`` expires in a queue with ``policy_`` (the
    smaller of the queue's TTL and the message's expiration, or an MQTT publish's message
    expiry); None: never."""
    ttl = policy_.message_ttl
    raw = properties.get(EXPIRATION_PROPERTY)
    if raw is not None:
        try:
            own = parse_expiration(raw)
        except PreconditionFailed:
            own = None
        if own is not None:
            ttl = own if ttl is None else min(ttl, own)
    deadline = None if ttl is None else stored_ms + ttl
    expiry = properties.get(MQTT_EXPIRY_AT)  # absolute ms
    if expiry is not None and expiry.isascii() and expiry.isdigit() and len(expiry) <= 16:
        deadline = int(expiry) if deadline is None else min(deadline, int(expiry))
    return deadline


_Letter = tuple[str | None, int, DeadLetter]
"""A dead letter and the named queue and offset to settle once it is stored (None: a publish
refused before it was stored)."""


def _rejects_publishes(the_policy: QueuePolicy) -> bool:
    return the_policy.limits_length and the_policy.overflow != "drop-head"


@dataclasses.dataclass(eq=False)
class _Queue:
    """One declared queue as the limits see it."""

    vhost: str
    name: str
    named: str
    policy: QueuePolicy
    sweep_at: int | None = None
    sweep: asyncio.TimerHandle | None = None
    unused: asyncio.TimerHandle | None = None
    outbox: list[_Letter] = dataclasses.field(default_factory=list)
    """Dead letters waiting for this turn's publish."""
    watch: asyncio.Future[None] | None = None
    """Resolved when the queue grows by any way in (MQTT and native messages too)."""
    returned: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)
    """Heap of (expires at, named queue, offset) of requeued messages, for the TTL timer."""


class QueueLimits:
    """Every AMQP queue's policy, applied on pop, on publish and by timers."""

    def __init__(self, queues: NamedQueues, vhosts: VirtualHosts, dead_letters: DeadLetters,
                 consumer_count: Callable[[str], int],
                 spawn: Callable[[Coroutine[Any, Any, None]], None],
                 deleted: Callable[[str], None]) -> None:
        self._named = queues
        self.tracer = queues.tracer
        """Core's message tracer (``core.trace``)."""
        self._vhosts = vhosts
        self._dead_letters = dead_letters
        self._consumer_count = consumer_count
        self._spawn = spawn
        self._deleted = deleted
        self._queues: dict[str, _Queue] = {}
        self._bytes = ReadyBytes(queues)
        self._outgoing: list[_Queue] = []
        """Queues with dead letters to publish at the end of this event-loop turn."""
        self._limited = 0
        """Queues with a reject-publish length limit: publishes look at none while 0."""

    # ---------------------------------------------------------------- queues

    def register(self, vhost: str, settings: QueueSettings, *, loaded: bool = False) -> None:
        """A queue declared or redeclared (a use, for x-expires), or ``loaded`` at start (its
        head is checked for messages that expired meanwhile)."""
        named = self._vhosts.get(vhost).named(settings.name)
        queue = self._queues.get(named)
        if queue is None:
            found = policy(settings.arguments) or _NO_POLICY
            queue = self._queues[named] = _Queue(vhost, settings.name, named, found)
            self._limited += _rejects_publishes(found)
            self._watch(queue)
            if loaded:
                self._arm_sweep(queue, now_ms())
        self.used(named)

    def used(self, named: str) -> None:
        """A basic.get, a consume or a redeclare: an x-expires queue's idle time restarts."""
        queue = self._queues.get(named)
        if queue is None or queue.policy.expires is None:
            return
        if queue.unused is not None:
            queue.unused.cancel()
        queue.unused = asyncio.get_running_loop().call_later(
            queue.policy.expires / 1000, self._maybe_unused, queue)

    def forget(self, named: str) -> None:
        """The queue is gone: its timers stop and its consumption state goes."""
        queue = self._queues.pop(named, None)
        if queue is not None:
            self._limited -= _rejects_publishes(queue.policy)
            for handle in (queue.sweep, queue.unused, queue.watch):
                if handle is not None:
                    handle.cancel()
        self._bytes.forget(named)
        self._named.forget(named)

    def _watch(self, queue: _Queue) -> None:
        """Follow a queue with a drop-head limit or a TTL as it grows, whoever feeds it (a
        queue bound to ``amq.topic`` gets MQTT and native messages without an AMQP publish)."""
        the_policy = queue.policy
        if the_policy.message_ttl is None and not (
                the_policy.limits_length and the_policy.overflow == "drop-head"):
            return
        queue.watch = self._named.watch(queue.named)
        queue.watch.add_done_callback(lambda _: self._grown(queue))

    def _grown(self, queue: _Queue) -> None:
        """Messages reached ``queue`` (or came back to it): apply drop-head and make sure a
        TTL timer runs (the queue's newest message expires last)."""
        if queue.watch is None or queue.watch.cancelled() or not self._alive(queue):
            return
        if queue.policy.limits_length and queue.policy.overflow == "drop-head":
            self._drop_heads(queue, queue.named)
        if queue.policy.message_ttl is not None and queue.sweep is None:
            self._arm_sweep(queue, now_ms() + queue.policy.message_ttl)
        self._watch(queue)

    def _alive(self, queue: _Queue) -> bool:
        """Whether ``queue`` is still declared (its virtual host may have been deleted under
        it); forgotten if not."""
        try:
            host = self._vhosts.get(queue.vhost)
            alive = self._queues.get(queue.named) is queue \
                and queue.name in host.queues and host.named(queue.name) == queue.named
        except NotFound:
            alive = False
        if not alive and self._queues.get(queue.named) is queue:
            self.forget(queue.named)
        return alive

    def _maybe_unused(self, queue: _Queue) -> None:
        queue.unused = None
        if not self._alive(queue):
            return
        if self._consumer_count(queue.named):
            self.used(queue.named)  # in use now: idle time starts over
            return
        self._spawn(self._delete_unused(queue))

    async def _delete_unused(self, queue: _Queue) -> None:
        if not self._alive(queue):
            return
        log.info("AMQP queue %s in vhost %s deleted: unused for %d ms (x-expires)",
                 clip(queue.name), clip(queue.vhost), queue.policy.expires)
        self._deleted(await self._vhosts.delete_queue(queue.vhost, queue.name))

    # ---------------------------------------------------------------- NamedQueues' face

    def pop(self, named: str, max_messages: int, invisible_ms: int, *,
            mark: bool = False, withheld: Withheld | None = None) -> list[Delivery]:
        """Pop like ``NamedQueues.pop``, never handing out an expired message or one past
        its queue's delivery limit (those are dead-lettered or dropped), nor one ``withheld``
        from the reader by an access rule (dropped, never dead-lettered: its copy would reach
        other readers); on quorum queues a redelivery carries ``x-delivery-count``."""
        queue = self._queue_of(named)
        the_policy = _NO_POLICY if queue is None else queue.policy
        out: list[Delivery] = []
        dropped: list[Delivery] = []
        if withheld is not None and queue is not None and queue.policy.max_length_bytes is not None:
            withheld = _noting(withheld, dropped)  # their bytes leave the queue's count
        while len(out) < max_messages:
            wanted = max_messages - len(out)
            popped = self._named.pop(named, wanted, invisible_ms, mark=mark, withheld=withheld)
            if dropped:
                self._taken(queue, named, dropped)
                for delivery in dropped:
                    self._bytes.settled(named, delivery.queue_offset)
                dropped.clear()
            self._taken(queue, named, popped)
            now = now_ms()
            dead: list[tuple[Delivery, str]] = []
            for delivery in popped:
                reason = self._leaving(the_policy, delivery, now)
                if reason is not None:
                    dead.append((delivery, reason))
                elif the_policy.quorum and delivery.attempt > 1:
                    out.append(dataclasses.replace(delivery, properties=with_header(
                        delivery.properties, "x-delivery-count", delivery.attempt - 1)))
                else:
                    out.append(delivery)
            if dead:
                self._dead_letter(queue, named, dead)
            if not dead or len(popped) < wanted:
                break
        return out

    def pop_first(self, queues: tuple[str, ...], max_messages: int, invisible_ms: int, *,
                  mark: bool = False, withheld: Withheld | None = None) -> list[Delivery]:
        """``pop`` from each of ``queues`` (a priority queue's levels, highest first) in turn
        until ``max_messages`` are taken."""
        popped: list[Delivery] = []
        for named in self._named.with_work(queues):
            if len(popped) >= max_messages:
                break
            try:
                popped += self.pop(named, max_messages - len(popped), invisible_ms, mark=mark,
                                   withheld=withheld)
            except HistoryPending:
                if popped:  # what the higher levels gave goes out; the fetch goes on meanwhile
                    break
                raise
        return popped

    def _queue_of(self, named: str) -> _Queue | None:
        """The queue a named queue belongs to (a priority level's name extends it with @)."""
        queue = self._queues.get(named)
        if queue is None and "@" in named:
            queue = self._queues.get(named.partition("@")[0])
        return queue

    @staticmethod
    def _leaving(the_policy: QueuePolicy, delivery: Delivery, now: int) -> str | None:
        limit = the_policy.delivery_limit
        if limit is not None and delivery.attempt - 1 > limit:
            return DELIVERY_LIMIT
        if the_policy.message_ttl is None and EXPIRATION_PROPERTY not in delivery.properties \
                and MQTT_EXPIRY_AT not in delivery.properties:
            return None
        deadline = expires_at(the_policy, delivery.properties, delivery.store_ts)
        return EXPIRED if deadline is not None and deadline <= now else None

    def settle(self, named: str, offset: int) -> None:
        self._settle(self._queue_of(named), named, offset)

    def _settle(self, queue: _Queue | None, named: str, offset: int) -> None:
        if queue is not None and queue.policy.max_length_bytes is not None:
            self._bytes.settled(named, offset)
        self._named.settle(named, offset)

    def _release(self, queue: _Queue | None, named: str, offset: int) -> None:
        if queue is not None and queue.policy.max_length_bytes is not None:
            self._bytes.released(named, offset)
        self._named.release(named, offset)

    def _taken(self, queue: _Queue | None, named: str, taken: list[Delivery]) -> None:
        if taken and queue is not None and queue.policy.max_length_bytes is not None:
            self._bytes.taken(named, taken)

    def purge(self, named: str) -> int:
        """``NamedQueues.purge``: every ready message of ``named`` is settled."""
        self._bytes.recount(named)
        return self._named.purge(named)

    def release(self, named: str, offset: int) -> None:
        """Requeue a delivery; one returned more often than its quorum queue's delivery limit,
        or past its queue's TTL, is dead-lettered (or dropped) instead, as RabbitMQ does."""
        queue = self._queue_of(named)
        if queue is None:
            self._named.release(named, offset)
            return
        limit = queue.policy.delivery_limit
        if limit is not None and self._named.attempts(named, offset) > limit:
            self._leave(queue, named, offset, DELIVERY_LIMIT)
        elif queue.policy.message_ttl is None:
            self._release(queue, named, offset)
        else:  # a requeue in a queue with a TTL costs a read (from the recent cache)
            message = self._message(named, offset)
            deadline = None if message is None else \
                expires_at(queue.policy, message.properties, message.store_ts)
            if deadline is not None and deadline <= now_ms():
                self._leave(queue, named, offset, EXPIRED)
                return
            self._release(queue, named, offset)
            if deadline is not None:
                heapq.heappush(queue.returned, (deadline, named, offset))
                self._arm_sweep(queue, deadline)

    def _message(self, named: str, offset: int) -> Delivery | None:
        messages, _ = self._named.read(named, offset, 1)
        return messages[0] if messages and messages[0].queue_offset == offset else None

    def ready(self, named: str) -> int:
        return self._named.ready(named)

    def unsettled(self, named: str) -> int:
        return self._named.unsettled(named)

    def take(self, named: str, offset: int, invisible_ms: int) -> None:
        self._named.take(named, offset, invisible_ms)

    def watch(self, named: str) -> asyncio.Future[None]:
        return self._named.watch(named)

    def signal_any(self, queues: tuple[str, ...]) -> asyncio.Future[None]:
        return self._named.signal_any(queues)

    def flush_marks(self) -> None:
        self._named.flush_marks()

    def bounds(self, named: str) -> tuple[int, int]:
        return self._named.bounds(named)

    def read(self, named: str, offset: int, max_messages: int) -> tuple[list[Delivery], int]:
        """Read a stream by offset (``NamedQueues.read``); no limit applies to readers."""
        return self._named.read(named, offset, max_messages)

    def offset_at(self, named: str, timestamp_ms: int) -> int:
        return self._named.offset_at(named, timestamp_ms)

    def reject(self, named: str, offset: int) -> None:
        """A delivery rejected (or nacked) without requeue: dead-lettered with reason
        ``rejected`` when its queue has a dead-letter exchange, else dropped."""
        self._leave(self._queue_of(named), named, offset, REJECTED)

    def _leave(self, queue: _Queue | None, named: str, offset: int, reason: str) -> None:
        """The popped message at ``offset`` leaves its queue for ``reason``."""
        if queue is None or queue.policy.dead_letter_exchange is None:
            self._settle(queue, named, offset)
            return
        message = self._message(named, offset)
        if message is None:
            self._settle(queue, named, offset)
            return
        self._dead_letter(queue, named, [(message, reason)])

    # ---------------------------------------------------------------- publish

    def admit(self, message: OutgoingMessage,
              pending: dict[str, tuple[int, int]]) -> tuple[OutgoingMessage | None, bool]:
        """``message`` without the queues whose reject-publish limit it would exceed, and
        whether any refused it (a confirm is then a nack). ``pending`` counts what this batch
        adds to each queue so far (messages, bytes). None when nothing is left to store."""
        if not self._limited:
            return message, False
        keep: list[str] = []
        refused = False
        size = len(message.body)
        for named in message.also_into:
            queue = self._queue_of(named)
            if queue is None or not queue.policy.limits_length \
                    or queue.policy.overflow == "drop-head":
                keep.append(named)
                continue
            count, octets = pending.get(named, (0, 0))
            if self._over(queue.policy, named, count + 1, octets + size):
                refused = True
                if queue.policy.overflow == "reject-publish-dlx":
                    self._dead_letter_unstored(queue, message)
                continue
            pending[named] = (count + 1, octets + size)
            keep.append(named)
        if not refused:
            return message, False
        if not keep and not message.properties.get(SUBJECT_PROPERTY):
            return None, True
        return dataclasses.replace(message, also_into=tuple(keep)), True

    def _over(self, the_policy: QueuePolicy, named: str, extra: int, extra_bytes: int) -> bool:
        """Whether ``extra`` more messages of ``extra_bytes`` would exceed a limit."""
        if the_policy.max_length is not None \
                and self._named.ready(named) + extra > the_policy.max_length:
            return True
        return the_policy.max_length_bytes is not None and \
            self._bytes.total(named) + extra_bytes > the_policy.max_length_bytes

    def stored(self, messages: Iterable[OutgoingMessage]) -> None:
        """Messages were stored: drop heads over a drop-head limit, arm expiry timers."""
        now = now_ms()
        touched: dict[str, _Queue] = {}
        for message in messages:
            for named in message.also_into:
                queue = self._queue_of(named)
                if queue is None:
                    continue
                touched[named] = queue
                deadline = expires_at(queue.policy, message.properties, now)
                if deadline is not None:
                    self._arm_sweep(queue, deadline)
        for named, queue in touched.items():
            if queue.policy.limits_length and queue.policy.overflow == "drop-head":
                self._drop_heads(queue, named)

    def _drop_heads(self, queue: _Queue, named: str) -> None:
        """Dead-letter (or drop) the oldest messages of ``named`` (a level of ``queue``)
        until it fits its limits."""
        the_policy = queue.policy
        excess = 0 if the_policy.max_length is None else \
            max(0, self._named.ready(named) - the_policy.max_length)
        dropped = self._named.pop(named, excess, MAX_INVISIBLE_MS) if excess else []
        self._taken(queue, named, dropped)
        if the_policy.max_length_bytes is not None:
            while self._bytes.total(named) > the_policy.max_length_bytes:
                head = self._named.pop(named, 1, MAX_INVISIBLE_MS)
                if not head:
                    break
                self._taken(queue, named, head)
                dropped.extend(head)
        if dropped:
            self._dead_letter(queue, named, [(d, MAXLEN) for d in dropped])

    # ---------------------------------------------------------------- expiry timers

    def _arm_sweep(self, queue: _Queue, at_ms: int) -> None:
        if queue.sweep_at is not None and queue.sweep_at <= at_ms:
            return
        if queue.sweep is not None:
            queue.sweep.cancel()
        loop = asyncio.get_running_loop()
        queue.sweep_at = at_ms
        queue.sweep = loop.call_later(max(0, at_ms - now_ms()) / 1000, self._sweep, queue)

    def _sweep(self, queue: _Queue) -> None:
        """Expire the queue's head: what nobody popped is taken out once its time is up."""
        queue.sweep_at = queue.sweep = None
        if not self._alive(queue):
            return
        now = now_ms()
        expired: list[tuple[Delivery, str]] = []
        for message in self._named.peek(queue.named, SWEEP_BATCH):
            deadline = expires_at(queue.policy, message.properties, message.store_ts)
            if deadline is None or deadline > now:
                if deadline is not None:
                    self._arm_sweep(queue, deadline)
                break
            self._named.take(queue.named, message.queue_offset, MAX_INVISIBLE_MS)
            self._taken(queue, queue.named, [message])
            expired.append((message, EXPIRED))
        if len(expired) == SWEEP_BATCH:
            self._arm_sweep(queue, now)  # more may be due
        if expired:
            self._dead_letter(queue, queue.named, expired)
        self._sweep_returned(queue, now)

    def _sweep_returned(self, queue: _Queue, now: int) -> None:
        """Expire requeued messages whose TTL ran out while they waited (one popped again
        meanwhile is left to its consumer)."""
        heap = queue.returned
        while heap and heap[0][0] <= now:
            _, named, offset = heapq.heappop(heap)
            message = self._message(named, offset) if self._named.returned(named, offset) \
                else None
            if message is not None:
                self._named.take(named, offset, MAX_INVISIBLE_MS)
                self._taken(queue, named, [message])
                self._dead_letter(queue, named, [(message, EXPIRED)])
        if heap:
            self._arm_sweep(queue, heap[0][0])

    # ---------------------------------------------------------------- dead letters

    def _dead_letter(self, queue: _Queue | None, named: str,
                     dead: Sequence[tuple[Delivery, str]]) -> None:
        """Settle ``dead`` (popped or taken) once their copies are stored in the dead-letter
        exchange; at once when the queue has none."""
        if queue is None or queue.policy.dead_letter_exchange is None:
            for delivery, _ in dead:
                self._settle(queue, named, delivery.queue_offset)
            return
        self._post(queue, [(named, d.queue_offset, DeadLetter(d.properties, d.body, reason))
                           for d, reason in dead])

    def _dead_letter_unstored(self, queue: _Queue, message: OutgoingMessage) -> None:
        if queue.policy.dead_letter_exchange is not None:
            self._post(queue, [(None, 0, DeadLetter(message.properties, message.body, MAXLEN))])

    def _post(self, queue: _Queue, letters: list[_Letter]) -> None:
        """Queue ``letters`` for one publish per queue and event-loop turn (no task per
        message, however many are rejected one by one)."""
        if not queue.outbox:
            self._outgoing.append(queue)
            if len(self._outgoing) == 1:
                asyncio.get_running_loop().call_soon(self._send_outgoing)
        queue.outbox.extend(letters)

    def _send_outgoing(self) -> None:
        for queue in self._outgoing:
            letters, queue.outbox = queue.outbox, []
            self._spawn(self._publish(queue, letters))
        self._outgoing.clear()

    async def _publish(self, queue: _Queue, letters: list[_Letter]) -> None:
        """Store ``letters`` in the dead-letter exchange, then settle their entries."""
        assert queue.policy.dead_letter_exchange is not None
        try:
            await self._dead_letters.send(queue.vhost, queue.name,
                                          queue.policy.dead_letter_exchange,
                                          queue.policy.dead_letter_routing_key,
                                          [letter for _, _, letter in letters])
            done = self._settle
        except SluiceError as error:  # NotFound too: its virtual host is gone
            log.warning("dead letters of AMQP queue %s in vhost %s not stored (kept in the "
                        "queue): %s", clip(queue.name), clip(queue.vhost), error)
            done = self._release
        for named, offset, _ in letters:
            if named is not None:
                done(queue, named, offset)
