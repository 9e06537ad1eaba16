"""Delivered marks: per named queue, the offset below which every message has been handed to a
consumer at least once, kept across a crash so that what was delivered and not acked comes back
marked as a redelivery (AMQP's redelivered flag), as RabbitMQ does.

Cursors (``core.cursors``) keep delivery attempts too, but they are saved once per commit
interval. Marks are taken in memory (``mark``) and written by ``flush``, one write for all
taken since, which the adapter calls before the deliveries they cover go out (once per
event-loop turn, not per message), so a SIGKILL loses none.

On a single node they go to the file ``delivered.log`` in the data directory (``MarksFile``),
with no fsync: the marks survive the process, not a power cut (then the last saved cursors
still count). Text lines appended::

    <named queue> SP <mark> LF      mark: first offset never delivered; -1: queue forgotten

The last line of a queue wins; a torn last line (no LF) is ignored. Past ``COMPACT_BYTES`` the
file is replaced by one line per queue.

A node of a replica group keeps them in its replicated log instead (``MarksInLog``): the
compacted topic ``MARKS_TOPIC``, one record per queue keyed by its name, a forgotten queue a
tombstone. Marks are appended at most every ``hold_s`` (``IN_LOG_HOLD_S``), all taken since
in one batch, without waiting for the group, so the next leader has every mark the old one
shipped; only marks taken in the last moments before it died (not yet on a follower) are
missing, and what they covered comes back without the flag. Runs on the event loop; not
thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Protocol

from store import replace_file
from store.api import Message, Store
from store.errors import StoreError

from .model import INTERNAL_PREFIX

log = logging.getLogger(__name__)

FILE_NAME = "delivered.log"
MARKS_TOPIC = f"{INTERNAL_PREFIX}delivered"
"""Where a replica group's nodes keep the marks (compacted, one queue)."""
COMPACT_BYTES = 1 << 20
IN_LOG_HOLD_S = 0.05
"""How long a group's node gathers marks before appending them: a record per queue each time,
not per delivery batch, so marks cost the log a few records a second."""
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


class MarksSink(Protocol):
    """Where marks are kept. ``write`` raises OSError or StoreError when they cannot be."""

    where: str

    def read(self) -> dict[str, int]: ...
    def write(self, changed: dict[str, int], every: dict[str, int]) -> None: ...
    def close(self) -> None: ...


class MarksFile:
    """Marks in ``delivered.log`` (see the module's docstring)."""

    def __init__(self, data_dir: str) -> None:
        self.where = self.path = os.path.join(data_dir, FILE_NAME)
        self._fd = -1
        self._size = 0

    def read(self) -> dict[str, int]:
        return read_marks(self.path)

    def write(self, changed: dict[str, int], every: dict[str, int]) -> None:
        """Append a line per changed queue; past ``COMPACT_BYTES``, rewrite ``every`` mark."""
        try:
            if self._fd < 0:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                self._size = os.fstat(self._fd).st_size
            data = memoryview("".join(f"{queue} {mark}\n" for queue, mark in changed.items()).encode())
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
                self._size += written
            if self._size > COMPACT_BYTES:
                self._compact(every)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _compact(self, every: dict[str, int]) -> None:
        """Replace the file by one line per queue (rare: blocks the loop for one small fsync)."""
        data = "".join(f"{queue} {mark}\n" for queue, mark in every.items()).encode()
        self.close()
        replace_file(self.path, data)
        self._size = len(data)


