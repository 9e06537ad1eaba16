"""``GET /topics/{topic}/tail``: a topic's recent messages, then new ones as they arrive.

The response is newline-delimited JSON that stays open: first every message stored in the last
``minutes`` (all queues), then each new message as soon as it is deliverable, and a heartbeat
line every ``HEARTBEAT_S`` seconds so clients and proxies can tell a quiet topic from a dead
connection. A client that falls more than ``MAX_BUFFERED`` messages behind gets a last line
``{"error": "overflow", ...}`` and the stream ends: reconnecting starts over from history.

The live part is a core listener on the topic's subjects, registered before history is read;
per-queue history ends drop what both parts saw. Lines carry the position (queue, offset),
keys, tag, subject, timestamps and the body as text (``body_base64`` when it is not UTF-8).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import deque
from typing import Any

from aiohttp import web

from core.model import SUBJECT_PROPERTY, Delivery, Principal

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
    broker = deps(request).broker
    topic = request.match_info["topic"]
    config = broker.get_topic(topic)  # NotFound: 404 with the topic's name
    minutes = query_int(request, "minutes", 60)
    if minutes < 0:
        raise HttpProblem(400, "invalid_query", f"minutes must be 0 or more, not {minutes}")
    since_ms = int(time.time() * 1000) - minutes * 60_000
    feed = LiveFeed()
    subjects = f"{topic}/#"
    broker.add_listener(subjects, feed)
    request.app[TAILS].add(feed)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson",
                                           "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        history_end = {}
        for queue_id in range(config.queue_count):
            history_end[queue_id] = await _send_history(broker, principal, topic, queue_id,
                                                        since_ms, response)
        await _send_live(feed, history_end, response)
    except ConnectionResetError:
        pass  # the client went away
    finally:
        broker.remove_listener(subjects, feed)
        request.app[TAILS].discard(feed)
    return response


async def _send_history(broker: Any, principal: Principal, topic: str, queue_id: int,
                        since_ms: int, response: web.StreamResponse) -> int:
    """Write one queue's messages stored since ``since_ms``; return where they end."""
    offset = broker.offset_at(topic, queue_id, since_ms)
    end = broker.offset_at(topic, queue_id, "latest")
    while offset < end:
        pulled = await broker.pull(principal, "$admin-tail", topic, queue_id, offset,
                                   max_messages=min(HISTORY_BATCH, end - offset))
        if not pulled.messages:
            break
        await response.write(_lines(pulled.messages))
        offset = pulled.next_offset
    return end


async def _send_live(feed: LiveFeed, history_end: dict[int, int],
                     response: web.StreamResponse) -> None:
    while not feed.closed:
        if feed.overflowed:
            await response.write(_json_line({
                "error": "overflow", "message": f"more than {MAX_BUFFERED} messages were waiting "
                "for this client; reconnect to start again from history"}))
            return
        if feed.pending:
            fresh = [d for d in feed.pending if d.queue_offset >= history_end.get(d.queue_id, 0)]
            feed.pending.clear()
            if fresh:
                await response.write(_lines(fresh))
            continue
        await feed.wait(HEARTBEAT_S)
        if not feed.pending and not feed.closed:
            await response.write(_json_line({"heartbeat": int(time.time() * 1000)}))


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
