"""Queues bound to ``amq.topic`` read subjects through core's fan-out, over a real core on
`MemoryStore`: a publish of another protocol (a core send with a subject, as MQTT and native
producers make) reaches the queue, an AMQP publish is indexed once, unbinding and deleting stop
it, and binding is authorized on the subject filter the key reads."""
from __future__ import annotations

import pytest
from pamqp.commands import Basic, Confirm, Queue

from core.clock import now_ms
from core.errors import AccessDenied
from core.exchanges import Destination
from core.interop import MQTT_EXPIRY_AT
from core.model import SUBJECT_PROPERTY, Action, OutgoingMessage, Permission, ResourceKind
from core.vhosts import QueueSettings
from tests.unit.amqp.fake_wire import ADMIN, USER, Client, run
from tests.unit.amqp.test_messages import declared, publish


async def send_subject(core, subject: str, body: bytes) -> None:
    """What an MQTT or native publish on ``subject`` stores."""
    topic = core.broker.topic_of_subject(subject)
    await core.broker.send_decided([OutgoingMessage(topic, body,
                                                    properties={SUBJECT_PROPERTY: subject})])


def bodies(core, queue: str) -> list[bytes]:
    return [d.body for d in core.queues.pop(core.vhosts.get("/").named(queue), 50, 1000)]


def test_other_protocols_reach_a_queue_bound_to_amq_topic_and_amqp_is_indexed_once(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "t")
        await client.call(1, Queue.Bind(queue="t", exchange="amq.topic",
                                        routing_key="devices.*.telemetry"))
        await client.call(1, Queue.Bind(queue="t", exchange="amq.topic", routing_key="#.alarm"))
        await send_subject(core, "devices/d1/telemetry", b"mqtt")
        await send_subject(core, "devices/d1/status", b"not bound")
        await send_subject(core, "plant/3/alarm", b"alarm")
        await client.call(1, Confirm.Select())
        publish(client, b"amqp", "amq.topic", "devices.d2.telemetry")
        assert isinstance(await client.expect(Basic.Ack), Basic.Ack)
        assert bodies(core, "t") == [b"mqtt", b"alarm", b"amqp"]
        get = await client.call(1, Basic.Get(queue="t"))
        assert isinstance(get, Basic.GetEmpty), "each message once"

        queue = core.vhosts.get("/").named("t")
        end = core.queues.bounds(queue)[1]
        await client.call(1, Queue.Unbind(queue="t", exchange="amq.topic", routing_key="#.alarm"))
        await send_subject(core, "plant/3/alarm", b"after unbind")
        assert core.queues.bounds(queue)[1] == end, "nothing indexed after unbind"
        await send_subject(core, "devices/d9/telemetry", b"still bound")
        assert bodies(core, "t") == [b"still bound"]
        await client.call(1, Queue.Delete(queue="t"))
        await send_subject(core, "devices/d1/telemetry", b"after delete")
        assert core.queues.bounds(queue)[1] == end + 1, "nothing indexed after delete"
    run(tmp_path, scenario)


def test_bindings_are_mirrored_when_the_front_end_starts(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "t")
        await client.call(1, Queue.Bind(queue="t", exchange="amq.topic", routing_key="a.*"))
        await frontend.stop()
        core.queues.unbind("a/+", core.vhosts.get("/").named("t"))  # as after a restart
        await frontend.start()
        await send_subject(core, "a/b", b"restored")
        assert bodies(core, "t") == [b"restored"]
    run(tmp_path, scenario)


def test_binding_to_amq_topic_needs_the_right_to_read_its_subjects(tmp_path):
    async def scenario(frontend, core):
        users = core.broker.users
        bob, ada = users.principal(USER), users.principal(ADMIN)
        with pytest.raises(AccessDenied, match="devices/\\+/telemetry"):
            frontend.check_binding(bob, "/", "amq.topic", "devices.*.telemetry")
        with pytest.raises(AccessDenied, match="a/#"):
            frontend.check_binding(bob, "/", "amq.topic", "a.#.b")
        frontend.check_binding(bob, "/", "amq.direct", "devices.*.telemetry")
        frontend.check_binding(ada, "/", "amq.topic", "#")
        users.grant(Permission(USER, ResourceKind.TOPIC, "devices",
                               frozenset({Action.SUBSCRIBE})))
        frontend.check_binding(users.principal(USER), "/", "amq.topic",
                               "devices.*.telemetry")
    run(tmp_path, scenario)


def test_an_expired_mqtt_message_is_not_delivered_from_an_amqp_queue(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "t")
        await client.call(1, Queue.Bind(queue="t", exchange="amq.topic", routing_key="a.*"))
        for body, expiry_at in ((b"expired", now_ms() - 1), (b"fresh", now_ms() + 60_000)):
            await core.broker.send_decided([OutgoingMessage("a", body, properties={
                SUBJECT_PROPERTY: "a/b", MQTT_EXPIRY_AT: str(expiry_at)})])
        get = await client.call(1, Basic.Get(queue="t", no_ack=True))
        assert isinstance(get, Basic.GetOk)
        await client.next()
        assert (await client.next())[1].value == b"fresh"
        assert isinstance(await client.call(1, Basic.Get(queue="t")), Basic.GetEmpty)
    run(tmp_path, scenario)


def test_a_deleted_virtual_host_reads_no_more_subjects(tmp_path):
    async def scenario(frontend, core):
        vhosts = core.vhosts
        await vhosts.create("plant")
        await vhosts.declare_queue("plant", QueueSettings("alarms"))
        await vhosts.bind("plant", "amq.topic", Destination("alarms"), "plant.*.alarm")
        queue = vhosts.get("plant").named("alarms")
        await send_subject(core, "plant/1/alarm", b"read")
        assert core.queues.bounds(queue)[1] == 1
        await vhosts.delete("plant")
        await send_subject(core, "plant/2/alarm", b"after delete")
        assert core.queues.bounds(queue)[1] == 1, "nothing indexed once the vhost is gone"
    run(tmp_path, scenario)
