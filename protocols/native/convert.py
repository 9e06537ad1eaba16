"""Mapping between RocketMQ 5 protobuf messages and core's domain types. Pure functions."""

from __future__ import annotations

import ipaddress
import time
import zlib

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb

from core.errors import InvalidArgument, NotSupported
from core import cloudevents
from core.interop import AMQP_EXCHANGE, MQTT_QOS, check_sender_properties, without_user_properties
from core.model import Delivery, MessageType, OutgoingMessage, Subscription, TopicConfig
from core.model import MESSAGE_GROUP_PROPERTY

BROKER_NAME = "sluice"
"""The one broker name every route and assignment names (Sluice is one broker process)."""

MESSAGE_TYPES = {
    MessageType.NORMAL: pb.MessageType.NORMAL,
    MessageType.FIFO: pb.MessageType.FIFO,
    MessageType.DELAY: pb.MessageType.DELAY,
    MessageType.TRANSACTION: pb.MessageType.TRANSACTION,
    MessageType.PRIORITY: pb.MessageType.PRIORITY,
    MessageType.LITE: pb.MessageType.LITE,
}


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def timestamp(ms: int) -> Timestamp:
    """A protobuf Timestamp for ``ms`` milliseconds since the epoch, held to the years 1-9999
    a Timestamp can name (a time stored by an older version may lie outside them)."""
    result = Timestamp()
    result.FromMilliseconds(min(max(ms, _FIRST_MS), _LAST_MS))
    return result


def duration(ms: int) -> Duration:
    """A protobuf Duration of ``ms`` milliseconds."""
    result = Duration()
    result.FromMilliseconds(ms)
    return result


def name_of(resource: pb.Resource, kind: str) -> str:
    """The name a Resource carries; raise InvalidArgument if it is empty."""
    if not resource.name:
        raise InvalidArgument(f"the request names no {kind}; set the {kind} name")
    return resource.name


def endpoints_for(host: str, port: int) -> pb.Endpoints:
    """Endpoints naming ``host:port``, with the scheme the clients expect for that host."""
    try:
        version = ipaddress.ip_address(host).version
        scheme = pb.AddressScheme.IPv4 if version == 4 else pb.AddressScheme.IPv6
    except ValueError:
        scheme = pb.AddressScheme.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def message_queue(topic: pb.Resource, config: TopicConfig, queue_id: int,
                  endpoints: pb.Endpoints,
                  permission: pb.Permission = pb.Permission.READ_WRITE) -> pb.MessageQueue:
    """The MessageQueue for one queue of a topic on this broker, readable and writable unless
    ``permission`` says otherwise."""
    return pb.MessageQueue(
        topic=pb.Resource(name=config.name, resource_namespace=topic.resource_namespace),
        id=queue_id, permission=permission,
        broker=pb.Broker(name=BROKER_NAME, id=0, endpoints=endpoints),
        accept_message_types=[MESSAGE_TYPES[config.message_type]])


def filter_of(expression: pb.FilterExpression) -> tuple[str, str]:
    """A request's filter as core's (expression, expression type): TAG or SQL92."""
    kind = "SQL92" if expression.type == pb.FilterType.SQL else "TAG"
    return expression.expression.strip() or "*", kind


def subscription(group: str, entry: pb.SubscriptionEntry) -> Subscription:
    """A core Subscription from a client's settings."""
    expression, kind = filter_of(entry.expression)
    return Subscription(group=group, topic=name_of(entry.topic, "topic"), expression=expression,
                        expression_type=kind)


def outgoing(message: pb.Message) -> OutgoingMessage:
    """A core OutgoingMessage from a SendMessage entry (a delivery time in the future makes
    it a delayed message, message type TRANSACTION a half message, a lite topic a message of
    one); GZIP bodies are refused, and so are user properties in a namespace the broker
    writes (``amqp.*``, ``mqtt.*``, ``sluice.*`` but the subject: ``core.interop``)."""
    props = message.system_properties
    if props.body_encoding == pb.Encoding.GZIP:
        raise NotSupported("GZIP-encoded bodies are not supported in this version of Sluice; "
                           "send the body uncompressed")
    check_sender_properties(message.user_properties)
    return OutgoingMessage(
        topic=name_of(message.topic, "topic"), body=message.body,
        tag=props.tag if props.HasField("tag") else "", keys=tuple(props.keys),
        properties=dict(message.user_properties),
        message_group=props.message_group if props.HasField("message_group") else "",
        msg_id=props.message_id,
        born_ts=_millis(props.born_timestamp, "born_timestamp") if props.HasField("born_timestamp") else 0,
        delivery_ts=(_millis(props.delivery_timestamp, "delivery_timestamp")
                     if props.HasField("delivery_timestamp") else 0),
        transactional=props.message_type == pb.MessageType.TRANSACTION,
        priority=props.priority if props.HasField("priority") else None,
        lite_topic=props.lite_topic if props.HasField("lite_topic") else "")


