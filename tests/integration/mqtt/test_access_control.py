"""Who may do what over MQTT, against a real `sluice serve` and real clients.

- Rules on topic filters (allow/deny, per user or everyone, ``%u``/``%c``) confine a device to
  its own branch and carve exceptions out of a topic permission; they apply to publish,
  subscribe, retained messages, wills and shared subscriptions.
- A persistent session belongs to the user that created it: another user's CONNECT with its
  client id is refused (0x87 / return code 5) and the owner keeps it.
- A revoke, a rule change or a user's deletion ends at once what it no longer allows.
- A native send cannot smuggle a message under another topic's subject, and internal state
  topics are for admins only.
"""
from __future__ import annotations

import asyncio

import pytest

from protocols.mqtt.codec import MQTT_5, MQTT_311
from protocols.mqtt.packets import (ConnAck, Connect, Disconnect, PubAck, Publish, SubAck,
                                    Subscribe, Subscription, Will)
from protocols.mqtt.properties import Properties
from sluice.client import ClientConfig, Message, Producer, PullConsumer
from sluice.client.errors import SluiceClientError
from tests.integration.mqtt.test_robustness import (PASSWORD, USER, PahoClient, RawClient,
                                                    sluice_cli, started)  # noqa: F401

PERSISTENT = Properties(session_expiry_interval=3600)


def admin_cli(server, *args: str) -> str:
    return sluice_cli(*args, "--admin", server.admin, "--user", USER, "--password", PASSWORD)


def add_user(server, name: str, *grants: tuple[str, ...]) -> None:
    admin_cli(server, "user", "create", name, "--new-password", "pw")
    for kind, pattern, *actions in grants:
        admin_cli(server, "user", "grant", name, kind, pattern, *actions)


def connect(server, user: str, client_id: str, version: int = MQTT_5, **options) -> RawClient:
    client = RawClient(server.mqtt, version)
    ack = client.connect(username=user, password="pw", client_id=client_id, **options)
    assert ack.reason_code == 0, ack
    return client


def publish_acked(client: RawClient, topic: str, packet_id: int, payload: bytes = b"x") -> int:
    client.send(Publish(topic, payload, 1, packet_id=packet_id))
    return client.expect(PubAck).reason_code


def test_rules_confine_each_device_to_its_own_client_id(started):
    server = started()
    add_user(server, "fleet", ("topic", "devices", "publish", "subscribe"))
    admin_cli(server, "acl", "deny", "devices/#", "publish", "subscribe")
    admin_cli(server, "acl", "allow", "devices/%c/#", "publish", "subscribe")
    assert "devices/%c/#" in admin_cli(server, "acl", "list")

    d1 = connect(server, "fleet", "d1")
    d1.send(Subscribe(1, (Subscription("devices/d1/#", 1), Subscription("devices/+/telemetry", 1),
                          Subscription("devices/#", 1))))
    assert d1.expect(SubAck).reason_codes == (1, 0x87, 0x87)
    assert publish_acked(d1, "devices/d2/cmd", 2) == 0x87
    d1.send(Publish("devices/d1/telemetry", b"mine", 1, packet_id=3))
    got = {type(packet): packet for packet in (d1.read(), d1.read())}  # PUBACK and the echo
    assert got[PubAck] == PubAck(3, 0)
    assert (got[Publish].topic, got[Publish].payload) == ("devices/d1/telemetry", b"mine")
    d1.send(PubAck(got[Publish].packet_id))

    # a will or a retained message on another device's branch is refused like a publish
    refused = RawClient(server.mqtt, MQTT_5)
    refused.send(Connect(client_id="d3", username="fleet", password=b"pw",
                         will=Will("devices/d1/cmd", b"gone", 1, False)))
    assert refused.expect(ConnAck).reason_code == 0x87

    # the admin (no rules bind admins) publishes to every device; d1 gets only its own
    watcher = PahoClient(server.mqtt, "watcher")
    watcher.publish("devices/d2/cmd", b"not-for-d1", qos=1)
    watcher.publish("devices/d1/cmd", b"for-d1", qos=1)
    delivered = d1.expect(Publish)
    assert (delivered.topic, delivered.payload) == ("devices/d1/cmd", b"for-d1")
    watcher.stop()


def test_a_deny_rule_carves_a_branch_out_of_a_subscription(started):
    server = started()
    add_user(server, "tester", ("topic", "test", "publish", "subscribe"))
    admin_cli(server, "acl", "deny", "test/private/#", "subscribe", "--for", "tester")
    client = connect(server, "tester", "tester-1", MQTT_311)
    client.send(Subscribe(1, (Subscription("test/#", 1), Subscription("test/private/#", 1))))
    assert client.expect(SubAck).reason_codes == (1, 0x80)
    watcher = PahoClient(server.mqtt, "watcher")
    watcher.publish("test/private/x", b"hidden", qos=1)
    watcher.publish("test/public/x", b"visible", qos=1)
    delivered = client.expect(Publish)
    assert (delivered.topic, delivered.payload) == ("test/public/x", b"visible")
    watcher.stop()


