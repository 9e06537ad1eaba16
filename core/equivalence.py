"""RabbitMQ's words for a redeclaration with other settings, so that an AMQP user reads the
reply text RabbitMQ gives: ``inequivalent arg 'durable' for queue 'q' in vhost '/': received
'false' but current is 'true'``. Only the first setting that differs is named."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import PreconditionFailed
from .untrusted import clip


def check_equivalent(kind: str, name: str, vhost: str, received: Mapping[str, Any],
                     current: Mapping[str, Any]) -> None:
    """PreconditionFailed naming the first setting whose ``received`` value differs from the
    ``current`` one (settings in their mapping order, then arguments by name)."""
    for setting in [*received, *sorted(set(current) - set(received))]:
        wanted, present = received.get(setting), current.get(setting)
        if wanted != present:
            raise PreconditionFailed(
                f"inequivalent arg {clip(setting)} for {kind} {clip(name)} in vhost "
                f"{clip(vhost)}: received {_text(wanted)} but current is {_text(present)}")


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"'{str(value).lower()}'"
    return clip(str(value))
