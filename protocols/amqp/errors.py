"""The AMQP adapter's one error table: core errors to AMQP 0-9-1 reply codes.

Soft codes close the channel and the connection goes on; hard ones close the connection
(``ReplyCode.hard``). An error class not in the table maps like its nearest listed base
(``core.errors.nearest``); one core did not raise on purpose is 541 INTERNAL_ERROR, as RabbitMQ
answers a crash in a channel.
"""

from __future__ import annotations

from core import errors

from .reason_codes import ReplyCode

REPLY_CODES: dict[type[BaseException], ReplyCode] = {
    errors.AccessDenied: ReplyCode.ACCESS_REFUSED,
    errors.Unauthenticated: ReplyCode.ACCESS_REFUSED,
    errors.NotFound: ReplyCode.NOT_FOUND,
    errors.ResourceLocked: ReplyCode.RESOURCE_LOCKED,
    errors.PreconditionFailed: ReplyCode.PRECONDITION_FAILED,
    errors.InvalidArgument: ReplyCode.PRECONDITION_FAILED,
    errors.AlreadyExists: ReplyCode.PRECONDITION_FAILED,
    errors.NotSupported: ReplyCode.NOT_IMPLEMENTED,
    errors.QuotaExceeded: ReplyCode.RESOURCE_ERROR,
    errors.Unavailable: ReplyCode.RESOURCE_ERROR,
    errors.SluiceError: ReplyCode.INTERNAL_ERROR,
}


def reply_code(error: BaseException) -> ReplyCode:
    """The AMQP reply code answering ``error``."""
    return errors.nearest(REPLY_CODES, error) or ReplyCode.INTERNAL_ERROR
