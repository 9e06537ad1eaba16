"""One push subscription at work: a poll loop that pops batches of its source (a topic, for
its consumer group, or an AMQP queue: ``sources``), and a fixed set of worker coroutines
(``concurrency``) that POST them.

At-least-once: a message is settled only after its receiver answered 2xx (and its reply, if
any, is stored); until then it is in flight (popped and hidden), so after a crash it is
delivered again when its invisible time ends. A 408, 429, 5xx or a connection error or timeout
retries after an exponential backoff with full jitter (or the receiver's Retry-After), by
hiding the message that long; any other status dead-letters it at once (and settles it), and
so does the last allowed attempt. Ordered subscriptions pop through a FIFO group and deliver
the messages of one key (the FIFO message group, else the subject) one at a time, in order,
retrying in place. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import hmac
import logging
import random
import time
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from standardwebhooks import Webhook

from core.cloudevents import native_properties
from core.errors import (AlreadyExists, InvalidReceiptHandle, NotFound, ReceiptExpired,
                         SluiceError)
from core.dead_letter import dead_letter_properties
from core.model import SUBJECT_PROPERTY, SYSTEM, Delivery, OutgoingMessage, Principal, TopicConfig
from core.push_model import PushSubscription
from core.push_subscriptions import compile_options
from core.trace import DEAD_LETTERED, PUSH_FAILED, PUSHED
from core.service import MAX_INVISIBLE_MS, Broker
from core.sink_policy import SinkPolicy
from core.vhost_queue_reader import VhostQueueReader

from .guard import SinkRefused, literal_refusal
from .render import event_of, render, synthesized
from .reply import reply_event
from .sources import QueueSource, Source, TopicSource
from .stats import PushStats

log = logging.getLogger(__name__)

RIGHTS_RECHECK_S = 1.0
INVISIBLE_MARGIN_MS = 30_000
"""Added to the request timeout (and any rate-limit wait) while a message is in flight, so it
is not handed out again while its request may still be answered."""
MAX_REPLY_BYTES = 1 << 20
RETRYABLE = frozenset({408, 429})
USER_AGENT = "Sluice-Push/1"


class Delivering:
    """The running part of one subscription."""

    def __init__(self, broker: Broker, session: aiohttp.ClientSession, policy: SinkPolicy,
                 subscription: PushSubscription, secret: str,
                 queues: VhostQueueReader | None = None) -> None:
        """``queues``: the virtual hosts' queues, for a subscription whose source is one."""
        self.broker = broker
        self.source: Source = (QueueSource(queues, subscription) if subscription.queue and queues
                               else TopicSource(broker, subscription))
        if subscription.queue and queues is None:
            raise ValueError("an AMQP queue source needs the virtual hosts' queues")
        self.session = session
        self.policy = policy
        self.subscription = subscription
        self.stats = PushStats(state="paused" if subscription.paused else "running")
        self._webhook = Webhook(secret)
        self._secret_key = self._webhook._whsecret
        self._match, self._transform = compile_options(subscription)
        self._principal: Principal | None = None
        self._generation = -1
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._chains: dict[str, deque[Delivery]] = {}
        self._in_flight = 0
        self._room = asyncio.Event()
        self._retrying: set[tuple[str, int, int]] = set()
        self._bucket = TokenBucket(subscription.rate_limit)
        self._poller: asyncio.Task[None] | None = None
        self._pop_failed = False
        self._batch = max(1, subscription.concurrency // 8)
        """Pop once this many workers are free: fewer, larger pops under load."""
        self._workers: list[asyncio.Task[None]] = []
        self._literal_refused = literal_refusal(policy, urlsplit(subscription.sink).hostname or "")
        """Why the sink's literal address is refused ('' when allowed, or a host name): aiohttp
        connects to a literal address without asking the resolver."""
        self._timeout = aiohttp.ClientTimeout(total=subscription.timeout_ms / 1000)
        wait_ms = 1000 * subscription.concurrency / subscription.rate_limit if subscription.rate_limit else 0
        self._invisible_ms = int(min(MAX_INVISIBLE_MS, subscription.timeout_ms + INVISIBLE_MARGIN_MS + wait_ms))

    # --- life cycle ---

    def start(self) -> None:
        self._workers = [asyncio.create_task(self._work(), name=f"push-{self.subscription.name}-{n}")
                         for n in range(self.subscription.concurrency)]
        if not self.subscription.paused:
            self._poller = asyncio.create_task(self._poll(), name=f"push-{self.subscription.name}")

    def set_paused(self, subscription: PushSubscription) -> None:
        """Apply a pause or resume: a paused subscription stops popping at once (what it holds
        already is still delivered)."""
        self.subscription = subscription
        self.source.subscription = subscription
        if subscription.paused:
            self.stats.state = "paused"
            if self._poller is not None:
                self._poller.cancel()
                self._poller = None
        elif self._poller is None:
            self.stats.state = "running"
            self._poller = asyncio.create_task(self._poll(), name=f"push-{subscription.name}")

    async def stop(self) -> None:
        """Stop popping and delivering; what is in flight is delivered again after its
        invisible time (at-least-once)."""
        tasks = [*self._workers, *([self._poller] if self._poller else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def remove(self) -> None:
        """Stop, then forget the subscription's position (a topic source's group)."""
        await self.stop()
        await self.source.remove()

    # --- popping ---

    async def _poll(self) -> None:
        """Pop and dispatch until cancelled; a failure is reported in the stats and popping
        starts again after a pause."""
        subscription = self.subscription
        await self.source.prepare()
        while True:
            try:
                await self._pop()
            except asyncio.CancelledError:
                raise
            except NotFound as error:  # the topic or queue is not there (yet)
                self.stats.state, self._pop_failed = "failing", True
                self.stats.last_error = (f"cannot read {self.source.describe()}: {error}; "
                                         "delivery starts once it exists")
                await self.source.wait_to_exist(RIGHTS_RECHECK_S)
            except Exception as error:  # noqa: BLE001 - report, then start over after a pause
                log.exception("push subscription %s failed to pop", subscription.name)
                self.stats.state, self._pop_failed = "failing", True
                self.stats.last_error = f"popping failed: {error}"
                await asyncio.sleep(RIGHTS_RECHECK_S)

    async def _pop(self) -> None:
        """Pop one batch (as large as the free workers) and hand it to the workers."""
        subscription = self.subscription
        principal = await self._owner()
        refused = self._refusal(principal)
        if refused:
            self.stats.state, self.stats.last_error = "refused", refused
            await asyncio.sleep(RIGHTS_RECHECK_S)
            return
        if self.stats.state == "refused" or self._pop_failed:  # what stopped it is over
            self.stats.state, self._pop_failed, self.stats.last_error = "running", False, ""
        while self._in_flight > subscription.concurrency - self._batch:
            self._room.clear()
            await self._room.wait()
        batch = await self.source.pop(principal, min(1024, subscription.concurrency - self._in_flight),
                                      self._invisible_ms)
        principal = await self._owner()  # rights may have changed during the long poll
        if batch and self._refusal(principal):
            for message in batch:  # handed out again once the owner may read them
                await self.source.give_back(message, message.receipt_handle)
            return
        withheld = self.broker.withheld_by_rules(principal)
        for message in batch:
            if withheld is not None and withheld(message) or not self._wanted(message):
                self.stats.filtered += 1
                await self.source.settle(message, message.receipt_handle)
                continue
            self._dispatch(message)

    async def _owner(self) -> Principal:
        """The owner's principal with its current rights (loaded again when rights change)."""
        users = self.broker.users
        if self._principal is None or self._generation != self.broker.rights_generation:
            self._generation = self.broker.rights_generation
            self._principal = await asyncio.to_thread(users.principal, self.subscription.owner)
        return self._principal

    def _refusal(self, principal: Principal) -> str:
        """Why the owner may not read the source now ('' when it may)."""
        return self.source.refusal(principal)

    def _wanted(self, message: Delivery) -> bool:
        subscription = self.subscription
        if subscription.subject_filter:
            subject = message.properties.get(SUBJECT_PROPERTY) or message.topic
            if not subject_matches(subscription.subject_filter, subject):
                return False
        if self._match is not None:
            event = event_of(message.properties, message.body)
            return self._match(event.attributes if event is not None else _plain_attributes(message))
        return True

    def current_stats(self) -> PushStats:
        """The stats, their lag (messages of the source not yet settled) taken now."""
        with contextlib.suppress(SluiceError):
            self.stats.lag = self.source.lag()
        return self.stats

    def _dispatch(self, message: Delivery) -> None:
        self._in_flight += 1
        self._retrying.discard((message.topic, message.queue_id, message.queue_offset))
        self.stats.retrying = len(self._retrying)
        if not self.subscription.ordered:
            self._queue.put_nowait(message)
            return
        key = message.message_group or message.properties.get(SUBJECT_PROPERTY) or message.topic
        chain = self._chains.get(key)
        if chain is not None:
            chain.append(message)
            return
        self._chains[key] = deque([message])
        self._queue.put_nowait(key)

    # --- delivering ---

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, str):
                chain = self._chains[item]
                while chain:
                    await self._guarded(chain[0], hold=True)
                    chain.popleft()
                    self._done()
                del self._chains[item]
            else:
                await self._guarded(item, hold=False)
                self._done()

    def _done(self) -> None:
        self._in_flight -= 1
        self._room.set()

    async def _guarded(self, message: Delivery, hold: bool) -> None:
        try:
            await self._deliver(message, hold)
        except asyncio.CancelledError:
            raise
        except (ReceiptExpired, InvalidReceiptHandle):
            pass  # its invisible time ended: it is delivered again
        except Exception as error:  # noqa: BLE001 - one message must not stop the worker
            log.exception("push subscription %s failed on message %s", self.subscription.name,
                          message.msg_id)
            self.stats.last_error = f"{type(error).__name__}: {error}"

    async def _deliver(self, message: Delivery, hold: bool) -> None:
        subscription = self.subscription
        handle, attempt = message.receipt_handle, message.attempt
        while True:
            outcome, delay_ms, reason = await self._attempt(message)
            if outcome == "ok":
                await self.source.settle(message, handle)
                return
            if outcome == "dead" or attempt >= subscription.max_attempts:
                await self._dead_letter(message, attempt, reason)
                await self.source.settle(message, handle)
                return
            delay_ms = delay_ms if delay_ms is not None else backoff_ms(
                attempt, subscription.backoff_min_ms, subscription.backoff_max_ms)
            place = (message.topic, message.queue_id, message.queue_offset)
            self._retrying.add(place)
            self.stats.retrying = len(self._retrying)
            if not hold:  # popped again, as attempt + 1, once the delay is over
                await self.source.retry_later(message, handle, min(MAX_INVISIBLE_MS, delay_ms))
                return
            handle = await self.source.hide(message, handle, min(
                MAX_INVISIBLE_MS, delay_ms + self._invisible_ms))
            await asyncio.sleep(delay_ms / 1000)
            self._retrying.discard(place)
            self.stats.retrying = len(self._retrying)
            attempt += 1

    async def _attempt(self, message: Delivery) -> tuple[str, int | None, str]:
        """POST ``message`` once: ("ok" | "retry" | "dead", Retry-After in ms or None, why it
        failed)."""
        subscription, stats = self.subscription, self.stats
        event = event_of(message.properties, message.body)
        try:
            rendered = render(message, event, subscription.format, self._transform)
        except Exception as error:  # noqa: BLE001 - a transform's failure on this data
            stats.last_error = f"transform failed on message {message.msg_id}: {error}"
            return "dead", None, stats.last_error
        headers = dict(rendered.headers)
        headers["User-Agent"] = USER_AGENT
        headers.update(self._signature(rendered.event_id, rendered.body))
        await self._bucket.take()
        try:
            if self._literal_refused:
                raise SinkRefused(self._literal_refused)
            async with self.session.post(subscription.sink, data=rendered.body, headers=headers,
                                         timeout=self._timeout, allow_redirects=False) as response:
                status = response.status
                body = await response.content.read(MAX_REPLY_BYTES) if (
                    200 <= status < 300 and subscription.reply_topic) else b""
                response_headers = response.headers
        except SinkRefused as error:
            return self._failed(message, None, str(error), permanent=True)
        except aiohttp.ClientConnectorError as error:
            cause = error.os_error
            if isinstance(cause, SinkRefused):
                return self._failed(message, None, str(cause), permanent=True)
            return self._failed(message, None, f"cannot connect to the sink: {error}")
        except TimeoutError:
            return self._failed(message, None, f"no answer within {subscription.timeout_ms} ms")
        except aiohttp.ClientError as error:
            return self._failed(message, None, f"{type(error).__name__}: {error}")
        stats.last_status = status
        if 200 <= status < 300:
            stats.delivered += 1
            stats.latencies.append(max(0.0, time.time() * 1000 - message.store_ts))
            if stats.state == "failing":
                stats.state = "running"
            if subscription.reply_topic:
                await self._reply(response_headers, body)
            self._trace(PUSHED, message, f"{status} from {subscription.sink}")
            return "ok", None, ""
        if 300 <= status < 400:
            where = response_headers.get("Location", "")
            return self._failed(message, status, f"answered {status} (redirect to {where[:200]!r}, "
                                "not followed: give the final URL as the sink)", permanent=True)
        permanent = status < 500 and status not in RETRYABLE
        return self._failed(message, status, f"answered {status}", permanent=permanent,
                            retry_after=retry_after_ms(response_headers.get("Retry-After")))

    def _failed(self, message: Delivery, status: int | None, reason: str, permanent: bool = False,
                retry_after: int | None = None) -> tuple[str, int | None, str]:
        stats = self.stats
        stats.failed += 1
        stats.last_status = status
        stats.last_error = reason
        if stats.state == "running":
            stats.state = "failing"
        self._trace(PUSH_FAILED, message, reason)
        return ("dead" if permanent else "retry"), retry_after, reason

    def _trace(self, event: str, message: Delivery, detail: str) -> None:
        self.broker.trace_push(self.subscription.group, message, event, detail)

    def _signature(self, event_id: str, body: bytes) -> dict[str, str]:
        now = int(time.time())
        try:
            text = body.decode()
        except UnicodeDecodeError:  # signed as the bytes they are, as the scheme defines
            signed = f"{event_id}.{now}.".encode() + body
            digest = hmac.new(self._secret_key, signed, hashlib.sha256).digest()
            signature = "v1," + base64.b64encode(digest).decode()
        else:
            signature = self._webhook.sign(event_id, datetime.fromtimestamp(now, UTC), text)
        return {"webhook-id": event_id, "webhook-timestamp": str(now),
                "webhook-signature": signature}

    async def _reply(self, headers: Mapping[str, str], body: bytes) -> None:
        event = reply_event(headers, body)
        if event is None:
            return
        principal = await self._owner()
        try:
            await self.broker.send(principal, [OutgoingMessage(
                self.subscription.reply_topic, event.data, properties=native_properties(event))],
                create_topics=True)
        except SluiceError as error:
            self.stats.last_error = f"the reply could not be stored: {error}"
            return
        self.stats.replies += 1

    async def _dead_letter(self, message: Delivery, attempt: int, reason: str) -> None:
        """Store ``message`` in the dead-letter topic with why its last attempt failed (this
        message's own reason: other workers change the stats' last error meanwhile)."""
        topic = self.subscription.dead_letters
        with contextlib.suppress(AlreadyExists):
            await self.broker.create_topic(SYSTEM, TopicConfig(topic, queue_count=1))
        properties = dead_letter_properties(message, attempt)
        properties.update({"sluice.push.subscription": self.subscription.name,
                           "sluice.push.last_error": reason[:500]})
        await self.broker.send(SYSTEM, [OutgoingMessage(topic, message.body, message.tag,
                                                        message.keys, properties,
                                                        born_ts=message.born_ts)])
        self.stats.dead_lettered += 1
        self._trace(DEAD_LETTERED, message, f"to {topic} after {attempt} attempt(s): {reason}")


class TokenBucket:
    """At most ``rate`` takes per second (bursts up to one second's worth); 0: unlimited."""

    def __init__(self, rate: float) -> None:
        self._rate = rate
        self._capacity = max(1.0, rate)
        self._tokens = self._capacity
        self._at = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self) -> None:
        if not self._rate:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._rate)


def backoff_ms(attempt: int, low: int, high: int) -> int:
    """The wait before the attempt after ``attempt``: exponential from ``low``, capped at
    ``high``, with full jitter (uniform between ``low`` and the cap)."""
    ceiling = min(high, low * 2 ** min(attempt - 1, 40))
    return int(random.uniform(low, ceiling))


def retry_after_ms(value: str | None) -> int | None:
    """A Retry-After header (seconds, or an HTTP date) in ms from now; None without a usable one."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(MAX_INVISIBLE_MS, int(value) * 1000)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0, min(MAX_INVISIBLE_MS, int((when.timestamp() - time.time()) * 1000)))


def subject_matches(subject_filter: str, subject: str) -> bool:
    """Whether ``subject`` matches an MQTT-style filter (``+`` one level, ``#`` the rest)."""
    pattern, levels = subject_filter.split("/"), subject.split("/")
    for n, part in enumerate(pattern):
        if part == "#":
            return True
        if n >= len(levels) or (part != "+" and part != levels[n]):
            return False
    return len(pattern) == len(levels)


def _plain_attributes(message: Delivery) -> dict[str, str]:
    return dict(synthesized(message).attributes)
