"""Fixtures of the tier tests: a file store whose segments seal after a few records, and an
object store (a real local directory) that fails the operations a test names."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from store import FileStore, Message, StoreConfig
from store.tier.objects import LocalDirectory, ObjectStoreError

SEGMENT = 4096
WAIT_S = 30


class FaultyDirectory(LocalDirectory):
    """A local directory whose operations fail while a fault names them: ``fail("put", "index/")``
    fails every put of a key under index/ until ``heal()``."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.faults: list[tuple[str, str]] = []

    def fail(self, operation: str, prefix: str = "") -> None:
        self.faults.append((operation, prefix))

    def heal(self) -> None:
        self.faults.clear()

    def _check(self, operation: str, key: str) -> None:
        if any(operation == name and key.startswith(prefix) for name, prefix in self.faults):
            raise ObjectStoreError(f"injected failure of {operation} {key}")

    def put(self, key: str, data: bytes) -> None:
        self._check("put", key)
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._check("put_if_absent", key)
        return super().put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self._check("delete", key)
        super().delete(key)


@pytest.fixture
def objects(tmp_path: Path) -> FaultyDirectory:
    return FaultyDirectory(str(tmp_path / "tier"))


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[Callable[..., FileStore]]:
    """``file_store(**config)``: a FileStore with 4 KiB segments; closed at the end."""
    opened: list[FileStore] = []

    def open_store(**config: object) -> FileStore:
        store = FileStore(str(tmp_path / f"data{len(opened)}"),
                          StoreConfig(**{"segment_size": SEGMENT, "checkpoint_interval_ms": 50, **config}))
        opened.append(store)
        return store
    yield open_store
    for store in opened:
        store.close()


def fill(store: FileStore, topic: str, count: int, size: int = 100, **fields: object) -> None:
    """Append ``count`` records of ``size``-byte bodies and wait until they are durable."""
    store.append_batch([Message(topic, f"{topic}-{n}-".encode().ljust(size, b"."), **fields) for n in range(count)])
    assert store.wait_durable(store.appended_end, WAIT_S)
