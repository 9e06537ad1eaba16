"""AMQP field-table values made JSON-safe, so core can store exchange, queue and binding
arguments as JSON: text stays, bytes become text when they are UTF-8 and otherwise a
``{"$base64": ...}`` marker, decimals become their text, timestamps epoch milliseconds."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

BYTES_MARKER = "$base64"
"""The key of the one-entry object standing for bytes that are not UTF-8."""


def json_safe(value: Any) -> Any:
    """``value`` (a field-table value, table or array) as JSON can hold it; never raises."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return {BYTES_MARKER: base64.b64encode(raw).decode()}
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return str(value)


def json_safe_table(table: Mapping[str, Any] | None) -> dict[str, Any]:
    """A field table (None: empty) with every value `json_safe`."""
    return {str(key): json_safe(value) for key, value in (table or {}).items()}
