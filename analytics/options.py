"""The ``sluice`` source's options, checked once on the driver; errors say what to write."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import StructType

from sluice.client import ClientConfig

from .remote import client_config
from .schema import COLUMN_TYPES

EARLIEST, LATEST = -2, -1
DEFAULT_PARTITION_RECORDS = 1_000_000


class SourceError(ValueError):
    """Options that do not describe something readable; the message says what to change."""


@dataclass(frozen=True)
class SourceOptions:
    """What to read, from where, and which columns."""

    path: str
    remote: ClientConfig | None
    topics: tuple[str, ...]
    starting: dict | int
    """EARLIEST, LATEST, or topic -> queue id (text) -> offset."""
    ending: dict | int
    starting_ms: int | None
    """``startingTimestamp``: start each queue at its first message stored at or after this."""
    ending_ms: int | None
    queues: frozenset[int] | None
    """Only these queue ids of every topic; None: all."""
    subject_regex: str | None
    """``subjectPattern`` as an anchored regular expression; None: every row."""
    partition_records: int
    max_per_trigger: int | None
    columns: tuple[str, ...]
    """The columns Spark asked for: all, or those of a schema the user gave."""


def parse_options(given: Mapping[str, str], schema: StructType | None = None) -> SourceOptions:
    """``given`` (Spark's options, any case) and the schema Spark passes to ``reader``."""
    options = {key.lower(): value for key, value in given.items()}
    path = options.get("path") or ""
    remote = client_config(options) if options.get("endpoint") else None
    if not path and remote is None:
        raise SourceError("give the data directory, spark.read.format('sluice').load(PATH), "
                          "or a broker, .option('endpoint', 'host:8081')")
    topics = tuple(t.strip() for t in options.get("subscribe", "").split(",") if t.strip())
    if not topics:
        raise SourceError("option 'subscribe' names no topic: .option('subscribe', 'devices')")
    pattern = options.get("subjectpattern")
    return SourceOptions(
        path=path, remote=remote, topics=topics,
        starting=_offsets(options.get("startingoffsets", "earliest"), "startingOffsets"),
        ending=_offsets(options.get("endingoffsets", "latest"), "endingOffsets"),
        starting_ms=_timestamp(options, "startingtimestamp", "startingTimestamp"),
        ending_ms=_timestamp(options, "endingtimestamp", "endingTimestamp"),
        queues=_queue_ids(options["queues"]) if "queues" in options else None,
        subject_regex=subject_regex(pattern) if pattern else None,
        partition_records=_positive(options, "maxrecordsperpartition", "maxRecordsPerPartition",
                                    DEFAULT_PARTITION_RECORDS),
        max_per_trigger=_positive(options, "maxoffsetspertrigger", "maxOffsetsPerTrigger", None),
        columns=_columns(schema),
    )


def subject_regex(pattern: str) -> str:
    """An MQTT-style subject filter (``+`` one level, ``#`` the rest) as an anchored regex."""
    levels = pattern.split("/")
    if any(level not in ("+", "#") and ("+" in level or "#" in level) for level in levels) \
            or "#" in levels[:-1]:
        raise SourceError(f"subjectPattern {pattern!r} is not a subject filter: '+' stands for one "
                          "whole level and '#' only for the last, e.g. 'devices/+/telemetry' or 'devices/#'")
    pieces = ["[^/]*" if level == "+" else re.escape(level) for level in levels]
    if levels[-1] == "#":  # 'a/#' matches 'a' itself and everything below it
        head = "/".join(pieces[:-1])
        return f"^{head}(?:/.*)?$" if head else "^.*$"
    return "^" + "/".join(pieces) + "$"


def _offsets(text: str, option: str) -> dict | int:
    """``earliest``/``latest`` as a default for every queue, or the per-queue JSON object."""
    value = text.strip()
    if value == "earliest":
        return EARLIEST
    if value == "latest":
        return LATEST
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(q, dict) for q in parsed.values()):
        raise SourceError(f"{option} must be 'earliest', 'latest' or JSON like "
                          f'{{"devices": {{"0": 42}}}}, not {text!r}')
    return {topic: {str(queue): int(offset) for queue, offset in queues.items()}
            for topic, queues in parsed.items()}


def _timestamp(options: Mapping[str, str], key: str, name: str) -> int | None:
    if key not in options:
        return None
    value = options[key].strip()
    if not value.isdigit():
        raise SourceError(f"{name} is milliseconds since the epoch, such as 1767225600000, not {value!r}")
    return int(value)


def _queue_ids(text: str) -> frozenset[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise SourceError(f"queues is a comma-separated list of queue ids such as '0,2', not {text!r}")
    return frozenset(int(part) for part in parts)


def _positive(options: Mapping[str, str], key: str, name: str, default: int | None) -> int | None:
    if key not in options:
        return default
    value = options[key].strip().replace("_", "")
    if not value.isdigit() or int(value) == 0:
        raise SourceError(f"{name} must be a positive whole number, not {options[key]!r}")
    return int(value)


def _columns(schema: StructType | None) -> tuple[str, ...]:
    """The columns of ``schema``, each checked against the source's own."""
    if schema is None:
        return tuple(COLUMN_TYPES)
    columns = []
    for field in schema.fields:
        wanted = COLUMN_TYPES.get(field.name)
        if wanted is None or field.dataType.simpleString() != wanted:
            offered = ", ".join(f"{name} {kind}" for name, kind in COLUMN_TYPES.items())
            raise SourceError(f"column {field.name} {field.dataType.simpleString()} is not one the "
                              f"sluice source offers; declare a subset of: {offered}")
        columns.append(field.name)
    return tuple(columns)
