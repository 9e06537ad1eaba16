"""The memory alarm, as RabbitMQ's ``vm_memory_high_watermark``: the broker's resident memory
(``/proc/self/statm``) is read once a second on a loop timer; above the high watermark the
alarm goes on, and it goes off once memory is back below ``CLEAR_RATIO`` of the mark (so it
does not flap around it). Memory freed by the broker but kept by the C allocator (glibc keeps
freed heap pages mapped) would hold the alarm on for ever, so whenever a reading is above the
clear mark the allocator is first asked to give free pages back (``malloc_trim``) and memory is
read again; that costs a heap walk at most once a second, only under pressure. Adapters watch
it and stop reading publishers meanwhile; consumers go on, since they are what frees memory.
No thread and no per-message work. Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
CLEAR_RATIO = 0.98
"""The alarm clears below this share of the watermark."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident set size (second field of ``/proc/self/statm``, in pages)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)`` (free heap pages go back to the system); a no-op elsewhere."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]

    def release() -> None:
        trim(0)
    return release


release_free_memory = _malloc_trim()
"""Give the C allocator's free pages back to the system."""


def total_memory_bytes() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PHYS_PAGES") * _PAGE


def watermark_bytes(fraction: float) -> int:
    """The high watermark for ``fraction`` of the machine's memory
    (``core.memory_high_watermark``)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"core.memory_high_watermark = {fraction} must be a fraction of the "
                         "machine's memory above 0 and at most 1 (RabbitMQ's default is 0.4)")
    return int(fraction * total_memory_bytes())


class MemoryAlarm:
    """On while resident memory is above ``limit`` bytes, off again below ``CLEAR_RATIO`` of it."""

    def __init__(self, limit: int, read: Callable[[], int] = resident_bytes,
                 release: Callable[[], None] = release_free_memory) -> None:
        self.limit = limit
        self.on = False
        self.resident = 0
        """Resident bytes at the last check."""
        self._read = read
        self._release = release
        self._watchers: list[Callable[[bool], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, watcher: Callable[[bool], None]) -> bool:
        """Call ``watcher(on)`` whenever the alarm goes on or off; returns whether it is on."""
        self._watchers.append(watcher)
        return self.on

    def check(self) -> None:
        """Read resident memory and raise or clear the alarm."""
        self.resident = self._read()
        if self.resident >= self.limit * CLEAR_RATIO:
            self._release()
            self.resident = self._read()
        if self.on:
            changed = self.resident < self.limit * CLEAR_RATIO
        else:
            changed = self.resident > self.limit
        if not changed:
            return
        self.on = not self.on
        if self.on:
            log.warning("memory alarm: resident memory %d MiB is above the high watermark %d MiB;"
                        " publishers are blocked", self.resident >> 20, self.limit >> 20)
        else:
            log.info("memory alarm cleared: resident memory %d MiB", self.resident >> 20)
        for watcher in list(self._watchers):
            try:
                watcher(self.on)
            except Exception:  # noqa: BLE001 - one watcher's bug must not silence the rest
                log.exception("a memory alarm watcher failed; the others go on")

    def start(self) -> None:
        """Check now and then every ``CHECK_INTERVAL_S`` on the running loop."""
        self._tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        try:
            self.check()
        except (OSError, ValueError, IndexError) as error:  # no /proc here
            log.warning("the memory alarm is off: resident memory cannot be read (%s)", error)
            self._timer = None
            return
        self._timer = asyncio.get_running_loop().call_later(CHECK_INTERVAL_S, self._tick)
