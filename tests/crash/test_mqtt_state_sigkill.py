"""MQTT state across a SIGKILL: QoS 2 exactly once in both directions, retained messages and
subscriptions.

- QoS 2: paho publishers (persistent sessions) and a raw publisher that leaves handshakes half
  done feed a raw subscriber that implements the receiver side itself (a packet id is held from
  PUBLISH to PUBREL and a message delivered once), and withholds some PUBRECs and PUBCOMPs so
  the kill lands inside handshakes. Every message acknowledged to its publisher is delivered
  exactly once across both broker lives.
- Retained messages and a persistent subscription survive the kill; an empty retained publish
  after the restart clears one.
"""
from __future__ import annotations

import threading
import time
from collections import Counter

import paho.mqtt.client as mqtt
from paho.mqtt.client import mqtt_ms_resend_pubrel
import pytest

import socket

from protocols.mqtt.codec import MQTT_5, MQTT_311, Decoder, encode
from protocols.mqtt.packets import (ConnAck, Connect, Packet, PubComp, Publish, PubRec, PubRel,
                                    SubAck, Subscribe, Subscription)
from protocols.mqtt.properties import Properties
from tests.crash.test_mqtt_sigkill import (EXPIRY_S, PASSWORD, USER, VERSIONS, WAIT_S, Broker, Paho,
                                           Publishers, host_port, wait_for)

pytestmark = pytest.mark.crash


# ----------------------------------------------------------------------------- raw client


class Closed(Exception):
    """The broker closed the connection (it was killed)."""


