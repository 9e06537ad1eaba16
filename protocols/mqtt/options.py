"""The ``[mqtt]`` settings: listeners and the limits the MQTT front end enforces and advertises."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MqttOptions:
    """MQTT listeners and limits. TLS and WSS listen only when a certificate is configured
    (``[tls]`` cert and key); any port set to -1 is not opened (0 picks a free port)."""

    host: str = "127.0.0.1"
    """Address the MQTT listeners bind."""
    port: int = 1883
    """MQTT over TCP."""
    ws_port: int = 8083
    """MQTT over WebSocket (subprotocol ``mqtt``)."""
    ws_path: str = "/mqtt"
    """HTTP path of the WebSocket listeners."""
    tls_port: int = 8883
    """MQTT over TLS; opened only with ``tls_cert`` and ``tls_key``."""
    wss_port: int = 8084
    """MQTT over secure WebSocket; opened only with ``tls_cert`` and ``tls_key``."""
    tls_cert: str | None = None
    """Deprecated: write ``tls.cert`` (it serves every TLS listener); still read as it."""
    tls_key: str | None = None
    """Deprecated: write ``tls.key``; still read as it."""
    max_packet_size: int = 4 << 20
    """Largest packet accepted (and advertised in MQTT 5 CONNACK)."""
    receive_maximum: int = 1024
    """Unacknowledged QoS 1/2 PUBLISHes a client may have towards us."""
    max_inflight_messages: int = 1000
    """Unacknowledged QoS 1/2 PUBLISHes we send a client at once (fewer if its Receive Maximum
    says so)."""
    topic_alias_maximum: int = 64
    """Topic aliases an MQTT 5 client may set up (advertised in CONNACK)."""
    max_keep_alive_s: int = 0
    """When > 0, a longer (or no) keep alive asked by an MQTT 5 client is lowered to this and
    announced as Server Keep Alive."""
    max_session_expiry_s: int = 0xFFFFFFFF
    """Caps the session expiry interval clients ask for (0xFFFFFFFF: never expires)."""
    max_queued_messages: int = 10_000
    """QoS 1/2 messages a connected non-persistent session holds beyond its in-flight window;
    more are dropped and logged. Persistent sessions read from their stored queue instead."""
    max_buffered_bytes: int = 4 << 20
    """A client whose unsent data exceeds this is slow: QoS 0 messages to it are dropped and
    stored messages wait, so one stalled client never stalls the others."""
    shared_invisible_ms: int = 60_000
    """How long a message popped for one shared-subscription member stays reserved for it
    before another member may get it."""
    # --- limits on what a peer can make the broker hold (SECURITY.md) ---
    connect_timeout_s: float = 10.0
    """A connection that has not sent a whole CONNECT within this many seconds is closed."""
    max_pending_connections: int = 1024
    """Connections accepted but not yet answered with a CONNACK; more are closed at once."""
    max_connections: int = 0
    """Open MQTT connections at once (every listener); 0: the process's descriptor limit less
    a reserve for the store and the other listeners."""
    max_connect_packet_size: int = 64 << 10
    """Largest packet accepted before a CONNECT is authenticated (the CONNECT itself, with its
    will); raise it for large will payloads."""
    max_client_id_length: int = 256
    """Longest client identifier accepted, in UTF-8 bytes (CONNACK 0x85 beyond)."""
    max_topic_length: int = 4096
    """Longest topic name or filter accepted, in UTF-8 bytes."""
    max_topic_levels: int = 128
    """Most levels a topic name or filter may have."""
    max_user_properties: int = 128
    """Most MQTT 5 user properties one packet may carry."""
    max_subscriptions: int = 1000
    """Most subscriptions one session may hold; SUBACK 0x97 (3.1.1: 0x80) beyond."""
    max_retained_messages: int = 100_000
    """Most retained messages kept; a retained PUBLISH for a new topic beyond is refused
    (MQTT 5 PUBACK 0x97) and not stored."""
    max_retained_bytes: int = 256 << 20
    """Most payload bytes of retained messages kept; beyond, as ``max_retained_messages``."""
    topic_map: str = ""
    """Which native topic stores an MQTT topic: comma-separated ``FILTER=TOPIC`` rules, the first
    matching filter wins (``+/telemetry=telemetry`` stores ``d1/telemetry``, ``d2/telemetry``,
    ... in one topic ``telemetry``); a topic no rule matches goes to the topic its first level
    names. Subscribing needs the subscribe right on every topic a filter can reach."""
    ws_allowed_origins: str = ""
    """Comma-separated Origins (``https://app.example.com``) whose browser pages may open MQTT
    WebSocket connections, besides same-origin pages and clients that send no Origin; ``*``
    allows any."""
