"""Commit-log record format: one encoder, one validating decoder.

Every record is self-describing and checksummed. Integers are little-endian.

    offset size  field
    ------ ----  -----------------------------------------------------------
       0     4   total_size      u32, whole record including this field
       4     2   magic           0x4C53 (b"SL")
       6     1   version         1
       7     1   flags           reserved: 0, anything else is rejected
       8     4   crc32c          CRC32C (Castagnoli) of bytes [12, total_size)
      12     8   phys_offset     u64, commit-log offset of this record
      20     4   queue_id        u32, home queue of the record's topic
      24     8   queue_offset    u64, position in the home queue
      32     8   born_ts         i64, ms since epoch, set by the producer
      40     8   store_ts        i64, ms since epoch, set by the store
      48     2   topic_len       u16
      50     2   msg_id_len      u16
      52     2   tag_len         u16
      54     2   keys_len        u16, bytes of the keys section
      56     4   props_len       u32, bytes of the properties section
      60     4   dispatch_len    u32, bytes of the dispatch section
      64     4   body_len        u32
      68     .   topic           UTF-8
       .     .   msg_id          UTF-8
       .     .   tag             UTF-8 (empty: no tag)
       .     .   keys            repeated { u16 len, UTF-8 key }
       .     .   properties      repeated { u16 len, UTF-8 name, u32 len, UTF-8 value }
       .     .   dispatch        repeated { u16 len, UTF-8 topic, u32 queue_id, u64 queue_offset }
       .     .   body            raw bytes, never altered

The dispatch section is the routing decision for fan-out without copying: every extra queue
the record belongs to, with the queue offset it was given at append time. Replaying the log
therefore rebuilds exactly the same consume queues, whatever the routing rules are later.
The CRC covers everything after itself, so a record carrying the wrong offset, a torn write
or a flipped bit is rejected.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Mapping, Sequence

import crc32c

from .errors import CorruptRecordError, InvalidRecordError

MAGIC = 0x4C53
VERSION = 1
HEADER = struct.Struct("<IHBBIQIQqqHHHHIII")
HEADER_SIZE = HEADER.size  # 68
_PREFIX = struct.Struct("<IHBBI")  # total_size .. crc32c
_CRC_FIELD = struct.Struct("<I")
MAGIC_BYTES = struct.pack("<HB", MAGIC, VERSION)  # bytes 4..6, used to resynchronise a scan

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_TARGET = struct.Struct("<IQ")
_MAX_U16 = 0xFFFF

Target = tuple[str, int, int]
"""A queue a record is dispatched to: (topic, queue_id, queue_offset)."""


def crc(data: bytes | memoryview) -> int:
    """CRC32C of ``data``."""
    return crc32c.crc32c(data)


def encode_keys(keys: Sequence[str]) -> bytes:
    """Encode the keys section."""
    out = bytearray()
    for key in keys:
        raw = key.encode()
        _check_u16(len(raw), "key")
        out += _U16.pack(len(raw))
        out += raw
    return bytes(out)


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode the properties section; insertion order is kept.

    On the write path of every message with properties, hence one ``join`` of ready-made
    pieces: a property name's bytes and lengths are cached, small value lengths come from a table.
    """
    parts: list[bytes] = []
    for name, value in properties.items():
        raw = value.encode()
        size = len(raw)
        parts += (_NAME_PIECES.get(name) or _name_piece(name),
                  _SMALL_U32[size] if size < _SMALL_SIZES else _U32.pack(size), raw)
    return b"".join(parts)


_SMALL_SIZES = 1024
_SMALL_U32 = [_U32.pack(size) for size in range(_SMALL_SIZES)]
_NAME_PIECES: dict[str, bytes] = {}
_MAX_NAME_PIECES = 4096  # names beyond it are encoded each time: producers use few names