class RawClient:
    """A blocking MQTT client on a plain socket: any packet out, decoded packets in."""

    def __init__(self, address: str, version: int) -> None:
        self.version = version
        self.sock = socket.create_connection(host_port(address), timeout=WAIT_S)
        self.decoder = Decoder(version)
        self.send_lock = threading.Lock()

    def send(self, packet: Packet) -> None:
        with self.send_lock:
            self.sock.sendall(encode(packet, self.version))

    def read(self, timeout: float = WAIT_S) -> Packet:
        deadline = time.monotonic() + timeout
        while (packet := self.decoder.next_packet()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no packet within {timeout} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            except socket.timeout:
                raise TimeoutError(f"no packet within {timeout} s") from None
            if not data:
                raise Closed()
            self.decoder.feed(data)
        return packet

    def connect(self, client_id: str) -> ConnAck:
        properties = Properties(session_expiry_interval=EXPIRY_S) if self.version == MQTT_5 else Properties()
        self.send(Connect(client_id=client_id, clean_start=False, keep_alive=60, username=USER,
                          password=PASSWORD.encode(), properties=properties))
        connack = self.read()
        assert isinstance(connack, ConnAck) and connack.reason_code == 0, connack
        return connack

    def close(self) -> None:
        self.sock.close()


class ExactlyOnceSubscriber:
    """A QoS 2 receiver implementing the spec's method B, whose state (packet ids awaiting
    PUBREL) lives in this object and so survives the broker's restart, as a client's own
    persisted state would. It delivers a message to the application on PUBLISH, once: a PUBLISH
    whose packet id is still held is a resend, answered with PUBREC and not delivered.

    In the first life it leaves some handshakes half done on purpose: no PUBREC at all for some
    messages (the broker must resend the PUBLISH, with the same packet id), no PUBCOMP for others
    (the broker must resend only the PUBREL)."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.lock = threading.Lock()
        self.delivered: Counter[str] = Counter()
        self.awaiting_release: dict[int, str] = {}
        self.released: dict[int, str] = {}
        self.withhold_pubrec: set[str] = set()
        self.withhold_pubcomp: set[str] = set()
        self.redelivered_dup: list[tuple[int, bool]] = []
        self.history: dict[str, list[tuple[str, int, bool]]] = {}
        """Payload -> every PUBLISH of it: (life, packet id, DUP flag)."""
        self.protocol_notes: list[str] = []
        self.first_life = True
        self.client: RawClient | None = None
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.ended: BaseException | None = None
        """What ended the connection's reader: the broker closing it, or the test."""

    def start(self, address: str, expect_session: bool) -> None:
        self.client = RawClient(address, self.version)
        connack = self.client.connect("crash-sub-q2")
        assert connack.session_present is expect_session, connack
        if not expect_session:
            self.client.send(Subscribe(1, (Subscription("crash/#", 2),)))
            suback = self.client.read()
            assert isinstance(suback, SubAck) and suback.reason_codes == (2,), suback
        self.thread = threading.Thread(target=self._run, args=(self.client,), daemon=True)
        self.thread.start()

    def _run(self, client: RawClient) -> None:
        try:
            while True:
                self._handle(client, client.read(timeout=3600))
        except (Closed, OSError) as end:
            self.ended = end
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def _handle(self, client: RawClient, packet: Packet) -> None:
        if isinstance(packet, Publish):
            assert packet.qos == 2, packet
            payload = packet.payload.decode()
            pid = packet.packet_id
            number = int(payload.split("-")[-1])
            with self.lock:
                self.history.setdefault(payload, []).append(
                    ("before" if self.first_life else "after", pid, packet.dup))
                if pid in self.awaiting_release:
                    if self.awaiting_release[pid] != payload:
                        self.protocol_notes.append(
                            f"packet id {pid} held for {self.awaiting_release[pid]} re-sent "
                            f"with {payload}")
                    self.redelivered_dup.append((pid, packet.dup))
                else:
                    self.delivered[payload] += 1
                    self.awaiting_release[pid] = payload
                if self.first_life and number % 11 == 5 and payload not in self.withhold_pubrec:
                    self.withhold_pubrec.add(payload)
                    return
            client.send(PubRec(pid))
        elif isinstance(packet, PubRel):
            pid = packet.packet_id
            with self.lock:
                payload = self.awaiting_release.pop(pid, None)
                if payload is None:
                    payload = self.released.get(pid, "?")
                self.released[pid] = payload
                if self.first_life and payload != "?" and int(payload.split("-")[-1]) % 7 == 3:
                    self.withhold_pubcomp.add(payload)
                    return
            client.send(PubComp(pid))
        else:
            with self.lock:
                self.protocol_notes.append(f"unexpected {packet}")

    def broker_gone(self) -> None:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        self.client.close()
        self.first_life = False

    @property
    def count(self) -> int:
        with self.lock:
            return sum(self.delivered.values())


class HalfDonePublisher:
    """A raw QoS 2 publisher with a persistent session that stops in the middle of handshakes:
    some messages PUBREC'd with no PUBREL sent yet when the broker is killed."""

    def __init__(self, address: str, version: int, count: int) -> None:
        self.version = version
        self.client = RawClient(address, version)
        assert self.client.connect("crash-raw-pub").session_present is False
        self.payloads = {pid: f"raw-{pid}" for pid in range(1, count + 1)}
        for pid, payload in self.payloads.items():
            self.client.send(Publish("crash/raw", payload.encode(), 2, packet_id=pid))
        recs = {self._read(PubRec).packet_id for _ in self.payloads}
        assert recs == set(self.payloads)
        self.completed = set(list(self.payloads)[: count // 2])
        for pid in self.completed:
            self.client.send(PubRel(pid))
        comps = {self._read(PubComp).packet_id for _ in self.completed}
        assert comps == self.completed
        self.pending_release = set(self.payloads) - self.completed

    def _read(self, kind: type):
        packet = self.client.read()
        assert isinstance(packet, kind), packet
        return packet

    def finish_after_restart(self, address: str) -> None:
        """Reconnect, resume the session and release what was PUBREC'd before the kill."""
        self.client.close()
        self.client = RawClient(address, self.version)
        connack = self.client.connect("crash-raw-pub")
        assert connack.session_present, "the publisher's persistent session was lost"
        for pid in sorted(self.pending_release):
            self.client.send(PubRel(pid))
        for _ in self.pending_release:
            comp = self._read(PubComp)
            assert comp.packet_id in self.pending_release and comp.reason_code == 0, comp
        self.client.close()


def keep_pubrel_across_failed_reconnects(client: mqtt.Client) -> None:
    """Work around paho 2.2.0: it resets in-flight messages before every reconnect attempt, and
    the second reset turns a QoS 2 message whose PUBREL it had sent ('resend PUBREL' after the
    first reset) back into a fresh PUBLISH without DUP, which it then publishes again as a new
    message once a later attempt succeeds. The spec forbids re-publishing after PUBREL, so such
    messages are kept at 'resend PUBREL' here; the broker cannot tell that resend from a new
    message."""
    reset = client._messages_reconnect_reset_out

    def reset_keeping_pubrel() -> None:
        with client._out_message_mutex:
            releasing = [m for m in client._out_messages.values()
                         if m.qos == 2 and m.state == mqtt_ms_resend_pubrel]
        reset()
        for message in releasing:
            message.state = mqtt_ms_resend_pubrel

    client._messages_reconnect_reset_out = reset_keeping_pubrel


@pytest.mark.parametrize("version", VERSIONS)
def test_qos2_is_exactly_once_across_sigkill(sluice_server, tmp_path, version):
    """Two paho publishers send 2 x 1,000 numbered QoS 2 messages (persistent sessions: paho
    resends PUBLISH/PUBREL as the spec says after the restart); a raw publisher leaves half of
    its 20 QoS 2 messages PUBREC'd without PUBREL; a raw method-B subscriber (QoS 2,
    persistent session) leaves some handshakes without PUBREC and some without PUBCOMP. SIGKILL
    once 600 publishes completed and 300 were delivered; restart; everyone reconnects.
    Every message acknowledged to its publisher is delivered to the subscriber's application
    exactly once: no loss, no duplicate stored message, no second delivery."""
    raw_version = MQTT_5 if version == mqtt.MQTTv5 else MQTT_311
    broker = Broker(sluice_server, tmp_path)
    address = broker.start()
    subscriber = ExactlyOnceSubscriber(raw_version)
    subscriber.start(address, expect_session=False)
    started = time.monotonic()
    half_done = HalfDonePublisher(address, raw_version, 20)
    publishers = Publishers(address, 2, 1_000, 2, "q2")
    for publisher in publishers.clients:
        keep_pubrel_across_failed_reconnects(publisher.client)
    wait_for(lambda: publishers.acked >= 600 and subscriber.count >= 300
             and len(subscriber.withhold_pubcomp) >= 5 and len(subscriber.withhold_pubrec) >= 5,
             "600 PUBCOMPs, 300 deliveries and half-done handshakes before the kill")
    broker.kill()
    acked_before_kill = publishers.acknowledged()
    in_flight = len(publishers.infos) - len(acked_before_kill)
    assert in_flight > 0, "nothing was in flight at the kill"
    subscriber.broker_gone()
    assert subscriber.error is None, subscriber.error
    first_life_count = subscriber.count

    address = broker.start()
    subscriber.start(address, expect_session=True)
    half_done.finish_after_restart(address)
    expected: set[str] = set()
    try:
        publishers.wait_all_acknowledged()
        expected = publishers.acknowledged() | set(half_done.payloads.values())
        wait_for(lambda: expected <= set(subscriber.delivered) or subscriber.error is not None,
                 "every acknowledged QoS 2 message to be delivered")
        wait_for(lambda: not subscriber.awaiting_release, "the broker to release every message")
    except AssertionError as timeout:
        with subscriber.lock:
            missing = sorted(expected - set(subscriber.delivered))
            held = dict(subscriber.awaiting_release)
        connected = subscriber.thread.is_alive()
        log = broker.server.stop_with_stacks()
        raise AssertionError(
            f"{timeout}: {len(missing)} acknowledged messages not delivered {missing[:10]}; "
            f"{len(held)} packet ids never released {list(held.items())[:10]}; subscriber "
            f"connection open: {connected} (ended by {subscriber.ended!r}), error: {subscriber.error!r}, "
            f"notes: {subscriber.protocol_notes[:5]}; publishers: {publishers.describe()}; "
            f"broker log:\n{log}") from None
    assert subscriber.error is None, subscriber.error
    publishers.stop()

    with subscriber.lock:
        delivered = Counter(subscriber.delivered)
        notes = list(subscriber.protocol_notes)
        resent = list(subscriber.redelivered_dup)
    print(f"\nQoS 2 ({version}): {len(acked_before_kill)} completed before the kill, {in_flight} in "
          f"flight; {first_life_count} delivered before; {len(subscriber.withhold_pubrec)} PUBRECs "
          f"and {len(subscriber.withhold_pubcomp)} PUBCOMPs withheld; {len(resent)} PUBLISH resends "
          f"of held ids ({sum(1 for _, dup in resent if not dup)} without DUP); "
          f"{time.monotonic() - started:.1f} s")
    lost = expected - set(delivered)
    assert not lost, f"{len(lost)} acknowledged QoS 2 messages were never delivered: {sorted(lost)[:10]}"
    twice = {payload: n for payload, n in delivered.items() if n > 1}
    assert not twice, (f"{len(twice)} QoS 2 messages delivered more than once; each PUBLISH of them "
                       f"(broker life, packet id, DUP): "
                       f"{ {p: subscriber.history[p] for p in list(twice)[:8]} }")
    assert not notes, notes
    unknown = set(delivered) - expected
    assert not unknown, f"delivered messages nobody published: {sorted(unknown)[:10]}"
    assert all(dup for _, dup in resent), "a resent PUBLISH lacked the DUP flag"


# ============================================================================ 3. retained + subscriptions


@pytest.mark.parametrize("version", VERSIONS)
def test_retained_messages_and_subscriptions_survive_sigkill(sluice_server, tmp_path, version):
    """Retained messages on three topics (QoS 1, PUBACKed), then a persistent session subscribes
    to ``crash/live/#`` and the broker is killed right after its SUBACK. After the restart a new
    subscriber gets the retained messages with the retain flag; an empty retained publish clears
    one; the persistent session is present and gets new messages on its old subscription."""
    broker = Broker(sluice_server, tmp_path)
    address = broker.start()
    lock = threading.Lock()
    received: list[mqtt.MQTTMessage] = []
    publisher = Paho(address, "crash-retain-pub", persistent=False)
    retained = {"crash/state/a": b"state-a", "crash/state/b": b"state-b", "crash/state/c": b"state-c"}
    infos = [publisher.client.publish(topic, payload, 1, retain=True) for topic, payload in retained.items()]
    wait_for(lambda: all(info.is_published() for info in infos), "retained publishes to be PUBACKed")
    publisher.stop()

    def keep(message: mqtt.MQTTMessage) -> None:
        with lock:
            received.append(message)

    session = Paho(address, "crash-retain-session", version=version, on_message=keep)
    session.subscribe("crash/live/#", 1)
    broker.kill()  # right after the SUBACK: the subscription must already be saved
    session.stop()

    address = broker.start()
    seen: list[mqtt.MQTTMessage] = []

    def look(message: mqtt.MQTTMessage) -> None:
        with lock:
            seen.append(message)

    observer = Paho(address, "crash-retain-observer", persistent=False, on_message=look)
    observer.subscribe("crash/state/#", 1)
    wait_for(lambda: len(seen) >= len(retained), "the retained messages")
    with lock:
        got = {m.topic: (m.payload, m.retain) for m in seen}
    assert got == {topic: (payload, True) for topic, payload in retained.items()}

    publisher = Paho(address, "crash-retain-pub", persistent=False)
    cleared = publisher.client.publish("crash/state/b", b"", 1, retain=True)
    cleared.wait_for_publish(WAIT_S)
    assert cleared.is_published()
    observer.stop()
    with lock:
        seen.clear()
    fresh = Paho(address, "crash-retain-observer-2", persistent=False, on_message=look)
    fresh.subscribe("crash/state/#", 1)
    marker = publisher.client.publish("crash/state/marker", b"end", 1)
    marker.wait_for_publish(WAIT_S)
    wait_for(lambda: any(m.topic == "crash/state/marker" for m in seen), "the marker message")
    with lock:
        got = {m.topic: (m.payload, m.retain) for m in seen}
    assert got == {"crash/state/a": (b"state-a", True), "crash/state/c": (b"state-c", True),
                   "crash/state/marker": (b"end", False)}, got

    resumed = Paho(address, "crash-retain-session", version=version, on_message=keep)
    assert resumed.connects[0] is True, "the persistent session was not present after the restart"
    live = publisher.client.publish("crash/live/x", b"after-restart", 1)
    live.wait_for_publish(WAIT_S)
    assert live.is_published()
    wait_for(lambda: any(m.payload == b"after-restart" for m in received),
             "a new message on the persistent session's old subscription")
    with lock:
        message = next(m for m in received if m.payload == b"after-restart")
    assert (message.topic, message.qos) == ("crash/live/x", 1)
    for client in (publisher, fresh, resumed):
        client.client.disconnect()
        client.client.loop_stop()
