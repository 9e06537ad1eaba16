"""Backpressure for one AMQP connection (uvicorn's ``flow_control.py``, reduced), both ways.

Reading stops while its login is being checked (the sans-IO decoder buffers what follows
unbounded then), while more than ``max_pending`` of its methods wait for core, and while the
connection is blocked for a resource alarm. Deliveries stop while the wire's write buffer is
above its high-water mark (`WriteGate`). Runs on the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Pausable(Protocol):
    """The reading side of a wire."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class FlowControl:
    """Reading is paused while any reason holds."""

    def __init__(self, wire: Pausable, max_pending: int) -> None:
        self._wire = wire
        self.max_pending = max_pending
        self._reasons: set[str] = set()

    def pause(self, reason: str) -> None:
        """Stop reading for ``reason``."""
        if not self._reasons:
            self._wire.pause_reading()
        self._reasons.add(reason)

    def resume(self, reason: str) -> None:
        """``reason`` no longer holds; reading resumes once none does."""
        if reason in self._reasons:
            self._reasons.discard(reason)
            if not self._reasons:
                self._wire.resume_reading()

    def pending(self, count: int) -> None:
        """``count`` methods wait for core: pause above ``max_pending``, resume at half."""
        if count > self.max_pending:
            self.pause("pending")
        elif count <= self.max_pending // 2:
            self.resume("pending")

    @property
    def paused(self) -> bool:
        return bool(self._reasons)


class WriteGate:
    """Whether the wire takes more bytes now (asyncio's ``pause_writing`` / ``resume_writing``
    at the transport's high and low water marks). Consumers that find it shut wait here instead
    of popping more messages, so a client that reads slowly (with no_ack above all) makes the
    broker hold at most about a write buffer for it. Runs on the event loop."""

    def __init__(self) -> None:
        self.open = True
        self._waiting: dict[Callable[[], None], None] = {}

    def wait(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the wire drains (once, however often it is asked)."""
        self._waiting[callback] = None

    def shut(self) -> None:
        """The transport's buffer is above its high-water mark."""
        self.open = False

    def reopen(self) -> None:
        """The buffer drained below the low-water mark: wake every waiter, in order."""
        self.open = True
        waiting, self._waiting = self._waiting, {}
        for callback in waiting:
            callback()
