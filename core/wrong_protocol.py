"""Naming a client that connected to another protocol's port, from its first bytes.

A newcomer who points an AMQP client at the MQTT port, a browser or curl at the AMQP port, or a
TLS client at a plain port sees only a closed connection. Each listener knows the first bytes
its own protocol starts with, and every greeting recognised here is already a protocol error
there (an MQTT connection must start with CONNECT, 0x10 and a protocol name; an AMQP connection
with ``AMQP``), so naming it costs nothing and can never turn a valid client away.

Runs on the event loop (it logs through a ``DenialLog``, once per peer host and protocol an
interval).
"""

from __future__ import annotations

from collections.abc import Mapping

from .untrusted import DenialLog

AMQP, HTTP, HTTP2, MQTT, TLS = "AMQP", "HTTP", "HTTP/2", "MQTT", "TLS"

_PREFIXES: tuple[tuple[bytes, str], ...] = (
    (b"AMQP", AMQP),
    (b"PRI * HTTP/2", HTTP2),   # the HTTP/2 connection preface (h2c with prior knowledge)
    *((method + b" ", HTTP) for method in (b"GET", b"POST", b"PUT", b"HEAD", b"DELETE",
                                            b"OPTIONS", b"PATCH", b"CONNECT")),
    (b"\x16\x03", TLS),          # a TLS handshake record: a ClientHello
)
MQTT_NAMES = (b"\x00\x04MQTT", b"\x00\x06MQIsdp")
"""The protocol names of an MQTT 3.1.1/5.0 and an MQTT 3.1 CONNECT."""


def greeting_protocol(first: bytes) -> str | None:
    """The protocol whose client starts a connection with ``first``, if it is one of those
    above; None for anything else (including a greeting cut short by the network)."""
    for prefix, protocol in _PREFIXES:
        if first.startswith(prefix):
            return protocol
    if first[:1] == b"\x10":  # CONNECT, then a remaining length of 1-4 bytes, then the name
        length_bytes = next((i for i in range(1, 5) if i < len(first) and first[i] < 0x80), None)
        if length_bytes is not None and first[length_bytes + 1:].startswith(MQTT_NAMES):
            return MQTT
    return None


def _article(protocol: str) -> str:
    return "an" if protocol[0] in "AEFHILMNORSX" else "a"


class WrongProtocol:
    """Recognises a client of another protocol on a listener of ``protocol`` and logs one
    line that names it and says where to go: ``an AMQP client (127.0.0.1:5555) connected to
    the MQTT port 1883; use port 5672 (AMQP)``.

    ``advice`` maps a protocol to that advice; the composition root fills it once every
    listener is open (until then, and for protocols it does not name, the line just names the
    client's protocol). Runs on the event loop.
    """

    def __init__(self, protocol: str, denials: DenialLog, advice: Mapping[str, str]) -> None:
        self.protocol = protocol
        self._denials = denials
        self._advice = advice

    def caught(self, first: bytes, peer: str, port: int) -> bool:
        """Whether ``first``, the first bytes a connection sent, are another protocol's
        greeting; if so it is logged (once per peer host, protocol and interval) and the
        caller closes the connection without reading more."""
        spoken = greeting_protocol(first)
        if spoken is None or spoken == self.protocol:
            return False
        advice = self._advice.get(spoken)
        self._denials.denied(peer.rpartition(":")[0] or peer, f"wrong-protocol {spoken}",
                             "%s %s client (%s) connected to the %s port %d%s",
                             _article(spoken).capitalize(), spoken, peer, self.protocol, port,
                             f"; {advice}" if advice else "")
        return True
