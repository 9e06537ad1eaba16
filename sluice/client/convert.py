"""Conversion between the SDK's types and the RocketMQ 5 protobuf messages. Pure, no I/O.

Also makes message ids in the official clients' v1 layout: ``01`` + MAC (6 bytes) + pid (low 2
bytes) + seconds since 2021-01-01 UTC (4 bytes) + a process-wide counter (4 bytes), in hex.
"""

from __future__ import annotations

import gzip
import ipaddress
import itertools
import os
import socket
import time
import uuid
import zlib

from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol.definition_pb2 import (Address, AddressScheme, Encoding, Endpoints,
                                                   FilterExpression, FilterType, MessageType,
                                                   Resource)
from rocketmq.grpc_protocol.definition_pb2 import Message as ProtoMessage

from .config import ClientConfig, split_endpoint
from .errors import PackedBatchError
from .model import Message, ReceivedMessage, Sql92
from .packing import BATCH_PROPERTY, unpack_bodies

_EPOCH_2021 = 1_609_459_200
_ids = itertools.count()
_id_prefix = ""


def _reset_id_prefix() -> None:
    global _id_prefix
    _id_prefix = ""


os.register_at_fork(after_in_child=_reset_id_prefix)  # a forked child has another pid


def new_message_id() -> str:
    """A new message id, unique across processes and hosts (official v1 layout)."""
    global _id_prefix
    if not _id_prefix:
        node = uuid.getnode().to_bytes(6, "big") + (os.getpid() & 0xFFFF).to_bytes(2, "big")
        _id_prefix = "01" + node.hex().upper()
    seconds = (int(time.time()) - _EPOCH_2021) & 0xFFFF_FFFF
    return f"{_id_prefix}{seconds:08X}{next(_ids) & 0xFFFF_FFFF:08X}"


def resource(namespace: str, name: str) -> Resource:
    """A topic or group name in ``namespace``."""
    return Resource(resource_namespace=namespace, name=name)


def endpoints(config: ClientConfig) -> Endpoints:
    """The configured access point (every endpoint of it) as an ``Endpoints`` message."""
    host, port = config.host, config.port
    try:
        scheme = AddressScheme.IPv4 if ipaddress.ip_address(host).version == 4 else AddressScheme.IPv6
    except ValueError:
        scheme = AddressScheme.DOMAIN_NAME
    addresses = [Address(host=host, port=port) for host, port in map(split_endpoint, config.endpoints)]
    return Endpoints(scheme=scheme, addresses=addresses)


def duration(seconds: float) -> Duration:
    """``seconds`` as a protobuf Duration."""
    result = Duration()
    result.FromNanoseconds(round(seconds * 1e9))
    return result


def tag_filter(expression: str) -> FilterExpression:
    """A tag filter: ``"*"`` for every tag, or ``"TagA || TagB"``; an ``Sql92`` expression
    becomes an SQL92 filter."""
    if isinstance(expression, Sql92):
        return FilterExpression(type=FilterType.SQL, expression=expression)
    return FilterExpression(type=FilterType.TAG, expression=expression or "*")


def message_type(message: Message, transactional: bool = False) -> MessageType.ValueType:
    """TRANSACTION within a transaction, PRIORITY with a priority, LITE with a lite topic,
    FIFO with a message group, DELAY with a delivery timestamp, else NORMAL."""
    if transactional:
        return MessageType.TRANSACTION
    if message.priority is not None:
        return MessageType.PRIORITY
    if message.lite_topic:
        return MessageType.LITE
    if message.message_group:
        return MessageType.FIFO
    if message.delivery_timestamp:
        return MessageType.DELAY
    return MessageType.NORMAL


def message_to_proto(message: Message, namespace: str, queue_id: int, message_id: str,
                     born_ms: int, transactional: bool = False) -> ProtoMessage:
    """The protobuf form of ``message``, addressed to ``queue_id``."""
    proto = ProtoMessage()  # field by field: much faster than keyword construction with upb
    proto.topic.resource_namespace = namespace
    proto.topic.name = message.topic
    proto.body = message.body
    if message.properties:
        proto.user_properties.update(message.properties)
    props = proto.system_properties
    props.message_id = message_id
    props.message_type = message_type(message, transactional)
    props.body_encoding = Encoding.IDENTITY
    props.born_host = _hostname()
    seconds, millis = divmod(born_ms, 1000)
    props.born_timestamp.seconds = seconds
    props.born_timestamp.nanos = millis * 1_000_000
    props.queue_id = queue_id
    if message.keys:
        props.keys.extend(message.keys)
    if message.tag:
        props.tag = message.tag
    if message.message_group:
        props.message_group = message.message_group
    if message.delivery_timestamp:
        props.delivery_timestamp.FromMilliseconds(message.delivery_timestamp)
    if message.priority is not None:
        props.priority = message.priority
    if message.lite_topic:
        props.lite_topic = message.lite_topic
    return proto


def message_from_proto(proto: ProtoMessage) -> ReceivedMessage:
    """The received form of a protobuf message; a GZIP body is decompressed."""
    props = proto.system_properties
    body = proto.body
    if props.body_encoding == Encoding.GZIP:
        body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else zlib.decompress(body)
    return ReceivedMessage(
        topic=proto.topic.name,
        queue_id=props.queue_id,
        offset=props.queue_offset,
        message_id=props.message_id,
        body=body,
        tag=props.tag,
        keys=tuple(props.keys),
        properties=dict(proto.user_properties),
        message_group=props.message_group,
        born_timestamp=props.born_timestamp.ToMilliseconds(),
        store_timestamp=props.store_timestamp.ToMilliseconds(),
        delivery_attempt=props.delivery_attempt if props.HasField("delivery_attempt") else 1,
        receipt_handle=props.receipt_handle,
        priority=props.priority if props.HasField("priority") else None,
        lite_topic=props.lite_topic,
    )


def expand_packed(message: ReceivedMessage) -> list[ReceivedMessage]:
    """One message per body if ``message`` is a packed batch, else ``[message]``."""
    count = message.properties.get(BATCH_PROPERTY)
    if count is None:
        return [message]
    bodies = unpack_bodies(message.body)
    if count != str(len(bodies)):
        raise PackedBatchError(f"message {message.message_id} says {BATCH_PROPERTY}={count!r} "
                               f"but its body packs {len(bodies)} bodies")
    m = message
    return [ReceivedMessage(m.topic, m.queue_id, m.offset, m.message_id, body, m.tag, m.keys,
                            m.properties, m.message_group, m.born_timestamp, m.store_timestamp,
                            m.delivery_attempt, m.receipt_handle, index)
            for index, body in enumerate(bodies)]


_host = ""


def _hostname() -> str:
    global _host
    if not _host:
        _host = socket.gethostname()
    return _host