MAX_TIMESTAMP_SECONDS = 253_402_300_799
"""The last second of year 9999, the largest valid protobuf Timestamp."""
_FIRST_MS = -62_135_596_800_000
"""The first millisecond of year 1, the smallest valid protobuf Timestamp."""
_LAST_MS = MAX_TIMESTAMP_SECONDS * 1000 + 999


def _millis(timestamp: Timestamp, field: str) -> int:
    """A Timestamp as milliseconds since the epoch. The official Python client puts the value
    it is given, documented as milliseconds, in the ``seconds`` field: a seconds value past
    year 9999 is read as milliseconds, so a timestamp in either unit works."""
    seconds, nanos = timestamp.seconds, timestamp.nanos
    if not 0 <= nanos < 1_000_000_000 or seconds < 0:
        raise InvalidArgument(f"{field} is not a valid timestamp (seconds {seconds}, nanos {nanos})")
    if seconds > MAX_TIMESTAMP_SECONDS:
        if seconds > MAX_TIMESTAMP_SECONDS * 1000:
            raise InvalidArgument(f"{field} {seconds} is beyond year 9999 in seconds and milliseconds")
        return seconds
    return seconds * 1000 + nanos // 1_000_000


def delivered(delivery: Delivery, topic: pb.Resource, message_type: MessageType,
              store_host: str, now: int) -> pb.Message:
    """The protobuf Message a consumer receives for ``delivery``."""
    props = pb.SystemProperties(
        keys=list(delivery.keys), message_id=delivery.msg_id,
        body_digest=pb.Digest(type=pb.DigestType.CRC32,
                              checksum=format(zlib.crc32(delivery.body) & 0xFFFFFFFF, "08X")),
        body_encoding=pb.Encoding.IDENTITY, message_type=MESSAGE_TYPES[message_type],
        born_timestamp=timestamp(delivery.born_ts), store_timestamp=timestamp(delivery.store_ts),
        store_host=store_host, queue_id=delivery.queue_id, queue_offset=delivery.queue_offset,
        delivery_attempt=delivery.attempt)
    if message_type is MessageType.PRIORITY:  # a priority topic's queue is the priority
        props.priority = delivery.queue_id
    if delivery.lite_topic:
        props.lite_topic = delivery.lite_topic
    if delivery.tag:
        props.tag = delivery.tag
    properties = dict(delivery.properties)
    if AMQP_EXCHANGE in properties or MQTT_QOS in properties:
        properties = with_event_properties(properties, delivery.body)
    group = properties.pop(MESSAGE_GROUP_PROPERTY, "")
    if group:
        props.message_group = group
    if delivery.receipt_handle:
        props.receipt_handle = delivery.receipt_handle
        props.invisible_duration.CopyFrom(duration(max(0, delivery.invisible_until_ms - now)))
    return pb.Message(topic=pb.Resource(name=delivery.topic, resource_namespace=topic.resource_namespace),
                      user_properties=properties, system_properties=props,
                      body=delivery.body)


def with_event_properties(stored: dict[str, str], body: bytes) -> dict[str, str]:
    """The properties of a message MQTT or AMQP stored, for a native consumer: a CloudEvent
    in the RocketMQ binding (``CE_<attribute>`` properties, ``CE_contenttype``, in place of
    the user properties or headers that carried them; a structured one keeps its body, with
    ``CE_contenttype`` ``application/cloudevents+json``); anything else as stored."""
    event = cloudevents.event_of(stored, body)
    if event is None:
        return stored
    if event.structured:
        return {**stored, cloudevents.NATIVE_CONTENT_TYPE: cloudevents.STRUCTURED_TYPE}
    return {**without_user_properties(stored, event.carried),
            **cloudevents.native_properties(event)}
