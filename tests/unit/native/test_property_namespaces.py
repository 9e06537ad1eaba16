"""A native producer names its own properties, but not in the namespaces the broker writes:
``amqp.*`` (the AMQP adapter), ``mqtt.*`` (the MQTT adapter) and ``sluice.*`` (core), except the
subject and the SDK's packed-batch count. Consumers rely on those names: a forged
``amqp.user_id`` would claim a user RabbitMQ vouches for, a forged ``sluice.timer.into``
would index a delayed message into an internal queue when it falls due. And what an older
version stored without these checks is still delivered."""
from __future__ import annotations

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from core import interop
from core.errors import InvalidArgument
from core.model import Delivery, MessageType
from protocols.native.convert import delivered, outgoing
from sluice.client import BATCH_PROPERTY


def send(properties: dict[str, str]) -> pb.Message:
    return pb.Message(topic=pb.Resource(name="devices"), body=b"b", user_properties=properties,
                      system_properties=pb.SystemProperties(message_id="m1"))


FORGED = ["amqp.headers", "amqp.user_id", "amqp.exchange", "amqp.routing_key",
          "amqp.delivery_mode", "mqtt.qos", "mqtt.user_properties", "mqtt.client",
          "mqtt.expiry_at", "sluice.message_group", "sluice.lite", "sluice.timer.into",
          "sluice.timer.queue", "sluice.txn.topic", "sluice.dlq.origin_topic", "sluice.", "amqp."]


@pytest.mark.parametrize("name", FORGED)
def test_a_property_in_a_namespace_the_broker_writes_is_refused_by_name(name):
    with pytest.raises(InvalidArgument, match=f"property '{name}' is in the {name.split('.')[0]}"):
        outgoing(send({"site": "oslo", name: '{"x": {"$decimal": "1e400000"}}'}))


@pytest.mark.parametrize("name", ["site", "sluice.subject", "sluice.batch", "amqp", "amqpx.y",
                                  "x.amqp.headers", "AMQP.headers", "Mqtt.qos", "sluice_subject"])
def test_other_names_are_the_producers_own(name):
    value = "devices/d1" if name == "sluice.subject" else "1"
    assert outgoing(send({name: value})).properties == {name: value}


def test_the_batch_property_is_the_sdks():
    assert interop.BATCH_PROPERTY == BATCH_PROPERTY
    assert interop.BATCH_PROPERTY in interop.SENDER_PROPERTIES


@pytest.mark.parametrize("born_ms", [1 << 62, -(1 << 62), 253_402_300_800_000, -1])
def test_a_stored_time_a_timestamp_cannot_name_is_delivered_held_to_its_range(born_ms):
    """Times an older version stored are not checked again: the message is still delivered."""
    message = Delivery("t", 0, 0, "id", b"body", "", (), {}, born_ms, born_ms)
    got = delivered(message, pb.Resource(name="t"), MessageType.NORMAL, "host", 0)
    assert got.SerializeToString()
    assert -62_135_596_800 <= got.system_properties.born_timestamp.seconds <= 253_402_300_799