def _name_piece(name: str) -> bytes:
    """``u16 len, UTF-8 name`` of a property name, cached while the cache has room."""
    raw = name.encode()
    _check_u16(len(raw), "property name")
    piece = _U16.pack(len(raw)) + raw
    if len(_NAME_PIECES) < _MAX_NAME_PIECES:
        _NAME_PIECES[name] = piece
    return piece


def dispatch_head(topic: bytes) -> bytes:
    """``u16 len, UTF-8 topic``: the start of a dispatch entry, the same for every record fanned
    out to the topic's queues (cached by the builder); ``pack_target`` packs the rest."""
    _check_u16(len(topic), "dispatch topic")
    return _U16.pack(len(topic)) + topic


pack_target = _TARGET.pack
"""``u32 queue_id, u64 queue_offset``: the end of a dispatch entry."""


def _check_u16(length: int, what: str) -> None:
    if length > _MAX_U16:
        raise InvalidRecordError(f"{what} is {length} bytes; at most {_MAX_U16} are allowed")


def encoded_size(topic: bytes, msg_id: bytes, tag: bytes, keys: bytes, props: bytes,
                 dispatch: bytes, body: bytes) -> int:
    """Size in bytes of the record these sections make."""
    for value, what in ((topic, "topic"), (msg_id, "message id"), (tag, "tag"), (keys, "keys")):
        _check_u16(len(value), what)
    return HEADER_SIZE + len(topic) + len(msg_id) + len(tag) + len(keys) + len(props) + len(dispatch) + len(body)


def encode_into(buf: bytearray, pos: int, size: int, phys_offset: int, queue_id: int,
                queue_offset: int, born_ts: int, store_ts: int, topic: bytes, msg_id: bytes,
                tag: bytes, keys: bytes, props: bytes, dispatch: bytes, body: bytes) -> None:
    """Encode one record of ``size`` bytes (see ``encoded_size``) into ``buf[pos:pos + size]``.

    Sections are already-encoded bytes (see the ``encode_*`` helpers). This is the write
    path's only encoder: it writes in place, with no intermediate copies.
    """
    HEADER.pack_into(buf, pos, size, MAGIC, VERSION, 0, 0, phys_offset, queue_id, queue_offset,
                     born_ts, store_ts, len(topic), len(msg_id), len(tag), len(keys), len(props),
                     len(dispatch), len(body))
    p = pos + HEADER_SIZE
    for section in (topic, msg_id, tag, keys, props, dispatch):
        if section:
            end = p + len(section)
            buf[p:end] = section
            p = end
    buf[p:pos + size] = body
    _CRC_FIELD.pack_into(buf, pos + 8, crc32c.crc32c(memoryview(buf)[pos + 12:pos + size]))


@functools.lru_cache(maxsize=1024)
def layout(topic_len: int, msg_id_len: int, props_len: int, dispatch_len: int) -> struct.Struct:
    """Header, topic, message id, properties and dispatch sections in one struct: the layout
    of a record with no tag or keys (the common shape), which the write path packs in one call."""
    return struct.Struct(f"{HEADER.format}{topic_len}s{msg_id_len}s{props_len}s{dispatch_len}s")


def encode_laid_out_into(buf: bytearray, pos: int, size: int, layout: struct.Struct, phys_offset: int,
                         queue_id: int, queue_offset: int, born_ts: int, store_ts: int, topic: bytes,
                         msg_id: bytes, props: bytes, dispatch: bytes, body: bytes) -> None:
    """``encode_into`` for a record with no tag or keys, whose ``layout`` fits its sections."""
    end = pos + size
    layout.pack_into(buf, pos, size, MAGIC, VERSION, 0, 0, phys_offset, queue_id, queue_offset,
                     born_ts, store_ts, len(topic), len(msg_id), 0, 0, len(props), len(dispatch),
                     len(body), topic, msg_id, props, dispatch)
    buf[end - len(body):end] = body
    _CRC_FIELD.pack_into(buf, pos + 8, crc32c.crc32c(memoryview(buf)[pos + 12:end]))


