"""Delivered marks: per named queue, the offset below which every message has been handed to a
consumer at least once, kept across a crash so that what was delivered and not acked comes back
marked as a redelivery (AMQP's redelivered flag), as RabbitMQ does.

Cursors (``core.cursors``) keep delivery attempts too, but they are saved once per commit
interval. Marks are taken in memory (``mark``) and written by ``flush``, one ``write`` for all
taken since, which the adapter calls before the deliveries they cover go out (once per
event-loop turn, not per message), so a SIGKILL loses none. There is no fsync: the marks
survive the process, not a power cut (then the last saved cursors still count).

File ``delivered.log`` in the data directory, text lines appended::

    <named queue> SP <mark> LF      mark: first offset never delivered; -1: queue forgotten

The last line of a queue wins; a torn last line (no LF) is ignored. Past ``COMPACT_BYTES`` the
file is replaced by one line per queue. Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import logging
import os

from store import replace_file

log = logging.getLogger(__name__)

FILE_NAME = "delivered.log"
COMPACT_BYTES = 1 << 20
_FORGOTTEN = -1


def read_marks(path: str) -> dict[str, int]:
    """The marks in the file at ``path`` (none if it does not exist)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return {}
    marks: dict[str, int] = {}
    for line in data.split(b"\n")[:-1]:  # the part after the last LF is torn or empty
        queue, _, mark = line.decode(errors="replace").rpartition(" ")
        try:
            value = int(mark)
        except ValueError:
            continue
        if value == _FORGOTTEN:
            marks.pop(queue, None)
        elif queue:
            marks[queue] = max(value, marks.get(queue, 0))
    return marks


class DeliveredMarks:
    """The delivered marks of every named queue popped with ``mark`` on."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self._marks = read_marks(self.path)
        self._restored = dict(self._marks)
        """Marks from before this start, not yet applied to their queue's cursor."""
        self._pending: dict[str, int] = {}
        """Marks taken since the last ``flush``."""
        self._fd = -1
        self._size = 0
        self.failing = False
        """Whether the last write failed (logged once per failing spell)."""

    def restored(self, queue: str) -> int | None:
        """The mark ``queue`` had before this start, once (None afterwards or if it had none)."""
        return self._restored.pop(queue, None) if self._restored else None

    def mark(self, queue: str, offset: int) -> None:
        """Everything of ``queue`` below ``offset`` is being delivered (kept at ``flush``)."""
        if offset > self._marks.get(queue, 0):
            self._marks[queue] = offset
            self._pending[queue] = offset

    def flush(self) -> None:
        """Write the marks taken since the last flush, in one write; call it before the
        deliveries they cover go out."""
        if self._pending:
            lines = "".join(f"{queue} {mark}\n" for queue, mark in self._pending.items())
            self._pending.clear()
            self._append(lines)

    def forget(self, queue: str) -> None:
        """``queue`` is gone, with the queues named ``queue@...`` (its priority levels): a
        queue declared again under its name starts unmarked."""
        def family(names: dict[str, int]) -> list[str]:
            return [name for name in names if name == queue or name.startswith(queue + "@")]
        for name in family(self._restored):
            del self._restored[name]
        for name in family(self._pending):
            del self._pending[name]
        for name in family(self._marks):
            del self._marks[name]
            self._append(f"{name} {_FORGOTTEN}\n")

    def close(self) -> None:
        """Flush and close the file."""
        self.flush()
        self._close_file()

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _append(self, lines: str) -> None:
        """Append ``lines``; a write that fails (a full disk, an I/O error) is logged once
        and dropped: deliveries go on, only their redelivered flag after a crash is at stake."""
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._size = os.fstat(self._fd).st_size
            data = memoryview(lines.encode())
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
                self._size += written
            if self._size > COMPACT_BYTES:
                self._compact()
        except OSError as error:
            self._close_file()
            if not self.failing:
                log.warning("delivered marks not written to %s (%s): after a crash, messages "
                            "delivered meanwhile may come back with redelivered=false; writing "
                            "resumes once the disk takes it", self.path, error)
            self.failing = True
            return
        if self.failing:
            log.info("delivered marks are written to %s again", self.path)
        self.failing = False

    def _compact(self) -> None:
        """Replace the file by one line per queue (rare: blocks the loop for one small fsync)."""
        data = "".join(f"{queue} {mark}\n" for queue, mark in self._marks.items()).encode()
        self._close_file()
        replace_file(self.path, data)
        self._size = len(data)
