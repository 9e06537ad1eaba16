"""Wills: what a client asked to be published when its connection ends without a DISCONNECT.

A will goes out at once, or after its Will Delay Interval (capped by the session expiry)
unless its client comes back first or its session ends sooner. A will with the retain flag
is retained only within the retained limits; a will that fails is logged, and the broker
goes on.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from core.model import OutgoingMessage, Principal
from core.service import Broker
from core.untrusted import clip

from .mapping import now_ms, to_outgoing
from .packets import Will
from .retained import RetainedMessages, as_retained

log = logging.getLogger(__name__)


def will_message(native_topic: str, will: Will, client_id: str, retain: bool) -> OutgoingMessage:
    """The core message a will becomes, stored in ``native_topic``; ``retain``: its retain
    flag was admitted."""
    message = to_outgoing(native_topic, will.topic, will.payload, will.qos, retain, client_id,
                          will.properties, now_ms())
    return as_retained(message, will.topic) if retain else message


class Wills:
    """Publishes wills, and holds the delayed ones by client id."""

    def __init__(self, broker: Broker, retained: RetainedMessages,
                 may_retain: Callable[[str, str, bytes], bool],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self._broker = broker
        self._retained = retained
        self._may_retain = may_retain
        self._spawn = spawn
        self._delayed: dict[str, tuple[asyncio.TimerHandle, Will, Principal]] = {}

    def publish(self, will: Will, principal: Principal, client_id: str, delay_s: int = 0) -> None:
        """Publish ``will`` now, or in ``delay_s`` seconds unless `cancel` comes first."""
        if not delay_s:
            self._spawn(self._publish(will, principal, client_id))
            return
        timer = asyncio.get_running_loop().call_later(delay_s, lambda: self.fire(client_id))
        self._delayed[client_id] = (timer, will, principal)

    def fire(self, client_id: str) -> None:
        """Publish a delayed will now (its delay passed, or its session ended first)."""
        entry = self._delayed.pop(client_id, None)
        if entry is not None:
            timer, will, principal = entry
            timer.cancel()
            self._spawn(self._publish(will, principal, client_id))

    def cancel(self, client_id: str) -> None:
        """The client came back: its delayed will is not published."""
        entry = self._delayed.pop(client_id, None)
        if entry is not None:
            entry[0].cancel()

    def stop(self) -> None:
        """Stop every delay timer (the broker is stopping)."""
        for timer, _, _ in self._delayed.values():
            timer.cancel()

    async def _publish(self, will: Will, principal: Principal, client_id: str) -> None:
        retain = will.retain and self._may_retain(client_id, will.topic, will.payload)
        try:
            message = will_message(self._broker.topic_of_subject(will.topic), will, client_id,
                                   retain)
            await self._broker.send(principal, [message], create_topics=True)
        except Exception:  # noqa: BLE001 - a failed will is logged, the broker goes on
            if retain:
                self._retained.cancel(will.topic)
            log.exception("will of client %s on %s not published", clip(client_id),
                          clip(will.topic))
            return
        if retain:
            self._retained.update(will.topic, message.body, message.properties)
