"""Requests whose bytes do not parse are answered with BAD_REQUEST, not a traceback.

grpc deserializes a request before the servicer sees it, and when that fails it logs an error
with a traceback and fails the call with UNKNOWN. ``add_servicer`` registers the servicer the way
the generated ``add_MessagingServiceServicer_to_server`` does, but each method's deserializer
turns bytes that are not a valid request into a ``MalformedRequest``, which the servicer answers
with a BAD_REQUEST status like any other bad request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rocketmq.grpc_protocol import service_pb2

from core.errors import InvalidArgument
from core.untrusted import clip

SERVICE = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]


class MalformedRequest:
    """A request (or stream command) whose bytes did not parse as the method's message."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def refusal(self) -> InvalidArgument:
        """The error a call answers with."""
        return InvalidArgument(f"the request does not parse as a {SERVICE.name} message "
                               f"({clip(self.error)}); check the client's protocol version")


def _checked(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as error:
            return MalformedRequest(str(error))
    return deserialize


_HANDLER_KINDS = {(False, False): grpc.unary_unary_rpc_method_handler,
                  (False, True): grpc.unary_stream_rpc_method_handler,
                  (True, False): grpc.stream_unary_rpc_method_handler,
                  (True, True): grpc.stream_stream_rpc_method_handler}


def add_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    """Serve every method of MessagingService with ``servicer``'s method of the same name."""
    handlers = {}
    for method in SERVICE.methods:
        request = getattr(service_pb2, method.input_type.name)
        response = getattr(service_pb2, method.output_type.name)
        kind = _HANDLER_KINDS[method.client_streaming, method.server_streaming]
        handlers[method.name] = kind(getattr(servicer, method.name),
                                     request_deserializer=_checked(request.FromString),
                                     response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name,
                                                                          handlers),))
