"""The checkpoint: how far the commit log and its derived data are known to be on disk.

    offset size  field
    ------ ----  -------------------------------------------------------------
       0     4   magic         b"SLCP"
       4     2   version       1
       6     2   flags         bit 0: written by a clean shutdown
       8     8   log_end       commit-log offset up to which the log is fsynced
      16     8   derived_end   commit-log offset up to which consume queues and key index
                               are fsynced; recovery replays the log from here
      24     8   written_at    ms since epoch
      32     4   crc32c        of bytes [0, 32)

It is replaced atomically (write a temporary file, fsync, rename, fsync the directory), so a
reader sees either the old or the new checkpoint, never a mix.
"""
from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass

import crc32c

from .durable_files import replace_file

log = logging.getLogger(__name__)

_BODY = struct.Struct("<4sHHQQq")
_CRC = struct.Struct("<I")
_MAGIC = b"SLCP"
_CLEAN = 1


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint file says."""

    log_end: int
    derived_end: int
    clean: bool
    written_at: int = 0


def load(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``, or None if it is missing or unreadable (then recovery rescans)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    if len(data) != _BODY.size + _CRC.size or crc32c.crc32c(data[:_BODY.size]) != _CRC.unpack_from(data, _BODY.size)[0]:
        log.warning("checkpoint %s is unreadable; the whole commit log will be rescanned", path)
        return None
    magic, version, flags, log_end, derived_end, written_at = _BODY.unpack_from(data)
    if magic != _MAGIC or version != 1:
        log.warning("checkpoint %s has an unknown format; the whole commit log will be rescanned", path)
        return None
    return Checkpoint(log_end, derived_end, bool(flags & _CLEAN), written_at)


def save(path: str, checkpoint: Checkpoint) -> None:
    """Atomically replace the checkpoint at ``path``. Runs on the flusher thread or at open/close."""
    body = _BODY.pack(_MAGIC, 1, _CLEAN if checkpoint.clean else 0, checkpoint.log_end,
                      checkpoint.derived_end, checkpoint.written_at or int(time.time() * 1000))
    replace_file(path, body + _CRC.pack(crc32c.crc32c(body)), site="checkpoint")
