"""Field-table values become JSON-safe before core stores them as JSON."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal

from protocols.amqp.arguments import BYTES_MARKER, json_safe, json_safe_table


def test_every_field_value_type_becomes_json():
    table = {"text": "é", "utf8": b"abc", "binary": bytearray(b"\xff\x00"),
             "decimal": Decimal("1.50"), "when": datetime(2024, 1, 2, tzinfo=timezone.utc),
             "naive": datetime(1970, 1, 1, 0, 0, 1), "nested": {"list": [b"x", Decimal("2")]},
             "plain": [1, 2.5, True, None]}
    safe = json_safe_table(table)
    assert json.loads(json.dumps(safe)) == safe
    assert safe == {"text": "é", "utf8": "abc", "binary": {BYTES_MARKER: "/wA="},
                    "decimal": "1.50", "when": 1704153600000, "naive": 1000,
                    "nested": {"list": ["x", "2"]}, "plain": [1, 2.5, True, None]}


def test_none_is_an_empty_table_and_unknown_values_become_text():
    assert json_safe_table(None) == {}
    assert json_safe(object) == str(object)
