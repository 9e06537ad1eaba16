"""Offline checks of a data directory (`sluice store verify`): the log, and every queue entry
against the log.

- every record of the commit log is whole and valid (size, magic, CRC32C, its own offset);
  garbage after the last record of the last segment is a torn tail: a write a crash cut short,
  which recovery cuts at the next start. It is reported, but it is not damage;
- every consume-queue entry points at a valid record of that size whose home queue and offset
  are the entry's, or, for a fan-out entry, whose dispatch list names the entry's queue and
  offset; no entry points past the end of the log's records;
- no entry is marked lost (size 0) while the log holds the record it should point at.

Each problem is one line naming the file or queue, the offsets and what is wrong. The checks
change nothing. Entries missing at a queue's end are not problems (recovery writes them from
the log at the next start). Run them on a stopped broker's directory: beside a live one, an
entry written during the check may point past the log end the check saw.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import record
from .errors import CorruptRecordError
from .view import StoreView

_BATCH = 4096
_REBUILD = ("stop the broker, delete the data directory's consumequeue/ and checkpoint, and start "
            "it again: queues are rebuilt from the log")

Target = tuple[str, int, int]


@dataclass(frozen=True)
class TornTail:
    """Garbage after the last record of the last segment, where nothing valid follows."""

    segment: str
    offset: int
    size: int

    def __str__(self) -> str:
        return (f"segment {self.segment}: torn tail of {self.size} bytes at offset {self.offset} "
                "(a write cut short by a crash), cut at the next start")


@dataclass
class Verification:
    """What ``check`` found: damage, and a torn tail, which is not."""

    problems: list[str] = field(default_factory=list)
    """One line per problem: corrupt records, queue entries that do not match the log."""
    torn_tail: TornTail | None = None


def check(reader: StoreView) -> Verification:
    """Check the store ``reader`` reads (see the module's docstring)."""
    found = Verification()
    records_end, corrupt = _check_log(reader, found)
    lost: dict[Target, int] = {}
    for topic, queue_id in reader.queues():
        found.problems += _check_queue(reader, topic, queue_id, records_end, corrupt, lost)
    if lost:
        found.problems += _lost_but_present(reader, lost)
    return found


def verify(reader: StoreView) -> list[str]:
    """One line per problem found in the store ``reader`` reads; empty if there is none (a
    torn tail is none)."""
    return check(reader).problems


def _check_log(reader: StoreView, found: Verification) -> tuple[int, list[tuple[int, int]]]:
    """Note the log's problems and torn tail in ``found``; return the offset where its last
    record ends and the corrupt spans (entries pointing into them are that problem, not
    another)."""
    corrupt: list[tuple[int, int]] = []
    segments = reader.log.segments()
    records_end = segments[-1].end if segments else 0
    for segment in segments:
        data = os.pread(segment.fd, segment.size, 0)
        for kind, pos, extent in record.scan(data, segment.base, segment is segments[-1]):
            if kind == "corrupt":
                found.problems.append(_span(segment.name, segment.base + pos, segment.base + extent))
                corrupt.append((segment.base + pos, segment.base + extent))
            elif kind == "end":
                records_end = segment.base + pos
                if extent:
                    found.torn_tail = TornTail(segment.name, records_end, extent)
    return records_end, corrupt


def _span(segment: str, start: int, stop: int) -> str:
    return f"segment {segment}: corrupt bytes at offsets [{start}, {stop})"


def _check_queue(reader: StoreView, topic: str, queue_id: int, records_end: int,
                 corrupt: list[tuple[int, int]], lost: dict[Target, int]) -> list[str]:
    """Problems of one queue's entries; size-0 entries are collected in ``lost``."""
    problems: list[str] = []
    queue = reader.consume_queues.get(topic, queue_id, create=False)
    offset, end = queue.min_offset, queue.max_offset
    while offset < end:
        entries = queue.read(offset, min(_BATCH, end - offset))
        if not entries:
            problems.append(f"queue {topic!r}/{queue_id}: entries [{offset}, {end}) cannot be read")
            break
        for phys, size, _ in entries:
            if size == 0:
                lost[(topic, queue_id, offset)] = phys
            elif any(start <= phys < stop for start, stop in corrupt):
                pass  # reported with its span
            elif (problem := _check_entry(reader, (topic, queue_id, offset), phys, size, records_end)):
                problems.append(f"queue {topic!r}/{queue_id} offset {offset}: {problem}")
            offset += 1
    return problems


def _check_entry(reader: StoreView, target: Target, phys: int, size: int, records_end: int) -> str | None:
    """What is wrong with the entry of ``target`` pointing at (``phys``, ``size``), if anything."""
    if phys + size > records_end:
        return (f"points at commit-log offsets [{phys}, {phys + size}), past the end of the log's "
                f"records at {records_end}; {_REBUILD}")
    try:
        message = reader.read_at(phys)
    except CorruptRecordError as error:
        return f"points at commit-log offset {phys}, where there is no valid record ({error.reason})"
    if message.size != size:
        return f"says {size} bytes, the record at commit-log offset {phys} has {message.size}; {_REBUILD}"
    if target not in _targets(message):
        return (f"points at commit-log offset {phys}, a record of {message.topic!r}/{message.queue_id} "
                f"offset {message.queue_offset} not dispatched to this queue; {_REBUILD}")
    return None


def _targets(message: record.StoredMessage) -> tuple[Target, ...]:
    return ((message.topic, message.queue_id, message.queue_offset), *message.dispatch)


def _lost_but_present(reader: StoreView, lost: dict[Target, int]) -> list[str]:
    """Entries marked lost whose record the log still holds (a queue write that failed)."""
    problems: list[str] = []
    segments = reader.log.segments()
    for segment in segments:
        data = os.pread(segment.fd, segment.size, 0)
        for kind, pos, _ in record.scan(data, segment.base, segment is segments[-1]):
            if kind != "record":
                continue
            message = record.decode(data, pos, segment.base + pos, segment.name)
            for target in _targets(message):
                if target in lost:
                    topic, queue_id, offset = target
                    problems.append(f"queue {topic!r}/{queue_id} offset {offset}: marked lost (size 0), "
                                    f"but the log holds its record at commit-log offset "
                                    f"{message.phys_offset}; {_REBUILD}")
    return problems
