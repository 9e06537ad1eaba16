"""Naming a client of another protocol from its first bytes (``core.wrong_protocol``)."""
from __future__ import annotations

import logging

import pytest

from core.untrusted import DenialLog
from core.wrong_protocol import AMQP, HTTP, HTTP2, MQTT, TLS, WrongProtocol, greeting_protocol

MQTT_311_CONNECT = b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd"
MQTT_31_CONNECT = b"\x10\x12\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x04abcd"
MQTT_CONNECT_LONG = b"\x10\xc8\x01\x00\x04MQTT\x05"  # a two-byte remaining length (200)


@pytest.mark.parametrize(("first", "protocol"), [
    (b"AMQP\x00\x00\x09\x01", AMQP),
    (b"AMQP\x01\x01\x00\x0a", AMQP),            # a 0-10 or 1.0 client, AMQP still
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HTTP2),  # what a gRPC client sends first
    (b"GET /health HTTP/1.1\r\n", HTTP),
    (b"POST /topics HTTP/1.1\r\n", HTTP),
    (b"\x16\x03\x01\x02\x00\x01", TLS),           # a ClientHello
    (MQTT_311_CONNECT, MQTT),
    (MQTT_31_CONNECT, MQTT),
    (MQTT_CONNECT_LONG, MQTT),
])
def test_greetings_are_recognised(first, protocol):
    assert greeting_protocol(first) == protocol


@pytest.mark.parametrize("first", [
    b"", b"A", b"AMQ", b"GET", b"\x10", b"\x10\x10\x00\x04MQ", b"\x10\xff\xff\xff\xff\x00\x04MQTT",
    b"\x30\x05\x00\x01a", b"\x00\x00\x00\x00", b"get / http/1.1",
])
def test_anything_else_is_not_named(first):
    assert greeting_protocol(first) is None


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def logged() -> list[str]:
    logger = logging.getLogger("test.wrong_protocol")
    logger.setLevel(logging.INFO)
    lines = Lines()
    logger.addHandler(lines)
    yield lines.messages
    logger.removeHandler(lines)


def watcher(logged: list[str], clock: list[float], advice: dict[str, str]) -> WrongProtocol:
    denials = DenialLog(logging.getLogger("test.wrong_protocol"), clock=lambda: clock[0])
    return WrongProtocol(MQTT, denials, advice)


def test_another_protocol_is_named_with_its_advice(logged):
    watch = watcher(logged, [0.0], {AMQP: "use port 5672 (AMQP)"})
    assert watch.caught(b"AMQP\x00\x00\x09\x01", "10.0.0.7:40001", 1883)
    assert logged == ["An AMQP client (10.0.0.7:40001) connected to the MQTT port 1883; use "
                      "port 5672 (AMQP)"]


def test_the_ports_own_protocol_and_unknown_bytes_pass(logged):
    watch = watcher(logged, [0.0], {})
    assert not watch.caught(MQTT_311_CONNECT, "10.0.0.7:40001", 1883)
    assert not watch.caught(b"\x00garbage", "10.0.0.7:40002", 1883)
    assert logged == []


def test_a_protocol_without_advice_is_still_named(logged):
    watch = watcher(logged, [0.0], {})
    assert watch.caught(b"GET / HTTP/1.1\r\n", "::1:40001", 1883)
    assert logged == ["An HTTP client (::1:40001) connected to the MQTT port 1883"]


def test_one_line_per_peer_and_protocol_a_minute(logged):
    clock = [0.0]
    watch = watcher(logged, clock, {AMQP: "use port 5672 (AMQP)"})
    for port in range(40_000, 40_050):
        assert watch.caught(b"AMQP\x00\x00\x09\x01", f"10.0.0.7:{port}", 1883)
    watch.caught(b"\x16\x03\x01", "10.0.0.7:41000", 1883)      # another mistake: its own line
    watch.caught(b"AMQP\x00\x00\x09\x01", "10.0.0.8:40000", 1883)  # another peer: its own line
    assert len(logged) == 3
    clock[0] = 61.0
    watch.caught(b"AMQP\x00\x00\x09\x01", "10.0.0.7:42000", 1883)
    assert "49 more refusals of wrong-protocol AMQP for '10.0.0.7'" in logged[3]
    assert logged[4].startswith("An AMQP client (10.0.0.7:42000)")
