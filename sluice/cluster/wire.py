"""Frames of the replication port: how a follower proves it belongs and fetches the log.

Every frame is ``length (u32, big-endian) | kind (u8) | payload``; ``length`` counts the kind
byte and the payload and is bounded, so a peer can make the other side buffer at most one
segment plus a header. The conversation:

    leader   -> CHALLENGE  32 random bytes
    follower -> HELLO      json {"node", "proof", "epochs": [[epoch, start]...], "end",
                                 "confirmed", "segment_size"}
                           proof = HMAC-SHA256(cluster secret, challenge | node)
    leader   -> START      json {"epoch", "from"}       append from "from" on (after truncating
                                                        to it if the log is longer)
    leader   -> BATCH      u64 epoch | u64 offset | u64 confirmed | records...
    follower -> ACK        u64 durable end
    leader   -> REFUSED    utf-8 reason, then the connection closes
    leader   -> SNAPSHOT   instead of START when the follower's history and the leader's
                           meet below the leader's log start (retention): a part of the
                           snapshot (``snapshots``), up to SNAPSHOT_CHUNK bytes; then
    leader   -> SNAPSHOT_END json {"size", "sha256"}, and the connection closes

A node relaying a client connection to the leader (``relay``) opens it the same way, but answers
the challenge with

    follower -> RELAY      json {"node", "proof", "listener", "proxy"}
                           listener: which client port ("mqtt", "amqp", "native", ...);
                           proxy: the PROXY v1 header naming the client

after which the connection carries the client's bytes both ways, unframed.

A BATCH never spans epochs; ``confirmed`` is the leader's confirm offset, also sent in an empty
BATCH while there is nothing new. Anything else, or anything malformed, closes the connection.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import struct
from dataclasses import dataclass
from enum import IntEnum

HEADER = struct.Struct(">IB")
BATCH_HEADER = struct.Struct(">QQQ")
ACK = struct.Struct(">Q")
CHALLENGE_SIZE = 32
MAX_CONTROL_FRAME = 64 << 10
"""Bound of every frame but BATCH and SNAPSHOT: a hello with thousands of epochs still fits."""
SNAPSHOT_CHUNK = 1 << 20
"""Bound of a SNAPSHOT frame's payload."""


class Kind(IntEnum):
    CHALLENGE = 1
    HELLO = 2
    START = 3
    BATCH = 4
    ACK = 5
    REFUSED = 6
    RELAY = 7
    SNAPSHOT = 8
    SNAPSHOT_END = 9


class ProtocolError(Exception):
    """The peer sent something this protocol does not allow; the connection is closed."""


@dataclass(frozen=True)
class Hello:
    node: str
    proof: bytes
    epochs: list[tuple[int, int]]
    end: int
    confirmed: int
    segment_size: int


def proof(secret: str, challenge: bytes, node: str) -> bytes:
    return hmac.new(secret.encode(), challenge + node.encode(), hashlib.sha256).digest()


def proves(secret: str, challenge: bytes, hello: Hello) -> bool:
    return bool(secret) and hmac.compare_digest(proof(secret, challenge, hello.node), hello.proof)


def frame(kind: Kind, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) + 1, kind) + payload


def encode_hello(hello: Hello) -> bytes:
    return frame(Kind.HELLO, json.dumps({
        "node": hello.node, "proof": hello.proof.hex(), "epochs": hello.epochs, "end": hello.end,
        "confirmed": hello.confirmed, "segment_size": hello.segment_size}).encode())


def decode_hello(payload: bytes) -> Hello:
    fields = _json(payload)
    try:
        epochs = [(_count(epoch), _count(start)) for epoch, start in fields["epochs"]]
        hello = Hello(str(fields["node"]), bytes.fromhex(fields["proof"]), epochs, _count(fields["end"]),
                      _count(fields["confirmed"]), _count(fields["segment_size"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ProtocolError("malformed HELLO") from None
    if not hello.node or len(hello.node) > 255:
        raise ProtocolError("HELLO names no node, or a name over 255 characters")
    return hello


@dataclass(frozen=True)
class RelayRequest:
    node: str
    proof: bytes
    listener: str
    proxy: bytes
    """A PROXY v1 header line naming the client."""


def encode_relay(request: RelayRequest) -> bytes:
    return frame(Kind.RELAY, json.dumps({
        "node": request.node, "proof": request.proof.hex(), "listener": request.listener,
        "proxy": request.proxy.decode("ascii")}).encode())


def decode_relay(payload: bytes) -> RelayRequest:
    fields = _json(payload)
    try:
        request = RelayRequest(str(fields["node"]), bytes.fromhex(fields["proof"]), str(fields["listener"]),
                               str(fields["proxy"]).encode("ascii"))
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeEncodeError):
        raise ProtocolError("malformed RELAY") from None
    if not request.node or len(request.node) > 255 or len(request.listener) > 32:
        raise ProtocolError("RELAY names no node, or a name too long")
    return request


def proves_relay(secret: str, challenge: bytes, request: RelayRequest) -> bool:
    return bool(secret) and hmac.compare_digest(proof(secret, challenge, request.node), request.proof)


def encode_start(epoch: int, start: int) -> bytes:
    return frame(Kind.START, json.dumps({"epoch": epoch, "from": start}).encode())


def decode_start(payload: bytes) -> tuple[int, int]:
    fields = _json(payload)
    try:
        return _count(fields["epoch"]), _count(fields["from"])
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("malformed START") from None


def encode_batch(epoch: int, offset: int, confirmed: int, records: bytes) -> bytes:
    return HEADER.pack(1 + BATCH_HEADER.size + len(records), Kind.BATCH) + BATCH_HEADER.pack(
        epoch, offset, confirmed) + records


def decode_batch(payload: bytes) -> tuple[int, int, int, bytes]:
    if len(payload) < BATCH_HEADER.size:
        raise ProtocolError("BATCH shorter than its header")
    epoch, offset, confirmed = BATCH_HEADER.unpack_from(payload)
    return epoch, offset, confirmed, payload[BATCH_HEADER.size:]


def encode_ack(durable: int) -> bytes:
    return frame(Kind.ACK, ACK.pack(durable))


def decode_ack(payload: bytes) -> int:
    if len(payload) != ACK.size:
        raise ProtocolError("ACK of the wrong size")
    return ACK.unpack(payload)[0]


async def read_frame(reader: asyncio.StreamReader, max_batch: int) -> tuple[Kind, bytes]:
    """The next frame; BATCH payloads may be ``max_batch`` bytes, others ``MAX_CONTROL_FRAME``.
    Raises ProtocolError on a malformed frame, IncompleteReadError when the peer hangs up."""
    length, kind = HEADER.unpack(await reader.readexactly(HEADER.size))
    try:
        kind = Kind(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame kind {kind}") from None
    limit = (max_batch + BATCH_HEADER.size if kind is Kind.BATCH
             else SNAPSHOT_CHUNK if kind is Kind.SNAPSHOT else MAX_CONTROL_FRAME)
    if not 1 <= length <= limit + 1:
        raise ProtocolError(f"{kind.name} frame of {length} bytes (at most {limit + 1})")
    return kind, await reader.readexactly(length - 1)


def _json(payload: bytes) -> dict:
    try:
        fields = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("a control frame that is not JSON") from None
    if not isinstance(fields, dict):
        raise ProtocolError("a control frame that is not a JSON object")
    return fields


def _count(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise ValueError(f"{value!r} is not an offset or epoch")
    return value
