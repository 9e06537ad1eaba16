"""The one dispatcher: turns commit-log records into consume-queue entries and key-index entries.

It runs on the flusher thread right after appended bytes reach the log, and during recovery
over records replayed from the log. Both paths feed the same ``DispatchRequest`` tuples, and
both are idempotent: a queue skips entries it already has, the key index skips offsets it
already indexed (RocketMQ's ``ConsumeQueue.putMessagePositionInfo`` does the same).
"""
from __future__ import annotations

from collections.abc import Iterable

from . import record
from .consume_queue import ConsumeQueue, ConsumeQueues
from .key_index import KeyIndex

DispatchRequest = tuple[int, int, int, int, tuple[record.Target, ...], tuple[bytes, ...]]
"""(phys_offset, size, tag_hash, store_ts, queue targets, key-index keys)"""


def id_key(topic: str, msg_id: str) -> bytes:
    """Key-index key of a message id, scoped to its topic: producers choose ids, so another
    topic may hold the same one."""
    return b"\x01" + topic.encode() + b"\x00" + msg_id.encode()


def business_key(topic: str, key: str) -> bytes:
    """Key-index key of a business key, scoped to its topic."""
    return b"\x02" + topic.encode() + b"\x00" + key.encode()


def tag_hash(tag: bytes) -> int:
    """Consume-queue tag hash: CRC32C of the tag, 0 for no tag."""
    return record.crc(tag) if tag else 0


def request_for(message: record.StoredMessage) -> DispatchRequest:
    """The dispatch request of a record read back from the log (recovery); as at append time,
    an id the store generated from the offset is not indexed."""
    targets = ((message.topic, message.queue_id, message.queue_offset), *message.dispatch)
    keys = tuple(business_key(message.topic, key) for key in message.keys)
    if message.msg_id != f"{message.phys_offset:016X}":
        keys = (id_key(message.topic, message.msg_id), *keys)
    return (message.phys_offset, message.size, tag_hash(message.tag.encode()), message.store_ts,
            targets, keys)


class Dispatcher:
    """Builds consume queues and the key index. Runs on the flusher thread (or at recovery)."""

    def __init__(self, queues: ConsumeQueues, key_index: KeyIndex) -> None:
        self.queues = queues
        self.key_index = key_index
        self.dispatched_end = 0

    def dispatch(self, requests: Iterable[DispatchRequest]) -> None:
        """Index every request, then write the queues that gathered enough entries."""
        queues, index = self.queues, self.key_index.add_many
        touched: dict[tuple[str, int], ConsumeQueue] = {}
        end = self.dispatched_end
        for phys, size, tag, store_ts, targets, keys in requests:
            for topic, queue_id, queue_offset in targets:
                queue = touched.get((topic, queue_id)) or queues.touch(topic, queue_id, touched)
                queue.put(queue_offset, phys, size, tag)
            if keys:
                index(keys, phys, store_ts)
            end = phys + size
        queues.write_pending(batch=touched.values())
        self.dispatched_end = max(self.dispatched_end, end)
