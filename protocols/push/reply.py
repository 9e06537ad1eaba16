"""A receiver's answer as a reply event: a 2xx response carrying a CloudEvent, in binary mode
(``ce-`` headers) or structured mode, parsed with the official SDK's HTTP binding."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat

from core.cloudevents import STRUCTURED_TYPE, CloudEvent, is_json, valid_attributes

log = logging.getLogger(__name__)
_FORMAT = JSONFormat()


def reply_event(headers: Mapping[str, str], body: bytes) -> CloudEvent | None:
    """The event a response carries, or None (no event, or not a valid one)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    binary = any(name.startswith("ce-") for name in lowered)
    if not binary and not lowered.get("content-type", "").startswith(STRUCTURED_TYPE):
        return None
    try:
        event = from_http(HTTPMessage(lowered, body), _FORMAT)
    except Exception as error:  # noqa: BLE001 - whatever the SDK refuses is no event
        log.info("a push receiver answered with an invalid CloudEvent (%s); no reply is stored",
                 error)
        return None
    attributes = valid_attributes((name, _text(value))
                                  for name, value in event.get_attributes().items()
                                  if value is not None)
    if attributes is None:
        return None
    return CloudEvent(attributes, _data_bytes(event.get_data(), attributes.get("datacontenttype")))


def _text(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


def _data_bytes(data: Any, content_type: str | None) -> bytes:
    if data is None:
        return b""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str) and not is_json(content_type):
        return data.encode()
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
