"""The store's packed-batch codec agrees with the SDK's byte for byte: what the tier unpacks
into rows packs again into exactly the record's body."""
from __future__ import annotations

from hypothesis import given, strategies as st

from sluice.client.packing import pack_bodies
from store.tier import packing

bodies = st.lists(st.binary(max_size=64), min_size=1, max_size=20)


@given(bodies)
def test_repacking_gives_the_sdks_bytes(parts: list[bytes]) -> None:
    packed = pack_bodies(parts)
    assert packing.unpack(packed) == parts
    assert packing.pack(packing.unpack(packed)) == packed


@given(st.binary(max_size=80))
def test_anything_else_stays_whole(body: bytes) -> None:
    parts = packing.unpack(body)
    assert parts is None or packing.pack(parts) == body


def test_malformed_and_empty_batches_are_not_unpacked() -> None:
    good = pack_bodies([b"a", b"bc"])
    assert packing.unpack(good[:-1]) is None  # lengths do not add up
    assert packing.unpack(b"XX" + good[2:]) is None
    assert packing.unpack(pack_bodies([])) is None  # no body: kept whole as one row
    assert packing.unpack(b"SB\x01\xff\xff\xff\xff") is None  # a count the bytes cannot hold
