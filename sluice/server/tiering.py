"""Tiered storage in the composition root: opens the object store named by ``[tier]``, and
builds the store's ``Tierer``, its ``TierReader`` and core's ``TieringLoop`` over them.

A malformed setting stops the start (``StartupError``); an object store that does not answer
does not (building touches no network): the loop's first pass reads the manifest, fails, and
retries, while ``GET /tier`` and ``/health`` say why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from core.tiering import TieringLoop, TieringSettings
from store.file_store import FileStore
from store.tier.convert import Worker
from store.tier.manifest import load_latest
from store.tier.objects import ObjectStore, ObjectStoreError, TierLocation, save_location
from store.tier.reader import TierReader
from store.tier.tierer import Tierer

from .config import TierConfig

log = logging.getLogger("sluice")


def location(tier: TierConfig) -> TierLocation:
    """The ``TierLocation`` of ``[tier]`` (its URL already checked by the config)."""
    return TierLocation(tier.url, tier.s3_endpoint, tier.s3_region)


def open_objects(tier: TierConfig) -> ObjectStore:
    """The object store of ``[tier]``; ``ValueError`` naming the setting when it cannot be
    opened at all (opening touches no network)."""
    try:
        return location(tier).open(tier.s3_access_key, tier.s3_secret_key)
    except (ValueError, ObjectStoreError) as error:
        raise ValueError(f"cannot open the tier at {tier.url} ({error}); check tier.url, "
                         "tier.s3_endpoint and the S3 keys ([tier] in the config file or "
                         "SLUICE_TIER_*)") from None


def build(tier: TierConfig, data_dir: str, store: FileStore,
          body_schema: Callable[[str], str | None], topics: Callable[[], list[Any]],
          epoch: Callable[[], int]) -> TieringLoop:
    """Wire tiering into ``store``: tier reads fall through to a ``TierReader``, local
    retention keeps what is not tiered yet, and the returned loop (to hand to core's engine)
    tiers. Blocks (writes ``<data>/tier.json``)."""
    objects = open_objects(tier)
    save_location(data_dir, location(tier))
    reader = TierReader(objects, tier.cache_bytes)
    settings = TieringSettings(tier.check_interval_ms, tier.max_lag_ms, tier.retry_max_ms)
    # segments are converted in a worker process: in this one, the conversion's CPU work would
    # hold the interpreter lock the event loop serves clients with
    worker = Worker(location(tier), tier.s3_access_key, tier.s3_secret_key)
    tierer = Tierer(store, objects, body_schema=body_schema, epoch=epoch, worker=worker,
                    body_schemas=lambda: {t.name: t.body_schema for t in topics() if t.body_schema})
    loop = TieringLoop(tierer, topics, settings, description=objects.description,
                       on_commit=reader.set_manifest)
    store.tier = reader
    store.tier_floor = lambda: loop.tiered_end
    return loop


class FollowerTier:
    """A follower's view of the leader's tier: the newest manifest, read again on every
    ``refresh``, gates the follower's local retention (nothing above the leader's tiered end is
    deleted) and serves its tier reads. Until a manifest is read, nothing is deleted."""

    def __init__(self, tier: TierConfig) -> None:
        self.objects = open_objects(tier)
        self.reader = TierReader(self.objects, tier.cache_bytes)
        self.tiered_end = 0
        self.failure: str | None = None

    def attach(self, store: FileStore) -> None:
        """Make ``store`` read through the tier and keep what the tier does not hold yet."""
        store.tier = self.reader
        store.tier_floor = lambda: self.tiered_end

    def refresh(self) -> None:
        """Read the newest manifest; an unreachable store keeps the last one (logged once).
        Blocks on the object store."""
        try:
            manifest = load_latest(self.objects)
        except ObjectStoreError as error:
            if str(error) != self.failure:
                log.warning("cannot read the tier's manifest at %s (%s); local retention keeps "
                            "what the last manifest read did not tier", self.objects.description,
                            error)
            self.failure = str(error)
            return
        self.failure = None
        if manifest is not None:
            self.reader.set_manifest(manifest)
            self.tiered_end = manifest.tiered_end
