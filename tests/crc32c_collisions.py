"""Forging CRC32C collisions, as an attacker would against an index keyed by CRC32C alone.

CRC32C is linear: four bytes appended to any prefix can steer its CRC to any chosen value. Run
the register backwards from the target for four steps (the top byte of each table entry is
unique, so each step's table index is known), then forwards from the prefix choosing each byte
so that the same table entries are taken.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from crc32c import crc32c

_POLY = 0x82F63B78  # CRC32C, reflected
_TABLE = []
for _byte in range(256):
    _reg = _byte
    for _ in range(8):
        _reg = (_reg >> 1) ^ (_POLY if _reg & 1 else 0)
    _TABLE.append(_reg)
_BY_TOP_BYTE = {entry >> 24: index for index, entry in enumerate(_TABLE)}


def forge(prefix: bytes, target: int) -> bytes:
    """``prefix`` and four more bytes whose CRC32C is ``target``."""
    reg, indices = target ^ 0xFFFFFFFF, []
    for _ in range(4):
        index = _BY_TOP_BYTE[reg >> 24]
        indices.append(index)
        reg = ((reg ^ _TABLE[index]) << 8) & 0xFFFFFFFF
    reg, tail = crc32c(prefix) ^ 0xFFFFFFFF, bytearray()
    for index in reversed(indices):
        tail.append((reg ^ index) & 0xFF)
        reg = (reg >> 8) ^ _TABLE[index]
    forged = prefix + bytes(tail)
    assert crc32c(forged) == target
    return forged


def colliding_strings(encode: Callable[[str], bytes], target: int, prefix: str = "k") -> Iterator[str]:
    """Endless distinct strings ``s`` of printable ASCII with ``crc32c(encode(s)) == target``:
    ``encode`` turns a candidate into the bytes that are hashed (say, the index key of a business
    key in the attacker's topic), and must end with the candidate's own bytes."""
    for n in itertools.count():
        stem = f"{prefix}{n}-"
        forged = forge(encode(stem), target)
        tail = forged[-4:]
        if all(0x21 <= b < 0x7F for b in tail):
            yield stem + tail.decode()
