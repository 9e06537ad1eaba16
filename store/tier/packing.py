"""Packed batches (many small bodies in one record, property ``sluice.batch``), as the tier
stores them: one row per body, packed again when a record is read back.

The format is the SDK's (sluice/client/packing.py, which the store may not import): magic
``SB``, version 1, a uint32 count, a uint32 length per body, the bodies; little-endian. A body
that is not a well-formed batch is kept whole, as one row.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import accumulate

BATCH_PROPERTY = "sluice.batch"
_MAGIC = b"SB"
_VERSION = 1
_HEADER = struct.Struct("<2sBI")


def unpack(body: bytes) -> list[bytes] | None:
    """The bodies packed in ``body``; None if it is not a well-formed batch of at least one
    (then the tier keeps it whole: ``pack`` of the result gives ``body`` back exactly)."""
    if len(body) < _HEADER.size:
        return None
    magic, version, count = _HEADER.unpack_from(body)
    start = _HEADER.size + 4 * count
    if magic != _MAGIC or version != _VERSION or not count or start > len(body):
        return None
    ends = list(accumulate(struct.unpack_from(f"<{count}I", body, _HEADER.size), initial=start))
    if ends[-1] != len(body):
        return None
    return [body[a:b] for a, b in zip(ends, ends[1:])]


def pack(bodies: Sequence[bytes]) -> bytes:
    """The packed batch of ``bodies``: the record body that ``unpack`` took apart."""
    return b"".join((_HEADER.pack(_MAGIC, _VERSION, len(bodies)), struct.pack(f"<{len(bodies)}I", *map(len, bodies)),
                     *bodies))
