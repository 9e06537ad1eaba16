"""The tiering loop: copies sealed segments to the object store and applies tier retention.

Every ``check_interval_ms`` the loop runs the store's ``Tierer`` in a worker thread until
nothing is pending, then drops tiered files older than each topic's ``tier_retention_ms``. The
hot path never waits on it: producers and consumers use the local log, and local retention keeps
every segment above the tiered end (``FileStore.tier_floor``), so an object store that is down
only makes the tier lag. A failure is logged once per distinct error and retried with a doubling
backoff up to ``retry_max_ms``. A ``ManifestConflict`` (a newer leader committed) stops tiering
on this node for good. The loop itself runs on the event loop; the tierer runs in a thread,
one step at a time (and converts segments in its worker process, off this process's
interpreter lock).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from store.api import RetentionReport
from store.tier.manifest import Manifest, ManifestConflict, TieredSegment
from store.tier.objects import ObjectStoreError

from . import clock
from .model import TopicConfig

log = logging.getLogger(__name__)

FIRST_READ_WAIT_S = 30.0
"""How long ``start`` waits for the manifest of an earlier run: a store that refuses answers at
once; one that hangs must not hold the broker's start for longer."""


class Tierer(Protocol):
    """What the loop drives: the store's tierer (``store.tier.tierer.Tierer``)."""

    manifest: Manifest | None

    def refresh(self) -> Manifest | None: ...
    def tier_once(self) -> TieredSegment | None: ...
    def apply_tier_retention(self, now_ms: int, retention_ms: Callable[[str], int | None]) -> list[str]: ...
    def status(self) -> Any: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class TieringSettings:
    """How often to tier, when to call the tier lagging, how far apart to retry."""

    check_interval_ms: int = 2_000
    max_lag_ms: int = 600_000
    retry_max_ms: int = 60_000


@dataclass
class TieringCounters:
    """What this broker tiered since it started, for ``/metrics``."""

    segments: int = 0
    bytes: int = 0
    errors: int = 0


