"""Errors the SDK raises: one small hierarchy, built from the broker's ``Status`` or a gRPC error.

Every error keeps the broker's own message, and ``code`` is the ``apache.rocketmq.v2.Code`` value
(0 when the error did not come from a Status), so callers see what the server said.
"""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol.definition_pb2 import Code, Status


class SluiceClientError(Exception):
    """Base of every error the SDK raises on purpose."""

    def __init__(self, message: str, code: int = Code.CODE_UNSPECIFIED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        if self.code == Code.CODE_UNSPECIFIED:
            return self.message
        return f"{self.message} [{code_name(self.code)}]"


class BadRequestError(SluiceClientError):
    """The broker rejected a field of the request (name, tag, filter, offset, duration...)."""


class InvalidReceiptHandleError(BadRequestError):
    """The receipt handle is malformed or was superseded; the message cannot be acked with it."""


class UnauthorizedError(SluiceClientError):
    """Credentials are missing or wrong (check access_key and secret_key)."""


class ForbiddenError(SluiceClientError):
    """The user may not do this on this topic or group."""


class NotFoundError(SluiceClientError):
    """A topic, group, offset or message does not exist."""


class TopicNotFoundError(NotFoundError):
    """The topic does not exist."""


class GroupNotFoundError(NotFoundError):
    """The consumer group does not exist."""


class PayloadTooLargeError(SluiceClientError):
    """A body, a batch or the properties exceed the broker's limit."""


class TooManyRequestsError(SluiceClientError):
    """The broker is throttling this client; slow down."""


class ClientTimeoutError(SluiceClientError):
    """The request did not complete within its deadline."""


class ServerError(SluiceClientError):
    """The broker failed while handling the request."""


class UnsupportedError(SluiceClientError):
    """The broker does not implement what the request asks for."""


class UnavailableError(SluiceClientError):
    """The broker could not be reached, even after reconnecting for ``reconnect_timeout``."""


class ClientClosedError(SluiceClientError):
    """The client was used before ``start()`` or after ``close()``."""


class PackedBatchError(SluiceClientError, ValueError):
    """A packed-batch body is malformed (see ``packing``)."""


_BY_CODE: dict[int, type[SluiceClientError]] = {
    Code.INVALID_RECEIPT_HANDLE: InvalidReceiptHandleError,
    Code.TOPIC_NOT_FOUND: TopicNotFoundError,
    Code.CONSUMER_GROUP_NOT_FOUND: GroupNotFoundError,
    Code.INVALID_TRANSACTION_ID: NotFoundError,  # decided already, or never open
}

_BY_FAMILY: dict[int, type[SluiceClientError]] = {  # code // 100, as HTTP status families
    400: BadRequestError, 401: UnauthorizedError, 402: ForbiddenError, 403: ForbiddenError,
    404: NotFoundError, 408: ClientTimeoutError, 413: PayloadTooLargeError,
    428: BadRequestError, 429: TooManyRequestsError, 431: PayloadTooLargeError,
    500: ServerError, 501: UnsupportedError, 504: ClientTimeoutError, 505: UnsupportedError,
}

_BY_GRPC: dict[grpc.StatusCode, type[SluiceClientError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: BadRequestError,
    grpc.StatusCode.OUT_OF_RANGE: BadRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: BadRequestError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthorizedError,
    grpc.StatusCode.PERMISSION_DENIED: ForbiddenError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: TooManyRequestsError,
    grpc.StatusCode.DEADLINE_EXCEEDED: ClientTimeoutError,
    grpc.StatusCode.UNIMPLEMENTED: UnsupportedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}

def code_name(code: int) -> str:
    """``Code``'s name for ``code`` (e.g. ``TOPIC_NOT_FOUND``), or the number if it has none."""
    return Code.Name(code) if code in Code.values() else str(code)


OK_CODES = frozenset({Code.OK, Code.MULTIPLE_RESULTS})


def error_from_status(status: Status) -> SluiceClientError:
    """The error a non-OK ``Status`` stands for, carrying its code and message."""
    cls = _BY_CODE.get(status.code) or _BY_FAMILY.get(status.code // 100, ServerError)
    return cls(status.message or f"the broker answered {code_name(status.code)}", status.code)


def raise_for_status(status: Status) -> None:
    """Return if ``status`` is OK (or MULTIPLE_RESULTS), else raise the matching error."""
    if status.code not in OK_CODES:
        raise error_from_status(status)


def error_from_rpc(error: grpc.aio.AioRpcError) -> SluiceClientError:
    """The error a failed gRPC call stands for; the message is the server's details."""
    cls = _BY_GRPC.get(error.code(), ServerError)
    return cls(error.details() or f"gRPC call failed with {error.code().name}")
