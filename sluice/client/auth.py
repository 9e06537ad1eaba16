"""Request metadata: client identity and the HMAC-SHA1 signature RocketMQ 5 brokers check.

The ``authorization`` header is
``MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time, Signature=<hex>``, where the
signature is HMAC-SHA1 keyed by the secret key over the ``x-mq-date-time`` value, as the
official clients send it. Runs anywhere; no I/O.
"""

from __future__ import annotations

import hmac
import uuid
from datetime import datetime, timezone
from hashlib import sha1

from .config import ClientConfig, sdk_version

DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
ALGORITHM = "MQv2-HMAC-SHA1"
SIGNED_HEADERS = "x-mq-date-time"


def sign(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of ``date_time`` keyed by ``secret_key``."""
    return hmac.new(secret_key.encode(), date_time.encode(), sha1).hexdigest()


def authorization(access_key: str, secret_key: str, date_time: str) -> str:
    """The ``authorization`` header value for a request stamped ``date_time``."""
    return (f"{ALGORITHM} Credential={access_key}, SignedHeaders={SIGNED_HEADERS}, "
            f"Signature={sign(secret_key, date_time)}")


def request_metadata(config: ClientConfig, client_id: str,
                     now: datetime | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata for one request: identity headers, plus the signature if keys are set.

    ``x-mq-date-time`` is UTC (the trailing ``Z`` says so).
    """
    date_time = (now or datetime.now(timezone.utc)).strftime(DATE_TIME_FORMAT)
    headers = [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", sdk_version()),
        ("x-mq-date-time", date_time),
        ("x-mq-request-id", str(uuid.uuid4())),
        ("x-mq-client-id", client_id),
        ("x-mq-namespace", config.namespace),
    ]
    if config.access_key:
        headers.append(("authorization", authorization(config.access_key, config.secret_key, date_time)))
    return tuple(headers)