class TieringLoop:
    """Drives one ``Tierer``. ``on_commit`` gets every newer manifest the tierer knows (the one
    found at start, then each it commits; the composition root hands them to the
    ``TierReader``). Constructing it touches no object store: an object store that does not
    answer at start must not stop the broker."""

    def __init__(self, tierer: Tierer, topics: Callable[[], list[TopicConfig]],
                 settings: TieringSettings, *, description: str,
                 on_commit: Callable[[Manifest], None] = lambda manifest: None) -> None:
        self.tierer = tierer
        self._topics = topics
        self.settings = settings
        self.description = description
        self._on_commit = on_commit
        self._handed: Manifest | None = None
        self._loaded = False
        self._first_read = asyncio.Event()
        self.counters = TieringCounters()
        self.failure: str | None = None
        """The error of the last pass, None when it succeeded."""
        self.failing_since_ms: int | None = None
        self.last_pass_ms: int | None = None
        """When a pass last succeeded (tiering something or finding nothing to tier)."""
        self.stopped: str | None = None
        """Why this node stopped tiering (a newer leader committed), None while it tiers."""
        self._retain: Callable[[], Awaitable[RetentionReport]] | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    @property
    def tiered_end(self) -> int:
        """Every record below this log offset is in the tier; 0 until the manifest is known
        (local retention then keeps everything). Any thread may read it."""
        manifest = self.tierer.manifest
        return manifest.tiered_end if manifest is not None else 0

    async def start(self, retain: Callable[[], Awaitable[RetentionReport]] | None = None) -> None:
        """Start the timer, whose first pass starts at once, and wait (at most
        ``FIRST_READ_WAIT_S``) for it to read the manifest of an earlier run, so tiered history
        is readable as soon as the broker serves. ``retain`` (core's local retention pass) runs
        after ``run_now``. Runs on the event loop."""
        self._retain = retain
        self._task = asyncio.create_task(self._run())
        try:
            await asyncio.wait_for(self._first_read.wait(), FIRST_READ_WAIT_S)
        except TimeoutError:
            log.warning("the tier's manifest at %s was not read within %.0f s; tiered history is "
                        "readable once it is", self.description, FIRST_READ_WAIT_S)

    async def close(self) -> None:
        """Stop the timer, wait for a step in progress (the store closes after this) and stop
        the tierer's worker process."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        async with self._lock:  # a step running in its thread finishes first
            await asyncio.to_thread(self.tierer.close)

    async def run_now(self) -> RetentionReport | None:
        """Tier everything pending now, apply tier retention, then run local retention (which
        may now delete the segments just tiered); raises what the pass raised
        (``ObjectStoreError``, ``ManifestConflict``) after recording it. Returns what local
        retention deleted (None before ``start``)."""
        await self._pass()
        return await self._retain() if self._retain is not None else None

    async def _run(self) -> None:
        interval = self.settings.check_interval_ms / 1000
        delay = 0.0  # at once: ``start`` waits for the manifest of an earlier run
        while self.stopped is None:
            await asyncio.sleep(delay)
            try:
                await self._pass()
            except ManifestConflict:
                return
            except Exception:  # noqa: BLE001 - recorded and logged by _pass; retried after a backoff
                delay = min(max(delay * 2, interval), self.settings.retry_max_ms / 1000)
            else:
                delay = interval

    async def _pass(self) -> None:
        async with self._lock:
            if self.stopped is not None:
                raise ManifestConflict(self.stopped)
            try:
                await self._tier_all()
            except ManifestConflict as error:
                self.stopped = (f"another broker committed a newer tier manifest ({error}): a "
                                "newer leader tiers now, so this node stopped tiering; restart "
                                "it to tier again if it should")
                log.error("tiering stopped: %s", self.stopped)
                raise
            except Exception as error:
                self._failed(error)
                raise
            finally:
                self._hand_over()
            self._recovered()

    async def _tier_all(self) -> None:
        tierer = self.tierer
        if not self._loaded:  # the manifest of an earlier run, for readers and local retention
            try:
                await asyncio.to_thread(tierer.refresh)
                self._loaded = True
                self._hand_over()
            finally:
                self._first_read.set()
        while (segment := await asyncio.to_thread(tierer.tier_once)) is not None:
            names = set(segment.files)
            self.counters.segments += 1
            self.counters.bytes += sum(f.bytes for f in tierer.manifest.files if f.key in names)
            self._hand_over()
        retention = {t.name: t.tier_retention_ms for t in self._topics()}
        dropped = await asyncio.to_thread(tierer.apply_tier_retention, clock.now_ms(),
                                          retention.get)
        if dropped:
            log.info("tier retention dropped %d objects", len(dropped))

    def _hand_over(self) -> None:
        """Give the tierer's manifest to ``on_commit`` if it is one not handed over yet."""
        manifest = self.tierer.manifest
        if manifest is not None and manifest is not self._handed:
            self._handed = manifest
            self._on_commit(manifest)

    def _failed(self, error: Exception) -> None:
        self.counters.errors += 1
        text = str(error) if isinstance(error, ObjectStoreError) else repr(error)
        if text != self.failure:  # once per distinct error, not every retry
            log.error("tiering to %s failed (%s); clients are served from the local log, which "
                      "keeps every segment not yet tiered; retrying with a backoff up to %d ms",
                      self.description, text, self.settings.retry_max_ms)
        self.failure = text
        if self.failing_since_ms is None:
            self.failing_since_ms = clock.now_ms()

    def _recovered(self) -> None:
        self.last_pass_ms = clock.now_ms()
        if self.failure is not None:
            log.info("tiering to %s works again", self.description)
        self.failure = None
        self.failing_since_ms = None

    def status(self) -> dict[str, Any]:
        """The tierer's status plus this loop's: JSON-able. Runs on the event loop."""
        found: dict[str, Any] = dataclasses.asdict(self.tierer.status())
        committed = found.get("last_success_ms")
        found.update(enabled=True, description=self.description,
                     last_success_ms=max(committed or 0, self.last_pass_ms or 0) or None)
        found.update(last_error=self.failure or found.get("last_error"), failing=self.failure is not None,
                     failing_since_ms=self.failing_since_ms, stopped=self.stopped,
                     lag_ms=self.lag_ms(found), max_lag_ms=self.settings.max_lag_ms)
        return found

    @staticmethod
    def lag_ms(status: dict[str, Any]) -> int:
        """How long the oldest sealed segment not yet tiered has waited (0: none waits)."""
        return int(status.get("oldest_pending_age_ms") or 0)

    def problems(self) -> list[str]:
        """Why ``/health`` should say degraded: tiering stopped, failing for longer than a
        check interval's backoff, or lagging more than ``max_lag_ms``. Empty when healthy."""
        found = []
        if self.stopped is not None:
            found.append(self.stopped)
        if self.failure is not None:
            found.append(f"tiering to {self.description} fails: {self.failure}")
        lag = self.lag_ms(self.status())
        if lag > self.settings.max_lag_ms:
            found.append(f"the oldest sealed segment not yet tiered waits for {lag // 1000} s, "
                         f"more than tier.max_lag_ms ({self.settings.max_lag_ms} ms)")
        return found
