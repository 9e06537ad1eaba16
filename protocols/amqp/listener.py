"""The AMQP listeners, plain TCP and TLS (`tls.TlsListener`) over asyncio: each accepted socket
(for TLS, once its handshake is done) a `Wire` to the front end. A client of another protocol
(MQTT, HTTP, TLS on the plain port) is named in the log and gets the AMQP protocol header and a
close, as the spec answers any header it does not speak."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Mapping

from core.wrong_protocol import AMQP, WrongProtocol
from protocols import relayed_peers
from protocols.tls import certificate_user

from .adapter import AmqpAdapter, Wire
from .frames import PROTOCOL_HEADER
from .frontend import AmqpFrontend
from .options import AmqpOptions
from .tls import TlsListener, listen

HIGH_WATER = 256 << 10
LOW_WATER = 64 << 10
BACKLOG = 4096


class AmqpWire(asyncio.Protocol):
    """A `Wire` over an asyncio transport. Runs on the event loop."""

    def __init__(self, new_connection: Callable[[Wire], AmqpAdapter],
                 wrong_protocol: WrongProtocol | None = None,
                 certificate_login: bool = False) -> None:
        """``certificate_login``: a verified client certificate's CN may log in by SASL
        EXTERNAL (``certificate_user``)."""
        self._new_connection = new_connection
        self._wrong_protocol = wrong_protocol
        self._certificate_login = certificate_login
        self.certificate_user: str | None = None
        """The user a verified client certificate names (with ``certificate_login``)."""
        self._transport: asyncio.Transport | None = None
        self._adapter: AmqpAdapter | None = None
        self.peer = "?"

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(HIGH_WATER, LOW_WATER)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = relayed_peers.client_address(transport.get_extra_info("peername"))
        if self._certificate_login:
            self.certificate_user = certificate_user(transport.get_extra_info("ssl_object"))
        self._adapter = self._new_connection(self)

    def data_received(self, data: bytes) -> None:
        assert self._adapter is not None and self._transport is not None
        if self._wrong_protocol is not None:
            checking, self._wrong_protocol = self._wrong_protocol, None  # the first bytes only
            if checking.caught(data, self.peer, self._transport.get_extra_info("sockname")[1]):
                self._transport.write(PROTOCOL_HEADER)  # the spec's answer to a header it
                self._transport.close()                 # does not speak, then the close
                return
        self._adapter.data_received(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self._adapter is not None:
            self._adapter.connection_lost()

    def pause_writing(self) -> None:
        if self._adapter is not None:
            self._adapter.pause_writing()

    def resume_writing(self) -> None:
        if self._adapter is not None:
            self._adapter.resume_writing()

    # Wire
    def write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        """Send what is queued, then close."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def pause_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()


class AmqpListener:
    """The open AMQP listeners and their bound ports (``tls_port`` None: no TLS listener)."""

    def __init__(self, server: asyncio.base_events.Server, tls: TlsListener | None) -> None:
        self._server = server
        self._tls = tls
        self.port: int = server.sockets[0].getsockname()[1]
        self.tls_port: int | None = None if tls is None else tls.port

    async def stop(self) -> None:
        """Stop accepting."""
        self._server.close()
        if self._tls is not None:
            self._tls.close()


async def start_amqp_listener(frontend: AmqpFrontend, options: AmqpOptions,
                              tls: ssl.SSLContext | None = None,
                              advice: Mapping[str, str] | None = None,
                              certificate_login: bool = False) -> AmqpListener:
    """Open the TCP listener of ``options``, and its TLS listener with ``tls`` unless
    ``tls_port`` is -1. A client of another protocol is logged with the ``advice`` for its
    protocol (see ``WrongProtocol``). ``certificate_login``: the TLS listener offers SASL
    EXTERNAL to a client whose verified certificate names a user. Raises OSError when a port
    is taken."""
    loop = asyncio.get_running_loop()
    wrong_protocol = WrongProtocol(AMQP, frontend.denials, {} if advice is None else advice)
    server = await loop.create_server(lambda: AmqpWire(frontend.new_connection, wrong_protocol),
                                      options.host, options.port, backlog=BACKLOG,
                                      reuse_address=True)
    secure = None
    if tls is not None and options.tls_port >= 0:
        try:
            secure = listen(options.host, options.tls_port, tls,
                            lambda: AmqpWire(frontend.new_connection, wrong_protocol,
                                             certificate_login),
                            timeout=options.connect_timeout_s, backlog=BACKLOG,
                            denials=frontend.denials)
        except BaseException:
            server.close()
            raise
    return AmqpListener(server, secure)
