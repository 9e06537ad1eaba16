"""Fixtures shared by the store tests: small geometry so segments, queue files and index files roll."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from store.api import StoreConfig
from store.file_store import FileStore
from store.memory_store import MemoryStore

SMALL = StoreConfig(segment_size=8192, queue_entries_per_file=16, index_slot_count=97,
                    index_max_entries=64, checkpoint_interval_ms=50)


@pytest.fixture(params=["file", "memory"])
def open_store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Callable[..., object]]:
    """Opens a store of each implementation; closes whatever was opened."""
    opened = []

    def factory(**overrides):
        config = StoreConfig(**{**SMALL.__dict__, **overrides})
        store = FileStore(str(tmp_path / "data"), config) if request.param == "file" else MemoryStore(config)
        opened.append(store)
        return store

    factory.kind = request.param
    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store):
    return open_store()


@pytest.fixture
def config() -> StoreConfig:
    """The small test geometry."""
    return SMALL

