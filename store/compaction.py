"""Compacted topics: the newest record per key, kept beside the commit log, never in it.

The shared commit log is never rewritten. Each queue of a compacted topic gets a snapshot file
``compacted/<escaped topic>/<queue id>.snapshot`` holding, verbatim, the newest record of each
live key up to a queue offset (RocketMQ 5's compaction topics work the same way):

    offset size  field
    ------ ----  -------------------------------------------------------------
       0     4   magic         b"SLCS"
       4     4   version       1
       8     8   next_offset   queue offset the snapshot covers up to (exclusive)
      16     4   count         number of records that follow
      20     .   records       as in record.py, each with its original offsets and CRC

The key of a record is its first business key; an empty body is a tombstone that deletes the
key. A view of the topic is the snapshot overlaid with the queue's records after it.
"""
from __future__ import annotations

import os
import struct
import threading
from typing import TYPE_CHECKING
from urllib.parse import unquote

from . import fileops
from .consume_queue import topic_dir_name
from .durable_files import replace_file
from .record import StoredMessage, decode_any

if TYPE_CHECKING:
    from .view import StoreView

_HEADER = struct.Struct("<4sIQI")
_MAGIC = b"SLCS"
_BATCH = 1024

Latest = dict[str, StoredMessage]


class CompactedTopics:
    """Snapshots of every compacted topic, with an in-memory cache of the newest one."""

    def __init__(self, directory: str, view: StoreView) -> None:
        self.directory = directory
        self.reader = view
        fileops.makedirs(directory, site="compaction")
        self.topics = {unquote(name) for name in os.listdir(directory)}
        self._cache: dict[tuple[str, int], tuple[int, Latest]] = {}
        self._lock = threading.Lock()

    def enable(self, topic: str) -> None:
        """Register ``topic`` as compacted (persistent)."""
        fileops.makedirs(os.path.join(self.directory, topic_dir_name(topic)), site="compaction")
        self.topics.add(topic)

    def compact(self, topic: str) -> int:
        """Write fresh snapshots for every queue of ``topic``; return the live keys kept."""
        live = 0
        for queue_id in self._queue_ids(topic):
            next_offset, latest = self._current(topic, queue_id)
            self._save(topic, queue_id, next_offset, latest)
            live += len(latest)
        return live

    def view(self, topic: str) -> list[StoredMessage]:
        """Newest live record per key across the topic's queues, in log order."""
        merged: Latest = {}
        for queue_id in self._queue_ids(topic):
            for key, message in self._current(topic, queue_id)[1].items():
                if key not in merged or merged[key].phys_offset < message.phys_offset:
                    merged[key] = message
        return sorted(merged.values(), key=lambda message: message.phys_offset)

    def _queue_ids(self, topic: str) -> list[int]:
        return [queue_id for name, queue_id in self.reader.queues() if name == topic]

    def _current(self, topic: str, queue_id: int) -> tuple[int, Latest]:
        """Snapshot plus the queue's newer records: (next queue offset, newest per key)."""
        with self._lock:
            next_offset, latest = self._cache.get((topic, queue_id)) or self._load(topic, queue_id)
            latest = dict(latest)
            offset = max(next_offset, self.reader.queue_range(topic, queue_id)[0])
            while batch := self.reader.read(topic, queue_id, offset, _BATCH):
                for message in batch:
                    key = message.keys[0] if message._keys else ""
                    if message.body:
                        latest.pop(key, None)  # keep insertion order = log order
                        latest[key] = message
                    else:
                        latest.pop(key, None)
                offset += len(batch)  # reads are contiguous; records of a queue a message
                # was fanned out to carry their home queue's offsets, not this queue's
            self._cache[(topic, queue_id)] = (offset, latest)
            return offset, latest

    def _path(self, topic: str, queue_id: int) -> str:
        return os.path.join(self.directory, topic_dir_name(topic), f"{queue_id}.snapshot")

    def _load(self, topic: str, queue_id: int) -> tuple[int, Latest]:
        try:
            with open(self._path(topic, queue_id), "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return 0, {}
        magic, version, next_offset, count = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != 1:
            raise ValueError(f"{self._path(topic, queue_id)} is not a snapshot file")
        latest: Latest = {}
        pos = _HEADER.size
        for _ in range(count):
            message = decode_any(data, pos, self._path(topic, queue_id))
            latest[message.keys[0]] = message
            pos += message.size
        return next_offset, latest

    def _save(self, topic: str, queue_id: int, next_offset: int, latest: Latest) -> None:
        path = self._path(topic, queue_id)
        fileops.makedirs(os.path.dirname(path), site="compaction")
        data = _HEADER.pack(_MAGIC, 1, next_offset, len(latest)) + b"".join(
            message.encode() for message in latest.values())
        replace_file(path, data, site="compaction")
