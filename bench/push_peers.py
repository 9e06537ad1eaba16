"""The push benchmark's other processes: ``receiver`` (an aiohttp server that answers 204 and
measures, from a time the publisher stamped in each payload, how late each event arrives) and
``publisher`` (MQTT QoS 1 publishes, paced or as fast as acknowledged, each payload stamped with
its publish time). Run as ``python -m bench.push_peers receiver PORT`` or
``python -m bench.push_peers publisher HOST:PORT TOPIC COUNT RATE``."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from aiohttp import web


def receiver(port: int) -> None:
    """Count requests; ``GET /stats`` answers the count and the latencies (ms) seen so far,
    ``POST /reset`` starts over."""
    state: dict[str, list] = {"latencies": [], "count": [0]}

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time_ns()
        state["count"][0] += 1
        if body.startswith(b'{"t":'):
            state["latencies"].append((now - json.loads(body)["t"]) / 1e6)
        return web.Response(status=204)

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({"count": state["count"][0], "latencies": state["latencies"]})

    async def reset(_: web.Request) -> web.Response:
        state["latencies"], state["count"] = [], [0]
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def publisher(address: str, topic: str, count: int, rate: float) -> None:
    """Publish ``count`` stamped events to ``topic/<n>`` over MQTT QoS 1 at ``rate`` per second
    (0: as fast as the broker acknowledges), then wait for every acknowledgement."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    host, port = address.rsplit(":", 1)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"push-bench-{time.time_ns()}")
    client.username_pw_set(*sys.stdin.readline().split())
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(host, int(port), keepalive=60)
    client.loop_start()
    start = time.monotonic()
    sent = []
    for n in range(count):
        if rate:
            due = start + n / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        stamp = json.dumps({"t": time.time_ns(), "n": n}, separators=(",", ":"))
        sent.append(client.publish(f"{topic}/e", stamp.encode(), qos=1))
    for info in sent:
        info.wait_for_publish(120)
    client.disconnect()
    client.loop_stop()


if __name__ == "__main__":
    if sys.argv[1] == "receiver":
        receiver(int(sys.argv[2]))
    else:
        publisher(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
