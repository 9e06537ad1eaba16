"""CloudEvents 1.0 over HTTP as the ingress reads them: binary, structured and batched mode.

Sans-IO: request headers and body in, neutral ``core.cloudevents.CloudEvent`` values out, or
``BadEvent`` saying what to fix. The mode follows the HTTP binding: ``Content-Type:
application/cloudevents+json`` is one structured event, ``application/cloudevents-batch+json``
a JSON array of them, and otherwise ``ce-`` headers carry the attributes (binary mode; the body
is the data, ``Content-Type`` its ``datacontenttype``). Header values are percent-decoded as
the binding says.

The official SDK's v1 event (``cloudevents.core.v1.event.CloudEvent``) checks attribute types,
``time`` and extension names; the checks it leaves out (it fills in a missing ``id`` and
``specversion`` itself) come first. The data stays the bytes that arrived (binary mode) or the
bytes the JSON event format gives (structured: ``data`` as JSON or text, ``data_base64``).
Nothing here raises anything but ``BadEvent`` on hostile input.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import unquote

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent as SdkEvent
from dateutil.parser import isoparse

from core.cloudevents import (BATCH_TYPE, MAX_ATTRIBUTES, REQUIRED, SPECVERSION, STRUCTURED_TYPE,
                              CloudEvent, from_envelope, is_attribute_name)
from core.untrusted import clip

from .errors import HttpProblem

MAX_BATCH_EVENTS: Final = 1000
"""Events one batched request may carry."""
HEADER_PREFIX: Final = "ce-"
BINARY, STRUCTURED, BATCH = "binary", "structured", "batch"
MODES: Final = (BINARY, STRUCTURED, BATCH)
MODES_HELP: Final = (
    "send a CloudEvent in binary mode (the attributes as ce-id, ce-source, ce-specversion: 1.0 "
    "and ce-type headers, the data as the body with its Content-Type) or in structured mode "
    f"(one JSON event with Content-Type: {STRUCTURED_TYPE}, or a JSON array of them with "
    f"Content-Type: {BATCH_TYPE})")


class BadEvent(HttpProblem):
    """A request that holds no valid event: HTTP status, error code and what to fix."""


def _invalid(message: str) -> BadEvent:
    return BadEvent(400, "invalid_cloudevent", message)


def mode_of(headers: Mapping[str, str]) -> str:
    """The request's content mode (BINARY, STRUCTURED or BATCH); BadEvent when it is none."""
    media = headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if media == STRUCTURED_TYPE:
        return STRUCTURED
    if media == BATCH_TYPE:
        return BATCH
    if media.startswith("application/cloudevents"):
        raise BadEvent(415, "unsupported_event_format",
                       f"event format {clip(media)} is not supported: the ingress reads the "
                       f"JSON event format only ({STRUCTURED_TYPE} or {BATCH_TYPE})")
    if any(name.lower().startswith(HEADER_PREFIX) for name in headers):
        return BINARY
    raise BadEvent(400, "not_a_cloudevent", f"this request is no CloudEvent: {MODES_HELP}")


def parse(mode: str, headers: Iterable[tuple[str, str]], body: bytes) -> list[CloudEvent]:
    """The events of a request in ``mode`` (``mode_of``) with ``headers`` (name, value pairs,
    names repeated as sent) and ``body``."""
    if mode == BINARY:
        return [binary(headers, body)]
    document = _json(body)
    if mode == STRUCTURED:
        return [structured(document)]
    if not isinstance(document, list):
        raise _invalid(f"a {BATCH_TYPE} body must be a JSON array of events, not "
                       f"{_json_kind(document)}")
    if not document:
        raise _invalid("the batch is empty: send at least one event")
    if len(document) > MAX_BATCH_EVENTS:
        raise BadEvent(413, "too_many_events", f"the batch holds {len(document)} events; send "
                       f"at most {MAX_BATCH_EVENTS} per request")
    events = []
    for number, envelope in enumerate(document):
        try:
            events.append(structured(envelope))
        except BadEvent as error:
            raise BadEvent(error.status, error.code, f"event {number} of the batch: {error}") from None
    return events


