"""AMQP messages through fake wires over a real core on `MemoryStore`: publishes routed and
stored once, their properties coming back, mandatory returns, publisher confirms, basic.get,
acks and requeues, consumers and prefetch."""
from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from pamqp.commands import Basic, Channel, Confirm, Exchange, Queue

from core.model import SUBJECT_PROPERTY
from core.settings import CoreConfig
from protocols.amqp.frames import encode_content
from protocols.amqp.mapping import exchange_topic, subject_of_key
from tests.unit.amqp.fake_wire import USER, Client, run

PROPERTIES = Basic.Properties(
    content_type="application/json", content_encoding="gzip",
    headers={"b": "text", "a": 1, "raw": bytearray(b"\xff\x00"), "n": Decimal("1.25"),
             "t": {"$bytes": "not a tag"}, "l": [True, None, 2.5],
             "at": datetime(2024, 5, 1, tzinfo=UTC)},
    delivery_mode=2, priority=7, correlation_id="c-1", reply_to="replies", expiration="60000",
    message_id="m-1", timestamp=datetime(2024, 5, 1, 12, 0, tzinfo=UTC), message_type="order",
    user_id="ada", app_id="shop")


def publish(client: Client, body: bytes, exchange: str = "", key: str = "q", channel: int = 1,
            properties: Basic.Properties | None = None, mandatory: bool = False) -> None:
    client.send(encode_content(channel, Basic.Publish(exchange=exchange, routing_key=key,
                                                      mandatory=mandatory),
                               properties or Basic.Properties(), body, 4096))


async def content(client: Client, kind: type) -> tuple[object, Basic.Properties, bytes]:
    """A method with content (deliver, get-ok, return): the method, properties, body."""
    method = await client.expect(kind)
    header = (await client.next())[1]
    body = b""
    while len(body) < header.body_size:
        body += (await client.next())[1].value
    return method, header.properties, body


async def declared(client: Client, queue: str, channel: int = 1) -> None:
    assert isinstance(await client.call(channel, Queue.Declare(queue=queue)), Queue.DeclareOk)


