"""A discard MQTT server, for measuring the MQTT load generator's own ceiling.

``python -m bench.mqtt_discard PORT`` listens on loopback ``PORT`` (asyncio, uvloop when
installed) and does the least a server must: CONNECT gets CONNACK, SUBSCRIBE gets SUBACK granting
what was asked, PINGREQ gets PINGRESP, a QoS 1 PUBLISH gets its PUBACK (one write per read), and
payloads are thrown away. Publishers driven against it show how fast the generator can publish.

For the subscriber side, a SUBSCRIBE to ``$flood/<qos>/<size>`` makes it write pre-encoded
PUBLISH packets of that QoS and payload size (publisher 0's ``mqtt_wire.Ring``, never stamped) to
the connection as fast as the socket takes them until the client disconnects (PUBACKs coming
back are read and dropped), which shows how fast the generator's subscribers can read.
"""
from __future__ import annotations

import asyncio
import sys

from . import mqtt_wire as wire

FLOOD_PREFIX = "$flood/"


def flood_filter(qos: int, size: int) -> str:
    return f"{FLOOD_PREFIX}{qos}/{size}"


async def _flood(writer: asyncio.StreamWriter, qos: int, size: int) -> None:
    """Write a ring of PUBLISH packets over and over until the connection goes (the task is
    cancelled)."""
    packets = bytes(wire.Ring(0, ("flood",), qos, size, slots=256).packets)
    while True:
        writer.write(packets)
        await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    pending = b""
    floods: list[asyncio.Task[None]] = []
    try:
        while True:
            data = await reader.read(1 << 18)
            if not data:
                return
            pending = pending + data if pending else data
            replies = []
            pos, size = 0, len(pending)
            while pos + 2 <= size:
                first_byte, length, header = pending[pos], pending[pos + 1], pos + 2
                if length >= 0x80:  # a longer remaining length; stop if it is cut off
                    length, shift = length & 0x7F, 7
                    while header < size and pending[header - 1] >= 0x80:
                        length += (pending[header] & 0x7F) << shift
                        shift += 7
                        header += 1
                    if pending[header - 1] >= 0x80:
                        break
                end = header + length
                if end > size:
                    break
                kind = first_byte >> 4
                if kind == wire.PUBLISH:
                    if first_byte & 0x06:
                        topic_end = header + 2 + (pending[header] << 8 | pending[header + 1])
                        replies.append(b"\x40\x02" + pending[topic_end:topic_end + 2])
                elif kind == wire.CONNECT:
                    replies.append(wire.CONNACK_ACCEPTED)
                elif kind == wire.SUBSCRIBE:
                    body = memoryview(pending)[header:end]
                    filters = list(wire.subscribe_filters(body))
                    replies.append(wire.suback(int.from_bytes(body[:2], "big"), [qos for _, qos in filters]))
                    for topic_filter, _ in filters:
                        if topic_filter.startswith(FLOOD_PREFIX):
                            qos, payload_size = (int(part) for part in topic_filter[len(FLOOD_PREFIX):].split("/"))
                            writer.write(b"".join(replies))
                            replies.clear()
                            floods.append(asyncio.create_task(_flood(writer, qos, payload_size)))
                elif kind == wire.PINGREQ:
                    replies.append(wire.PINGRESP_PACKET)
                elif kind == wire.DISCONNECT:
                    return
                pos = end
            pending = pending[pos:]
            if replies:
                writer.write(b"".join(replies))
    except (ConnectionError, OSError):
        pass
    finally:
        for task in floods:
            task.cancel()
        writer.close()


async def _main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=512)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> int:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_main(int(argv[0])))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
