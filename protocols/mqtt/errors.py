"""The MQTT adapter's one error table: core errors to MQTT 5 reason codes.

An error class not in the table maps like its nearest listed base (``core.errors.nearest``), so
``BadFilter`` answers like ``InvalidArgument``.
"""

from __future__ import annotations

from core import errors

from .reason_codes import ReasonCode

REASONS: dict[type[BaseException], ReasonCode] = {
    errors.AccessDenied: ReasonCode.NotAuthorized,
    errors.MessageTooLarge: ReasonCode.PacketTooLarge,
    errors.InvalidArgument: ReasonCode.TopicNameInvalid,
    errors.QuotaExceeded: ReasonCode.QuotaExceeded,
    errors.Unavailable: ReasonCode.ServerUnavailable,
}


def reason_for(error: BaseException) -> ReasonCode:
    """The MQTT 5 reason code answering a core error; ImplementationSpecificError when unlisted."""
    return errors.nearest(REASONS, error) or ReasonCode.ImplementationSpecificError