class MarksInLog:
    """Marks in the replicated log's compacted topic ``MARKS_TOPIC``, which must exist before
    the first ``write``."""

    where = f"the log ({MARKS_TOPIC})"

    def __init__(self, store: Store) -> None:
        self._store = store

    def read(self) -> dict[str, int]:
        marks: dict[str, int] = {}
        for stored in self._store.compacted(MARKS_TOPIC):
            try:
                if stored.keys and stored.body:
                    marks[stored.keys[0]] = int(stored.body)
            except ValueError:
                log.error("an unreadable delivered mark for %r in %s is ignored", stored.keys[0], MARKS_TOPIC)
        return marks

    def write(self, changed: dict[str, int], every: dict[str, int]) -> None:
        """Append one record per changed queue (a tombstone for a forgotten one), not waiting
        for the group to confirm them."""
        self._store.append_batch([
            Message(MARKS_TOPIC, b"" if mark == _FORGOTTEN else str(mark).encode(), keys=(queue,))
            for queue, mark in changed.items()])

    def close(self) -> None:
        pass


class DeliveredMarks:
    """The delivered marks of every named queue popped with ``mark`` on."""

    def __init__(self, sink: MarksSink | str, hold_s: float = 0.0) -> None:
        """``sink``: where marks are kept, or a data directory for its ``delivered.log``;
        ``hold_s``: gather the marks of every flush within that long into one write (0: write
        at each flush)."""
        self._sink = MarksFile(sink) if isinstance(sink, str) else sink
        self._hold_s = hold_s
        self._held: asyncio.TimerHandle | None = None
        self._marks = self._sink.read()
        self._restored = dict(self._marks)
        """Marks from before this start, not yet applied to their queue's cursor."""
        self._pending: dict[str, int] = {}
        """Marks taken since the last ``flush``."""
        self.failing = False
        """Whether the last write failed (logged once per failing spell)."""

    @property
    def path(self) -> str:
        """Where the marks are kept."""
        return self._sink.where

    def restored(self, queue: str) -> int | None:
        """The mark ``queue`` had before this start, once (None afterwards or if it had none)."""
        return self._restored.pop(queue, None) if self._restored else None

    def mark(self, queue: str, offset: int) -> None:
        """Everything of ``queue`` below ``offset`` is being delivered (kept at ``flush``)."""
        if offset > self._marks.get(queue, 0):
            self._marks[queue] = offset
            self._pending[queue] = offset

    def flush(self) -> None:
        """Write the marks taken since the last flush, in one write (within ``hold_s``); call
        it before the deliveries they cover go out."""
        if not self._pending:
            return
        if self._hold_s:
            if self._held is None:
                self._held = asyncio.get_running_loop().call_later(self._hold_s, self._write_pending)
            return
        self._write_pending()

    def _write_pending(self) -> None:
        self._held = None
        if self._pending:
            changed, self._pending = self._pending, {}
            self._write(changed)

    def forget(self, queue: str) -> None:
        """``queue`` is gone, with the queues named ``queue@...`` (its priority levels): a
        queue declared again under its name starts unmarked."""
        def family(names: dict[str, int]) -> list[str]:
            return [name for name in names if name == queue or name.startswith(queue + "@")]
        for name in family(self._restored):
            del self._restored[name]
        for name in family(self._pending):
            del self._pending[name]
        gone = family(self._marks)
        for name in gone:
            del self._marks[name]
        if gone:
            self._write(dict.fromkeys(gone, _FORGOTTEN))

    def close(self) -> None:
        """Write what is pending (held or not) and close the file."""
        if self._held is not None:
            self._held.cancel()
        self._write_pending()
        self._sink.close()

    def _write(self, changed: dict[str, int]) -> None:
        """Keep ``changed``; a write that fails (a full disk, an I/O error, a group refusing
        writes) is logged once and dropped: deliveries go on, only their redelivered flag after
        a crash is at stake."""
        try:
            self._sink.write(changed, self._marks)
        except (OSError, StoreError) as error:
            if not self.failing:
                log.warning("delivered marks not written to %s (%s): after a crash, messages "
                            "delivered meanwhile may come back with redelivered=false; writing "
                            "resumes once it takes them", self.path, error)
            self.failing = True
            return
        if self.failing:
            log.info("delivered marks are written to %s again", self.path)
        self.failing = False
