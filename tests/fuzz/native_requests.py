"""Valid serialized requests for every method of the native gRPC API (RocketMQ 5's
MessagingService), for the live fuzzer to mutate, and how to call a method with raw bytes; and
sends whose properties are forged in the namespaces the broker writes (refused) or carry poison
values under the sender's own names (stored, and delivered to every protocol)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as rpc

from sluice.client.config import ClientConfig
from sluice.client.convert import (duration, endpoints, message_to_proto, new_message_id,
                                          resource, tag_filter)
from sluice.client.model import Message
from tests.fuzz.forged_properties import forged_properties, own_properties

SERVICE = rpc.DESCRIPTOR.services_by_name["MessagingService"]
TOPIC, GROUP = "fuzz", "fuzz-group"

Shape = Literal["unary", "server-stream", "bidi"]


@dataclass(frozen=True)
class NativeRequest:
    """One method and a valid request for it."""

    method: str
    shape: Shape
    body: bytes

    @property
    def path(self) -> str:
        return f"/{SERVICE.full_name}/{self.method}"


def valid_requests(config: ClientConfig) -> list[NativeRequest]:
    """A valid request for each method (topic ``fuzz``, group ``fuzz-group``)."""
    topic, group = resource("", TOPIC), resource("", GROUP)
    queue = pb.MessageQueue(topic=topic, id=0, permission=pb.READ_WRITE, broker=pb.Broker(
        name="sluice", id=0, endpoints=endpoints(config)))
    message = message_to_proto(Message(TOPIC, b"fuzz body", "tag", ("key",), {"site": "fuzz"}),
                               "", 0, new_message_id(), 1_700_000_000_000)
    handle = "0:fuzz:0:0:0"
    requests: dict[str, object] = {
        "QueryRoute": rpc.QueryRouteRequest(topic=topic, endpoints=endpoints(config)),
        "Heartbeat": rpc.HeartbeatRequest(group=group, client_type=pb.SIMPLE_CONSUMER),
        "SendMessage": rpc.SendMessageRequest(messages=[message]),
        "QueryAssignment": rpc.QueryAssignmentRequest(topic=topic, group=group,
                                                      endpoints=endpoints(config)),
        "ReceiveMessage": rpc.ReceiveMessageRequest(
            group=group, message_queue=queue, filter_expression=tag_filter("*"), batch_size=4,
            invisible_duration=duration(5), long_polling_timeout=duration(0.5)),
        "AckMessage": rpc.AckMessageRequest(group=group, topic=topic, entries=[
            rpc.AckMessageEntry(message_id=message.system_properties.message_id,
                                receipt_handle=handle)]),
        "ForwardMessageToDeadLetterQueue": rpc.ForwardMessageToDeadLetterQueueRequest(
            group=group, topic=topic, receipt_handle=handle, message_id="m", delivery_attempt=1,
            max_delivery_attempts=3),
        "PullMessage": rpc.PullMessageRequest(group=group, message_queue=queue, offset=0,
                                              batch_size=4, filter_expression=tag_filter("*"),
                                              long_polling_timeout=duration(0.5)),
        "UpdateOffset": rpc.UpdateOffsetRequest(group=group, message_queue=queue, offset=1),
        "GetOffset": rpc.GetOffsetRequest(group=group, message_queue=queue),
        "QueryOffset": rpc.QueryOffsetRequest(message_queue=queue,
                                              query_offset_policy=pb.END),
        "EndTransaction": rpc.EndTransactionRequest(topic=topic, message_id="m",
                                                    transaction_id="t", resolution=pb.COMMIT,
                                                    source=pb.SOURCE_CLIENT),
        "Telemetry": rpc.TelemetryCommand(settings=pb.Settings(
            client_type=pb.PRODUCER, access_point=endpoints(config),
            request_timeout=duration(3), publishing=pb.Publishing(topics=[topic]))),
        "NotifyClientTermination": rpc.NotifyClientTerminationRequest(group=group),
        "ChangeInvisibleDuration": rpc.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, invisible_duration=duration(5),
            message_id="m"),
        "RecallMessage": rpc.RecallMessageRequest(topic=topic, recall_handle="r"),
        "SyncLiteSubscription": rpc.SyncLiteSubscriptionRequest(
            action=pb.PARTIAL_ADD, topic=topic, group=group, lite_topic_set=["s1", "s2"]),
    }
    out = []
    for method in SERVICE.methods:
        request = requests.get(method.name)
        if request is None:
            continue
        shape: Shape = ("bidi" if method.client_streaming else
                        "server-stream" if method.server_streaming else "unary")
        out.append(NativeRequest(method.name, shape, request.SerializeToString()))
    rng = random.Random(0)  # the same requests on every run
    out += [NativeRequest("SendMessage", "unary", send_request(rng, forged=True)),
            NativeRequest("SendMessage", "unary", send_request(rng, forged=False))]
    return out


def send_request(rng: random.Random, forged: bool) -> bytes:
    """A SendMessage of one message to ``fuzz`` (subject ``fuzz/forged``) with poison values,
    under forged namespaced names (``forged``: to be refused) or the sender's own."""
    properties = forged_properties(rng) if forged else own_properties(rng)
    properties["sluice.subject"] = f"{TOPIC}/forged"
    message = message_to_proto(Message(TOPIC, b"forged", "tag", (), properties), "", 0,
                               new_message_id(), 1_700_000_000_000)
    return rpc.SendMessageRequest(messages=[message]).SerializeToString()