def binary(headers: Iterable[tuple[str, str]], body: bytes) -> CloudEvent:
    """The event of a binary-mode request: ``ce-`` headers, Content-Type and the body as data."""
    attributes: dict[str, str] = {}
    content_type = None
    for name, value in headers:
        lower = name.lower()
        if lower == "content-type":
            content_type = value
        if not lower.startswith(HEADER_PREFIX):
            continue
        attribute = lower[len(HEADER_PREFIX):]
        if not is_attribute_name(attribute):
            raise _invalid(f"header {clip(name)} names no valid attribute: attribute names "
                           "are 1-20 lower-case letters and digits")
        if attribute == "datacontenttype":
            raise _invalid("binary mode takes the data's content type as the Content-Type "
                           "header, not as ce-datacontenttype")
        if attribute in attributes:
            raise _invalid(f"header {clip(name)} appears twice: send each attribute once")
        try:
            attributes[attribute] = _text(attribute, unquote(value, errors="strict"))
        except UnicodeDecodeError:
            raise _invalid(f"header {clip(name)} is not UTF-8 once percent-decoded") from None
    if content_type is not None:
        attributes["datacontenttype"] = _text("datacontenttype", content_type)
    return CloudEvent(_checked(attributes), body)


def structured(envelope: Any) -> CloudEvent:
    """The event of one decoded JSON event object (the JSON event format)."""
    if not isinstance(envelope, dict):
        raise _invalid(f"an event must be a JSON object, not {_json_kind(envelope)}")
    if "data" in envelope and "data_base64" in envelope:
        raise _invalid("an event holds data or data_base64, not both")
    attributes: dict[str, str] = {}
    for name, value in envelope.items():
        if name in ("data", "data_base64") or value is None:
            continue
        if not is_attribute_name(name):
            raise _invalid(f"{clip(name)} is no valid attribute name: attribute names are "
                           "1-20 lower-case letters and digits")
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, int):
            value = str(value)
        elif not isinstance(value, str):
            raise _invalid(f"attribute {name!r} must be a string, integer or boolean, not "
                           f"{_json_kind(value)}")
        attributes[name] = _text(name, value)
    _checked(attributes)
    encoded = envelope.get("data_base64")
    if encoded is not None:
        try:
            base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError, TypeError):
            raise _invalid("data_base64 is not valid base64") from None
    event = from_envelope(envelope)
    if event is None:  # only what the checks above refuse makes this None
        raise _invalid("the event is not valid in the JSON event format")
    return CloudEvent(event.attributes, event.data)


def _checked(attributes: dict[str, str]) -> dict[str, str]:
    """``attributes`` if they form a valid CloudEvents 1.0 context, else BadEvent naming the
    first problem."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise _invalid(f"the event has {len(attributes)} attributes; at most {MAX_ATTRIBUTES} "
                       "are taken")
    missing = [name for name in REQUIRED if not attributes.get(name)]
    if missing:
        raise _invalid(f"required attribute(s) missing or empty: {', '.join(missing)} (every "
                       "event has id, source, specversion and type)")
    if attributes["specversion"] != SPECVERSION:
        raise _invalid(f"specversion {clip(attributes['specversion'])} is not supported: "
                       f"send specversion {SPECVERSION}")
    typed: dict[str, Any] = dict(attributes)
    if "time" in typed:
        try:
            typed["time"] = isoparse(typed["time"])
        except (ValueError, OverflowError):
            raise _invalid(f"time {clip(attributes['time'])} is not an RFC 3339 timestamp "
                           "(e.g. 2024-05-01T12:00:00Z)") from None
    try:
        SdkEvent(typed)
    except BaseCloudEventException as error:
        raise _invalid(f"the event is not valid: {str(error)[:500]}") from None
    return attributes


def _text(name: str, value: str) -> str:
    """``value`` if it is text an attribute may hold (no control characters, no surrogates)."""
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise _invalid(f"attribute {name!r} holds control characters or invalid Unicode")
    return value


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise _invalid("the body is not UTF-8 JSON") from None
    except ValueError as error:
        raise _invalid(f"the body is not JSON ({str(error)[:200]})") from None
    except RecursionError:
        raise _invalid("the body nests arrays or objects too deeply") from None


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")
