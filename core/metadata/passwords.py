"""Password hashes: scrypt with a random salt, parameters stored with each hash.

Format: ``scrypt$<n>$<r>$<p>$<salt base64>$<key base64>``. Changing ``SCRYPT_N``/``_R``/``_P``
affects new hashes only; old ones keep verifying with the parameters they were made with.
Pure functions, thread-safe; each call costs one scrypt (tens of milliseconds), so call them off
the event loop.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os

SCRYPT_N = 2 ** 14
SCRYPT_R = 8
SCRYPT_P = 1
_SALT_BYTES = 16
_KEY_BYTES = 32


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES,
                          maxmem=256 * r * (n + p + 2))


def hash_password(password: str) -> str:
    """A new salted hash of ``password`` with the current parameters."""
    salt = os.urandom(_SALT_BYTES)
    key = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return "$".join(["scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P),
                     base64.b64encode(salt).decode(), base64.b64encode(key).decode()])


def check_password(encoded: str, password: str) -> bool:
    """Whether ``password`` matches ``encoded`` (a ``hash_password`` result); constant-time compare."""
    scheme, n, r, p, salt, key = encoded.split("$")
    if scheme != "scrypt":
        raise ValueError(f"unknown password hash scheme {scheme!r}")
    computed = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    return hmac.compare_digest(computed, base64.b64decode(key))


@functools.cache
def _decoy() -> str:
    return hash_password(os.urandom(16).hex())


def waste_check(password: str) -> None:
    """Spend the time of one ``check_password``, so an unknown user answers as slowly as a known one."""
    check_password(_decoy(), password)
