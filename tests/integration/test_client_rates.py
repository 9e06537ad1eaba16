"""Per-client message totals, rates and in-flight counts in ``/clients``: a real broker, real
paho-mqtt, pika and SDK clients publishing and consuming at a steady pace, and what an operator
reads of each of them while they do."""
from __future__ import annotations

import threading
from collections.abc import Callable

import pika
import pytest

from sluice.client import ClientConfig, Message, SyncProducer, SyncSimpleConsumer
from tests.integration.test_admin_api import BrokerThread, Http
from tests.integration.test_clients import MqttTarget
from tests.interop.scenarios import V5, Client
from tests.waiting import wait_for

PACE_S = 0.05
"""Between two messages of a publisher: a steady, modest pace."""
WAIT_S = 90.0
"""How long a poll waits (rates change every sampling interval, 5 s, on a shared machine)."""
AMQP_QUEUE = "rates-amqp"
NATIVE_TOPIC = "rates-native"


@pytest.fixture
def broker(tmp_path):
    thread = BrokerThread(str(tmp_path / "data"))
    yield thread
    thread.stop()


def rows(admin: Http, query: str = "") -> list[dict]:
    status, body, _ = admin("GET", "/clients" + query)
    assert status == 200, body
    return body


def poll(what: str, check: Callable[[], object], seen: Callable[[], object] | None = None) -> object:
    """``check()`` once it is truthy; after ``WAIT_S`` fails naming ``what`` and what ``seen()``
    says was there instead."""
    return wait_for(check, what, WAIT_S, seen)


def amqp_connection(broker: BrokerThread, name: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.running.amqp_listener.port,
        credentials=pika.PlainCredentials("sluice", "sluice"),
        client_properties={"connection_name": name}, connection_attempts=1, socket_timeout=10))


def name(client: dict) -> str:
    """An AMQP connection's name (the details quote it as they quote any client text), or
    the client id."""
    return client["details"].get("connection_name", "").strip("'") or client["client_id"]


class Paced(threading.Thread):
    """Runs ``setup``, then ``step`` every ``PACE_S`` until ``finish``, then ``teardown`` at
    ``end`` (so the client stays connected in between); ``count`` is how many steps ran."""

    def __init__(self, setup: Callable[[], object], step: Callable[[object], None],
                 teardown: Callable[[object], None] = lambda _: None) -> None:
        super().__init__(daemon=True)
        self.setup, self.step, self.teardown = setup, step, teardown
        self.ready, self.stopped = threading.Event(), threading.Event()
        self._halt, self._ending = threading.Event(), threading.Event()
        self.count, self.error = 0, None

    def run(self) -> None:
        try:
            state = self.setup()
            self.ready.set()
            while not self._halt.wait(PACE_S):
                self.step(state)
                self.count += 1
            self.stopped.set()
            self._ending.wait()
            self.teardown(state)
        except Exception as error:  # reported by finish()
            self.error = error
            self.ready.set()
            self.stopped.set()

    def finish(self) -> int:
        """Stop stepping; how many steps ran (raises what the thread raised)."""
        self._halt.set()
        self.stopped.wait(WAIT_S)
        if self.error is not None:
            raise self.error
        return self.count

    def end(self) -> None:
        """Stop, tear down and wait for the thread."""
        self._halt.set()
        self._ending.set()
        self.join(WAIT_S)


def amqp_consumer(broker: BrokerThread) -> Paced:
    """Consumes ``AMQP_QUEUE`` with automatic acks, a short while at a time."""
    def setup():
        connection = amqp_connection(broker, "rates-consumer")
        channel = connection.channel()
        channel.queue_declare(AMQP_QUEUE)
        channel.basic_consume(AMQP_QUEUE, lambda *_: None, auto_ack=True)
        return connection
    return Paced(setup, lambda c: c.process_data_events(time_limit=PACE_S), lambda c: c.close())


def amqp_publisher(broker: BrokerThread) -> Paced:
    def setup():
        connection = amqp_connection(broker, "rates-publisher")
        channel = connection.channel()
        channel.queue_declare(AMQP_QUEUE)
        channel.confirm_delivery()
        return connection, channel
    return Paced(setup, lambda s: s[1].basic_publish("", AMQP_QUEUE, b"m"),
                 lambda s: s[0].close())


def native_consumer(config: ClientConfig) -> Paced:
    """Receives and acks ``NATIVE_TOPIC`` messages, polling a second at most at a time."""
    def step(consumer: SyncSimpleConsumer) -> None:
        for message in consumer.receive(32):
            consumer.ack(message)
    def setup() -> SyncSimpleConsumer:
        consumer = SyncSimpleConsumer(config, "rates-group", {NATIVE_TOPIC: "*"}, await_duration=1)
        consumer.start()
        return consumer
    return Paced(setup, step, lambda c: c.close())


def started(client: SyncProducer) -> SyncProducer:
    client.start()
    return client


