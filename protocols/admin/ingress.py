"""``POST /events/{topic}``: CloudEvents over HTTP into the log, acknowledged once durable.

The path after ``/events/`` is the subject, ``/``-separated as an MQTT topic: ``/events/evt2/a/b``
and ``/events/evt2%2Fa%2Fb`` both mean subject ``evt2/a/b``, stored in topic ``evt2`` (the
subject's first level, ``Broker.topic_of_subject``), so MQTT subscribers of ``evt2/#`` and AMQP
queues bound to ``amq.topic`` with ``evt2.#`` receive it. A subject is checked as an MQTT
publish topic (no wildcards, no leading ``$``), then the caller's publish right on it, once,
before the body is read; topics are created on first use as MQTT publishes create them.

Each event (one in binary and structured mode, up to ``event_parsing.MAX_BATCH_EVENTS`` in a
batch) is stored as a native send is: its data as the body, its attributes as RocketMQ binding
properties (``core.cloudevents.native_properties``) plus the subject. The answer, ``202`` with
the stored message ids, leaves only once the store made them durable (under ``sync`` flush);
when the store cannot take them the answer is ``503`` and nothing is acknowledged.

Runs on the event loop.
"""

from __future__ import annotations

import time
from typing import Any, Final

from aiohttp import web

from core.cloudevents import CloudEvent, native_properties
from core.errors import AccessDenied, QuotaExceeded, SluiceError, Unavailable
from core.model import SUBJECT_PROPERTY, Action, OutgoingMessage, Principal
from core.subjects import MAX_SUBJECT_LEVELS, SEPARATOR
from core.untrusted import clip

from . import event_parsing
from .errors import HttpProblem, status_for
from .handlers import deps
from .metrics import METRICS

MAX_SUBJECT_BYTES: Final = 4096
"""The longest subject taken, in UTF-8 bytes (MQTT's default ``max_topic_length``)."""
CHUNK_BYTES: Final = 64 * 1024
"""The body is read this much at a time, and never beyond the limit plus one chunk."""


async def post_event(request: web.Request, principal: Principal) -> web.Response:
    """Store the CloudEvent(s) of the request under the subject its path names."""
    mode = "unknown"
    counters = request.app[METRICS].ingress
    try:
        subject = check_subject(request.match_info["topic"])
        broker = deps(request).broker
        if not broker.subject_allowed(principal, Action.PUBLISH, subject):
            raise AccessDenied(
                f"user {principal.user!r} may not publish to {clip(subject)}: that needs the "
                f"publish right on topic {broker.topic_of_subject(subject)!r} (`sluice user "
                f"grant {principal.user} topic {broker.topic_of_subject(subject)} publish`) or "
                "an access rule that allows the subject")
        mode = event_parsing.mode_of(request.headers)
        body = await read_bounded(request, deps(request).events_max_body_bytes)
        events = event_parsing.parse(mode, request.headers.items(), body)
        ids = await _store(broker, subject, events)
    except Exception as error:
        counters.refused(mode, _result_of(error))
        raise
    counters.accepted(mode, len(ids))
    topic = broker.topic_of_subject(subject)
    return web.json_response({"subject": subject, "topic": topic, "ids": ids}, status=202)


def check_subject(subject: str) -> str:
    """``subject`` if an MQTT client could publish to it, else a 400 saying why."""
    def bad(why: str) -> HttpProblem:
        return HttpProblem(400, "invalid_subject", f"subject {clip(subject)} {why}; POST to "
                           "/events/LEVEL/LEVEL/... (e.g. /events/orders/eu/created)")
    if not subject:
        raise bad("is empty")
    if "+" in subject or "#" in subject:
        raise bad("holds a wildcard (+ or #): events are published to one subject")
    if subject.startswith("$"):
        raise bad("starts with $, which names the broker's own topics")
    if "\0" in subject:
        raise bad("holds a NUL character")
    try:
        size = len(subject.encode("utf-8"))
    except UnicodeEncodeError:
        raise bad("is not valid UTF-8") from None
    if size > MAX_SUBJECT_BYTES:
        raise bad(f"is longer than {MAX_SUBJECT_BYTES} bytes")
    if subject.count(SEPARATOR) >= MAX_SUBJECT_LEVELS:
        raise bad(f"has more than {MAX_SUBJECT_LEVELS} levels")
    return subject


async def read_bounded(request: web.Request, limit: int) -> bytes:
    """The request body, read a chunk at a time; 413 once it is longer than ``limit`` bytes."""
    def too_large() -> HttpProblem:
        return HttpProblem(413, "payload_too_large", f"the request body is larger than {limit} "
                           "bytes (admin.events_max_body_bytes); send smaller events, or fewer "
                           "per batch")
    if request.content_length is not None and request.content_length > limit:
        raise too_large()
    body = bytearray()
    async for chunk in request.content.iter_chunked(CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise too_large()
    return bytes(body)


async def _store(broker: Any, subject: str, events: list[CloudEvent]) -> list[str]:
    """Send the events as one batch; their message ids once durable."""
    topic, now = broker.topic_of_subject(subject), int(time.time() * 1000)
    messages = [OutgoingMessage(topic, event.data, born_ts=now,
                                properties={**native_properties(event), SUBJECT_PROPERTY: subject})
                for event in events]
    try:
        results = await broker.send_decided(messages)
    except (QuotaExceeded, Unavailable) as error:
        raise HttpProblem(503, "store_unavailable", f"the events were not stored ({error}); "
                          "nothing was acknowledged: send them again later") from None
    return [result.msg_id for result in results]


RESULTS: Final = {400: "invalid", 401: "unauthenticated", 403: "forbidden", 413: "too_large",
                  415: "invalid", 503: "unavailable"}
"""The ``result`` label of a refused request, by its status (else ``failed``)."""


def _result_of(error: Exception) -> str:
    if isinstance(error, HttpProblem | SluiceError):
        status = status_for(error)[0]
    else:
        status = 500
    return RESULTS.get(status, "failed")
