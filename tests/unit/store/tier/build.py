"""Tier files built straight from a FileStore's segments with pyarrow, exactly as the tier
contract's column tables say: a second, independent writer for the reader's tests."""
from __future__ import annotations

import datetime
import io
import struct
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from store import record
from store.tier.manifest import Manifest, QueueSpan, TieredFile, TieredSegment, commit, load_latest
from store.tier.reader import DATA_TYPES, INDEX_TYPES

DATA_COLUMNS = ("queue", "offset", "batch_index", "msg_id", "keys", "tag", "subject", "properties",
                "body", "born_ts", "store_ts", "log_offset", "log_size", "dispatch")
DATA_SCHEMA = pa.schema([(name, DATA_TYPES[name]) for name in DATA_COLUMNS])
INDEX_SCHEMA = pa.schema(list(INDEX_TYPES.items()))


def unpack(body: bytes) -> list[bytes] | None:
    """The bodies of a packed batch, None if ``body`` is not one."""
    if len(body) < 7 or body[:3] != b"SB\x01":
        return None
    count = struct.unpack_from("<I", body, 3)[0]
    start = 7 + 4 * count
    if start > len(body):
        return None
    lengths = struct.unpack_from(f"<{count}I", body, 7)
    if start + sum(lengths) != len(body):
        return None
    out, pos = [], start
    for length in lengths:
        out.append(body[pos:pos + length])
        pos += length
    return out


def segment_records(store, segment) -> list[record.StoredMessage]:
    data, _ = store.log.read(segment.base, segment.size)
    return [record.decode(data, pos, segment.base + pos) for kind, pos, size
            in record.scan(data, segment.base, last=False) if kind == "record"]


def data_rows(messages) -> pa.Table:
    columns = {name: [] for name in DATA_COLUMNS}
    for message in messages:
        properties = message.properties
        bodies = unpack(message.body) if "sluice.batch" in properties else None
        for index, body in enumerate(bodies if bodies else [message.body]):
            for name, value in (("queue", message.queue_id), ("offset", message.queue_offset),
                                ("batch_index", index if bodies else None), ("msg_id", message.msg_id),
                                ("keys", list(message.keys)), ("tag", message.tag or None),
                                ("subject", properties.get("sluice.subject")),
                                ("properties", list(properties.items())), ("body", body),
                                ("born_ts", message.born_ts * 1000), ("store_ts", message.store_ts * 1000),
                                ("log_offset", message.phys_offset), ("log_size", message.size),
                                ("dispatch", [{"topic": t, "queue": q, "offset": o} for t, q, o in message.dispatch])):
                columns[name].append(value)
    return pa.table(columns, schema=DATA_SCHEMA)


def parquet(table: pa.Table, row_group_size: int = 131072) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size, write_page_checksum=True)
    return sink.getvalue()


def day(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d")


def tier_segments(store, objects, count: int, row_group_size: int = 131072) -> Manifest:
    """Tier the oldest ``count`` segments of ``store`` not yet tiered into ``objects``."""
    previous = load_latest(objects)
    segments, files = list(previous.segments if previous else ()), list(previous.files if previous else ())
    done = previous.tiered_end if previous else 0
    for segment in [s for s in store.log.segments()[:-1] if s.end > done][:count]:
        messages = segment_records(store, segment)
        groups: dict[tuple[str, str], list] = {}
        for message in messages:
            groups.setdefault((message.topic, day(message.store_ts)), []).append(message)
        keys = []
        for (topic, when), found in sorted(groups.items()):
            key = f"data/topic={quote(topic, safe='')}/day={when}/{segment.base:020d}.parquet"
            data = parquet(data_rows(found), row_group_size)
            objects.put(key, data)
            spans: dict[tuple[str, int], list[int]] = {}
            for message in found:
                for target in ((message.topic, message.queue_id, message.queue_offset), *message.dispatch):
                    spans.setdefault(target[:2], []).append(target[2])
            files.append(TieredFile(key, topic, segment.base, when, len(found), len(data),
                                    found[0].phys_offset, found[-1].phys_offset,
                                    min(m.store_ts for m in found), max(m.store_ts for m in found),
                                    tuple(QueueSpan(t, q, min(o), max(o)) for (t, q), o in sorted(spans.items())),
                                    None))
            keys.append(key)
        index = sorted([("id", m.msg_id, m.topic, m.phys_offset, m.store_ts * 1000) for m in messages]
                       + [("key", k, m.topic, m.phys_offset, m.store_ts * 1000) for m in messages for k in m.keys])
        index_key = f"index/{segment.base:020d}.parquet"
        objects.put(index_key, parquet(pa.table(dict(zip(INDEX_SCHEMA.names, zip(*index))) if index else
                                                {n: [] for n in INDEX_SCHEMA.names}, schema=INDEX_SCHEMA),
                                       row_group_size))
        segments.append(TieredSegment(segment.base, segment.end, tuple(keys), index_key, 0))
        done = segment.end
    manifest = Manifest((previous.version if previous else 0) + 1, 0, done, tuple(segments), tuple(files))
    commit(objects, manifest)
    return manifest
