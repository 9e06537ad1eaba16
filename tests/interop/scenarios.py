"""MQTT client scripts run unchanged against Mosquitto and against Sluice.

Each scenario is a plain function ``(broker, version) -> observation``: it connects paho-mqtt 2
clients (or the ``mosquitto_pub``/``mosquitto_sub`` command-line clients) to ``broker.host``
and ``broker.port`` with ``broker.username``/``broker.password``, does one thing, and returns
what the clients saw as plain comparable data (tuples, lists, dicts of ints, bytes and bools).
Topics in observations are relative to the scenario's own prefix (``it-<uuid>``) so that two
runs, on two brokers, give equal observations; client ids are fresh uuids too.

Waiting is driven by events: CONNACK, SUBACK, UNSUBACK, PUBACK/PUBCOMP and received messages
are awaited with a timeout. Where a scenario must show that something did NOT arrive, it
publishes a *sentinel* afterwards, QoS 1, from a publisher whose earlier publishes were all
acknowledged, and reads until the sentinel: a broker that had routed the unwanted message would
have delivered it first. A scenario never raises on a missing message; it returns what arrived
(a timeout shows up as a short list in the observation, and the test's comparison shows it).

Only two scenarios wait for time itself, because time is what they test: message expiry (the
message must age past its interval) and the will delay interval (the will must be late).
"""
from __future__ import annotations

import queue
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from paho.mqtt.client import CallbackAPIVersion, Client as Paho, MQTTMessage, MQTTv311, MQTTv5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

V311 = MQTTv311
V5 = MQTTv5
TIMEOUT = 5.0
"""Seconds to wait for any one event (CONNACK, SUBACK, a message, the end of a collection)."""
PROPERTY_NAMES = ("PayloadFormatIndicator", "MessageExpiryInterval", "ContentType", "ResponseTopic",
                  "CorrelationData", "UserProperty", "SubscriptionIdentifier")


# ---------------------------------------------------------------------------------------------
# Client plumbing


