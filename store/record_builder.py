"""Turning an append into record bytes: queue offsets, message id, sections, dispatch request.

Shared by every store implementation, so they number queues and encode records identically.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from . import record
from .api import AppendResult, Message, SharedProperties
from .consume_queue import topic_dir_name
from .dispatcher import DispatchRequest, business_key, id_key
from .errors import InvalidRecordError

Place = Callable[[int], tuple[int, bytearray, int]]
"""Place a record of n bytes: its commit-log offset, and the (array, position) to encode it at."""

_new_tuple = tuple.__new__  # AppendResult without NamedTuple's keyword handling: hot path

_GENERATED_ID_LEN = 16
_HEX = frozenset("0123456789ABCDEF")
PROPERTY_SECTIONS_BYTES = 8 << 20
"""What the encoded properties sections kept by identity may hold (counting the mappings they
keep alive): those of tens of thousands of (client, topic) pairs."""
_SECTION_OVERHEAD = 250
"""Bytes a kept section costs beyond twice its length (its mapping holds the same strings)."""


def generated_id_offset(msg_id: str) -> int | None:
    """The commit-log offset a store-generated message id names, or None if it is not one.

    Generated ids are not put in the key index: they are found by reading at this offset
    (and checking the record's id, since a producer may choose an id of the same shape).
    """
    if len(msg_id) == _GENERATED_ID_LEN and _HEX.issuperset(msg_id):
        return int(msg_id, 16)
    return None


class PropertySections:
    """Properties sections of `SharedProperties` encoded once per mapping, however many
    messages share it (an MQTT client's plain publishes to one topic all carry one), kept by
    the mapping's identity within a byte budget, oldest first out. Each entry keeps its
    mapping alive, so a reused ``id`` never matches another mapping. Other mappings are
    encoded every time."""

    def __init__(self, budget_bytes: int = PROPERTY_SECTIONS_BYTES) -> None:
        self.budget = budget_bytes
        self.size = 0
        self._entries: dict[int, tuple[Mapping[str, str], bytes, int]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, properties: Mapping[str, str]) -> bytes:
        """The properties section of ``properties``."""
        if type(properties) is not SharedProperties:
            return record.encode_properties(properties)
        entries = self._entries
        entry = entries.get(id(properties))
        if entry is not None and entry[0] is properties:
            return entry[1]
        section = record.encode_properties(properties)
        cost = 2 * len(section) + _SECTION_OVERHEAD
        if cost <= self.budget:
            if entry is not None:
                self.size -= entry[2]
            entries[id(properties)] = (properties, section, cost)
            self.size += cost
            while self.size > self.budget:
                self.size -= entries.pop(next(iter(entries)))[2]
        return section


class RecordBuilder:
    """Assigns queue offsets and encodes records. Runs under the owning store's append lock."""

    def __init__(self, next_queue_offsets: dict[tuple[str, int], int], compacted_topics: set[str]) -> None:
        self.next_queue_offsets = next_queue_offsets
        self.compacted_topics = compacted_topics
        self._topic_bytes: dict[str, bytes] = {}
        self._dispatch_heads: dict[str, bytes] = {}
        self.property_sections = PropertySections()

    def _topic(self, topic: str) -> bytes:
        encoded = self._topic_bytes.get(topic)
        if encoded is None:
            topic_dir_name(topic)  # validates the name
            encoded = self._topic_bytes[topic] = topic.encode()
        return encoded

    def _targets(self, extra_queues: Sequence[tuple[str, int]]) -> tuple[tuple[record.Target, ...], bytes]:
        """The fan-out targets of a record with their queue offsets, and its dispatch section."""
        offsets, heads, pack = self.next_queue_offsets, self._dispatch_heads, record.pack_target
        extra: list[record.Target] = []
        parts: list[bytes] = []
        for key in extra_queues:
            topic, queue_id = key
            offset = offsets.get(key, 0)
            extra.append((topic, queue_id, offset))
            parts += (heads.get(topic) or self._dispatch_head(topic), pack(queue_id, offset))
        return tuple(extra), b"".join(parts)

    def _dispatch_head(self, topic: str) -> bytes:
        """The dispatch head of a (validated) queue topic, kept like the topic's own bytes."""
        head = self._dispatch_heads[topic] = record.dispatch_head(self._topic(topic))
        return head

    def build(self, place: Place, topic: str, body: bytes, queue_id: int,
              tag: str, keys: Sequence[str], properties: Mapping[str, str] | None, msg_id: str,
              born_ts: int, extra_queues: Sequence[tuple[str, int]], now: int,
              ) -> tuple[DispatchRequest, AppendResult]:
        """Validate, place and encode one append; return its dispatch request and result.

        Everything that can be refused is checked before log space is allocated, so a refused
        append leaves no gap. A message without ``msg_id`` gets its commit-log offset in hex
        (unique in this store); only ids given by the producer go into the key index.
        """
        topic_bytes = self._topic_bytes.get(topic) or self._topic(topic)
        if type(body) is not bytes:
            body = bytes(body)
        if keys:
            keys_bytes = record.encode_keys(keys)
        elif topic in self.compacted_topics:
            raise InvalidRecordError(f"topic {topic!r} is compacted: every message needs a key")
        else:
            keys_bytes = b""
        if not 0 <= queue_id <= 0xFFFFFFFF:
            raise InvalidRecordError(f"queue id {queue_id} is out of range")
        if not 0 <= born_ts < 1 << 63:
            raise InvalidRecordError(f"born timestamp {born_ts} is not milliseconds since the epoch")
        tag_bytes = tag.encode() if tag else b""
        id_bytes = msg_id.encode() if msg_id else b""
        if len(tag_bytes) > 0xFFFF or len(id_bytes) > 0xFFFF:
            raise InvalidRecordError("a tag and a message id have at most 65535 bytes")
        props_bytes = self.property_sections.encode(properties) if properties else b""
        offsets = self.next_queue_offsets
        home = (topic, queue_id)
        queue_offset = offsets.get(home, 0)
        extra, dispatch_bytes = self._targets(extra_queues) if extra_queues else ((), b"")
        size = (record.HEADER_SIZE + len(topic_bytes) + (len(id_bytes) or _GENERATED_ID_LEN) + len(tag_bytes)
                + len(keys_bytes) + len(props_bytes) + len(dispatch_bytes) + len(body))
        phys, buf, pos = place(size)
        if not msg_id:
            msg_id = f"{phys:016X}"
            id_bytes = msg_id.encode()
            index_keys: tuple[bytes, ...] = ()
        else:
            index_keys = (id_key(topic, msg_id),)
        record.encode_into(buf, pos, size, phys, queue_id, queue_offset, born_ts or now, now, topic_bytes,
                           id_bytes, tag_bytes, keys_bytes, props_bytes, dispatch_bytes, body)
        offsets[home] = queue_offset + 1
        for t, q, offset in extra:
            offsets[(t, q)] = offset + 1
        if keys:
            index_keys += tuple(business_key(topic, key) for key in keys)
        request = (phys, size, record.crc(tag_bytes) if tag_bytes else 0, now,
                   ((topic, queue_id, queue_offset), *extra) if extra else ((topic, queue_id, queue_offset),),
                   index_keys)
        return request, _new_tuple(AppendResult, (topic, queue_id, queue_offset, phys, size, msg_id, now, extra))

    def build_batch(self, place: Place, messages: Sequence[Message], now: int,
                    requests: list[DispatchRequest], results: list[AppendResult]) -> None:
        """``build`` each message in order into ``requests`` and ``results``. If one is refused,
        those before it stay built (the lists say which).

        Messages with no tag, keys or id of their own on a topic seen before (what MQTT and AMQP
        publish: properties, maybe fan-out) take an inlined path that packs header and sections
        with one cached struct (``record.layout``). It is the write path's hot loop, hence the
        locals and the unpacked messages; ``build`` encodes the same bytes.
        """
        general, compacted, topics = self.build, self.compacted_topics, self._topic_bytes
        offsets, encode, new_tuple = self.next_queue_offsets, record.encode_laid_out_into, _new_tuple
        encode_properties, layout = self.property_sections.encode, record.layout
        add_request, add_result = requests.append, results.append
        for topic, body, queue_id, tag, keys, properties, msg_id, born_ts, extra_queues in messages:
            topic_bytes = topics.get(topic)
            if (topic_bytes is None or tag or keys or msg_id or topic in compacted or type(body) is not bytes
                    or not 0 <= queue_id <= 0xFFFFFFFF or not 0 <= born_ts < 1 << 63):
                request, result = general(place, topic, body, queue_id, tag, keys, properties, msg_id, born_ts,
                                          extra_queues, now)
            else:
                props = encode_properties(properties) if properties else b""
                extra, dispatch = self._targets(extra_queues) if extra_queues else ((), b"")
                shape = layout(len(topic_bytes), _GENERATED_ID_LEN, len(props), len(dispatch))
                size = shape.size + len(body)
                home = (topic, queue_id)
                queue_offset = offsets.get(home, 0)
                phys, buf, pos = place(size)
                msg_id = "%016X" % phys
                encode(buf, pos, size, shape, phys, queue_id, queue_offset, born_ts or now, now,
                       topic_bytes, msg_id.encode(), props, dispatch, body)
                offsets[home] = queue_offset + 1
                if extra:
                    for t, q, offset in extra:
                        offsets[(t, q)] = offset + 1
                    request = (phys, size, 0, now, (home + (queue_offset,), *extra), ())
                else:
                    request = (phys, size, 0, now, (home + (queue_offset,),), ())
                result = new_tuple(AppendResult, (topic, queue_id, queue_offset, phys, size, msg_id, now, extra))
            add_request(request)
            add_result(result)
