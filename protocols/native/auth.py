"""Who a native request comes from: the RocketMQ 5 ``authorization`` header, checked by core.

The official clients send, on every call,
``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1 of the x-mq-date-time value keyed by the secret>``. Core holds the
secrets; this module takes the header apart and checks that the signature is fresh. A client
with empty credentials still sends the header, with an empty access key: that counts as
anonymous.

The signature covers only ``x-mq-date-time`` (``yyyyMMdd'T'HHmmss'Z'``), so a captured pair of
headers would open every call for as long as the broker accepts its time: a call is refused
when that time is more than ``max_skew_s`` (15 minutes by default) from the broker's clock. The
Node client stamps UTC, but the official Java and Python clients format their *local* time with
a literal ``Z``; a stamp is therefore fresh if it is close to the broker's clock read either as
UTC or as the broker's local time (the same thing on a UTC host).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import unquote

from core.errors import Unauthenticated
from core.model import Principal
from core.untrusted import DenialLog, clip

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
CLIENT_ID_HEADER = "x-mq-client-id"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_DATE_SHAPE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
DEFAULT_MAX_SKEW_S = 900
"""How far (seconds, either way) a signed time may be from the broker's clock by default."""

log = logging.getLogger("sluice.native")


@dataclass(frozen=True)
class Credential:
    """The parts of an ``authorization`` header."""

    access_key: str
    signed_headers: tuple[str, ...]
    signature_hex: str


def parse_authorization(value: str) -> Credential:
    """Take an ``authorization`` header value apart; raise Unauthenticated if it is malformed."""
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise Unauthenticated(f"authorization scheme {algorithm!r} is not supported; "
                              f"sign requests with {ALGORITHM} as the RocketMQ 5 clients do")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, field_value = part.strip().partition("=")
        if sep:
            fields[name.strip()] = field_value.strip()
    if "Credential" not in fields or "Signature" not in fields:
        raise Unauthenticated("authorization header lacks Credential or Signature; "
                              f"expected '{ALGORITHM} Credential=<ak>, SignedHeaders={DATE_HEADER}, "
                              "Signature=<hex>'")
    signed = tuple(h.strip().lower() for h in fields.get("SignedHeaders", DATE_HEADER).split(";"))
    return Credential(fields["Credential"], signed, fields["Signature"])


@functools.lru_cache(maxsize=64)  # every call of a second carries the same value
def signed_at(value: str) -> float:
    """Seconds since the epoch of an ``x-mq-date-time`` value read as UTC; Unauthenticated if
    it is not ``yyyyMMdd'T'HHmmss'Z'``."""
    try:
        if _DATE_SHAPE.fullmatch(value):
            return datetime.strptime(value, DATE_FORMAT).replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        pass
    raise Unauthenticated(f"the signed {DATE_HEADER} {clip(value)} is not a time of the form "
                          "yyyyMMdd'T'HHmmss'Z': each request must carry the time it was signed, "
                          "which the broker checks for clock skew")


def grpc_peer_host(peer: str) -> str:
    """The host of a gRPC peer name (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``, brackets
    sometimes percent-encoded); anything else (``unix:/path``) as it is."""
    scheme, _, rest = peer.partition(":")
    if scheme in ("ipv4", "ipv6"):
        return unquote(rest).rpartition(":")[0].strip("[]")
    return peer


def clock_skew_s(value: str, now: float) -> float:
    """How far (seconds) the signed time ``value`` is from ``now``, read as UTC or as the broker's
    local time, whichever is closer; Unauthenticated if ``value`` is not a time."""
    stamp = signed_at(value)
    local_offset_s = time.localtime(now).tm_gmtoff
    return min(abs(stamp - now), abs(stamp - local_offset_s - now))


class Authenticator:
    """Turns a call's metadata into a Principal via ``broker.authenticate_signature``.

    ``anonymous`` is the Principal for calls without credentials; None refuses them. Every
    call is checked (core keeps known secrets in memory), and a signature made further than
    ``max_skew_s`` seconds from ``clock()`` is refused before its secret is looked up. Runs on
    the event loop.
    """

    def __init__(self, broker, anonymous: Principal | None,
                 max_skew_s: float = DEFAULT_MAX_SKEW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self._broker = broker
        self._anonymous = anonymous
        self._max_skew_s = max_skew_s
        self._clock = clock
        self._denials = DenialLog(log)

    async def principal(self, metadata: Iterable[tuple[str, str | bytes]],
                        peer: str = "") -> Principal:
        """The Principal a call with ``metadata`` from ``peer`` (gRPC's ``ipv4:host:port``)
        acts for; raises Unauthenticated. Wrong signatures are throttled by core per address
        and access key, as failed passwords are."""
        headers = {key.lower(): value for key, value in metadata if isinstance(value, str)}
        header = headers.get("authorization", "")
        credential = parse_authorization(header) if header else None
        if credential is None or not credential.access_key:
            if self._anonymous is None:
                raise Unauthenticated("this broker requires credentials: configure the client with "
                                      "an access key and secret (a Sluice user and its password)")
            return self._anonymous
        if credential.signed_headers != (DATE_HEADER,):
            raise Unauthenticated(f"only SignedHeaders={DATE_HEADER} is supported, "
                                  f"not {';'.join(credential.signed_headers)}")
        signed = headers.get(DATE_HEADER)
        if not signed:
            raise Unauthenticated(f"the signed {DATE_HEADER} header is missing")
        self._check_fresh(credential.access_key, signed)
        return await self._broker.authenticate_signature(
            credential.access_key, signed.encode("utf-8"), credential.signature_hex,
            grpc_peer_host(peer))

    def _check_fresh(self, access_key: str, signed: str) -> None:
        """Unauthenticated unless ``signed`` is a time within the allowed clock skew."""
        try:
            skew = clock_skew_s(signed, self._clock())
        except Unauthenticated:
            self._denials.denied(access_key, "unreadable signature time",
                                 "native call from access key %s refused: %s %s is not a time",
                                 clip(access_key), DATE_HEADER, clip(signed))
            raise
        if skew <= self._max_skew_s:
            return
        self._denials.denied(access_key, "stale signature",
                             "native call from access key %s refused: signed at %s, %.0f s from "
                             "the broker's clock (clock skew; at most %.0f s allowed)",
                             clip(access_key), clip(signed), skew, self._max_skew_s)
        raise Unauthenticated(
            f"the request was signed at {signed} ({DATE_HEADER}), {skew:.0f} s away from the "
            f"broker's clock; at most {self._max_skew_s:.0f} s of clock skew is allowed, so a "
            "captured request cannot be replayed. Sync the client's clock (NTP); the official "
            "Java and Python clients sign with their local time, so run them in UTC or in the "
            "broker's time zone")
