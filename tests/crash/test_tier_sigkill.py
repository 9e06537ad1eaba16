"""SIGKILL the broker in the middle of a tiering step: right after the first data object of a
segment is uploaded (``SLUICE_TIER_PAUSE_AT=upload``) and right before the manifest naming it
is committed (``manifest``). The broker creates ``SLUICE_TIER_PAUSE_FILE`` and blocks there;
the test waits for that file, kills the broker and restarts it without the fault point.

After the restart tiering completes and local retention deletes the tiered segments; every
acknowledged send then reads back through the tier exactly once. Objects the killed step left
behind, and one more planted under a key no manifest names, are never read (reading sees each
body once, and the planted object's garbage would break a read) and are swept: in the end
every object in the tier is one the newest manifest names.
"""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from store.tier.layout import data_key, index_key
from store.tier.manifest import load_latest
from store.tier.objects import LocalDirectory
from tests.integration.tier_world import (SEGMENT, TierTarget, create_topic, publish_native,
                                          read_native, tier_config, tier_status,
                                          wait_history_tiered)
from tests.waiting import wait_for

pytestmark = pytest.mark.crash
SENDS = 3000
"""About 3 MiB: three sealed segments of 1 MiB to tier."""
PLANTED_BASE = 1
"""A segment base no segment has (segments start at record boundaries above 0)."""


def tier_objects(tier: Path) -> set[str]:
    """Every object key under the tier directory (temporary files of a write left out)."""
    return {str(p.relative_to(tier)) for p in tier.rglob("*") if p.is_file()
            and not p.name.startswith(".")}


def plant_orphan(tier: Path) -> set[str]:
    """Garbage under the keys a data file and an index file of segment ``PLANTED_BASE`` would
    have: what a crashed step of some other layout could leave."""
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    keys = {data_key("tiered", day, PLANTED_BASE), index_key(PLANTED_BASE)}
    for key in keys:
        (tier / key).parent.mkdir(parents=True, exist_ok=True)
        (tier / key).write_bytes(b"not parquet: never to be read")
    return keys


@pytest.mark.parametrize("pause_at", ["upload", "manifest"])
def test_a_kill_mid_tiering_loses_nothing_duplicates_nothing_and_orphans_are_swept(
        sluice_server, tmp_path: Path, pause_at: str):
    data, tier, pause = tmp_path / "data", tmp_path / "tier", tmp_path / "paused"
    config = tier_config(TierTarget(f"file://{tier}"))
    server = sluice_server(data, config=config, env={"SLUICE_TIER_PAUSE_AT": pause_at,
                                                     "SLUICE_TIER_PAUSE_FILE": str(pause)})
    server.wait_ready()
    create_topic(server)
    sent, _ = publish_native(server, SENDS)
    wait_for(pause.exists, f"the tierer pausing at {pause_at}", 120, seen=lambda: tier_status(server))
    left = tier_objects(tier)
    assert any(key.startswith("data/") for key in left), left
    assert not any(key.startswith("manifest/") for key in left), "killed before any commit"
    if pause_at == "manifest":
        assert any(key.startswith("index/") for key in left), left
    server.kill()
    planted = plant_orphan(tier)

    restarted = sluice_server(data, config=config)
    restarted.wait_ready()
    tiered_end = wait_history_tiered(restarted, data, at_least=2 * SEGMENT)
    assert tiered_end > PLANTED_BASE

    read = read_native(restarted, SENDS)
    counts = Counter(r.body for r in read)
    assert set(counts) == set(sent), f"{len(set(sent) - set(counts))} acknowledged sends lost"
    assert max(counts.values()) == 1, "a record was read twice"

    objects = LocalDirectory(str(tier))

    def named_only() -> bool:
        manifest = load_latest(objects)
        named = {f.key for f in manifest.files} | {s.index_key for s in manifest.segments}
        present = tier_objects(tier)
        return not {k for k in present if not k.startswith("manifest/")} - named
    wait_for(named_only, "the orphaned objects swept", 120, seen=lambda: tier_objects(tier))
    assert not planted & tier_objects(tier)
    assert tier_status(restarted).get("last_error") in (None, "")
    assert restarted.stop() == 0
