"""Stored messages with hostile properties become AMQP deliveries without raising, in bounded
work.

An older version let a native producer store any ``amqp.*`` property; a decimal with a huge
exponent froze the loop in pamqp's encoder, and NaN, deep nesting, an integer past 64 bits or a
lone surrogate made the content header fail to marshal, which closed every consumer of the
queue with 541. ``to_properties``/``properties_payload`` must turn each such message into a
content header that marshals and decodes, the bad value dropped and the rest kept.
"""
from __future__ import annotations

import json
import logging
import struct
from decimal import Decimal

import pamqp.encode
import pytest
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from core.untrusted import DenialLog
from protocols.amqp import mapping
from protocols.amqp.field_values import (MAX_DECIMAL_SCALE, MAX_DEPTH, MAX_ENTRIES, Conversion,
                                         field_table)
from protocols.amqp.mapping import origin, properties_payload, to_properties
from protocols.amqp.mapping import to_outgoing as amqp_outgoing
from protocols.amqp.properties import FieldError, FieldReader

AMQP = {"amqp.exchange": "amq.topic", "amqp.routing_key": "devices.d1"}


def delivered_headers(stored: dict[str, str], born_ms: int = 0) -> Basic.Properties:
    """The properties a consumer decodes from the content header sent for ``stored``."""
    header = ContentHeader()
    header.unmarshal(struct.pack(">HxxQ", Basic.frame_id, 1) + properties_payload(stored, born_ms))
    return header.properties


def with_headers(raw: str) -> dict[str, str]:
    return {**AMQP, "amqp.headers": raw}


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"t": value}
    return value


POISON_HEADERS = {
    "decimal bomb": {"x": {"$decimal": "1e400000"}},
    "decimal bomb, larger": {"x": {"$decimal": "1e999999999999999999"}},
    "tiny decimal": {"x": {"$decimal": "1e-400000"}},
    "decimal NaN": {"x": {"$decimal": "NaN"}},
    "decimal sNaN": {"x": {"$decimal": "-sNaN"}},
    "decimal Infinity": {"x": {"$decimal": "Infinity"}},
    "decimal mantissa past 32 bits": {"x": {"$decimal": "4294967295"}},
    "decimal scale past 255": {"x": {"$decimal": "1E-256"}},
    "decimal digits": {"x": {"$decimal": "1" * 5000}},
    "decimal not a number": {"x": {"$decimal": "one"}},
    "float past single precision": {"x": 1e300},
    "float NaN (pika reads floats as integers)": {"x": float("nan")},
    "float Infinity": {"x": float("-inf")},
    "integer past 64 bits": {"x": 1 << 64},
    "lone surrogate value": {"x": "\ud800"},
    "lone surrogate name": {"\udfff": "v"},
    "name past 128 bytes": {"n" * 129: "v"},
    "time before the epoch": {"x": {"$time": -1}},
    "time past 2106": {"x": {"$time": 1 << 40}},
    "time not a number": {"x": {"$time": "soon"}},
    "bytes not base64": {"x": {"$bytes": "!!"}},
    "600 levels of tables": {"x": nested(600)},
    "600 levels of arrays": {"x": json.loads("[" * 600 + "]" * 600)},
    "a malformed tag": {"x": {"$table": 5}},
}


@pytest.mark.parametrize("poison", POISON_HEADERS.values(), ids=POISON_HEADERS)
def test_a_header_amqp_cannot_carry_is_dropped_and_the_rest_delivered(poison):
    got = delivered_headers(with_headers(json.dumps({**poison, "ok": "kept"})))
    assert got.headers is not None and got.headers["ok"] == "kept"
    for name in poison:
        assert name not in got.headers or name == "x" and got.headers["x"] != poison["x"]


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", '"text"', "{" * 5000, "[" * 50_000,
                                 json.dumps({"x": "v" * 70_000})])
def test_headers_that_are_not_a_table_are_left_out(raw):
    got = delivered_headers(with_headers(raw))
    assert not got.headers


POISON_FIELDS = [
    ("amqp.delivery_mode", "7"), ("amqp.delivery_mode", "x"), ("amqp.priority", "999"),
    ("amqp.priority", "9" * 5000), ("amqp.timestamp", str(1 << 62)), ("amqp.timestamp", "-5"),
    ("amqp.content_type", "é" * 200), ("amqp.user_id", "ü" * 300), ("amqp.type", "x" * 300),
    ("amqp.expiration", "9" * 400), ("amqp.reply_to", "a" * 1000),
]


@pytest.mark.parametrize("name, value", POISON_FIELDS, ids=[f"{n}={v[:8]}" for n, v in POISON_FIELDS])
def test_a_property_amqp_cannot_carry_is_cut_or_left_out(name, value):
    got = delivered_headers({**AMQP, name: value})
    field = {"amqp.type": "message_type"}.get(name, name.removeprefix("amqp."))
    carried = getattr(got, field)
    assert carried is None or len(str(carried).encode()) <= 255