def test_a_persistent_session_belongs_to_the_user_that_created_it(started):
    server = started()
    for name in ("alice", "mallory"):
        add_user(server, name, ("topic", "*", "publish", "subscribe"))
    alice = connect(server, "alice", "alice-phone", properties=PERSISTENT)
    alice.send(Subscribe(1, (Subscription("inbox/alice", 1),)))
    assert alice.expect(SubAck).reason_codes == (1,)

    for version, refusal in ((MQTT_5, 0x87), (MQTT_311, 5)):
        thief = RawClient(server.mqtt, version)
        ack = thief.connect(username="mallory", password="pw", client_id="alice-phone",
                            clean_start=False)
        assert ack.reason_code == refusal
        thief.close()
    alice.close()  # offline now: its session keeps messages, and still belongs to alice
    thief = RawClient(server.mqtt, MQTT_5)
    assert thief.connect(username="mallory", password="pw", client_id="alice-phone",
                         clean_start=False).reason_code == 0x87
    watcher = PahoClient(server.mqtt, "watcher")
    watcher.publish("inbox/alice", b"private", qos=1)
    alice = connect(server, "alice", "alice-phone", clean_start=False, properties=PERSISTENT)
    assert alice.expect(Publish).payload == b"private"
    watcher.stop()


def test_a_revoke_ends_the_subscriptions_it_no_longer_allows_at_once(started):
    server = started()
    add_user(server, "bob", ("topic", "alerts", "subscribe"), ("topic", "news", "subscribe"))
    bob = connect(server, "bob", "bob-1", properties=PERSISTENT)
    bob.send(Subscribe(1, (Subscription("alerts/#", 1), Subscription("news/#", 1))))
    assert bob.expect(SubAck).reason_codes == (1, 1)
    watcher = PahoClient(server.mqtt, "watcher")
    watcher.publish("alerts/a", b"before", qos=1)
    assert bob.expect(Publish).payload == b"before"
    bob.send(PubAck(1))

    admin_cli(server, "user", "revoke", "bob", "topic", "alerts")
    assert bob.read_until_closed() == [Disconnect(0x87)]
    watcher.publish("alerts/a", b"after", qos=1)  # kept for nobody: the subscription is gone
    watcher.publish("news/n", b"still", qos=1)
    bob = connect(server, "bob", "bob-1", clean_start=False, properties=PERSISTENT)
    assert bob.expect(Publish).payload == b"still"
    bob.send(Subscribe(2, (Subscription("alerts/#", 1),)))
    assert bob.expect(SubAck).reason_codes == (0x87,)
    watcher.stop()


def test_deleting_a_user_ends_its_connections_and_sessions(started):
    server = started()
    add_user(server, "temp", ("topic", "*", "publish", "subscribe"))
    temp = connect(server, "temp", "temp-1", properties=PERSISTENT)
    admin_cli(server, "user", "delete", "temp")
    assert temp.read_until_closed() == [Disconnect(0x87)]
    add_user(server, "temp", ("topic", "*", "publish", "subscribe"))  # a new user of that name
    again = RawClient(server.mqtt, MQTT_5)
    ack = again.connect(username="temp", password="pw", client_id="temp-1", clean_start=False,
                        properties=PERSISTENT)
    assert ack.reason_code == 0 and not ack.session_present


def test_a_native_send_cannot_reach_another_topics_subscribers(started):
    """A user allowed only on native topic ``a-1`` sends there with subject ``secret/cmd``:
    refused, and subscribers of ``secret/#`` (live or persistent) get nothing."""
    server = started()
    add_user(server, "narrow", ("topic", "a-1", "publish"))
    admin_cli(server, "topic", "create", "a-1", "--queues", "1")
    admin_cli(server, "topic", "create", "secret", "--queues", "1")
    watcher = PahoClient(server.mqtt, "watcher")
    watcher.subscribe("secret/#", qos=1)
    config = ClientConfig(server.native, access_key="narrow", secret_key="pw")

    async def send() -> None:
        async with Producer(config, ["a-1"]) as producer:
            with pytest.raises(SluiceClientError, match="does not belong to topic"):
                await producer.send(Message("a-1", b"injected",
                                            properties={"sluice.subject": "secret/cmd"}))
            await producer.send(Message("a-1", b"fine", properties={"sluice.subject": "a-1/x"}))
    asyncio.run(send())
    watcher.publish("secret/cmd", b"marker", qos=1)
    assert watcher.next_message().payload == b"marker"  # nothing came before it
    watcher.stop()


def test_internal_state_topics_are_for_admins_only(started):
    server = started()
    add_user(server, "wide", ("topic", "*", "publish", "subscribe"), ("group", "*", "subscribe"))
    config = ClientConfig(server.native, access_key="wide", secret_key="pw")

    async def probe() -> None:
        async with Producer(config, []) as producer:
            with pytest.raises(SluiceClientError, match="may (not|neither) publish"):
                await producer.send(Message("%SYS%mqtt.sessions", b"x", keys=["s/victim"]))
        with pytest.raises(SluiceClientError, match="may (not|neither) (publish nor )?subscribe"):
            async with PullConsumer(config, "g", ["%SYS%mqtt.sessions"],
                                    start_from="earliest") as consumer:
                async for _ in consumer.poll():
                    break
    asyncio.run(probe())
