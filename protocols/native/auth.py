"""Who a native request comes from: the RocketMQ 5 ``authorization`` header, checked by core.

The official clients send, on every call,
``authorization: MQv2-HMAC-SHA1 Credential=<access key>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1 of the x-mq-date-time value keyed by the secret>``. Core holds the
secrets; this module only takes the header apart. A client with empty credentials still sends
the header, with an empty access key: that counts as anonymous.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.errors import Unauthenticated
from core.model import Principal

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
CLIENT_ID_HEADER = "x-mq-client-id"


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


class Authenticator:
    """Turns a call's metadata into a Principal via ``broker.authenticate_signature``.

    ``anonymous`` is the Principal for calls without credentials; None refuses them. Every
    call is checked (core keeps known secrets in memory). Runs on the event loop.
    """

    def __init__(self, broker, anonymous: Principal | None) -> None:
        self._broker = broker
        self._anonymous = anonymous

    async def principal(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        """The Principal a call with ``metadata`` acts for; raises Unauthenticated."""
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
        return await self._broker.authenticate_signature(credential.access_key, signed.encode("utf-8"),
                                                         credential.signature_hex)