class Topics:
    """A fresh topic prefix: ``topics("a/b")`` is ``it-<uuid>/a/b``; ``rel`` strips it again."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.prefix = f"it-{self.id}"

    def __call__(self, suffix: str) -> str:
        return f"{self.prefix}/{suffix}"

    def rel(self, topic: str) -> str:
        return topic.replace(self.prefix, "P").replace(self.id, "ID")


@dataclass(frozen=True)
class Message:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    properties: dict[str, Any]


def _properties(props: Properties | None) -> dict[str, Any]:
    if props is None:
        return {}
    found = {name: getattr(props, name) for name in PROPERTY_NAMES if hasattr(props, name)}
    if "SubscriptionIdentifier" in found and not isinstance(found["SubscriptionIdentifier"], list):
        found["SubscriptionIdentifier"] = [found["SubscriptionIdentifier"]]
    return found


def _value(code: Any) -> int:
    return code.value if isinstance(code, ReasonCode) else int(code)


def new_client_id() -> str:
    return f"it-{uuid.uuid4().hex[:16]}"


class Client:
    """One paho-mqtt 2 client on its own network thread, with its events as waitable state.

    paho's automatic reconnect is off: a client that the broker disconnects (takeover) stays
    disconnected, and a dropped one does not come back.
    """

    def __init__(self, broker: Any, version: int, client_id: str | None = None, *, clean: bool = True,
                 session_expiry: int | None = None, will: tuple | None = None,
                 will_properties: Properties | None = None) -> None:
        self.broker, self.version = broker, version
        self.id = client_id or new_client_id()
        self.clean, self.session_expiry = clean, session_expiry
        self.paho = Paho(CallbackAPIVersion.VERSION2, client_id=self.id, protocol=version,
                         clean_session=clean if version != V5 else None, reconnect_on_failure=False)
        self.paho.username_pw_set(broker.username, broker.password)
        if will is not None:
            topic, payload, qos, retain = will
            self.paho.will_set(topic, payload, qos, retain, properties=will_properties)
        self.messages: queue.Queue[Message] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.connack: tuple[int, bool, dict[str, Any]] | None = None
        self.disconnect_reason: int | None = None
        self.disconnect_from_server: bool | None = None
        self._acks: dict[int, Any] = {}
        self._acked = threading.Condition()
        self.paho.on_connect = self._on_connect
        self.paho.on_disconnect = self._on_disconnect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_ack
        self.paho.on_unsubscribe = self._on_ack

    # paho callbacks (network thread)
    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        props = {}
        if properties is not None:
            props = {name: getattr(properties, name) for name in
                     ("TopicAliasMaximum", "RetainAvailable", "SharedSubscriptionAvailable",
                      "SubscriptionIdentifierAvailable", "WildcardSubscriptionAvailable",
                      "AssignedClientIdentifier", "SessionExpiryInterval") if hasattr(properties, name)}
        self.connack = (_value(reason_code), bool(flags.session_present), props)
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnect_reason = _value(reason_code)
        self.disconnect_from_server = bool(flags.is_disconnect_packet_from_server)
        self.disconnected.set()

    def _on_message(self, client, userdata, message: MQTTMessage) -> None:
        self.messages.put(Message(message.topic, message.payload, message.qos, bool(message.retain),
                                  _properties(getattr(message, "properties", None))))

    def _on_ack(self, client, userdata, mid, reason_codes, properties) -> None:
        codes = reason_codes if isinstance(reason_codes, list) else [reason_codes]
        with self._acked:
            self._acks[mid] = [_value(code) for code in codes]
            self._acked.notify_all()

    def _wait_ack(self, mid: int) -> list[int]:
        with self._acked:
            if not self._acked.wait_for(lambda: mid in self._acks, TIMEOUT):
                raise AssertionError(f"{self.broker.kind}: no SUBACK/UNSUBACK for mid {mid} in {TIMEOUT}s")
            return self._acks.pop(mid)

    # actions (test thread)
    def connect(self) -> Client:
        """Connect and wait for CONNACK; ``self.connack`` is (reason code, session present, props)."""
        kwargs: dict[str, Any] = {}
        if self.version == V5:
            props = Properties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            kwargs = {"clean_start": self.clean, "properties": None if props.isEmpty() else props}
        self.paho.connect(self.broker.host, self.broker.port, keepalive=30, **kwargs)
        self.paho.loop_start()
        if not self.connected.wait(TIMEOUT):
            raise AssertionError(f"{self.broker.kind}: no CONNACK for {self.id} in {TIMEOUT}s")
        if self.connack[0] != 0:
            raise AssertionError(f"{self.broker.kind}: CONNACK refused {self.id}: {self.connack}")
        return self

    @property
    def session_present(self) -> bool:
        return self.connack[1]

    def subscribe(self, *filters: tuple[str, Any], properties: Properties | None = None) -> list[int]:
        """Subscribe to (filter, qos or SubscribeOptions) pairs; the SUBACK's reason codes."""
        result, mid = self.paho.subscribe(list(filters), properties=properties)
        assert result == 0, f"subscribe not sent: {result}"
        return self._wait_ack(mid)

    def unsubscribe(self, *filters: str) -> list[int]:
        """Unsubscribe; the UNSUBACK's reason codes (MQTT 5) or [] (3.1.1, which has none)."""
        result, mid = self.paho.unsubscribe(list(filters))
        assert result == 0, f"unsubscribe not sent: {result}"
        codes = self._wait_ack(mid)
        return codes if self.version == V5 else []

    def publish(self, topic: str, payload: bytes | str = b"", qos: int = 0, retain: bool = False,
                properties: Properties | None = None) -> None:
        """Publish and wait until it is sent (QoS 0) or acknowledged (PUBACK, PUBCOMP)."""
        info = self.paho.publish(topic, payload, qos, retain, properties=properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"{self.broker.kind}: publish to {topic} not acknowledged in {TIMEOUT}s"

    def publish_many(self, items: Iterable[tuple[str, bytes | str, int]]) -> None:
        """Publish all at once (paho keeps its own in-flight window), then wait for every ack."""
        infos = [self.paho.publish(topic, payload, qos) for topic, payload, qos in items]
        deadline = time.monotonic() + 4 * TIMEOUT
        for info in infos:
            info.wait_for_publish(max(0.0, deadline - time.monotonic()))
            assert info.is_published(), f"{self.broker.kind}: a publish was not acknowledged in time"

    def collect(self, count: int | None = None, sentinel: str | None = None,
                timeout: float = TIMEOUT) -> list[Message]:
        """Messages received until ``count`` arrived and the ``sentinel`` topic was seen (not
        returned); on timeout, whatever arrived."""
        found: list[Message] = []
        seen = sentinel is None
        deadline = time.monotonic() + timeout
        while not (seen and (count is None or len(found) >= count)):
            try:
                message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message.topic == sentinel:
                seen = True
            else:
                found.append(message)
        return found

    def disconnect(self, reason: int | None = None) -> None:
        """Send DISCONNECT (MQTT 5: with ``reason``) and wait until the connection is closed."""
        code = ReasonCode(PacketTypes.DISCONNECT, identifier=reason) if reason is not None else None
        self.paho.disconnect(reasoncode=code)
        self.disconnected.wait(TIMEOUT)
        self.paho.loop_stop()

    def drop(self) -> None:
        """End the connection without DISCONNECT: shut the TCP socket down under paho."""
        sock = self.paho.socket()
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.disconnected.wait(TIMEOUT)
        self.paho.loop_stop()

    def close(self) -> None:
        if self.paho.is_connected():
            self.paho.disconnect()
            self.disconnected.wait(TIMEOUT)
        self.paho.loop_stop()


@contextmanager
def session(broker: Any, version: int) -> Iterator[Any]:
    """``connect(**options)`` makes connected clients; all are closed when the block ends."""
    with ExitStack() as stack:
        def connect(**options: Any) -> Client:
            client = Client(broker, version, **options)
            stack.callback(client.close)
            return client.connect()
        yield connect


def rows(topics: Topics, messages: Iterable[Message]) -> list[tuple[str, bytes, int, bool]]:
    """The comparable part of deliveries: (relative topic, payload, qos, retain)."""
    return [(topics.rel(m.topic), m.payload, m.qos, m.retain) for m in messages]


def props(version: int, **values: Any) -> Properties | None:
    """PUBLISH properties (MQTT 5 only; None under 3.1.1)."""
    if version != V5:
        return None
    built = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(built, name, value)
    return built


def options(qos: int, **flags: Any) -> SubscribeOptions:
    return SubscribeOptions(qos=qos, **flags)


# ---------------------------------------------------------------------------------------------
# Scenarios


def qos_round_trip(broker: Any, version: int) -> dict[str, Any]:
    """Subscribe at QoS 0, 1 and 2 (one filter each), publish at QoS 0, 1 and 2 to each topic:
    every message arrives once, at min(publish QoS, subscription QoS)."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        granted = sub.subscribe((t("s0"), 0), (t("s1"), 1), (t("s2"), 2), (t("end"), 1))
        for s in range(3):
            for p in range(3):
                pub.publish(t(f"s{s}"), f"p{p}", qos=p)
        pub.publish(t("end"), "", qos=1)
        got = sub.collect(count=9, sentinel=t("end"))
    return {"granted": granted, "received": sorted(rows(t, got))}


def ordering(broker: Any, version: int, count: int = 200) -> dict[str, Any]:
    """``count`` QoS 1 messages published back to back on one topic arrive once each, in order."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        sub.subscribe((t("seq"), 1))
        pub.publish_many((t("seq"), str(i), 1) for i in range(count))
        got = sub.collect(count=count)
    return {"payloads": [int(m.payload) for m in got], "qos": sorted({m.qos for m in got})}


WILDCARD_TOPICS = ("a", "a/b", "x/b", "a/b/c", "a/", "a//b")
WILDCARD_FILTERS = ("+/b", "a/#", "+", "#", "+/+", "a/+/c", "a/+", "+/#")


def wildcards(broker: Any, version: int) -> dict[str, list[str]]:
    """One subscriber per filter; each publishes-side topic goes to exactly the filters that
    match it (``#`` includes the parent level, ``+`` matches an empty level)."""
    t = Topics()
    with session(broker, version) as connect:
        pub = connect()
        subs = {}
        for pattern in WILDCARD_FILTERS:
            subs[pattern] = connect()
            subs[pattern].subscribe((t(pattern), 1), (f"end/{t.id}", 1))
        # the filters root at the prefix, so "P" itself is a topic too
        pub.publish(t.prefix, "root", qos=1)
        for topic in WILDCARD_TOPICS:
            pub.publish(t(topic), topic, qos=1)
        pub.publish(f"end/{t.id}", "", qos=1)
        return {pattern: sorted(t.rel(m.topic) for m in sub.collect(sentinel=f"end/{t.id}"))
                for pattern, sub in subs.items()}


def dollar_topics(broker: Any, version: int) -> dict[str, list[str]]:
    """A topic starting with ``$`` is not matched by ``#`` nor by a filter starting with ``+``,
    but is matched by a filter that starts with the same ``$`` level."""
    t = Topics()
    dollar, plain = f"$it/{t.id}/x", f"plain/{t.id}/x"
    with session(broker, version) as connect:
        pub = connect()
        subs = {name: connect() for name in ("#", "+/ID/x", "$it/#")}
        for name, sub in subs.items():
            sub.subscribe((name.replace("ID", t.id), 1), (f"end/{t.id}", 1))
        pub.publish(dollar, "d", qos=1)
        pub.publish(plain, "p", qos=1)
        pub.publish(f"end/{t.id}", "", qos=1)
        # `#` also sees retained messages other scenarios left on the broker: keep only ours,
        # and anything whose topic starts with `$` (which `#` must never deliver)
        return {name: sorted(t.rel(m.topic) for m in sub.collect(sentinel=f"end/{t.id}")
                             if t.id in m.topic or m.topic.startswith("$"))
                for name, sub in subs.items()}


def retained(broker: Any, version: int) -> dict[str, Any]:
    """Retained messages: stored, delivered with RETAIN=1 to a later subscriber (exact filter and
    wildcard), delivered with RETAIN=0 to an existing subscription, replaced by a newer retained
    message, and cleared by an empty retained payload (which existing subscribers still get)."""
    t = Topics()
    with session(broker, version) as connect:
        pub = connect()
        pub.publish(t("r/1"), "one", qos=1, retain=True)
        pub.publish(t("r/2"), "two", qos=1, retain=True)
        exact, wild = connect(), connect()
        exact.subscribe((t("r/1"), 1))
        on_subscribe_exact = exact.collect(count=1)
        wild.subscribe((t("r/+"), 1), (t("end"), 1))
        on_subscribe_wild = sorted(rows(t, wild.collect(count=2)))
        pub.publish(t("r/1"), "one-b", qos=1, retain=True)  # live and retained
        pub.publish(t("r/2"), "live", qos=1)  # live, not retained: keeps "two" stored
        pub.publish(t("r/1"), "", qos=1, retain=True)  # clears r/1
        pub.publish(t("end"), "", qos=1)
        live = wild.collect(sentinel=t("end"))
        late = connect()
        late.subscribe((t("r/+"), 1), (t("end"), 1))
        pub.publish(t("end"), "", qos=1)
        after_clear = late.collect(sentinel=t("end"))
        pub.publish(t("r/2"), "", qos=1, retain=True)
    return {"exact": rows(t, on_subscribe_exact), "wildcard": on_subscribe_wild,
            "live": rows(t, live), "after_clear": rows(t, after_clear)}


def will(broker: Any, version: int) -> dict[str, Any]:
    """The will is published when a client's connection ends without DISCONNECT, and not after a
    normal DISCONNECT (MQTT 5: reason 0x00); MQTT 5's DISCONNECT 0x04 sends it on purpose."""
    t = Topics()
    with session(broker, version) as connect:
        watcher, pub = connect(), connect()
        watcher.subscribe((t("will/#"), 2), (t("end"), 1))
        normal = Client(broker, version, will=(t("will/normal"), "normal", 1, False)).connect()
        normal.disconnect(0 if version == V5 else None)
        dropped = Client(broker, version, will=(t("will/dropped"), "dropped", 1, False)).connect()
        dropped.drop()
        abnormal = rows(t, watcher.collect(count=1))
        on_purpose = []
        if version == V5:
            chosen = Client(broker, version, will=(t("will/chosen"), "chosen", 2, False)).connect()
            chosen.disconnect(0x04)
            on_purpose = rows(t, watcher.collect(count=1))
        pub.publish(t("end"), "", qos=1)
        rest = rows(t, watcher.collect(sentinel=t("end")))
    return {"after_drop": abnormal, "after_disconnect_0x04": on_purpose, "afterwards": rest}


def will_delay(broker: Any, version: int = V5, delay: int = 1) -> dict[str, Any]:
    """MQTT 5 Will Delay Interval: a client that drops and reconnects (clean start 0) within the
    delay cancels its will; the will of a dropped client that stays away (session expiry longer
    than the delay) comes ``delay`` seconds late. The second client drops after the first came
    back, so its will is due last: once it arrived, the cancelled one would be overdue."""
    t = Topics()
    will_props = Properties(PacketTypes.WILLMESSAGE)
    will_props.WillDelayInterval = delay
    with session(broker, version) as connect:
        watcher = connect()
        watcher.subscribe((t("will/#"), 1))
        back = Client(broker, version, will=(t("will/back"), "back", 1, False), will_properties=will_props,
                      session_expiry=60).connect()
        back.drop()
        again = Client(broker, version, back.id, clean=False, session_expiry=0).connect()
        late = Client(broker, version, will=(t("will/late"), "late", 1, False), will_properties=will_props,
                      session_expiry=60).connect()
        late.drop()
        dropped_at = time.monotonic()
        first = watcher.collect(count=1, timeout=delay + TIMEOUT)
        waited = time.monotonic() - dropped_at
        # `again` ends with session expiry 0 and a normal DISCONNECT: no will is left to send
        again.disconnect(0)
        return {"first_will": rows(t, first), "came_after_delay": waited >= delay - 0.5,
                "reconnected_session_present": again.session_present,
                "other_wills": rows(t, watcher.collect(timeout=0.0))}


def persistent_session(broker: Any, version: int) -> dict[str, Any]:
    """A persistent session keeps subscriptions and queues QoS 1/2 messages while offline:
    3.1.1 with clean session 0, MQTT 5 with clean start 0 and a session expiry interval. The
    CONNACK says whether a session was present; a clean session discards it."""
    t = Topics()
    cid = new_client_id()

    def connect(clean: bool) -> Client:
        return Client(broker, version, cid, clean=clean, session_expiry=None if clean else 300).connect()
    with session(broker, version) as plain:
        pub = plain()
        first = connect(clean=False)
        first.subscribe((t("q"), 2), (t("end"), 1))
        first.disconnect()
        pub.publish(t("q"), "m1", qos=1)
        pub.publish(t("q"), "m2", qos=2)
        pub.publish(t("q"), "m3", qos=1)
        resumed = connect(clean=False)
        queued = resumed.collect(count=3)  # ordered only within one QoS: compared sorted
        pub.publish(t("end"), "", qos=1)  # the subscriptions survived: live delivery works too
        live_end = resumed.collect(count=1)
        resumed.disconnect()
        cleaned = connect(clean=True)
        cleaned.disconnect()
        pub.publish(t("q"), "lost", qos=1)
        fresh = connect(clean=False)
        fresh.subscribe((t("end"), 1))
        pub.publish(t("end"), "", qos=1)
        after_clean = fresh.collect(sentinel=t("end"))
        fresh.disconnect()
        connect(clean=True).disconnect()  # leave nothing behind
    return {"first_present": first.session_present, "resumed_present": resumed.session_present,
            "queued": sorted(rows(t, queued)), "qos1_order": [m.payload for m in queued if m.qos == 1],
            "live_after_resume": rows(t, live_end),
            "clean_present": cleaned.session_present, "after_clean_present": fresh.session_present,
            "after_clean": rows(t, after_clean)}


def session_takeover(broker: Any, version: int) -> dict[str, Any]:
    """A second connection with the same client id closes the first one; MQTT 5 tells the first
    with DISCONNECT 0x8E (Session taken over). The second one keeps working."""
    t = Topics()
    cid = new_client_id()
    with session(broker, version) as connect:
        first = connect(client_id=cid)
        second = connect(client_id=cid)
        kicked = first.disconnected.wait(TIMEOUT)
        second.subscribe((t("after"), 1))
        second.publish(t("after"), "ok", qos=1)
        works = rows(t, second.collect(count=1))
        observed = {"first_disconnected": kicked, "second_works": works}
        if version == V5:  # the reason code of a DISCONNECT the server sent, None if it sent none
            observed["server_disconnect"] = first.disconnect_reason if first.disconnect_from_server else None
        return observed


def unsubscribe(broker: Any, version: int) -> dict[str, Any]:
    """After UNSUBACK nothing more arrives on the filter; other subscriptions go on."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        sub.subscribe((t("u"), 1), (t("end"), 1))
        pub.publish(t("u"), "before", qos=1)
        before = sub.collect(count=1)
        codes = sub.unsubscribe(t("u"))
        pub.publish(t("u"), "after", qos=1)
        pub.publish(t("end"), "", qos=1)
        after = sub.collect(sentinel=t("end"))
    return {"before": rows(t, before), "unsuback": codes, "after": rows(t, after)}


def mqtt5_properties(broker: Any, version: int = V5) -> dict[str, Any]:
    """PUBLISH properties travel to the subscriber unchanged: user properties (in order, with a
    repeated key), content type, response topic, correlation data, payload format indicator;
    the message expiry interval arrives as at most what was sent."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        sub.subscribe((t("p"), 1))
        sent = props(version, UserProperty=[("b", "2"), ("a", "1"), ("b", "3")], ContentType="text/plain",
                     ResponseTopic=t("reply"), CorrelationData=b"\x00\x01corr", PayloadFormatIndicator=1,
                     MessageExpiryInterval=60)
        pub.publish(t("p"), "hello", qos=1, properties=sent)
        pub.publish(t("p"), "bare", qos=1)
        got = sub.collect(count=2)
    observed = []
    for message in got:
        p = dict(message.properties)
        expiry = p.pop("MessageExpiryInterval", None)
        if "ResponseTopic" in p:
            p["ResponseTopic"] = t.rel(p["ResponseTopic"])
        observed.append((message.payload, p, None if expiry is None else 55 <= expiry <= 60))
    return {"messages": observed}


def message_expiry(broker: Any, version: int = V5) -> dict[str, Any]:
    """A QoS 1 message queued for an offline persistent session expires after its Message
    Expiry Interval (1 s here; the scenario waits 2.5 s): the reconnecting session gets only the
    messages without expiry or with time left, the latter with the remaining interval."""
    t = Topics()
    cid = new_client_id()
    with session(broker, version) as connect:
        pub = connect()
        first = Client(broker, version, cid, clean=True, session_expiry=300).connect()
        first.subscribe((t("e"), 1))
        first.disconnect()
        pub.publish(t("e"), "short", qos=1, properties=props(version, MessageExpiryInterval=1))
        pub.publish(t("e"), "long", qos=1, properties=props(version, MessageExpiryInterval=300))
        pub.publish(t("e"), "forever", qos=1)
        time.sleep(2.5)  # the message must age past its expiry interval: time is the subject here
        again = Client(broker, version, cid, clean=False, session_expiry=0).connect()
        pub.publish(t("e"), "end", qos=1)  # same topic and publisher: ordered after the others
        got = again.collect(count=3)
        again.disconnect()
    return {"present": again.session_present,
            "received": [(m.payload, 280 <= m.properties.get("MessageExpiryInterval", -1) < 300
                          if m.payload == b"long" else m.properties.get("MessageExpiryInterval"))
                         for m in got]}


def no_local(broker: Any, version: int = V5) -> dict[str, Any]:
    """No Local: a client's own publishes are not sent back to it on that subscription; other
    subscribers get them."""
    t = Topics()
    with session(broker, version) as connect:
        me, other = connect(), connect()
        me.subscribe((t("n"), options(1, noLocal=True)), (t("end"), options(1)))
        other.subscribe((t("n"), options(1)))
        me.publish(t("n"), "mine", qos=1)
        other.publish(t("end"), "", qos=1)
        return {"publisher": rows(t, me.collect(sentinel=t("end"))), "other": rows(t, other.collect(count=1))}


def retain_as_published(broker: Any, version: int = V5) -> dict[str, Any]:
    """Retain As Published: live deliveries keep RETAIN=1 on a subscription with the option,
    and have RETAIN=0 on one without it."""
    t = Topics()
    with session(broker, version) as connect:
        keep, clear, pub = connect(), connect(), connect()
        keep.subscribe((t("k"), options(1, retainAsPublished=True)))
        clear.subscribe((t("k"), options(1, retainAsPublished=False)))
        pub.publish(t("k"), "r", qos=1, retain=True)
        pub.publish(t("k"), "n", qos=1)
        observed = {"rap": rows(t, keep.collect(count=2)), "no_rap": rows(t, clear.collect(count=2))}
        pub.publish(t("k"), "", qos=1, retain=True)
    return observed


def retain_handling(broker: Any, version: int = V5) -> dict[str, Any]:
    """Retain Handling 0 sends retained messages at every subscribe, 1 only when the
    subscription is new, 2 never. Each client subscribes twice to the same filter."""
    t = Topics()
    with session(broker, version) as connect:
        pub = connect()
        pub.publish(t("h"), "kept", qos=1, retain=True)
        observed = {}
        for handling in (0, 1, 2):
            sub = connect()
            sub.subscribe((t("end"), options(1)))
            for _ in range(2):
                sub.subscribe((t("h"), options(1, retainHandling=handling)))
            pub.publish(t("end"), "", qos=1)
            observed[handling] = rows(t, sub.collect(sentinel=t("end")))
        pub.publish(t("h"), "", qos=1, retain=True)
    return observed


def subscription_identifiers(broker: Any, version: int = V5) -> dict[str, Any]:
    """Subscription Identifiers come back on the messages a subscription matched. A message
    matching two subscriptions of one client may arrive once with both identifiers or once per
    subscription with its own (the spec allows either), so the observation is, per topic, the
    identifiers received in total, and whether any delivery carried one not matching."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        for ident, pattern in ((1, "a/#"), (2, "+/b")):
            sub_props = Properties(PacketTypes.SUBSCRIBE)
            sub_props.SubscriptionIdentifier = ident
            sub.subscribe((t(pattern), options(1)), properties=sub_props)
        sub.subscribe((t("end"), options(1)))  # no identifier
        for topic in ("a/x", "y/b", "a/b"):
            pub.publish(t(topic), topic, qos=1)
        pub.publish(t("end"), "", qos=1)
        got = sub.collect(count=3, sentinel=t("end"))
    ids: dict[str, set[int]] = {}
    for message in got:
        ids.setdefault(t.rel(message.topic), set()).update(message.properties.get("SubscriptionIdentifier", []))
    return {topic: sorted(found) for topic, found in sorted(ids.items())}


def topic_alias_from_client(broker: Any, version: int = V5) -> dict[str, Any]:
    """A client sets Topic Alias 1 on a publish with a topic, then publishes with alias 1 and an
    empty topic: the subscriber gets both on the full topic (CONNACK allows aliases)."""
    t = Topics()
    with session(broker, version) as connect:
        sub, pub = connect(), connect()
        alias_max = pub.connack[2].get("TopicAliasMaximum", 0)
        sub.subscribe((t("alias"), 1))
        pub.publish(t("alias"), "set", qos=1, properties=props(version, TopicAlias=1))
        pub.publish("", "used", qos=1, properties=props(version, TopicAlias=1))
        got = sub.collect(count=2)
    return {"aliases_allowed": alias_max >= 1, "received": rows(t, got)}


def shared_subscription(broker: Any, version: int = V5, count: int = 100) -> dict[str, Any]:
    """``$share/g/topic``: two members of group g split ``count`` QoS 1 messages, each message
    to exactly one member; a plain subscriber on the same topic gets all of them."""
    t = Topics()
    group = f"g{t.id}"
    with session(broker, version) as connect:
        a, b, plain, pub = connect(), connect(), connect(), connect()
        for member in (a, b):
            member.subscribe((f"$share/{group}/{t('s')}", 1), (t("end"), 1))
        plain.subscribe((t("s"), 1))
        pub.publish_many((t("s"), str(i), 1) for i in range(count))
        everything = plain.collect(count=count)
        pub.publish(t("end"), "", qos=1)  # both members have had every share they will get
        got_a, got_b = a.collect(sentinel=t("end")), b.collect(sentinel=t("end"))
    payloads = sorted(int(m.payload) for m in got_a + got_b)
    return {"union": payloads == list(range(count)), "duplicates": len(payloads) - len(set(payloads)),
            "both_members_used": bool(got_a) and bool(got_b), "topics": sorted({t.rel(m.topic) for m in got_a + got_b}),
            "plain_subscriber": len(everything)}


def cli_pub_sub(broker: Any, version: int) -> dict[str, Any]:
    """``mosquitto_sub -C 4 -v`` receives what ``mosquitto_pub`` sent, with -u/-P and -V. The
    subscriber runs with -d under ``stdbuf -oL`` so its "received SUBACK" line tells us when to
    publish."""
    t = Topics()
    proto = "mqttv5" if version == V5 else "mqttv311"
    common = ["-h", broker.host, "-p", str(broker.port), "-u", broker.username, "-P", broker.password,
              "-V", proto]
    sub = subprocess.Popen(["stdbuf", "-oL", "mosquitto_sub", *common, "-q", "1", "-t", t("#"), "-C", "4",
                            "-v", "-d"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in sub.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    try:
        subscribed = False
        deadline = time.monotonic() + TIMEOUT
        while not subscribed:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"mosquitto_sub ended before subscribing: {sub.wait()} {sub.stderr.read()}")
            subscribed = "received SUBACK" in line
        codes = [subprocess.run(["mosquitto_pub", *common, "-q", "1", "-t", t("one"), "-m", "hello world"],
                                capture_output=True, timeout=TIMEOUT).returncode,
                 subprocess.run(["mosquitto_pub", *common, "-q", "1", "-t", t("lines"), "-l"],
                                input=b"a\nb\nc\n", capture_output=True, timeout=TIMEOUT).returncode]
        received = []
        while (line := lines.get(timeout=TIMEOUT)) is not None:
            if line.startswith(t.prefix):
                received.append(t.rel(line))
        return {"pub_exit": codes, "sub_exit": sub.wait(TIMEOUT), "received": received}
    except queue.Empty:
        return {"error": "mosquitto_sub produced no line in time"}
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()


def amqtt_round_trip(broker: Any, version: int = V311) -> dict[str, Any]:
    """A second client implementation (amqtt, MQTT 3.1.1, asyncio): it subscribes at QoS 2 and
    receives paho's QoS 0/1/2 publishes at their QoS, and its own QoS 1 and 2 publishes reach a
    paho subscriber."""
    import asyncio

    from amqtt.client import MQTTClient

    t = Topics()
    uri = f"mqtt://{broker.username}:{broker.password}@{broker.host}:{broker.port}/"

    async def run(pub: Client) -> tuple[list[int], list[Message]]:
        client = MQTTClient(client_id=new_client_id(), config={"auto_reconnect": False})
        await client.connect(uri, cleansession=True)
        try:
            granted = await client.subscribe([(t("to-amqtt/#"), 2)])
            await asyncio.to_thread(lambda: [pub.publish(t(f"to-amqtt/q{q}"), f"q{q}", qos=q) for q in range(3)])
            got = []
            for _ in range(3):
                message = await client.deliver_message(timeout_duration=TIMEOUT)
                got.append(Message(message.topic, bytes(message.data), message.qos, bool(message.retain), {}))
            await client.publish(t("from-amqtt"), b"a1", qos=1)
            await client.publish(t("from-amqtt"), b"a2", qos=2)
            return list(granted), got
        finally:
            await client.disconnect()

    with session(broker, V311) as connect:
        pub, listener = connect(), connect()
        listener.subscribe((t("from-amqtt"), 2))
        granted, got = asyncio.run(run(pub))
        from_amqtt = listener.collect(count=2)
    return {"granted": granted, "amqtt_received": sorted(rows(t, got)), "paho_received": rows(t, from_amqtt)}
