"""The connection.start-ok decision: who a client is, or why it is refused.

Credentials are checked by core's ``Broker.authenticate`` (in memory when seen before,
otherwise off the event loop), which throttles failures per peer address and user name and
answers them late, as RabbitMQ answers a failed login 3 s late. As in RabbitMQ, user ``guest``
may log in only from a loopback address while ``amqp.guest_from_loopback`` is on. Runs on the
event loop.
"""

from __future__ import annotations

import ipaddress

from core.errors import LoginBusy, LoginThrottled, Unauthenticated
from core.model import Principal
from core.service import Broker

from .events import LoginRequested
from .methods import EXTERNAL

GUEST = "guest"
GUEST_REFUSED = f"user '{GUEST}' can only connect via localhost"
"""RabbitMQ's words for a guest login from elsewhere."""


class Refused(Exception):
    """A login answered with 403 ACCESS_REFUSED; ``reason`` is told to the client ('' for
    the generic text that names the mechanism)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def peer_host(peer: str) -> str:
    """The address of a ``host:port`` or ``[v6]:port`` peer name."""
    return peer.rpartition(":")[0].strip("[]") or peer


def is_loopback(peer: str) -> bool:
    """Whether ``peer`` (``host:port``) is a loopback address (IPv4-mapped ones included)."""
    try:
        address = ipaddress.ip_address(peer_host(peer))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


async def log_in(broker: Broker, event: LoginRequested, peer: str,
                 guest_from_loopback: bool, certificate_user: str | None = None) -> Principal:
    """The principal for ``event``'s credentials; `Refused` if it may not log in. SASL
    EXTERNAL logs in as ``certificate_user``, the user the verified client certificate names."""
    if event.mechanism == EXTERNAL:
        if certificate_user is None:  # offered only with one; kept as a refusal all the same
            raise Refused("", "EXTERNAL needs a verified client certificate naming a user")
        checking = broker.authenticate_certificate(certificate_user, peer_host(peer))
    elif guest_from_loopback and event.user == GUEST and not is_loopback(peer):
        raise Refused(GUEST_REFUSED, GUEST_REFUSED)
    else:
        checking = broker.authenticate(event.user, event.password, peer_host(peer))
    try:
        return await checking
    except (LoginThrottled, LoginBusy) as refused:  # say why: the client cannot guess it
        raise Refused(str(refused), str(refused)) from None
    except Unauthenticated as refused:
        raise Refused("", str(refused)) from None
