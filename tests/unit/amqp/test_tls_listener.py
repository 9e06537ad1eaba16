"""The AMQP TLS listener bounds handshakes in number and in time: beyond ``max_handshakes`` a
connection is closed at once, a silent one is closed after the timeout, and each is logged as a
denial, not an error. Real sockets on 127.0.0.1, a real certificate."""
from __future__ import annotations

import asyncio
import logging
import socket

from core.untrusted import DenialLog
from protocols.amqp.tls import TlsListener
from protocols.tls import ServerTls, TlsConfig
from tests.conftest import write_self_signed_cert


def test_handshakes_beyond_the_bound_are_closed_at_once_and_silent_ones_time_out(tmp_path,
                                                                                caplog):
    files = write_self_signed_cert(tmp_path)
    context = ServerTls(TlsConfig(files.cert, files.key)).context()

    async def main() -> None:
        sock = socket.create_server(("127.0.0.1", 0))
        sock.setblocking(False)
        listener = TlsListener(sock, context, asyncio.Protocol, timeout=1.0,
                               denials=DenialLog(logging.getLogger("test")), max_handshakes=2)
        try:
            silent = [await asyncio.open_connection("127.0.0.1", listener.port)
                      for _ in range(2)]
            while len(listener._handshakes) < 2:  # accepted: their handshakes wait for data
                await asyncio.sleep(0.01)  # polling the listener's own state; no event for it
            extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1",
                                                                       listener.port)
            assert await asyncio.wait_for(extra_reader.read(), 5) == b""
            assert len(listener._handshakes) == 2, "closed before the silent ones timed out"
            for reader, _ in silent:  # the handshake timeout closes them
                assert await asyncio.wait_for(reader.read(), 5) == b""
            for _, writer in [*silent, (extra_reader, extra_writer)]:
                writer.close()
        finally:
            listener.close()

    caplog.set_level("INFO")
    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("handshakes in progress" in r.getMessage() for r in caplog.records)
