"""Manifests: JSON round trip, hostile documents refused with a clear ValueError (never another
kind of crash), the newest readable version wins, and a commit never overwrites a version nor
goes past a newer leader's epoch."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from store.tier import layout
from store.tier.manifest import (Manifest, ManifestConflict, QueueSpan, TieredFile, TieredSegment, commit,
                                 load_latest)
from store.tier.objects import LocalDirectory

FILE = TieredFile(layout.data_key("a/b", "2026-01-02", 0), "a/b", 0, "2026-01-02", 10, 999, 0, 500,
                  1767312000000, 1767312000999, (QueueSpan("a/b", 0, 0, 9), QueueSpan("fan", 1, 4, 13)),
                  '{"type": "object", "properties": {"x": {"type": "integer"}}}')
SEGMENT = TieredSegment(0, 4096, (FILE.key,), layout.index_key(0), 1767312001000)


def manifest(version: int = 1, epoch: int = 0) -> Manifest:
    return Manifest(version, epoch, 4096, (SEGMENT,), (FILE,))


def test_json_round_trip() -> None:
    assert Manifest.from_json(manifest(3, 7).to_json()) == manifest(3, 7)
    plain = Manifest(1, 0, 0, (), (TieredFile("k", "t", 0, "2026-01-01", 0, 0, 0, 0, 0, 0, (), None),))
    assert Manifest.from_json(plain.to_json()) == plain


@pytest.mark.parametrize("change, problem", [
    (lambda d: d.pop("files"), "has no 'files'"),
    (lambda d: d.update(version=0), "version 0 is not positive"),
    (lambda d: d.update(format=2), "format 2 is not 1"),
    (lambda d: d.update(epoch=True), "'epoch' is not a non-negative"),
    (lambda d: d["files"][0].update(queues={}), "'queues' is not an array"),
    (lambda d: d["files"][0]["queues"][0].update(first=-1), "queue 0: 'first' is not a non-negative"),
    (lambda d: d["segments"][0].update(files=[3]), "is not a string"),
    (lambda d: d.update(tiered_end=1 << 64), "64-bit"),
])
def test_hostile_fields_are_named(change, problem: str) -> None:
    document = json.loads(manifest().to_json())
    change(document)
    with pytest.raises(ValueError, match=problem):
        Manifest.from_json(json.dumps(document).encode())


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode()),
                 st.builds(lambda key, value: _mutated(key, value), st.integers(0, 200), json_values)))
def test_any_input_parses_or_raises_value_error(data: bytes) -> None:
    try:
        parsed = Manifest.from_json(data)
    except ValueError:
        return
    assert Manifest.from_json(parsed.to_json()) == parsed


def _mutated(position: int, value: object) -> bytes:
    """A real manifest with one field (the ``position``-th found walking it) replaced by ``value``."""
    document = json.loads(manifest().to_json())
    slots = []

    def walk(node: object) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            slots.append((node, key))
            walk(child)
    walk(document)
    node, key = slots[position % len(slots)]
    node[key] = value
    return json.dumps(document).encode()


def test_deeply_nested_json_is_refused() -> None:
    with pytest.raises(ValueError, match="manifest"):
        Manifest.from_json(b"[" * 100_000 + b"]" * 100_000)


def test_commit_never_overwrites_and_the_newest_readable_wins(tmp_path: Path) -> None:
    objects = LocalDirectory(str(tmp_path))
    assert load_latest(objects) is None
    commit(objects, manifest(1))
    with pytest.raises(ManifestConflict, match="exists already"):
        commit(objects, manifest(1))
    commit(objects, manifest(2))
    objects.put(layout.manifest_key(3), b"{damaged")
    assert load_latest(objects) == manifest(2)  # a damaged newest version is skipped
    objects.put(layout.manifest_key(4), manifest(9).to_json())  # claims another version: skipped
    assert load_latest(objects) == manifest(2)


def test_commit_refuses_to_go_past_a_newer_epoch(tmp_path: Path) -> None:
    objects = LocalDirectory(str(tmp_path))
    commit(objects, manifest(1, epoch=5))
    with pytest.raises(ManifestConflict, match="epoch 5, newer than this writer's 4"):
        commit(objects, manifest(2, epoch=4))
    commit(objects, manifest(2, epoch=6))
    assert load_latest(objects).epoch == 6


def test_a_commit_following_a_superseded_manifest_reads_the_newest_and_refuses(tmp_path: Path) -> None:
    objects = LocalDirectory(str(tmp_path))
    commit(objects, manifest(1, epoch=4))
    commit(objects, manifest(2, epoch=4), previous=manifest(1, epoch=4))  # still the newest: no read back
    commit(objects, manifest(3, epoch=5), previous=manifest(2, epoch=4))  # a newer leader
    with pytest.raises(ManifestConflict, match="epoch 5, newer than this writer's 4"):
        commit(objects, manifest(4, epoch=4), previous=manifest(2, epoch=4))
    assert load_latest(objects) == manifest(3, epoch=5)
