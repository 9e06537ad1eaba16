"""File-operation faults for tests: make a chosen store write site fail the way disks fail.

    ops = FaultyFileOps(Fault("consumequeue", "write", errno.ENOSPC, after_bytes=4096))
    previous = fileops.install(ops)
    ...                      # appends now fail once 4 KiB of queue entries were written
    ops.lift()               # the disk has room again: the store resumes by itself
    fileops.install(previous)

A fault with ``error=None`` only shortens writes (each call writes half of what it was given);
a fault with an errno lets writes through until ``after_calls`` calls or ``after_bytes`` bytes
matched it, writes the bytes up to that limit (a short write, as a filling disk does) and then
fails every matching call with that errno until lifted (or ``times`` calls failed).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from .fileops import FileOps


@dataclass
class Fault:
    """Calls of ``op`` at ``site`` (``"*"``: any) on a path containing ``path`` fail with ``error``."""

    site: str
    op: str = "write"
    error: int | None = None
    path: str = ""
    after_calls: int = 0
    after_bytes: int = 0
    times: int | None = None
    """How many calls fail before the fault passes everything again; None: until lifted."""
    calls: int = 0
    written: int = 0
    failed: int = 0

    def matches(self, site: str, op: str, path: str) -> bool:
        return (self.site in ("*", site) and self.op in ("*", op) and self.path in path
                and (self.times is None or self.failed < self.times))

    def admit(self, op: str, path: str, size: int) -> int:
        """Bytes of a ``size``-byte call that go through; raises once the fault fires."""
        self.calls += 1
        if self.error is None:
            allowed = max(1, size // 2) if size > 1 else size
        elif self.calls <= self.after_calls or (self.after_bytes and self.written + size <= self.after_bytes):
            allowed = size
        elif self.after_bytes and self.written < self.after_bytes and op == "write":
            allowed = self.after_bytes - self.written  # the rest of the room: a short write
        else:
            self.failed += 1
            raise OSError(self.error, os.strerror(self.error), path)
        self.written += allowed
        return allowed


class FaultyFileOps(FileOps):
    """``FileOps`` that applies the first matching ``Fault`` to each call. Thread-safe."""

    def __init__(self, *faults: Fault) -> None:
        self._lock = threading.Lock()
        self.faults = list(faults)
        self.failures = 0
        """How many calls failed so far."""

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def lift(self) -> None:
        """Remove every fault: from now on every call goes through."""
        with self._lock:
            self.faults.clear()

    def admit(self, site: str, op: str, path: str, size: int = 0) -> int:
        with self._lock:
            for fault in self.faults:
                if fault.matches(site, op, path):
                    failed = fault.failed
                    try:
                        return fault.admit(op, path, size)
                    finally:
                        self.failures += fault.failed - failed
        return size