def test_exchange_and_routing_key_are_short_strings_whatever_was_stored():
    exchange, key = origin("t", {"amqp.exchange": "é" * 200, "amqp.routing_key": "k" * 300})
    assert len(exchange.encode()) <= 255 and len(key.encode()) == 255


def test_a_publish_time_past_year_9999_is_left_out():
    got = delivered_headers({"sluice.subject": "devices/n1", "site": "oslo"}, born_ms=1 << 62)
    assert got.timestamp is None and got.headers == {"site": "oslo"}


def test_user_properties_amqp_cannot_carry_are_dropped():
    stored = {"mqtt.qos": "1", "mqtt.user_properties": json.dumps(
        [["ok", "v"], ["bad", "\ud800"], ["\ud800", "v"]])}
    assert delivered_headers(stored).headers == {"ok": "v", "x-mqtt-publish-qos": 1}


def test_a_dropped_header_is_logged_once_per_reason(caplog, monkeypatch):
    monkeypatch.setattr(mapping, "_dropped", DenialLog(mapping.log, interval_s=300.0))
    with caplog.at_level(logging.INFO, "protocols.amqp.mapping"):
        for seq in range(5):  # five messages, one reason: one line
            to_properties(with_headers(json.dumps({"x": {"$decimal": "NaN"}, "seq": seq})))
    lines = [r.getMessage() for r in caplog.records if "cannot carry" in r.getMessage()]
    assert len(lines) == 1 and "'x'" in lines[0]


# ----------------------------------------------------------------------------- cost


def worst_allowed_table() -> dict:
    """As many values as allowed, nested as deep as allowed, with the largest decimals."""
    deep = {"leaf": {"$decimal": f"-2147483648E-{MAX_DECIMAL_SCALE}"}}
    for _ in range(MAX_DEPTH - 2):
        deep = {"t": deep}
    table = {"deep": deep, "bomb": {"$decimal": "1E+400000"}}
    table.update({f"d{i}": {"$decimal": "2147483647E+0"} for i in range(MAX_ENTRIES)})
    return table


def test_converting_the_worst_table_does_bounded_work(monkeypatch):
    """Values looked at, pamqp encoder calls and decimal sizes are counted: none grows past
    the bounds, whatever the stored table holds."""
    calls = {"values": 0}
    decimals: list[Decimal] = []
    encode_value, encode_decimal = pamqp.encode.encode_table_value, pamqp.encode.decimal

    def counting_value(value):
        calls["values"] += 1
        return encode_value(value)

    def recording_decimal(value):
        decimals.append(value)
        return encode_decimal(value)

    monkeypatch.setattr(pamqp.encode, "encode_table_value", counting_value)
    monkeypatch.setattr(pamqp.encode, "decimal", recording_decimal)
    worst = worst_allowed_table()
    conversion = Conversion()
    table = field_table(json.loads(json.dumps(worst)), conversion)
    assert conversion.visited <= MAX_ENTRIES
    assert conversion.dropped >= 2  # the bomb, and what lies past the entry limit
    payload = Basic.Properties(headers=table).marshal()
    assert calls["values"] <= MAX_ENTRIES
    assert decimals and all(-MAX_DECIMAL_SCALE <= d.as_tuple().exponent <= 9
                            and len(d.as_tuple().digits) <= 10 for d in decimals)
    assert len(payload) < 64 * MAX_ENTRIES


def test_the_deepest_allowed_table_is_kept_whole_and_one_level_more_is_dropped():
    kept = field_table({"x": nested(MAX_DEPTH - 1)})
    assert json.dumps(kept).count("leaf") == 1
    conversion = Conversion()
    cut = field_table({"x": nested(MAX_DEPTH)}, conversion)
    assert conversion.first_drop == ("x", f"tables or arrays nested deeper than {MAX_DEPTH}")
    assert "leaf" not in json.dumps(cut)


def test_the_largest_table_a_publisher_may_send_is_delivered_whole():
    """What the inbound decoder accepts (``protocols.amqp.properties``: depth and values) the
    delivery keeps, so the two bounds are one."""
    table = {"x": nested(MAX_DEPTH - 1), "wide": list(range(MAX_ENTRIES - MAX_DEPTH - 1))}
    raw = pamqp.encode.field_table(table)
    accepted, _ = FieldReader(raw).table(0, len(raw))
    with pytest.raises(FieldError):  # one more value, or one more level, is refused
        wider = pamqp.encode.field_table({**table, "one more": 1})
        FieldReader(wider).table(0, len(wider))
    with pytest.raises(FieldError):
        deeper = pamqp.encode.field_table({**table, "x": nested(MAX_DEPTH)})
        FieldReader(deeper).table(0, len(deeper))
    stored = dict(amqp_outgoing("devices", "devices/d1", "amq.topic", "devices.d1",
                                Basic.Properties(headers=accepted), b"p", ()).properties)
    conversion = Conversion()
    assert field_table(json.loads(stored["amqp.headers"]), conversion) == accepted
    assert conversion.dropped == 0 and delivered_headers(stored).headers == accepted
