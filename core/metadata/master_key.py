"""The master key file: the Fernet key that encrypts users' signing secrets at rest.

Created once, atomically, with mode 0600; every later open reads the same key. Losing it makes
stored signing secrets unreadable (passwords still verify: they are hashed, not encrypted).
"""

from __future__ import annotations

import os
import tempfile

from cryptography.fernet import Fernet

from core.errors import SluiceError


class BadMasterKey(SluiceError):
    """The master key file exists but does not hold a Fernet key."""


def load_or_create(path: str) -> bytes:
    """The key stored at ``path``, creating the file first if it does not exist.

    Safe against a concurrent creator (another process opening the same data dir): the key is
    written to a private temporary file and published with ``link``, which never replaces a file,
    so whoever loses the race reads the winner's key.
    """
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".master.key.")  # mode 0600
    try:
        os.write(fd, Fernet.generate_key() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    _fsync_dir(os.path.dirname(path) or ".")
    return _read(path)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        key = file.read().strip()
    try:
        Fernet(key)
    except ValueError:
        raise BadMasterKey(f"the master key file {path} is damaged (not a Fernet key): restore it "
                           "from a backup; without it stored signing secrets cannot be read") from None
    return key


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
