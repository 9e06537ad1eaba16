"""``python -m bench hardening``: what hostile input costs the broker.

The section is a list of measurements (`MEASUREMENTS`), each a function from the settings to
result lines; add one by writing such a function and listing it. Today:

- decoding MQTT 5 PUBLISH packets with 1, 1,000 and 100,000 user properties (the broker's
  ``max_user_properties`` cap lifted for the measurement), the time per property for each:
  a decoder linear in its input keeps it flat (the quadratic one of issue 12 took minutes
  for 790,000);
- the broker's open descriptors and resident memory with 100,000 persistent MQTT sessions,
  each with a message in its stored queue (``session_footprint.py``): descriptors stay within
  the store's cache of queue files however many sessions there are.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from protocols.mqtt.codec import Decoder
from protocols.mqtt.properties import varint
from store.api import StoreConfig

from . import session_footprint
from .report import MeasuredSection, Measurement, run_measurements

Log = Callable[[str], None]
LINEAR_SPREAD = 3.0
"""Time per property may vary this much between the counts and still read as linear."""


@dataclass(frozen=True)
class Settings:
    property_counts: tuple[int, ...] = (1, 1_000, 100_000)
    repeats: int = 5
    """Each decode is timed this many times; the fastest counts (the least disturbed)."""
    sessions: int = 100_000
    session_concurrency: int = 32
    """Sessions opened at once by the measuring client."""

    @classmethod
    def smoke(cls) -> Settings:
        return cls(repeats=1, sessions=500)


def publish_with_user_properties(count: int) -> bytes:
    """An MQTT 5 QoS 0 PUBLISH to ``a/b`` carrying ``count`` user properties ("k", "v")."""
    body = b"\x26\x00\x01k\x00\x01v" * count
    variable = b"\x00\x03a/b" + varint(len(body)) + body
    return b"\x30" + varint(len(variable) + 7) + variable + b"payload"


def decode_seconds(packet: bytes, repeats: int) -> float:
    """The fastest of ``repeats`` decodes of ``packet`` by an MQTT 5 decoder without caps."""
    best = float("inf")
    for _ in range(repeats):
        decoder = Decoder(5, max_packet_size=len(packet), max_user_properties=None)
        began = time.perf_counter()
        decoder.feed(packet)
        decoded = decoder.next_packet()
        best = min(best, time.perf_counter() - began)
        assert decoded is not None
    return best


def property_decoding(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    """Time per user property for each count: flat when decoding is linear."""
    per_property: list[float] = []
    lines = []
    for count in settings.property_counts:
        packet = publish_with_user_properties(count)
        seconds = decode_seconds(packet, settings.repeats)
        per_property.append(seconds / count)
        noun = "user property" if count == 1 else "user properties"
        lines.append(f"{count:>9,} {noun:15} ({len(packet):>9,} B)  {seconds * 1000:10.3f} ms"
                     f"  {seconds / count * 1e6:8.3f} us/property")
        log(f"  decoded a PUBLISH with {count:,} {noun} in {seconds * 1000:.3f} ms")
    large = [p for c, p in zip(settings.property_counts, per_property) if c >= 1_000]
    if len(large) >= 2:
        spread = max(large) / min(large)
        verdict = "linear" if spread <= LINEAR_SPREAD else "NOT linear"
        lines.append(f"time per property from {min(c for c in settings.property_counts if c >= 1_000):,}"
                     f" to {max(settings.property_counts):,} properties varies {spread:.2f}x: {verdict}")
    return "MQTT 5 PUBLISH decode, user properties cap lifted", lines


def persistent_sessions(settings: Settings, workdir: Path, log: Log) -> tuple[str, list[str]]:
    """Descriptors and memory of the broker with ``settings.sessions`` persistent sessions."""
    log(f"opening {settings.sessions:,} persistent MQTT sessions")
    result = session_footprint.measure(workdir, settings.sessions, settings.session_concurrency, log)
    cache = StoreConfig().max_open_queue_files
    rows = [("started", result.start), (f"{result.count:,} sessions", result.sessions),
            ("a message in each", result.messages)]
    lines = [f"{label:20} {f.descriptors:>6,} descriptors  {f.rss_bytes / 2**20:8.1f} MiB resident"
             for label, f in rows]
    grown = result.messages.descriptors - result.start.descriptors
    per_session = (result.messages.rss_bytes - result.start.rss_bytes) / result.count
    lines.append(f"sessions opened at {result.count / result.open_seconds:,.0f}/s, messages stored "
                 f"and delivered to their queues at {result.count / result.publish_seconds:,.0f}/s")
    lines.append(f"descriptors grew by {grown:,} (cache of queue files: {cache}): "
                 f"{'bounded' if grown <= cache + 64 else 'NOT bounded'}; "
                 f"memory {per_session / 1024:.1f} KiB per session")
    return f"{result.count:,} persistent MQTT sessions, each with a stored message", lines


MEASUREMENTS: list[Measurement] = [property_decoding, persistent_sessions]
"""Run in order; each returns (title, result lines)."""


def run_section(settings: Settings, workdir: Path, log: Log) -> MeasuredSection:
    """Every measurement of the section; ``workdir`` is for measurements that need files."""
    return run_measurements("hardening benchmark: what hostile input costs", MEASUREMENTS,
                            settings, workdir, log)
