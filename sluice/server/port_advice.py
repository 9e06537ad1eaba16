"""What the MQTT and AMQP listeners tell a client of another protocol, by the ports this broker
really opened (``core.wrong_protocol`` logs it)."""

from __future__ import annotations

from collections.abc import Mapping

from core.wrong_protocol import AMQP, HTTP, HTTP2, MQTT, TLS

NO_TLS = "this broker has no {} TLS listener (--tls-cert and --tls-key open one)"


def wrong_port_advice(native_port: int, admin_url: str, mqtt_ports: Mapping[str, int],
                      amqp_port: int | None, amqp_tls_port: int | None
                      ) -> tuple[dict[str, str], dict[str, str]]:
    """(advice on the MQTT ports, advice on the AMQP ports): protocol -> where to go instead.
    ``mqtt_ports`` maps ``tcp``, ``ws``, ``tls``, ``wss`` to the ports open; a None AMQP port
    is a listener that is off."""
    common = {HTTP2: f"use port {native_port} (native gRPC)",
              HTTP: f"the admin API is at {admin_url}"}
    mqtt = dict(common)
    if "ws" in mqtt_ports:
        mqtt[HTTP] += f", MQTT over WebSocket on port {mqtt_ports['ws']}"
    if amqp_port is not None:
        mqtt[AMQP] = f"use port {amqp_port} (AMQP)"
    mqtt[TLS] = (f"use port {mqtt_ports['tls']} (MQTT over TLS)" if "tls" in mqtt_ports
                 else NO_TLS.format("MQTT"))
    amqp = dict(common)
    if "tcp" in mqtt_ports:
        amqp[MQTT] = f"use port {mqtt_ports['tcp']} (MQTT)"
    amqp[TLS] = (f"use port {amqp_tls_port} (AMQP over TLS)" if amqp_tls_port is not None
                 else NO_TLS.format("AMQP"))
    return mqtt, amqp
