"""Records rebuilt from the rows of a tiered data file: the same ``StoredMessage`` the commit
log held, byte for byte (sections re-encoded with record.py's encoders, packed batches
re-packed from their rows).

Tiered objects are untrusted input: every inconsistency found here raises TierDataError.
"""
from __future__ import annotations

import struct

from ..errors import InvalidRecordError, StoreError
from ..record import StoredMessage, dispatch_head, encode_keys, encode_properties, encoded_size, pack_target
from .packing import pack

_MS = 1000  # timestamps are microseconds in Parquet, milliseconds in the log


class TierDataError(StoreError):
    """A tiered object is unreadable or does not hold what the manifest says it does."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"tiered object {key} is unreadable: {reason}; its records cannot be "
                         "served from the tier (restore the object from a backup, or remove its "
                         "file from the tier so that readers skip it)")
        self.key = key
        self.reason = reason


def rebuild(topic: str, rows: dict[str, list], key: str) -> StoredMessage:
    """The record of ``topic`` held by ``rows`` (the columns of every row of one log offset,
    in file order, timestamps as integer microseconds), checked against its ``log_size``."""
    try:
        return _rebuild(topic, rows, key)
    except (TypeError, ValueError, AttributeError, IndexError, OverflowError, struct.error,
            InvalidRecordError, UnicodeError) as error:
        raise TierDataError(key, f"the rows of log offset {rows['log_offset'][0]} do not make a "
                                 f"record ({type(error).__name__}: {error})") from None


_REQUIRED = ("queue", "offset", "msg_id", "keys", "properties", "body", "born_ts", "store_ts", "log_offset",
             "log_size", "dispatch")


def _rebuild(topic: str, rows: dict[str, list], key: str) -> StoredMessage:
    log_offset = rows["log_offset"][0]
    missing = [name for name in _REQUIRED if any(value is None for value in rows[name])]
    if missing:
        raise TierDataError(key, f"the rows of log offset {log_offset} hold nulls in {', '.join(missing)}")
    indexes = rows["batch_index"]
    if indexes[0] is None:
        if len(indexes) != 1:
            raise TierDataError(key, f"log offset {log_offset} has {len(indexes)} rows but no batch index")
        body = rows["body"][0]
    elif indexes != list(range(len(indexes))):
        raise TierDataError(key, f"the batch indexes of log offset {log_offset} are not 0..{len(indexes) - 1}")
    else:
        body = pack(rows["body"])
    keys = encode_keys(rows["keys"][0])
    props = encode_properties(dict(rows["properties"][0]))
    dispatch = b"".join(dispatch_head(target["topic"].encode()) + pack_target(target["queue"], target["offset"])
                        for target in rows["dispatch"][0])
    tag, msg_id = rows["tag"][0] or "", rows["msg_id"][0]
    born, stored = rows["born_ts"][0], rows["store_ts"][0]
    if born % _MS or stored % _MS:
        raise TierDataError(key, f"the timestamps of log offset {log_offset} are not whole milliseconds")
    size = encoded_size(topic.encode(), msg_id.encode(), tag.encode(), keys, props, dispatch, body)
    if size != rows["log_size"][0]:
        raise TierDataError(key, f"log offset {log_offset} rebuilds to {size} bytes, the log held "
                                 f"{rows['log_size'][0]}")
    return StoredMessage(log_offset, size, topic, rows["queue"][0], rows["offset"][0], born // _MS,
                         stored // _MS, msg_id, tag, body, keys, props, dispatch)