def test_a_publish_is_stored_once_and_comes_back_with_its_properties(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await declared(client, "r")
        assert isinstance(await client.call(1, Exchange.Declare(exchange="fan",
                                                                exchange_type="fanout")),
                          Exchange.DeclareOk)
        for queue in ("q", "r"):
            assert isinstance(await client.call(1, Queue.Bind(queue=queue, exchange="fan")),
                              Queue.BindOk)
        publish(client, b"hello", "fan", "any", properties=PROPERTIES)
        get = await client.call(1, Basic.Get(queue="q"))
        if isinstance(get, Basic.GetEmpty):  # the store answered after the get was read
            get = await client.call(1, Basic.Get(queue="q"))
        assert isinstance(get, Basic.GetOk)
        assert (get.exchange, get.routing_key, get.redelivered, get.message_count) == \
            ("fan", "any", False, 0)
        header = (await client.next())[1]
        body = (await client.next())[1].value
        assert body == b"hello" and header.properties == PROPERTIES
        topic = exchange_topic("/", "fan")
        assert topic == "amqp.fan" and core.broker.describe_topic(topic).queues
        stored = sum(q.max_offset for q in core.broker.describe_topic(topic).queues)
        assert stored == 1, "stored once, indexed into both queues"
        [other] = core.queues.pop(core.vhosts.get("/").named("r"), 5, 1000)
        assert other.body == b"hello"
    run(tmp_path, scenario)


def test_exchange_topics_and_subjects_are_escaped_reversibly():
    assert exchange_topic("/", "") == "amqp.amq%2Edefault"
    assert exchange_topic("prod", "a.b") == "amqp.prod.a%2Eb"
    assert exchange_topic("a", "b") != exchange_topic("/", "a.b")
    assert len(exchange_topic("/", "x" * 255)) <= 127
    assert subject_of_key("devices.d/1.50%") == "devices/d.1/50%"


def test_amq_topic_stores_under_the_subject_of_the_routing_key(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "t")
        await client.call(1, Queue.Bind(queue="t", exchange="amq.topic",
                                        routing_key="devices.*.telemetry"))
        await client.call(1, Confirm.Select())
        publish(client, b"21.5", "amq.topic", "devices.d1.telemetry")
        assert isinstance(await client.expect(Basic.Ack), Basic.Ack)
        [stored] = core.queues.pop(core.vhosts.get("/").named("t"), 5, 1000)
        assert stored.home_topic == "devices"
        assert stored.properties[SUBJECT_PROPERTY] == "devices/d1/telemetry"
    run(tmp_path, scenario)


def test_unroutable_mandatory_is_returned_then_confirmed_and_nothing_is_stored(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert isinstance(await client.call(1, Confirm.Select()), Confirm.SelectOk)
        publish(client, b"lost", "amq.direct", "nobody", mandatory=True)
        returned, _, body = await content(client, Basic.Return)
        assert (returned.reply_code, returned.reply_text, body) == (312, "NO_ROUTE", b"lost")
        ack = await client.expect(Basic.Ack)
        assert (ack.delivery_tag, ack.multiple) == (1, False)
        publish(client, b"dropped", "amq.direct", "nobody")
        assert (await client.expect(Basic.Ack)).delivery_tag == 2
        assert "amqp.amq%2Edirect" not in {t.name for t in core.broker.list_topics()}
    run(tmp_path, scenario)


def test_a_returned_publish_whose_headers_pamqp_cannot_encode_is_returned_all_the_same(tmp_path):
    """A long-string header that is not UTF-8 decodes as bytes, which pamqp's encoder refuses:
    the return carries it as a byte array instead of failing the publisher's connection."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await client.call(1, Confirm.Select())
        wire = encode_content(1, Basic.Publish(exchange="amq.direct", routing_key="nobody",
                                               mandatory=True),
                              Basic.Properties(headers={"k": "AB", "n": 1}), b"lost", 4096)
        client.send(wire.replace(b"S\x00\x00\x00\x02AB", b"S\x00\x00\x00\x02\xff\xfe"))
        returned, properties, body = await content(client, Basic.Return)
        assert (returned.reply_code, body) == (312, b"lost")
        assert properties.headers == {"k": bytearray(b"\xff\xfe"), "n": 1}
        assert (await client.expect(Basic.Ack)).delivery_tag == 1
    run(tmp_path, scenario)


def test_confirms_ack_consecutive_publishes_with_multiple(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        client.send(b"".join(encode_content(1, Basic.Publish(routing_key="q"),
                                            Basic.Properties(), b"%d" % n, 4096)
                             for n in range(5)))
        acked = 0
        while acked < 5:
            ack = await client.expect(Basic.Ack)
            assert ack.delivery_tag > acked and (ack.multiple or ack.delivery_tag == acked + 1)
            acked = ack.delivery_tag
        assert core.queues.ready(core.vhosts.get("/").named("q")) == 5
    run(tmp_path, scenario)


def test_a_store_that_fails_is_nacked(tmp_path, monkeypatch):
    async def scenario(frontend, core):
        from core.errors import QuotaExceeded

        async def full(messages):
            raise QuotaExceeded("disk full")
        monkeypatch.setattr(core.broker, "send_decided", full)
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        publish(client, b"x")
        nack = await client.expect(Basic.Nack)
        assert nack.delivery_tag == 1
    run(tmp_path, scenario)


def test_a_body_larger_than_core_stores_is_refused_at_its_header_as_rabbitmq_does(tmp_path):
    """core.max_message_bytes below amqp.max_message_size: the smaller holds, with RabbitMQ's
    406 channel close naming it, rather than a nack once the body was read."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        publish(client, b"x" * 1000)
        assert (await client.expect(Basic.Ack, 1)).delivery_tag == 1
        publish(client, b"x" * 1001, channel=2)
        close = await client.expect(Channel.Close, 2)
        assert (close.reply_code, close.reply_text) == (406, "PRECONDITION_FAILED - message "
                                                        "size 1001 is larger than configured "
                                                        "max size 1000")
    run(tmp_path, scenario, config=CoreConfig(offset_commit_interval_ms=50,
                                              max_message_bytes=1000))


def test_user_id_must_be_the_logged_in_user(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        publish(client, b"x", properties=Basic.Properties(user_id="mallory"))
        close = await client.expect(Channel.Close)
        assert close.reply_code == 406 and "mallory" in close.reply_text
    run(tmp_path, scenario)


def test_the_vhost_write_permission_decides_an_exchange_publish_and_subjects_need_theirs(
        tmp_path):
    """As in RabbitMQ, write on the exchange lets a user publish to it (its messages are
    stored in the exchange's own topic, no topic grant needed); amq.topic's keys are subjects
    MQTT and native clients share, so publishing there also needs the subject's publish right."""
    async def scenario(frontend, core):
        admin = Client(frontend)
        await admin.open()
        await declared(admin, "q")
        await core.vhost_admin.permit(USER, "/", "", "^(amq\\.default|amq\\.topic)$", "")
        client = Client(frontend)
        await client.open(USER)
        await client.call(1, Confirm.Select())
        publish(client, b"x")
        await client.expect(Basic.Ack)
        publish(client, b"reading", exchange="amq.topic", key="devices.d1.telemetry")
        close = await client.expect(Channel.Close)
        assert close.reply_code == 403 and "devices/d1/telemetry" in close.reply_text
        get, _, body = await content_of_get(admin, "q")
        assert body == b"x"
    run(tmp_path, scenario)


def test_get_ack_reject_and_requeue(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        for body in (b"a", b"b"):
            publish(client, body)
            await client.expect(Basic.Ack)
        get, _, body = await content_of_get(client, "q")
        assert (body, get.redelivered, get.message_count) == (b"a", False, 1)
        client.send_method(1, Basic.Nack(get.delivery_tag, requeue=True))
        get, _, body = await content_of_get(client, "q")
        assert (body, get.redelivered) == (b"a", True)
        client.send_method(1, Basic.Reject(get.delivery_tag, requeue=False))
        get, _, body = await content_of_get(client, "q")
        assert body == b"b"
        client.send_method(1, Basic.Ack(get.delivery_tag))
        assert isinstance(await client.call(1, Basic.Get(queue="q")), Basic.GetEmpty)
        close = await client.call(1, Basic.Ack(99))
        assert isinstance(close, Channel.Close) and close.reply_code == 406
        assert "unknown delivery tag 99" in close.reply_text
    run(tmp_path, scenario)


async def content_of_get(client: Client, queue: str):
    client.send_method(1, Basic.Get(queue=queue))
    return await content(client, Basic.GetOk)


def test_requeued_messages_come_back_in_queue_order(tmp_path, monkeypatch):
    """As RabbitMQ requeues a message at its place: rejected c, b, a (a second apart each)
    come back a, b, c."""
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 1000))
    monkeypatch.setattr("core.named_queues.now_ms", lambda: next(clock))

    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        for body in (b"a", b"b", b"c"):
            publish(client, body)
            await client.expect(Basic.Ack)
        tags = [(await content_of_get(client, "q"))[0].delivery_tag for _ in range(3)]
        for tag in reversed(tags):
            client.send_method(1, Basic.Reject(tag, requeue=True))
        again = [await content_of_get(client, "q") for _ in range(3)]
        assert [(body, get.redelivered) for get, _, body in again] == [
            (b"a", True), (b"b", True), (b"c", True)]
    run(tmp_path, scenario)


def test_closing_a_channel_releases_its_unacked_deliveries(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open(channels=(1, 2))
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        publish(client, b"a")
        await client.expect(Basic.Ack)
        client.send_method(2, Basic.Get(queue="q"))
        await content(client, Basic.GetOk)
        assert isinstance(await client.call(2, Channel.Close(200, "bye", 0, 0)), Channel.CloseOk)
        get, _, body = await content_of_get(client, "q")
        assert (body, get.redelivered) == (b"a", True)
        client.send_method(1, Basic.Recover(requeue=True))
        await client.expect(Basic.RecoverOk)
        get, _, _ = await content_of_get(client, "q")
        assert get.redelivered
    run(tmp_path, scenario)


def test_a_consumer_never_holds_more_than_its_prefetch(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await declared(client, "q")
        await client.call(1, Confirm.Select())
        for n in range(5):
            publish(client, b"%d" % n)
            await client.expect(Basic.Ack)
        await client.call(1, Basic.Qos(prefetch_count=2))
        client.send_method(1, Basic.Consume(queue="q"))
        ok = await client.expect(Basic.ConsumeOk)
        assert ok.consumer_tag.startswith("amq.ctag-")
        first, _, _ = await content(client, Basic.Deliver)
        second, _, _ = await content(client, Basic.Deliver)
        assert (first.delivery_tag, second.delivery_tag) == (1, 2)
        declare = await client.call(1, Queue.Declare(queue="q", passive=True))
        assert (declare.message_count, declare.consumer_count) == (3, 1)
        client.send_method(1, Basic.Ack(2, multiple=True))
        third, _, body = await content(client, Basic.Deliver)
        assert third.delivery_tag == 3 and body == b"2"
        fourth, _, _ = await content(client, Basic.Deliver)
        assert isinstance(await client.call(1, Basic.Cancel(ok.consumer_tag)), Basic.CancelOk)
        client.send_method(1, Basic.Ack(fourth.delivery_tag, multiple=True))
        get, _, body = await content_of_get(client, "q")
        assert body == b"4", "a cancelled consumer gets nothing more"
    run(tmp_path, scenario)


def test_a_consumer_is_pushed_what_arrives_and_cancelled_when_its_queue_goes(tmp_path):
    async def scenario(frontend, core):
        consumer = Client(frontend)
        await consumer.open()
        await declared(consumer, "q")
        consumer.send_method(1, Basic.Consume(queue="q", consumer_tag="c1", no_ack=True))
        await consumer.expect(Basic.ConsumeOk)
        other = Client(frontend)
        await other.open()
        close = await other.call(1, Basic.Consume(queue="q", exclusive=True))
        assert isinstance(close, Channel.Close) and close.reply_code == 403
        other.send_method(1, Channel.CloseOk())
        other.send_method(2, Channel.Open())
        await other.expect(Channel.OpenOk)
        publish(other, b"pushed", channel=2)
        deliver, _, body = await content(consumer, Basic.Deliver)
        assert (deliver.consumer_tag, body) == ("c1", b"pushed")
        assert isinstance(await other.call(2, Queue.Delete(queue="q")), Queue.DeleteOk)
        cancel = await consumer.expect(Basic.Cancel)
        assert cancel.consumer_tag == "c1"
    run(tmp_path, scenario)
