"""Small files replaced atomically and durably, and directory entries made to last."""
from __future__ import annotations

import os


def fsync_directory(directory: str) -> None:
    """Make files created, renamed or removed in ``directory`` survive power loss."""
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: a reader sees the old or the new content, never a mix,
    and after the call the new content survives power loss."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(path))
