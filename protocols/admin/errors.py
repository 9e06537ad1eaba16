"""The admin API's one error table: core errors to HTTP statuses and JSON error bodies.

Every error body is ``{"error": CODE, "message": TEXT}``; TEXT says what went wrong and what to
do next (core's messages already do). An error class not in the table is looked up by its
bases, so a new subclass of ``NotFound`` is a 404 without touching this file.
"""

from __future__ import annotations

from aiohttp import web

from core import errors as core

STATUS: dict[type[BaseException], tuple[int, str]] = {
    core.Unauthenticated: (401, "unauthenticated"),
    core.LoginThrottled: (429, "too_many_failed_logins"),
    core.LoginBusy: (503, "login_busy"),
    core.AccessDenied: (403, "forbidden"),
    core.NotFound: (404, "not_found"),
    core.TopicNotFound: (404, "topic_not_found"),
    core.GroupNotFound: (404, "group_not_found"),
    core.UserNotFound: (404, "user_not_found"),
    core.MessageNotFound: (404, "message_not_found"),
    core.ClientNotFound: (404, "client_not_found"),
    core.AlreadyExists: (409, "already_exists"),
    core.PreconditionFailed: (409, "precondition_failed"),
    core.ResourceLocked: (409, "resource_locked"),
    core.InvalidArgument: (400, "invalid_argument"),
    core.BadFilter: (400, "bad_filter"),
    core.MessageTooLarge: (413, "message_too_large"),
    core.OffsetOutOfRange: (416, "offset_out_of_range"),
    core.InvalidReceiptHandle: (400, "invalid_receipt_handle"),
    core.ReceiptExpired: (409, "receipt_expired"),
    core.NotSupported: (501, "not_supported"),
    core.Unavailable: (503, "unavailable"),
    core.QuotaExceeded: (507, "quota_exceeded"),
    core.SluiceError: (500, "internal"),
}


class HttpProblem(Exception):
    """An error the admin API itself detects (bad JSON, missing field): status, code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def status_for(error: Exception) -> tuple[int, str]:
    """(HTTP status, error code) for ``error``: the nearest class in STATUS along its MRO."""
    if isinstance(error, HttpProblem):
        return error.status, error.code
    return core.nearest(STATUS, error) or (500, "internal")


def error_response(error: Exception) -> web.Response:
    """The JSON response for ``error``. A 401 carries no ``WWW-Authenticate`` challenge: callers
    send credentials with every request, and a challenge would make browsers prompt and then
    replay the credentials on requests other sites' pages make."""
    status, code = status_for(error)
    message = str(error) or code.replace("_", " ")
    if status == 500 and not isinstance(error, core.SluiceError | HttpProblem):
        message = (f"internal error ({type(error).__name__}: {error}); the broker's log has "
                   "the details")
    response = web.json_response({"error": code, "message": message}, status=status)
    if isinstance(error, core.LoginThrottled):
        response.headers["Retry-After"] = str(error.retry_after_s)
    return response
