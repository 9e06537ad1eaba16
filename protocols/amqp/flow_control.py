"""When one AMQP connection stops reading (uvicorn's ``flow_control.py``, reduced): while its
login is being checked (the sans-IO decoder buffers what follows unbounded then) and while
more than ``max_pending`` of its methods wait for core. Runs on the event loop."""

from __future__ import annotations

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
