"""The AMQP TLS listener (``amqps``, 5671): it accepts sockets itself so that TLS handshakes are
bounded in time (``connect_timeout_s``) and in number (`MAX_HANDSHAKES` at once; more are
closed at once), and a failed one is logged in one line per peer host a minute. A finished
handshake becomes an `AmqpWire` like a plain TCP connection. Runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Final

from core.untrusted import DenialLog, clip

log = logging.getLogger(__name__)

MAX_HANDSHAKES: Final = 1024
"""TLS handshakes in progress at once; a connection beyond them is closed at once."""


class TlsListener:
    """Accepts on ``sock`` and runs each handshake as a task until ``close``."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext,
                 protocol: Callable[[], asyncio.Protocol], *, timeout: float,
                 denials: DenialLog, max_handshakes: int = MAX_HANDSHAKES) -> None:
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        self._context = context
        self._protocol = protocol
        self._timeout = timeout
        self._denials = denials
        self._max_handshakes = max_handshakes
        self._handshakes: set[asyncio.Task[None]] = set()
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(self._sock)
            except OSError as error:  # EMFILE and the like: the listener goes on
                log.warning("AMQP TLS listener cannot accept: %s", error)
                await asyncio.sleep(0.1)  # back off while descriptors are short
                continue
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            if len(self._handshakes) >= self._max_handshakes:
                self._denials.denied(address[0], "tls-busy", "AMQP TLS connection from %s "
                                     "closed at once: %d handshakes in progress", peer,
                                     len(self._handshakes))
                sock.close()
                continue
            task = loop.create_task(self._handshake(sock, peer))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket, peer: str) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._protocol, sock, ssl=self._context, ssl_handshake_timeout=self._timeout)
        except (OSError, EOFError) as failed:  # ssl.SSLError, resets and timeouts are OSErrors
            self._denials.denied(peer.rpartition(":")[0], "tls", "AMQP TLS handshake from %s "
                                 "failed: %s", peer, clip(str(failed) or type(failed).__name__))
            sock.close()

    def close(self) -> None:
        """Stop accepting and abandon handshakes in progress."""
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()


def listen(host: str, port: int, context: ssl.SSLContext,
           protocol: Callable[[], asyncio.Protocol], *, timeout: float, backlog: int,
           denials: DenialLog) -> TlsListener:
    """Bind ``host:port`` and accept TLS connections on it. Raises OSError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=backlog)
    sock.setblocking(False)
    return TlsListener(sock, context, protocol, timeout=timeout, denials=denials)
