"""The mixed-mode front of the native port (TLS and plaintext gRPC on one port) fed garbage:
each bad connection is closed and the port serves on. ``route`` by hypothesis; the live front
of a real `sluice serve` by a bounded, seeded stream of hostile first bytes."""
from __future__ import annotations

import asyncio
import random
import socket

from hypothesis import given, strategies as st

from protocols.native.mixed_front import HTTP2_PREFACE, TLS_HANDSHAKE, route
from sluice.cli.dev_cert import write_dev_certs
from sluice.client import ClientConfig, Message, Producer

GARBAGE_CONNECTIONS = 40
WAIT_S = 30


@given(st.binary(min_size=1, max_size=64))
def test_route_sends_only_a_tls_record_or_the_http2_preface_on(first):
    where = route(first)
    if first[0] == TLS_HANDSHAKE:
        assert where == "tls"
    elif HTTP2_PREFACE.startswith(first[:len(HTTP2_PREFACE)]):
        assert where == "plain"
    else:
        assert where is None


def hostile(rng: random.Random) -> bytes:
    """Random bytes, some starting like a TLS record or the HTTP/2 preface."""
    body = rng.randbytes(rng.randint(24, 300))
    start = rng.choice([b"", bytes([TLS_HANDSHAKE]), bytes([TLS_HANDSHAKE, 3, 1]), b"PRI * HTTP",
                        HTTP2_PREFACE[:-1], b"GET / HTTP/1.1\r\n"])
    return start + body


def read_until_closed(address: tuple[str, int], data: bytes) -> None:
    """Send ``data``, end our side and read until the broker closes the connection (a broker
    that keeps it open fails the test with a socket timeout)."""
    with socket.create_connection(address, timeout=WAIT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass


async def send(endpoint: str, ca: str | None) -> None:
    async with Producer(ClientConfig(endpoint, "sluice", "sluice", ca_file=ca)) as producer:
        await producer.send(Message("fuzzed", b"still served"))


def test_the_front_closes_garbage_connections_and_serves_on(sluice_server, tmp_path):
    certs = write_dev_certs(tmp_path / "certs")
    server = sluice_server(tmp_path / "data", "--tls-cert", certs.cert, "--tls-key", certs.key,
                           "--native-tls", "mixed")
    server.wait_ready()
    host, port = server.native.rsplit(":", 1)
    rng = random.Random(20261129)
    for _ in range(GARBAGE_CONNECTIONS):
        read_until_closed((host, int(port)), hostile(rng))
    asyncio.run(send(server.native, certs.ca))
    asyncio.run(send(server.native, None))
    assert server.process.poll() is None
