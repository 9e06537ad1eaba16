"""The AMQP adapter's one error table: core errors to AMQP 0-9-1 reply codes.

Codes below 500 are soft errors: the channel closes with the code and the connection goes on.
From 500 up they are hard errors: the connection closes. An error class not in the table maps
like its nearest listed base (``core.errors.nearest``); one core did not raise on purpose is
541 INTERNAL_ERROR, as RabbitMQ answers a crash in a channel.
"""

from __future__ import annotations

from core import errors

ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530
RESOURCE_ERROR = 506
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_CODES: dict[type[BaseException], int] = {
    errors.AccessDenied: ACCESS_REFUSED,
    errors.Unauthenticated: ACCESS_REFUSED,
    errors.NotFound: NOT_FOUND,
    errors.ResourceLocked: RESOURCE_LOCKED,
    errors.PreconditionFailed: PRECONDITION_FAILED,
    errors.InvalidArgument: PRECONDITION_FAILED,
    errors.AlreadyExists: PRECONDITION_FAILED,
    errors.NotSupported: NOT_IMPLEMENTED,
    errors.QuotaExceeded: RESOURCE_ERROR,
    errors.Unavailable: RESOURCE_ERROR,
    errors.SluiceError: INTERNAL_ERROR,
}


def reply_code(error: BaseException) -> int:
    """The AMQP reply code answering ``error``."""
    return errors.nearest(REPLY_CODES, error) or INTERNAL_ERROR


def is_hard(code: int) -> bool:
    """Whether ``code`` closes the whole connection rather than one channel."""
    return code >= 500
