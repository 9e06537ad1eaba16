"""A node whose log lacks segments the leader's retention deleted starts from a snapshot.

When the consistent point of a follower's history and the leader's lies below the leader's log
start, there is nothing to ship from: the leader sends a snapshot instead, as SNAPSHOT frames
of at most ``CHUNK`` bytes and a SNAPSHOT_END frame naming its size and SHA-256, then closes the
connection. The follower keeps it in a file, replaces its store by one beginning at the
leader's log start (``store.snapshot``) and its metadata database by the leader's rows, and
connects again: replication goes on from the log start.

A snapshot is ``u32 manifest length | manifest (JSON) | compacted copies | epochs | metadata``,
the manifest giving the log start, each queue's first queue offset and every part's size.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import struct
from dataclasses import dataclass

from store.snapshot import StoreSnapshot

from . import wire
from .wire import Kind, ProtocolError

CHUNK = wire.SNAPSHOT_CHUNK
MAX_SNAPSHOT_BYTES = 64 << 30
"""A follower refuses a snapshot larger than this (it lands on its disk, not in memory)."""
_LENGTH = struct.Struct(">I")


@dataclass
class Snapshot:
    """A store snapshot and the metadata database's rows (``MetadataRepository.dump``)."""

    store: StoreSnapshot
    metadata: bytes


def encode(snapshot: Snapshot) -> bytes:
    store = snapshot.store
    names = sorted(store.compacted)
    manifest = json.dumps({
        "log_start": store.log_start, "queues": store.queues,
        "compacted": [[name, len(store.compacted[name])] for name in names],
        "epochs": len(store.epochs), "metadata": len(snapshot.metadata)}).encode()
    return b"".join([_LENGTH.pack(len(manifest)), manifest, *(store.compacted[name] for name in names),
                     store.epochs, snapshot.metadata])


def decode(data: bytes) -> Snapshot:
    """Raises ProtocolError when ``data`` is not a whole snapshot."""
    try:
        (length,) = _LENGTH.unpack_from(data)
        manifest = json.loads(data[_LENGTH.size:_LENGTH.size + length])
        pos = _LENGTH.size + length

        def take(size: int) -> bytes:
            nonlocal pos
            if not isinstance(size, int) or size < 0 or pos + size > len(data):
                raise ValueError("a part runs past the snapshot's end")
            pos += size
            return data[pos - size:pos]
        compacted = {str(name): take(size) for name, size in manifest["compacted"]}
        epochs, metadata = take(manifest["epochs"]), take(manifest["metadata"])
        queues = [(str(topic), int(queue_id), int(first)) for topic, queue_id, first in manifest["queues"]]
        log_start = int(manifest["log_start"])
    except (struct.error, ValueError, TypeError, KeyError, UnicodeDecodeError) as error:
        raise ProtocolError(f"malformed snapshot ({error})") from None
    if pos != len(data) or log_start <= 0 or any(queue_id < 0 or first < 0 for _, queue_id, first in queues):
        raise ProtocolError("malformed snapshot (trailing bytes, no log start, or a negative queue offset)")
    return Snapshot(StoreSnapshot(log_start, queues, compacted, epochs), metadata)


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Send ``data`` as SNAPSHOT frames and a SNAPSHOT_END."""
    for start in range(0, len(data), CHUNK):
        writer.write(wire.frame(Kind.SNAPSHOT, data[start:start + CHUNK]))
        await writer.drain()
    writer.write(wire.frame(Kind.SNAPSHOT_END, json.dumps(
        {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}).encode()))
    await writer.drain()


async def receive(reader: asyncio.StreamReader, first: bytes, path: str, timeout_s: float) -> None:
    """Write the snapshot whose first SNAPSHOT payload was ``first`` to ``path``, checked
    against its SNAPSHOT_END; ProtocolError if it does not match or is too large. Each frame
    must come within ``timeout_s``."""
    digest, size = hashlib.sha256(), 0
    with open(path, "wb") as file:
        payload = first
        while True:
            size += len(payload)
            if size > MAX_SNAPSHOT_BYTES:
                raise ProtocolError(f"a snapshot of more than {MAX_SNAPSHOT_BYTES} bytes")
            digest.update(payload)
            file.write(payload)
            async with asyncio.timeout(timeout_s):
                kind, payload = await wire.read_frame(reader, 0)
            if kind is Kind.SNAPSHOT_END:
                break
            if kind is not Kind.SNAPSHOT:
                raise ProtocolError(f"expected SNAPSHOT or SNAPSHOT_END, got {kind.name}")
        file.flush()
        os.fsync(file.fileno())
    try:
        end = json.loads(payload)
        matches = end["size"] == size and end["sha256"] == digest.hexdigest()
    except (ValueError, TypeError, KeyError):
        raise ProtocolError("malformed SNAPSHOT_END") from None
    if not matches:
        raise ProtocolError("the snapshot received does not match its size and checksum")