def encode(phys_offset: int, queue_id: int, queue_offset: int, born_ts: int, store_ts: int,
           topic: bytes, msg_id: bytes, tag: bytes, keys: bytes, props: bytes,
           dispatch: bytes, body: bytes) -> bytes:
    """Encode one record into new bytes (compaction snapshots, tests)."""
    size = encoded_size(topic, msg_id, tag, keys, props, dispatch, body)
    buf = bytearray(size)
    encode_into(buf, 0, size, phys_offset, queue_id, queue_offset, born_ts, store_ts, topic,
                msg_id, tag, keys, props, dispatch, body)
    return bytes(buf)


def check(buf: bytes | memoryview, pos: int, end: int, offset: int) -> int:
    """Size of the valid record for commit-log ``offset`` at ``buf[pos:end]``, or 0 if none is there.

    Used by scans (recovery, verification); ``decode`` is the reading path.
    """
    if end - pos < HEADER_SIZE:
        return 0
    size, magic, version, flags, checksum, phys = HEADER.unpack_from(buf, pos)[:6]
    if magic != MAGIC or version != VERSION or flags or size < HEADER_SIZE or pos + size > end or phys != offset:
        return 0
    if crc32c.crc32c(memoryview(buf)[pos + 12:pos + size]) != checksum:
        return 0
    return size


def find_valid(buf: bytes, pos: int, base: int) -> int | None:
    """Position of the next valid record at or after ``pos`` in ``buf`` (which starts at
    commit-log offset ``base``), found by resynchronising on the magic bytes; None if none."""
    while True:
        found = buf.find(MAGIC_BYTES, pos + 4)
        if found < 0:
            return None
        candidate = found - 4
        if check(buf, candidate, len(buf), base + candidate):
            return candidate
        pos = candidate + 1


def scan(buf: bytes, base: int, last: bool) -> Iterator[tuple[str, int, int]]:
    """Walk the records of ``buf``, a segment's bytes from commit-log offset ``base``. Yields

    - ``("record", pos, size)`` for each valid record;
    - ``("corrupt", pos, stop)`` for bad bytes that valid records (or a later segment) follow;
    - in the last segment, ``("end", pos, torn)`` where its records stop: ``torn`` bytes of
      garbage follow them (0: only preallocated zeros), and nothing valid comes after.
    """
    pos = 0
    while pos < len(buf):
        size = check(buf, pos, len(buf), base + pos)
        if size:
            yield "record", pos, size
            pos += size
            continue
        if last and buf.count(0, pos) == len(buf) - pos:
            yield "end", pos, 0
            return
        following = find_valid(buf, pos + 1, base)
        if following is None and last:
            yield "end", pos, len(buf.rstrip(b"\0")) - pos
            return
        following = len(buf) if following is None else following
        yield "corrupt", pos, following
        pos = following