def test_clients_of_every_protocol_report_rates_and_totals_of_what_they_sent(broker):
    admin = Http(broker.running.admin_url)
    assert admin("POST", "/topics", {"name": NATIVE_TOPIC})[0] == 201
    target = MqttTarget("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"])
    subscriber = Client(target, V5, "rates-mqtt-sub").connect()
    subscriber.subscribe(("rates/#", 0))
    native = ClientConfig(broker.running.native_address, "sluice", "sluice", client_id="rates-native-pub",
                          request_timeout=10)
    consumer_config = ClientConfig(broker.running.native_address, "sluice", "sluice",
                                   client_id="rates-native-sub", request_timeout=10)
    workers = [amqp_consumer(broker), native_consumer(consumer_config)]
    for worker in workers:
        worker.start()
        assert worker.ready.wait(WAIT_S) and worker.error is None, worker.error
    publishers = {
        ("mqtt", "rates-mqtt-pub"): Paced(lambda: Client(target, V5, "rates-mqtt-pub").connect(),
                                          lambda c: c.publish("rates/a", b"m", qos=1),
                                          lambda c: c.close()),
        ("amqp", "rates-publisher"): amqp_publisher(broker),
        ("native", "rates-native-pub"): Paced(lambda: started(SyncProducer(native)),
                                              lambda p: p.send(Message(NATIVE_TOPIC, b"m")),
                                              lambda p: p.close()),
    }
    consumers = {("mqtt", "rates-mqtt-sub"), ("amqp", "rates-consumer"),
                 ("native", "rates-native-sub")}

    def by_key() -> dict[tuple[str, str], dict]:
        return {(c["protocol"], name(c)): c for c in rows(admin)}

    try:
        for publisher in publishers.values():
            publisher.start()
            assert publisher.ready.wait(WAIT_S) and publisher.error is None, publisher.error
        # while they publish, every publisher's and consumer's rate goes above 0
        poll("every publisher and consumer to report a rate above 0", lambda: all(
            (row := by_key().get(key)) is not None and row[field] > 0
            for keys, field in ((publishers, "publish_rate"), (consumers, "deliver_rate"))
            for key in keys), lambda: {k: (r["publish_rate"], r["deliver_rate"], r["published"],
                                           r["delivered"]) for k, r in by_key().items()})

        def busiest() -> set[tuple[str, str]]:
            return {(c["protocol"], name(c)) for c in rows(admin, "?sort=-publish_rate&limit=3")}
        poll("the publishers to come first by publish rate", lambda: busiest() == set(publishers),
             busiest)

        sent = {key: publisher.finish() for key, publisher in publishers.items()}
        assert all(sent.values())
        # once they stop, each publisher's total is what it sent and each consumer got it all
        expected = {**sent, ("mqtt", "rates-mqtt-sub"): sent[("mqtt", "rates-mqtt-pub")],
                    ("amqp", "rates-consumer"): sent[("amqp", "rates-publisher")],
                    ("native", "rates-native-sub"): sent[("native", "rates-native-pub")]}

        def totals() -> dict[tuple[str, str], int]:
            now = by_key()
            return {key: now[key]["published" if key in publishers else "delivered"]
                    for key in expected if key in now}
        poll(f"totals {expected}", lambda: totals() == expected, totals)
        shown = admin("GET", "/clients/mqtt/rates-mqtt-sub")[1]
        assert shown["delivered"] == expected[("mqtt", "rates-mqtt-sub")] and shown["published"] == 0
        assert isinstance(shown["deliver_rate"], float)
    finally:
        for worker in [*publishers.values(), *workers]:
            worker.end()
        subscriber.close()


def test_an_amqp_clients_unacked_deliveries_are_its_inflight_count(broker):
    admin = Http(broker.running.admin_url)
    connection = amqp_connection(broker, "rates-holder")
    try:
        first, second = connection.channel(), connection.channel()
        first.queue_declare("rates-held")
        first.confirm_delivery()
        for n in range(5):
            first.basic_publish("", "rates-held", b"held %d" % n)
        held = [(channel, channel.basic_get("rates-held")[0]) for channel in (first,) * 3 + (second,) * 2]
        assert all(method is not None for _, method in held)

        def holder() -> dict | None:
            return next((c for c in rows(admin, "?protocol=amqp")
                         if name(c) == "rates-holder"), None)
        assert holder()["details"]["inflight"] == 5, "3 unacked on one channel and 2 on another"
        assert holder()["published"] == 5 and holder()["delivered"] == 5
        first.basic_ack(held[2][1].delivery_tag, multiple=True)
        second.basic_nack(held[4][1].delivery_tag, multiple=True, requeue=True)
        connection.process_data_events(time_limit=0)
        poll("the acks and requeues to empty the in-flight count",
             lambda: holder()["details"]["inflight"] == 0)
    finally:
        connection.close()


def test_kept_mqtt_sessions_have_no_totals_or_rates(broker):
    admin = Http(broker.running.admin_url)
    target = MqttTarget("127.0.0.1", broker.running.mqtt_listeners.ports["tcp"])
    device = Client(target, V5, "rates-kept", clean=False, session_expiry=3600).connect()
    device.publish("rates/kept", b"m", qos=1)
    assert admin("GET", "/clients/mqtt/rates-kept")[1]["published"] == 1
    device.disconnect()
    kept = poll("the session to be kept without its connection",
                lambda: (c := admin("GET", "/clients/mqtt/rates-kept")[1]) and not c["connected"] and c)
    assert (kept["published"], kept["delivered"], kept["publish_rate"], kept["deliver_rate"]) == (
        None, None, None, None)
    device.close()
