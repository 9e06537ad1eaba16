"""Hypothesis against the replication port's decoders: any bytes give a frame, "need more"
(IncompleteReadError) or ProtocolError, never another exception; a valid HELLO or snapshot
mutated anywhere is refused cleanly or still decodes, and a snapshot cannot plant a file
outside the store it is installed into."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.cluster import snapshots, wire
from store.file_store import FileStore
from store.snapshot import StoreSnapshot, install
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


SNAPSHOT = snapshots.encode(snapshots.Snapshot(
    StoreSnapshot(4096, [("orders", 0, 17), ("%SYS%offsets", 0, 3)], {"%25SYS%25offsets/0.snapshot": b"\x00" * 40},
                  b"1 0\n3 2048\n"), b'{"users": []}'))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_mutated_snapshot_is_refused_cleanly_or_still_decodes(seed):
    try:
        snapshots.decode(mutate(seed, base=SNAPSHOT))
    except ProtocolError:
        pass


def test_a_snapshot_naming_a_file_outside_the_store_is_not_installed(tmp_path):
    directory = tmp_path / "store"
    FileStore(str(directory)).close()
    hostile = StoreSnapshot(4096, [], {"../../outside": b"planted"})
    with pytest.raises(ValueError, match="outside the store"):
        install(str(directory), hostile)
    assert not (tmp_path / "outside").exists() and not (directory.parent.parent / "outside").exists()
    assert FileStore(str(directory)).appended_end == 0, "the store is as it was"
