"""Names of the tier's objects. Stable and documented (docs/tiering.md): users read them directly.

    data/topic=<escaped topic>/day=<YYYY-MM-DD>/<segment base, 20 digits>.parquet
    index/<segment base, 20 digits>.parquet
    manifest/<version, 20 digits>.json

The topic is escaped as Hive escapes partition values (``%XX``, uppercase hex, for every byte
outside ``[A-Za-z0-9._-]``), which Spark, pyarrow and DuckDB undo. Names depend only on what
they hold, so a retry writes the same keys again.
"""
from __future__ import annotations

import datetime
import re

DATA = "data/"
INDEX = "index/"
MANIFEST = "manifest/"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_MANIFEST_KEY = re.compile(r"manifest/(\d{20})\.json")
_SEGMENT_KEY = re.compile(r"(?:data/topic=[^/]+/day=\d{4}-\d{2}-\d{2}|index)/(\d{20})\.parquet")


def escape(value: str) -> str:
    """``value`` as a Hive partition value: unsafe bytes of its UTF-8 as ``%XX``."""
    return "".join(chr(byte) if byte in _SAFE else f"%{byte:02X}" for byte in value.encode())


def unescape(value: str) -> str:
    """The inverse of ``escape``."""
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 16)), value).encode("latin-1").decode()


def day_of(store_ts_ms: int) -> str:
    """The UTC day (``YYYY-MM-DD``) of a timestamp in ms."""
    return datetime.datetime.fromtimestamp(store_ts_ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d")


def data_key(topic: str, day: str, segment: int) -> str:
    """The data file of ``topic``'s records of one UTC ``day`` in the segment based at ``segment``."""
    return f"{DATA}topic={escape(topic)}/day={day}/{segment:020d}.parquet"


def index_key(segment: int) -> str:
    """The key-index file of the segment based at ``segment``."""
    return f"{INDEX}{segment:020d}.parquet"


def manifest_key(version: int) -> str:
    """The manifest of ``version``."""
    return f"{MANIFEST}{version:020d}.json"


def manifest_version(key: str) -> int | None:
    """The version a manifest key names; None for any other key."""
    match = _MANIFEST_KEY.fullmatch(key)
    return int(match.group(1)) if match else None


def segment_of(key: str) -> int | None:
    """The segment base a data or index key names; None for any other key."""
    match = _SEGMENT_KEY.fullmatch(key)
    return int(match.group(1)) if match else None
