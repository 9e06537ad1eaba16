"""SIGKILL `sluice serve` (sync flush) while MQTT clients publish and persistent sessions receive.

DESIGN.md's durability contract through the MQTT front end: a PUBACK means the message is on
disk, so every acknowledged QoS 1 publish is delivered to a persistent session (3.1.1 clean
session 0, or MQTT 5 session expiry > 0) after the restart, duplicates allowed and counted.
QoS 2, retained messages and subscriptions across a kill: test_mqtt_state_sigkill.py.

The kill always happens on an event (enough acknowledged publishes and deliveries, more still in
flight, deliveries deliberately left unacknowledged), never after a fixed sleep. The broker
restarts on the same data dir and the same MQTT port, so clients reconnect as in production.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

pytestmark = pytest.mark.crash

USER, PASSWORD = "sluice", "sluice"
EXPIRY_S = 3600
WAIT_S = 20
"""Longest wait for any one event (the whole test stays well under 30 s when the broker works)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


class Broker:
    """`sluice serve` on a fixed MQTT port and data dir, killed and restarted by the test."""

    def __init__(self, sluice_server, tmp_path: Path) -> None:
        self._start = sluice_server
        self.data_dir = tmp_path / "data"
        self.port = free_port()
        self.server = None
        self.lives = 0

    def start(self) -> str:
        self.server = self._start(self.data_dir, "--mqtt-port", str(self.port), "--flush", "sync")
        self.server.wait_ready()
        self.lives += 1
        assert self.server.mqtt.endswith(f":{self.port}")
        return self.server.mqtt

    def kill(self) -> None:
        self.server.kill()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll a condition that threads make true (short polls on shared state, not fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


# ----------------------------------------------------------------------------- paho clients


class Paho:
    """A paho client on its own network thread; reconnects by itself (same client id)."""

    def __init__(self, address: str, client_id: str, *, version: int = mqtt.MQTTv311,
                 persistent: bool = True, manual_ack: bool = False,
                 on_message: Callable[[mqtt.MQTTMessage], None] | None = None) -> None:
        self.version = version
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version,
                                  clean_session=None if version == mqtt.MQTTv5 else not persistent,
                                  manual_ack=manual_ack)
        self.client.username_pw_set(USER, PASSWORD)
        self.client.reconnect_delay_set(1, 1)
        self.lock = threading.Lock()
        self.connects: list[bool] = []
        """Session present flag of every CONNACK."""
        self.acked = 0
        self.subacks: dict[int, list] = {}
        self.on_message = on_message
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda client, userdata, message: self.on_message(message)
        properties = None
        if version == mqtt.MQTTv5:
            properties = PahoProperties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = EXPIRY_S if persistent else 0
        self.client.connect(*host_port(address), keepalive=30, properties=properties,
                            clean_start=not persistent if version == mqtt.MQTTv5
                            else mqtt.MQTT_CLEAN_START_FIRST_ONLY)
        self.client.loop_start()
        wait_for(lambda: self.connects, f"{client_id} to connect")

    def _on_connect(self, client, userdata, flags, reason, properties) -> None:
        assert not reason.is_failure, f"refused: {reason}"
        with self.lock:
            self.connects.append(flags.session_present)

    def _on_publish(self, client, userdata, mid, reason, properties) -> None:
        with self.lock:
            self.acked += 1

    def _on_subscribe(self, client, userdata, mid, reasons, properties) -> None:
        with self.lock:
            self.subacks[mid] = reasons

    def subscribe(self, topic_filter: str, qos: int) -> None:
        result, mid = self.client.subscribe(topic_filter, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS
        wait_for(lambda: mid in self.subacks, f"SUBACK of {topic_filter}")
        assert [int(getattr(r, "value", r)) for r in self.subacks[mid]] == [qos]

    def stop(self) -> None:
        """Stop the network thread without a DISCONNECT (the process 'died')."""
        self.client.loop_stop()
        try:
            self.client.socket() and self.client.socket().close()
        except OSError:
            pass


class Publishers:
    """Paho publishers, each publishing numbered messages to ``crash/<name>`` with a persistent
    session so that paho resends what was not acknowledged when it reconnects."""

    def __init__(self, address: str, count: int, per_publisher: int, qos: int, prefix: str) -> None:
        self.clients = [Paho(address, f"{prefix}-pub-{i}") for i in range(count)]
        self.infos: list[tuple[str, mqtt.MQTTMessageInfo]] = []
        for number in range(per_publisher):
            for index, client in enumerate(self.clients):
                payload = f"p{index}-{number}"
                info = client.client.publish(f"crash/p{index}/{number % 8}", payload.encode(), qos)
                assert info.rc == mqtt.MQTT_ERR_SUCCESS, info.rc
                self.infos.append((payload, info))

    @property
    def acked(self) -> int:
        return sum(client.acked for client in self.clients)

    def acknowledged(self) -> set[str]:
        return {payload for payload, info in self.infos if info.is_published()}

    def wait_all_acknowledged(self) -> None:
        wait_for(lambda: all(info.is_published() for _, info in self.infos),
                 "every publish to be acknowledged after the restart")

    def describe(self) -> str:
        """Each client's connection and its unacknowledged messages by paho state."""
        parts = []
        for paho in self.clients:
            client = paho.client
            with client._out_message_mutex:
                states = Counter(m.state for m in client._out_messages.values())
            parts.append(f"{client._client_id.decode()}: connected {client.is_connected()}, "
                         f"{len(paho.connects)} CONNACKs, paho in flight {client._inflight_messages}, "
                         f"unacknowledged by state {dict(states)}")
        return "; ".join(parts)

    def stop(self) -> None:
        for client in self.clients:
            client.client.disconnect()
            client.client.loop_stop()


VERSIONS = [pytest.param(mqtt.MQTTv311, id="v311-clean-session-0"),
            pytest.param(mqtt.MQTTv5, id="v5-session-expiry-3600")]


# ============================================================================ 1. QoS 1


@pytest.mark.parametrize("version", VERSIONS)
def test_qos1_every_puback_is_delivered_to_a_persistent_session_across_sigkill(sluice_server, tmp_path, version):
    """Two publishers send 2 x 1,500 numbered QoS 1 messages; a persistent-session subscriber
    (manual acks) leaves every 7th message unacknowledged. SIGKILL once 800 publishes were
    PUBACKed and 300 delivered, with more in flight; restart; paho resends the unacknowledged
    publishes; the subscriber comes back with the same client id (a new process: no state).
    Every PUBACKed message reaches the subscriber; duplicates are counted, not failed."""
    broker = Broker(sluice_server, tmp_path)
    address = broker.start()
    lock = threading.Lock()
    delivered: Counter[str] = Counter()
    unacked_at_kill: set[str] = set()

    subscriber: Paho

    def first_life(message: mqtt.MQTTMessage) -> None:
        payload = message.payload.decode()
        with lock:
            delivered[payload] += 1
        if int(payload.split("-")[1]) % 7 == 3:
            with lock:
                unacked_at_kill.add(payload)  # never acknowledged: the broker must send it again
        else:
            subscriber.client.ack(message.mid, 1)

    subscriber = Paho(address, "crash-sub-q1", version=version, manual_ack=True, on_message=first_life)
    subscriber.subscribe("crash/#", 1)
    started = time.monotonic()
    publishers = Publishers(address, 2, 1_500, 1, "q1")
    wait_for(lambda: publishers.acked >= 800 and sum(delivered.values()) >= 300,
             "800 PUBACKs and 300 deliveries before the kill")
    broker.kill()
    acked_before_kill = publishers.acknowledged()
    subscriber.stop()
    in_flight = len(publishers.infos) - len(acked_before_kill)
    assert in_flight > 0, "nothing was in flight at the kill"
    with lock:
        first_life_count = sum(delivered.values())

    address = broker.start()

    def second_life(message: mqtt.MQTTMessage) -> None:
        with lock:
            delivered[message.payload.decode()] += 1

    again = Paho(address, "crash-sub-q1", version=version, on_message=second_life)
    assert again.connects[0] is True, "the persistent session was not present after the restart"
    publishers.wait_all_acknowledged()
    acknowledged = publishers.acknowledged()
    wait_for(lambda: acknowledged <= set(delivered), "every PUBACKed message to be delivered")
    publishers.stop()
    again.stop()

    lost = acknowledged - set(delivered)
    lost_before_kill = acked_before_kill - set(delivered)
    assert not lost_before_kill, f"{len(lost_before_kill)} messages PUBACKed before the kill were lost"
    assert not lost, f"{len(lost)} PUBACKed messages were never delivered"
    assert unacked_at_kill <= set(delivered)
    duplicates = sum(n - 1 for n in delivered.values())
    print(f"\nQoS 1 ({version}): {len(acked_before_kill)} PUBACKed before the kill, {in_flight} "
          f"in flight; {first_life_count} deliveries before, {len(unacked_at_kill)} left "
          f"unacknowledged; {len(acknowledged)} distinct delivered, {duplicates} duplicates; "
          f"{time.monotonic() - started:.1f} s")


# ============================================================================ 3. subscriptions
