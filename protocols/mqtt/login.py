"""The CONNECT decision: who a client is, the client id and session expiry it gets, whether
its will may be published, and what the CONNACK adds; or why it is refused.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from core.errors import LoginBusy, LoginThrottled, Unauthenticated
from core.model import Action, Principal
from core.service import Broker
from core.untrusted import DenialLog, clip

from .codec import MQTT_5
from .events import ConnectRequested
from .options import MqttOptions
from .properties import NO_PROPERTIES, Properties
from .reason_codes import ReasonCode
from .session_store import NEVER_EXPIRES


@dataclass(frozen=True)
class Login:
    """A CONNECT let in: the session to open and what the CONNACK says."""

    principal: Principal
    """Who the client acts for, ``client_id`` set."""
    client_id: str
    assigned_client_id: str | None
    """The client id made for a client that sent none (MQTT 5 tells it in the CONNACK)."""
    expiry_s: int
    """Session expiry interval, capped by ``max_session_expiry_s``."""
    properties: Properties
    """CONNACK properties (MQTT 5): the expiry or keep alive where ours override the client's."""


class Refused(Exception):
    """A CONNECT that is answered with ``reason`` and closed."""

    def __init__(self, reason: ReasonCode, detail: str = "") -> None:
        super().__init__(detail or reason.name)
        self.reason = reason
        self.detail = detail


def peer_host(peer: str) -> str:
    """The address part of a ``host:port`` peer name: refusals are summarised per host."""
    return peer.rpartition(":")[0] or peer


def _refusal(refused: Unauthenticated, v5: bool) -> ReasonCode:
    """The CONNACK reason for a refused login: MQTT 5 says banned or busy where core refused it
    unchecked; MQTT 3.1.1 has only "not authorized" and "server unavailable" for those."""
    if isinstance(refused, LoginThrottled):
        return ReasonCode.Banned if v5 else ReasonCode.NotAuthorized
    if isinstance(refused, LoginBusy):
        return ReasonCode.ServerBusy if v5 else ReasonCode.ServerUnavailable
    return ReasonCode.BadUserNameOrPassword


class Logins:
    """Authenticates CONNECTs and settles their client id, expiry and will."""

    def __init__(self, broker: Broker, options: MqttOptions, denials: DenialLog, *,
                 allow_anonymous: bool = False, anonymous_principal: Principal | None = None) -> None:
        self._broker = broker
        self._options = options
        self._denials = denials
        self._allow_anonymous = allow_anonymous
        self._anonymous_principal = anonymous_principal

    async def authenticate(self, username: str | None, password: bytes | None,
                           peer: str = "", certificate_user: str | None = None) -> Principal:
        """The principal for CONNECT credentials from ``peer`` (``host:port``); Unauthenticated
        if refused (core throttles failures per address and user name). ``certificate_user``:
        the user a verified client certificate names, who logs in without a password (a
        CONNECT user name, if any, must be the same)."""
        if certificate_user is not None:
            if username is not None and username != certificate_user:
                raise Unauthenticated(f"the client certificate names user {certificate_user!r} "
                                      f"but CONNECT names {clip(username)!r}: connect without a "
                                      "user name, or with the certificate's")
            return await self._broker.authenticate_certificate(certificate_user, peer_host(peer))
        if username is None:
            if self._allow_anonymous and self._anonymous_principal is not None:
                return self._anonymous_principal
            raise Unauthenticated("anonymous access is off: connect with a username and password")
        secret = (password or b"").decode("utf-8", "replace")
        return await self._broker.authenticate(username, secret, peer_host(peer))

    def server_keep_alive(self, asked: int) -> int | None:
        """The Server Keep Alive to announce, if ours overrides what the client asked."""
        limit = self._options.max_keep_alive_s
        if limit and (asked == 0 or asked > limit):
            return limit
        return None

    async def log_in(self, event: ConnectRequested, peer: str,
                     certificate_user: str | None = None) -> Login:
        """Let ``event`` in, or raise `Refused` (the refusal is logged); ``certificate_user`` as
        in ``authenticate``."""
        v5 = event.version == MQTT_5
        try:
            principal = await self.authenticate(event.username, event.password, peer,
                                                certificate_user)
        except Unauthenticated as refused:
            self._denials.denied(peer_host(peer), "login", "MQTT client %s from %s refused: %s",
                                 clip(event.client_id), peer, clip(str(refused), 300))
            raise Refused(_refusal(refused, v5), str(refused)) from None
        client_id, assigned = event.client_id, None
        if not client_id:
            if not event.clean_start and not v5:
                raise Refused(ReasonCode.ClientIdentifierNotValid,
                              "a persistent session needs a client identifier")
            client_id = assigned = f"sluice-{uuid.uuid4().hex}"
        asked = event.properties.session_expiry_interval or 0
        if v5:
            expiry = asked
        else:
            expiry = 0 if event.clean_start else NEVER_EXPIRES
        expiry = min(expiry, self._options.max_session_expiry_s)
        principal = replace(principal, client_id=client_id)
        will = event.will
        if will is not None and not self._broker.subject_allowed(principal, Action.PUBLISH,
                                                                 will.topic):
            raise Refused(ReasonCode.NotAuthorized,
                          f"not authorized to publish the will on {will.topic}")
        properties = NO_PROPERTIES
        if v5:
            properties = Properties(session_expiry_interval=expiry if expiry != asked else None,
                                    server_keep_alive=self.server_keep_alive(event.keep_alive))
        return Login(principal, client_id, assigned, expiry, properties)
