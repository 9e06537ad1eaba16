"""A node's metadata database kept in step with the group's log (``core.metadata.journal``).

The leader's repository hands each write's journal entry to ``journal``, which appends it to the
log and returns once the group confirmed it. Every node (the leader too: an entry whose wait
timed out may be confirmed later) runs ``follow``, which applies confirmed entries past the
database's position in log order as they become readable. A node about to lead first applies
everything its log holds (``catch_up``), so it starts with every user, permission and
definition the old leader had.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from core.errors import QuotaExceeded, Unavailable
from core.metadata import MetadataRepository
from core.metadata.journal import JOURNAL_TOPIC
from store.api import AppendResult, StoredMessage
from store.errors import StoreDegradedError

log = logging.getLogger(__name__)

CONFIRM_TIMEOUT_S = 30.0
BATCH = 256


def group_master_key(secret: str) -> bytes:
    """The master key every node of a group shares (signing secrets are stored encrypted under
    it and replicated as they are), derived from the cluster secret."""
    derived = HKDF(hashes.SHA256(), 32, salt=None, info=b"sluice metadata master key").derive(secret.encode())
    return base64.urlsafe_b64encode(derived)


class JournalStore(Protocol):
    """What the sync needs of a node's replicated store."""

    def append(self, topic: str, body: bytes, queue_id: int) -> AppendResult: ...
    def wait_confirmed(self, end_offset: int, timeout: float | None = None) -> bool: ...
    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]: ...
    def read(self, topic: str, queue_id: int, queue_offset: int, max_count: int = 32,
             max_bytes: int = 4 << 20) -> list[StoredMessage]: ...
    def add_listener(self, listener: Callable[[int, int], None]) -> None: ...
    def remove_listener(self, listener: Callable[[int, int], None]) -> None: ...


class MetadataSync:
    def __init__(self, store: Callable[[], JournalStore], metadata: MetadataRepository) -> None:
        """``store()`` is the node's store now (cutting the log back reopens it)."""
        self._store, self.metadata = store, metadata
        self._position = metadata.journal_position()

    def journal(self, entry: bytes) -> int:
        """Append ``entry`` and wait until the group confirmed it; its position. Raises
        QuotaExceeded while the group refuses writes, Unavailable when it does not confirm in
        time (the change is applied if it is confirmed later). Blocking."""
        store = self._store()
        try:
            appended = store.append(JOURNAL_TOPIC, entry, queue_id=0)
            confirmed = store.wait_confirmed(appended.end_offset, CONFIRM_TIMEOUT_S)
        except StoreDegradedError as refused:
            raise QuotaExceeded(f"{refused}; nothing was changed") from None
        if not confirmed:
            raise Unavailable(f"the group did not confirm the change within {CONFIRM_TIMEOUT_S:.0f} s; it is "
                              "applied if it is confirmed later: check before trying again")
        return appended.queue_offset

    def behind(self) -> bool:
        """Whether the log holds entries past what the database applied (cheap: no I/O)."""
        return self._store().queue_range(JOURNAL_TOPIC, 0)[1] > self._position + 1

    def catch_up(self) -> int:
        """Apply every readable entry past the database's position; how many. Blocking."""
        applied = 0
        store = self._store()
        while True:
            at = self._position = self.metadata.journal_position()
            low, high = store.queue_range(JOURNAL_TOPIC, 0)
            if high <= at + 1:
                return applied
            start = at + 1
            if start < low:
                log.error("the metadata journal now begins at %d (retention), past this node's position %d: "
                          "metadata changes between them are missing here", low, at)
                start = low
            for stored in store.read(JOURNAL_TOPIC, 0, start, max_count=BATCH, max_bytes=16 << 20):
                applied += self.metadata.apply_journal(stored.body, stored.queue_offset)

    async def follow(self) -> None:
        """Until cancelled: apply entries as the store makes them readable."""
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def listener(visible: int, durable: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(moved.set)
        watched: JournalStore | None = None
        try:
            while True:
                store = self._store()
                if store is not watched:  # cutting the log back reopened it
                    if watched is not None:
                        watched.remove_listener(listener)
                    store.add_listener(listener)
                    watched = store
                moved.clear()
                if self.behind():
                    try:
                        await asyncio.to_thread(self.catch_up)
                    except Exception:  # noqa: BLE001 - logged; the next move tries again
                        log.exception("could not apply the metadata journal; retrying when the log moves")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await moved.wait()
        finally:
            if watched is not None:
                watched.remove_listener(listener)
