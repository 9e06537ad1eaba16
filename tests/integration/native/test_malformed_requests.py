"""Bytes that do not parse as a request get BAD_REQUEST on every method, in one log line or
none, and the server goes on: grpc itself would fail such a call with UNKNOWN and log a
traceback for each."""
from __future__ import annotations

import asyncio
import logging

import grpc
import grpc.aio
import pytest
from rocketmq.grpc_protocol.definition_pb2 import Code
from rocketmq.grpc_protocol import service_pb2

from protocols.native.decoding import SERVICE
from sluice.client.auth import request_metadata
from sluice.client.config import ClientConfig

GARBAGE = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, with a length past the end


async def _call(endpoint: str, metadata, method) -> int:
    path = f"/{SERVICE.full_name}/{method.name}"
    response = getattr(service_pb2, method.output_type.name)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        if method.client_streaming:
            call = channel.stream_stream(path, response_deserializer=response.FromString)(
                iter([GARBAGE]), metadata=metadata, timeout=5)
            first = await call.read()
            call.cancel()
            return first.status.code
        if method.server_streaming:
            call = channel.unary_stream(path, response_deserializer=response.FromString)(
                GARBAGE, metadata=metadata, timeout=5)
            return (await call.read()).status.code
        answer = await channel.unary_unary(path, response_deserializer=response.FromString)(
            GARBAGE, metadata=metadata, timeout=5)
        return answer.status.code


@pytest.mark.parametrize("method", SERVICE.methods, ids=lambda m: m.name)
def test_a_request_that_does_not_parse_is_a_bad_request_without_a_traceback(
        native_broker, method, caplog):
    config = ClientConfig(native_broker.endpoint, access_key=native_broker.user,
                          secret_key=native_broker.password)
    with caplog.at_level(logging.INFO):
        code = asyncio.run(_call(native_broker.endpoint, request_metadata(config, "garbage"), method))
    assert code == Code.BAD_REQUEST, Code.Name(code)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
        [r.getMessage() for r in caplog.records]
