"""The one table turning core errors into RocketMQ ``Code`` values, and status helpers.

RocketMQ 5 answers every RPC with gRPC status OK and puts the outcome in the response's
``Status`` (code + message); the official clients read that, not the gRPC status. The message is
the core error's text, which says what to do next.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from rocketmq.grpc_protocol import definition_pb2

from core import errors

Code = definition_pb2.Code
Status = definition_pb2.Status

log = logging.getLogger("sluice.native")

ERROR_CODES: dict[type[BaseException], int] = {
    # An error class missing here maps like its nearest listed base (core.errors.nearest).
    errors.BadFilter: Code.ILLEGAL_FILTER_EXPRESSION,
    errors.MessageTooLarge: Code.MESSAGE_BODY_TOO_LARGE,
    errors.InvalidReceiptHandle: Code.INVALID_RECEIPT_HANDLE,
    errors.OffsetOutOfRange: Code.ILLEGAL_OFFSET,
    errors.InvalidArgument: Code.BAD_REQUEST,
    errors.TopicNotFound: Code.TOPIC_NOT_FOUND,
    errors.GroupNotFound: Code.CONSUMER_GROUP_NOT_FOUND,
    errors.MessageNotFound: Code.MESSAGE_NOT_FOUND,
    errors.TransactionNotFound: Code.INVALID_TRANSACTION_ID,
    errors.NotFound: Code.NOT_FOUND,
    errors.AlreadyExists: Code.BAD_REQUEST,
    errors.PreconditionFailed: Code.BAD_REQUEST,
    errors.ResourceLocked: Code.BAD_REQUEST,
    # The clients stop retrying an ack or a nack on INVALID_RECEIPT_HANDLE: right for an expired
    # receipt too, since the message is redelivered anyway.
    errors.ReceiptExpired: Code.INVALID_RECEIPT_HANDLE,
    errors.Unauthenticated: Code.UNAUTHORIZED,
    errors.LoginBusy: Code.TOO_MANY_REQUESTS,
    errors.AccessDenied: Code.FORBIDDEN,
    errors.NotSupported: Code.UNSUPPORTED,
    errors.Unavailable: Code.TOO_MANY_REQUESTS,
    errors.QuotaExceeded: Code.TOO_MANY_REQUESTS,
    errors.SluiceError: Code.INTERNAL_ERROR,
}


def code_of(error: Exception) -> int:
    """The RocketMQ code for ``error``; INTERNAL_ERROR for anything core did not raise on purpose."""
    code = errors.nearest(ERROR_CODES, error)
    return Code.INTERNAL_ERROR if code is None else code


def status_of(error: Exception) -> Status:
    """The Status answering a request that failed with ``error``; logs unexpected errors.

    An error core did not raise on purpose is a bug: its traceback goes to the log, the client
    gets INTERNAL_ERROR, and the server keeps serving everyone else.
    """
    if not isinstance(error, errors.SluiceError):
        log.exception("unexpected error while serving a native request", exc_info=error)
        return Status(code=Code.INTERNAL_ERROR,
                      message=f"internal error in Sluice ({type(error).__name__}); "
                              "the broker log has the details, retry later")
    return Status(code=code_of(error), message=str(error) or type(error).__name__)


def ok(message: str = "OK") -> Status:
    """The Status of a request that succeeded."""
    return Status(code=Code.OK, message=message)


def overall(statuses: Iterable[Status]) -> Status:
    """The top-level Status of a multi-entry answer: the common status, or MULTIPLE_RESULTS."""
    distinct = {(status.code, status.message): status for status in statuses}
    if not distinct:
        return ok()
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    codes = {code for code, _ in distinct}
    if codes == {Code.OK}:
        return ok()
    return Status(code=Code.MULTIPLE_RESULTS, message="entries have different results; see each entry")
