"""Small files replaced atomically and durably, and directory entries made to last."""
from __future__ import annotations

import os

from . import fileops


def fsync_directory(directory: str, *, site: str) -> None:
    """Make files created, renamed or removed in ``directory`` survive power loss."""
    fd = fileops.open_file(directory or ".", os.O_RDONLY, site=site)
    try:
        fileops.fsync(fd, site=site, path=directory)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes, *, site: str = "file") -> None:
    """Replace ``path`` with ``data``: a reader sees the old or the new content, never a mix,
    and after the call the new content survives power loss. On failure the temporary file is
    removed and ``path`` is left as it was."""
    tmp = path + ".tmp"
    try:
        fd = fileops.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, site=site)
        try:
            fileops.write(fd, data, site=site, path=tmp)
            fileops.fsync(fd, site=site, path=tmp)
        finally:
            os.close(fd)
        fileops.rename(tmp, path, site=site)
    except BaseException:
        fileops.remove_quietly(tmp, site=site)
        raise
    fsync_directory(os.path.dirname(path), site=site)
