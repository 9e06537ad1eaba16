"""Hypothesis against the replication port's decoders: any bytes give a frame, "need more"
(IncompleteReadError) or ProtocolError, never another exception; a valid HELLO mutated anywhere
is refused cleanly or still decodes."""
from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.cluster import wire
from sluice.cluster.wire import Kind, ProtocolError
from tests.fuzz.mutations import mutate

HELLO = wire.encode_hello(wire.Hello("n2", bytes(32), [(3, 0), (9, 4096)], 8192, 4096, 1 << 20))


def read_all(data: bytes, max_batch: int = 1 << 16) -> list[tuple[Kind, bytes]]:
    async def scenario():
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        frames = []
        try:
            while True:
                frames.append(await wire.read_frame(reader, max_batch))
        except (asyncio.IncompleteReadError, ProtocolError):
            return frames
    return asyncio.run(scenario())


def decode(kind: Kind, payload: bytes) -> None:
    decoders = {Kind.HELLO: wire.decode_hello, Kind.START: wire.decode_start, Kind.BATCH: wire.decode_batch,
                Kind.ACK: wire.decode_ack, Kind.RELAY: wire.decode_relay}
    if kind in decoders:
        try:
            decoders[kind](payload)
        except ProtocolError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_give_frames_or_a_protocol_error(data):
    for kind, payload in read_all(data):
        decode(kind, payload)


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_mutated_hello_is_refused_cleanly_or_still_decodes(seed):
    for kind, payload in read_all(mutate(seed, base=HELLO)):
        decode(kind, payload)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Kind)), st.binary(max_size=300))
def test_every_kind_of_frame_with_any_payload_is_decoded_or_refused(kind, payload):
    for found, body in read_all(wire.frame(kind, payload)):
        assert found is kind
        decode(found, body)


def test_a_frame_longer_than_its_kind_allows_is_refused_before_it_is_read():
    refused = wire.HEADER.pack(wire.MAX_CONTROL_FRAME + 2, Kind.HELLO)
    assert read_all(refused) == []
    assert read_all(wire.HEADER.pack(100 + wire.BATCH_HEADER.size + 2, Kind.BATCH), max_batch=100) == []
