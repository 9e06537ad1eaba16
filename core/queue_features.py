"""Queue arguments that change how a queue hands out its messages, checked as RabbitMQ 4 checks
them: ``x-max-priority``, ``x-single-active-consumer`` and ``x-queue-type: stream``.

A priority queue (``x-max-priority`` N, 1..255) is N+1 named queues, one per priority level:
level 0 is the queue's own named queue, level k is ``<named queue>@p<k>``; a message is indexed
(stored once) into the level of its ``priority`` (above N counts as N, none as 0), and
consumers take from the highest level first. The ``@`` makes the levels part of the queue's
consumption state, forgotten with it (``CursorBook.drop_consumer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from .errors import PreconditionFailed
from .untrusted import clip

MAX_PRIORITY = 255
STREAM = "stream"
QUEUE_TYPES = ("classic", "quorum", STREAM)


@dataclass(frozen=True, slots=True)
class QueueFeatures:
    """How a queue's messages go to consumers, from its arguments."""

    max_priority: int = 0
    single_active: bool = False
    stream: bool = False


def features(arguments: Mapping[str, Any]) -> QueueFeatures:
    """The features of a queue declared with ``arguments`` (checked by ``check`` before)."""
    return QueueFeatures(int(arguments.get("x-max-priority") or 0),
                         arguments.get("x-single-active-consumer") is True,
                         arguments.get("x-queue-type") == STREAM)


def check(queue: str, vhost: str, arguments: Mapping[str, Any], *, durable: bool,
          exclusive: bool, auto_delete: bool) -> None:
    """PreconditionFailed (406) with RabbitMQ's wording for an argument it would refuse."""
    def invalid(name: str, reason: str) -> PreconditionFailed:
        return PreconditionFailed(f"invalid arg '{name}' for queue {clip(queue)} in vhost "
                                  f"{clip(vhost)}: {reason}")

    priority = arguments.get("x-max-priority")
    if priority is not None:
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise invalid("x-max-priority", f"{{unacceptable_type,{field_type(priority)}}}")
        if priority < 0:
            raise invalid("x-max-priority", f"{{value_negative,{priority}}}")
        if priority > MAX_PRIORITY:
            raise invalid("x-max-priority", f"{{max_value_exceeded,{priority}}}")
    single = arguments.get("x-single-active-consumer")
    if single is not None and not isinstance(single, bool):
        raise invalid("x-single-active-consumer", f"{{unacceptable_type,{field_type(single)}}}")
    kind = arguments.get("x-queue-type")
    if kind is not None and not isinstance(kind, str):
        raise invalid("x-queue-type", f"{{unacceptable_type,{field_type(kind)}}}")
    if kind is not None and kind not in QUEUE_TYPES:
        raise invalid("x-queue-type", f"unsupported queue type {clip(kind)}")
    if kind == STREAM:
        for flag, name in ((not durable, "non-durable"), (exclusive, "exclusive-owner"),
                           (auto_delete, "auto-delete")):
            if flag:
                raise PreconditionFailed(f"invalid property '{name}' for queue "
                                         f"{clip(queue)} in vhost {clip(vhost)}")
        if priority is not None:
            raise invalid("x-max-priority", "not supported by stream queues")


def field_type(value: Any) -> str:
    """AMQP's name for the field type of a decoded ``value``, as RabbitMQ names it in its
    refusals."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    for kind, name in ((str, "longstr"), (bytes, "longstr"), (bytearray, "longstr"),
                       (float, "double"), (Decimal, "decimal"), (datetime, "timestamp"),
                       (Mapping, "table"), (list, "array"), (tuple, "array")):
        if isinstance(value, kind):
            return name
    return "void"


def level_queue(queue: str, level: int) -> str:
    """The named queue of priority ``level`` of the queue whose named queue is ``queue``."""
    return queue if level <= 0 else f"{queue}@p{level}"


def levels(queue: str, max_priority: int) -> tuple[str, ...]:
    """Every named queue of ``queue``, highest priority first (just ``queue`` without
    priorities)."""
    return tuple(level_queue(queue, level) for level in range(max_priority, -1, -1))


def target(queue: str, arguments: Mapping[str, Any], priority: int | None) -> str:
    """The named queue a message of ``priority`` is indexed into."""
    top = arguments.get("x-max-priority")
    if not top or not priority or not isinstance(top, int):
        return queue
    return level_queue(queue, min(max(priority, 0), top))
