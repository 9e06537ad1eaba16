"""``GET /topics/{topic}/tail``: a topic's recent messages, then new ones as they arrive.

The response is newline-delimited JSON that stays open: first every message stored in the last
``minutes`` (all queues), then each new message as soon as it is deliverable, and a heartbeat
line every ``HEARTBEAT_S`` seconds so clients and proxies can tell a quiet topic from a dead
connection. A client that falls more than ``MAX_BUFFERED`` messages behind gets a last line
``{"error": "overflow", ...}`` and the stream ends: reconnecting starts over from history.

The live part is a core listener on the topic's subjects, registered before history is read;
per-queue history ends drop what both parts saw. Lines carry the position (queue, offset),
keys, tag, subject, timestamps and the body as text (``body_base64`` when it is not UTF-8).

Reading bodies needs the subscribe right on the topic: the route's access rule decides it before
any header is written (a 403 JSON answer), and the right is checked again before every batch and
heartbeat, since rights change at runtime: a caller who loses it gets a last line
``{"error": "forbidden", ...}`` and the stream ends. Messages whose subject an access-control
rule denies the caller (``core.acl``) are left out, history and live alike.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import deque
from typing import Any

from aiohttp import web

from core.errors import AccessDenied
from core.history import with_history
from core.model import SUBJECT_PROPERTY, Action, Delivery, Principal

from .errors import HttpProblem
from .handlers import deps, query_int

HEARTBEAT_S = 15.0
MAX_BUFFERED = 20_000
HISTORY_BATCH = 1000
TAILS: web.AppKey[set[LiveFeed]] = web.AppKey("tails", set)


class LiveFeed:
    """A core listener buffering a topic's new messages for one streaming response."""

    def __init__(self) -> None:
        self.pending: deque[Delivery] = deque()
        self.overflowed = False
        self.closed = False
        self._wakeup = asyncio.Event()

    def deliver(self, delivery: Delivery) -> None:
        if len(self.pending) >= MAX_BUFFERED:
            self.overflowed = True
        else:
            self.pending.append(delivery)
        self._wakeup.set()

    def close(self) -> None:
        """End the stream (the server is stopping)."""
        self.closed = True
        self._wakeup.set()

    async def wait(self, timeout: float) -> None:
        """Return when something arrived, the feed closed, or after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except TimeoutError:
            pass
        self._wakeup.clear()


async def tail_topic(request: web.Request, principal: Principal) -> web.StreamResponse:
    """Stream the topic (see the module docstring). Runs on the event loop."""
    broker, queues = deps(request).broker, deps(request).queues
    topic = request.match_info["topic"]
    config = broker.get_topic(topic)  # NotFound: 404 with the topic's name
    minutes = query_int(request, "minutes", 60)
    if minutes < 0:
        raise HttpProblem(400, "invalid_query", f"minutes must be 0 or more, not {minutes}")
    since_ms = int(time.time() * 1000) - minutes * 60_000
    feed = LiveFeed()
    subjects = f"{topic}/#"
    queues.add_listener(subjects, feed)
    request.app[TAILS].add(feed)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                           "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        stream = _Stream(broker, principal, topic, response)
        try:
            if minutes:
                history_end = {queue_id: await stream.history(queue_id, since_ms)
                               for queue_id in range(config.queue_count)}
            else:  # only new messages: not even one stored in this very millisecond
                history_end = {queue_id: broker.offset_at(topic, queue_id, "latest")
                               for queue_id in range(config.queue_count)}
            await stream.live(feed, history_end)
        except AccessDenied as error:  # the right was revoked (or the user deleted) meanwhile
            await response.write(_json_line({"error": "forbidden", "message": str(error)}))
    except ConnectionResetError:
        pass  # the client went away
    finally:
        queues.remove_listener(subjects, feed)
        request.app[TAILS].discard(feed)
    return response


class _Stream:
    """One open tail: writes batches and heartbeats, each only while the caller may still read
    the topic (AccessDenied otherwise). Runs on the event loop."""

    def __init__(self, broker: Any, principal: Principal, topic: str,
                 response: web.StreamResponse) -> None:
        self._broker = broker
        self._principal = principal
        self._topic = topic
        self._response = response

    async def history(self, queue_id: int, since_ms: int) -> int:
        """Write one queue's messages stored since ``since_ms``; return where they end."""
        broker, topic = self._broker, self._topic
        offset = await with_history(lambda: broker.offset_at(topic, queue_id, since_ms))
        end = broker.offset_at(topic, queue_id, "latest")
        while offset < end:
            pulled = await broker.pull(self._principal, "$admin-tail", topic, queue_id, offset,
                                       max_messages=min(HISTORY_BATCH, end - offset))
            if not pulled.messages:
                break
            await self._write(_lines(pulled.messages))
            offset = pulled.next_offset
        return end

    async def live(self, feed: LiveFeed, history_end: dict[int, int]) -> None:
        """Write new messages as the feed gets them, and heartbeats while it is quiet."""
        while not feed.closed:
            if feed.overflowed:
                await self._response.write(_json_line({
                    "error": "overflow", "message": f"more than {MAX_BUFFERED} messages were "
                    "waiting for this client; reconnect to start again from history"}))
                return
            if feed.pending:
                withheld = self._broker.withheld_by_rules(self._principal)
                fresh = [d for d in feed.pending if d.queue_offset >= history_end.get(d.queue_id, 0)
                         and (withheld is None or not withheld(d))]
                feed.pending.clear()
                if fresh:
                    await self._write(_lines(fresh))
                continue
            await feed.wait(HEARTBEAT_S)
            if not feed.pending and not feed.closed:
                await self._write(_json_line({"heartbeat": int(time.time() * 1000)}))

    async def _write(self, data: bytes) -> None:
        if not self._broker.allowed(self._principal, Action.SUBSCRIBE, self._topic):
            raise AccessDenied(f"user {self._principal.user!r} may no longer read topic "
                               f"{self._topic!r} (its subscribe right is gone); the stream ends")
        await self._response.write(data)


def _lines(deliveries: list[Delivery]) -> bytes:
    return b"".join(_json_line(_message(d)) for d in deliveries)


def _message(delivery: Delivery) -> dict[str, Any]:
    line: dict[str, Any] = {
        "queue": delivery.queue_id, "offset": delivery.queue_offset, "keys": list(delivery.keys),
        "tag": delivery.tag or None, "subject": delivery.properties.get(SUBJECT_PROPERTY),
        "born_ts": delivery.born_ts, "store_ts": delivery.store_ts}
    try:
        line["body"] = delivery.body.decode("utf-8")
    except UnicodeDecodeError:
        line["body_base64"] = base64.b64encode(delivery.body).decode()
    return line


def _json_line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def close_tails(app: web.Application) -> None:
    """``on_shutdown``: end every open tail so stopping the server does not wait for them."""
    for feed in list(app[TAILS]):
        feed.close()
