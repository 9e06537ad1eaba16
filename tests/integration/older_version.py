"""Messages written straight into a stopped broker's data directory, as an older version of
Sluice could have stored them: before adapters owned their property namespaces, a native
producer could store any ``amqp.*`` or ``mqtt.*`` property. Today's broker refuses such sends,
so this is the only way to put those messages in front of consumers again."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.metadata import MetadataRepository
from core.vhosts import VirtualHosts
from store import FileStore, StoreConfig
from store.api import Message
from tests.conftest import CONFIG

SEGMENT_SIZE = 4 << 20
"""The segment size of ``tests.conftest.CONFIG``, which the brokers of these tests run with."""
assert f"segment_size = {SEGMENT_SIZE:_}" in CONFIG


def amqp_queue_store_name(data_dir: Path, vhost: str, queue: str) -> str:
    """The store queue holding the entries of the durable AMQP queue ``queue`` of ``vhost``."""
    metadata = MetadataRepository.for_data_dir(str(data_dir))
    try:
        vhosts = VirtualHosts(metadata)
        vhosts.load(metadata.topology())
        return vhosts.get(vhost).named(queue)
    finally:
        metadata.close()


def append(data_dir: Path, messages: Sequence[Message]) -> None:
    """Append ``messages`` (durably) to the store of a stopped broker."""
    store = FileStore(str(data_dir), StoreConfig(segment_size=SEGMENT_SIZE, flush="sync"))
    try:
        results = store.append_batch(messages)
        assert store.wait_durable(results[-1].end_offset, timeout=30)
    finally:
        store.close()
