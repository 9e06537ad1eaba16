"""A stored message as the HTTP request a push subscription sends: CloudEvents binary or
structured mode, or the raw body, plus the Standard Webhooks signature headers.

The event of a message is recognised by its writer (``core.cloudevents``); a message that is
not an event gets a synthesized one (id: the message id, source ``/sluice/topics/<topic>``,
type ``sluice.message``, subject and store time). The webhook id is the event id, the same on
every attempt, so receivers can drop repeats.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from core import cloudevents
from core.cloudevents import CloudEvent
from core.interop import AMQP_EXCHANGE, common, namespace_of
from core.model import SUBJECT_PROPERTY, Delivery

SYNTHESIZED_TYPE = "sluice.message"
_CE_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
"""Printable ASCII but space, double quote and percent: left as is in ``ce-`` headers (HTTP
binding 3.1.3.2); everything else is percent-encoded."""
_SAFE = re.compile(r"[!#-$&-~]*")
"""A value made of ``_CE_SAFE`` characters only, sent as it is (most are)."""


@dataclass(frozen=True, slots=True)
class Rendered:
    """What one POST carries, the signature headers aside."""

    event_id: str
    headers: dict[str, str]
    body: bytes


def event_of(properties: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The CloudEvent a stored message is, recognised by the protocol that wrote it."""
    finder: Callable[[Mapping[str, str], bytes], CloudEvent | None] | None = getattr(
        cloudevents, "event_of", None)
    if finder is not None:
        return finder(properties, body)
    if AMQP_EXCHANGE in properties:
        found = common(properties, 0)
        return cloudevents.from_amqp_headers(found.user_properties, found.content_type, body)
    if any(namespace_of(name) == "mqtt" for name in properties):
        found = common(properties, 0)
        return cloudevents.from_user_properties(found.user_properties, found.content_type, body)
    return cloudevents.from_native(properties, body)


def synthesized(message: Delivery) -> CloudEvent:
    """The event a plain message is pushed as."""
    topic = message.home_topic or message.topic
    attributes = {"id": message.msg_id, "source": f"/sluice/topics/{topic}",
                  "specversion": cloudevents.SPECVERSION, "type": SYNTHESIZED_TYPE,
                  "subject": message.properties.get(SUBJECT_PROPERTY) or topic,
                  "time": rfc3339(message.store_ts)}
    content_type = common(message.properties, message.born_ts).content_type
    if content_type:
        attributes["datacontenttype"] = content_type
    return CloudEvent(attributes, message.body)


def rfc3339(ms: int) -> str:
    """Milliseconds since the epoch as an RFC 3339 UTC time."""
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def render(message: Delivery, event: CloudEvent | None, mode: str,
           transform: Callable[[bytes], bytes] | None = None) -> Rendered:
    """The request for ``message`` (``event``: its recognised event, None for a plain one) in
    ``mode`` (binary, structured or raw); ``transform`` rewrites the data first."""
    if mode == "raw":
        body = message.body if event is None or event.structured else event.data
        if transform is not None:
            body = transform(body)
        content_type = (event.content_type if event is not None else
                        common(message.properties, message.born_ts).content_type)
        headers = {"Content-Type": content_type or "application/octet-stream"}
        return Rendered(event.id if event is not None else message.msg_id, headers, body)
    if event is None:
        event = synthesized(message)
    if transform is not None:
        attributes = dict(event.attributes)
        attributes["datacontenttype"] = "application/json"
        event = CloudEvent(attributes, transform(event.data))
    if mode == "structured":
        return Rendered(event.id, {"Content-Type": cloudevents.STRUCTURED_TYPE},
                        cloudevents.to_structured(event))
    headers = {("Content-Type" if name == "datacontenttype" else "ce-" + name):
               (value if name == "datacontenttype" or _SAFE.fullmatch(value)
                else quote(value, safe=_CE_SAFE))
               for name, value in event.attributes.items()}
    return Rendered(event.id, headers, event.data)