class StoredMessage:
    """A record read back from the store. Keys, properties and dispatch targets decode lazily."""

    __slots__ = ("phys_offset", "size", "topic", "queue_id", "queue_offset", "born_ts", "store_ts",
                 "msg_id", "tag", "body", "_keys", "_props", "_dispatch")

    def __init__(self, phys_offset: int, size: int, topic: str, queue_id: int, queue_offset: int,
                 born_ts: int, store_ts: int, msg_id: str, tag: str, body: bytes,
                 keys: bytes, props: bytes, dispatch: bytes) -> None:
        self.phys_offset = phys_offset
        self.size = size
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.born_ts = born_ts
        self.store_ts = store_ts
        self.msg_id = msg_id
        self.tag = tag
        self.body = body
        self._keys = keys
        self._props = props
        self._dispatch = dispatch

    @property
    def keys(self) -> tuple[str, ...]:
        """Business keys, in the order they were given."""
        raw, pos, out = self._keys, 0, []
        while pos < len(raw):
            (length,) = _U16.unpack_from(raw, pos)
            out.append(raw[pos + 2:pos + 2 + length].decode())
            pos += 2 + length
        return tuple(out)

    @property
    def properties(self) -> dict[str, str]:
        """Properties, in the order they were given."""
        raw, pos, out = self._props, 0, {}
        while pos < len(raw):
            (name_len,) = _U16.unpack_from(raw, pos)
            name = raw[pos + 2:pos + 2 + name_len].decode()
            pos += 2 + name_len
            (value_len,) = _U32.unpack_from(raw, pos)
            out[name] = raw[pos + 4:pos + 4 + value_len].decode()
            pos += 4 + value_len
        return out

    def encode(self) -> bytes:
        """The record's bytes, exactly as the log holds them (used for compacted copies)."""
        return encode(self.phys_offset, self.queue_id, self.queue_offset, self.born_ts, self.store_ts,
                      self.topic.encode(), self.msg_id.encode(), self.tag.encode(), self._keys,
                      self._props, self._dispatch, self.body)

    @property
    def dispatch(self) -> tuple[Target, ...]:
        """Extra queues this record was fanned out to."""
        return tuple(iter_dispatch(self._dispatch))

    def __repr__(self) -> str:
        return (f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, phys_offset={self.phys_offset}, "
                f"msg_id={self.msg_id!r}, body={len(self.body)} bytes)")


def iter_dispatch(raw: bytes):
    """Yield the (topic, queue_id, queue_offset) targets of an encoded dispatch section."""
    pos = 0
    while pos < len(raw):
        (length,) = _U16.unpack_from(raw, pos)
        topic = raw[pos + 2:pos + 2 + length].decode()
        pos += 2 + length
        queue_id, queue_offset = _TARGET.unpack_from(raw, pos)
        pos += _TARGET.size
        yield topic, queue_id, queue_offset


def decode_any(buf: bytes, pos: int, where: str = "") -> StoredMessage:
    """Decode and validate a record copied out of the log (it keeps its original offset)."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(pos, "truncated header", where)
    return decode(buf, pos, HEADER.unpack_from(buf, pos)[5], where)


def decode(buf: bytes, pos: int, expected_offset: int, segment: str = "") -> StoredMessage:
    """Decode and validate the record at ``buf[pos:]`` that should sit at ``expected_offset``.

    Raises CorruptRecordError (naming the segment and offset) if it fails any check.
    """
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(expected_offset, "truncated header", segment)
    (size, magic, version, flags, checksum, phys, queue_id, queue_offset, born, stored, topic_len,
     id_len, tag_len, keys_len, props_len, dispatch_len, body_len) = HEADER.unpack_from(buf, pos)
    if magic != MAGIC or version != VERSION or flags:
        raise CorruptRecordError(expected_offset, "bad magic, version or flags", segment)
    end = pos + size
    if (size != HEADER_SIZE + topic_len + id_len + tag_len + keys_len + props_len + dispatch_len + body_len
            or end > len(buf)):
        raise CorruptRecordError(expected_offset, "bad length", segment)
    if crc32c.crc32c(memoryview(buf)[pos + 12:end]) != checksum:
        raise CorruptRecordError(expected_offset, "CRC32C mismatch", segment)
    if phys != expected_offset:
        raise CorruptRecordError(expected_offset, f"record claims offset {phys}", segment)
    p = pos + HEADER_SIZE
    topic = buf[p:p + topic_len].decode()
    p += topic_len
    msg_id = buf[p:p + id_len].decode()
    p += id_len
    tag = buf[p:p + tag_len].decode() if tag_len else ""
    p += tag_len
    keys = buf[p:p + keys_len]
    p += keys_len
    props = buf[p:p + props_len]
    p += props_len
    dispatch = buf[p:p + dispatch_len]
    p += dispatch_len
    return StoredMessage(phys, size, topic, queue_id, queue_offset, born, stored, msg_id, tag,
                         buf[p:end], keys, props, dispatch)
