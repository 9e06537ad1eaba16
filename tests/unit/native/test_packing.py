"""Packed batches: the byte layout, round trips, and malformed bodies refused with a clear error."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.client import PackedBatchError, SluiceClientError, pack_bodies, unpack_bodies

bodies_strategy = st.lists(st.binary(max_size=300), max_size=60)


@given(bodies_strategy)
def test_round_trip(bodies):
    assert unpack_bodies(pack_bodies(bodies)) == bodies


def test_layout_is_header_then_length_table_then_bodies():
    packed = pack_bodies([b"ab", b"", b"cde"])
    assert packed == b"SB\x01" + struct.pack("<I", 3) + struct.pack("<3I", 2, 0, 3) + b"abcde"


def test_accepts_any_bytes_like_body():
    assert unpack_bodies(pack_bodies([bytearray(b"x"), memoryview(b"yz")])) == [b"x", b"yz"]


@given(bodies_strategy.filter(bool), st.data())
def test_every_truncation_is_refused(bodies, data):
    packed = pack_bodies(bodies)
    cut = data.draw(st.integers(0, len(packed) - 1))
    with pytest.raises(PackedBatchError):
        unpack_bodies(packed[:cut])


@given(bodies_strategy, st.binary(min_size=1, max_size=20))
def test_trailing_bytes_are_refused(bodies, extra):
    with pytest.raises(PackedBatchError, match="add up to"):
        unpack_bodies(pack_bodies(bodies) + extra)


@pytest.mark.parametrize("body, message", [
    (b"", "shorter than its 7-byte header"),
    (b"SB\x01\x00", "shorter than its 7-byte header"),
    (b"XX\x01" + struct.pack("<I", 0), "magic is b'XX'"),
    (b"SB\x02" + struct.pack("<I", 0), "version 2 is not supported"),
    (b"SB\x01" + struct.pack("<I", 1_000_000) + b"\x00" * 8, "cannot hold their length table"),
    (b"SB\x01" + struct.pack("<I", 1) + struct.pack("<I", 5) + b"abc", "add up to 5 bytes"),
])
def test_malformed_bodies_say_what_is_wrong(body, message):
    with pytest.raises(PackedBatchError, match=message):
        unpack_bodies(body)


def test_packed_batch_error_is_a_value_error_and_an_sdk_error():
    assert issubclass(PackedBatchError, ValueError)
    assert issubclass(PackedBatchError, SluiceClientError)
