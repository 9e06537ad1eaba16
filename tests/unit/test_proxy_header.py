"""PROXY v1 headers: what a relay writes, and what a listener accepts."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.proxy_header import MAX_LINE, ProxiedAddress, ProxyHeaderError, decode, encode, header_length


@pytest.mark.parametrize("client, relay, line", [
    (("127.0.0.9", 50123), ("127.0.0.2", 1883), b"PROXY TCP4 127.0.0.9 127.0.0.2 50123 1883\r\n"),
    (("::1", 4000), ("::1", 5672), b"PROXY TCP6 ::1 ::1 4000 5672\r\n"),
    (None, None, b"PROXY UNKNOWN\r\n"),
])
def test_a_header_round_trips(client, relay, line):
    assert encode(client, relay) == line
    assert decode(line) == (ProxiedAddress(*client) if client else ProxiedAddress(None, None))
    assert header_length(line + b"\x10\x00rest") == len(line)


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 127.0.0.1 127.0.0.2 1 2\n", b"PROXY TCP4 127.0.0.1 127.0.0.2 1\r\n",
    b"PROXY TCP4 ::1 127.0.0.2 1 2\r\n", b"PROXY TCP6 127.0.0.1 ::1 1 2\r\n",
    b"PROXY TCP4 127.0.0.1 127.0.0.2 65536 2\r\n", b"PROXY TCP4 127.0.0.1 127.0.0.2 01 2\r\n",
    b"PROXY TCP4 127.0.0.1 127.0.0.2 -1 2\r\n", b"PROXY UDP4 127.0.0.1 127.0.0.2 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n", b"PROXY TCP4 " + b"1" * 100 + b"\r\n",
])
def test_malformed_headers_are_refused(line):
    with pytest.raises(ProxyHeaderError):
        decode(line)


def test_the_start_of_a_stream_is_a_header_in_progress_or_not_a_header():
    assert header_length(b"PRO") is None
    assert header_length(b"PROXY TCP4 1.2.3.4") is None
    with pytest.raises(ProxyHeaderError):
        header_length(b"\x10\x0c\x00\x04MQTT")  # an MQTT CONNECT straight away
    with pytest.raises(ProxyHeaderError):
        header_length(b"PROXY " + b"x" * MAX_LINE)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_a_header_or_a_proxy_header_error(data):
    try:
        length = header_length(data)
        if length is not None:
            decode(data[:length])
    except ProxyHeaderError:
        pass
