"""A broker with only the native listener, as a separate process, for tests that SIGKILL it.

    python tests/integration/native/broker_process.py --data-dir DIR [--port N] [--setup JSON]
                                                      [--core JSON]

``--setup`` is ``{"users": [[name, password, admin]], "topics": [[name, queues, type]],
"groups": [[name, max_attempts, initial_backoff_ms, fifo]]}``, created if missing;
``--core`` holds CoreConfig overrides. Prints ``READY <port>`` once serving; SIGTERM stops it
cleanly, SIGKILL is what the crash tests send.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from core.errors import AlreadyExists  # noqa: E402
from core.metadata import MetadataRepository  # noqa: E402
from core.model import SYSTEM, GroupConfig, MessageType, RetryPolicy, TopicConfig  # noqa: E402
from core.assembly import Core  # noqa: E402
from core.service import Broker  # noqa: E402
from core.settings import CoreConfig  # noqa: E402
from protocols.mqtt.topics import SYNTAX as MQTT_TOPIC_SYNTAX  # noqa: E402
from protocols.native.server import start_native_server  # noqa: E402
from store import FileStore, StoreConfig  # noqa: E402


async def _setup(broker: Broker, setup: dict) -> None:
    for name, password, admin in setup.get("users", []):
        try:
            await asyncio.to_thread(broker.users.create_user, name, password, admin)
        except AlreadyExists:
            pass
    for name, queues, kind in setup.get("topics", []):
        if name not in {t.name for t in broker.list_topics()}:
            await broker.create_topic(SYSTEM, TopicConfig(name, queues, MessageType(kind)))
    for name, attempts, backoff_ms, fifo in setup.get("groups", []):
        if name not in {g.name for g in broker.list_groups()}:
            retry = RetryPolicy(max_attempts=attempts, initial_backoff_ms=backoff_ms)
            await broker.create_group(SYSTEM, GroupConfig(name, retry=retry, fifo=fifo))


async def main(args: argparse.Namespace) -> None:
    store = FileStore(os.path.join(args.data_dir, "store"), StoreConfig(flush="sync"))
    metadata = MetadataRepository.for_data_dir(args.data_dir)
    config = dataclasses.replace(CoreConfig(), **json.loads(args.core))
    core = Core(store, metadata, args.data_dir, config, flush="sync",
                subject_syntax=MQTT_TOPIC_SYNTAX)
    await core.start()
    broker = core.broker
    await _setup(broker, json.loads(args.setup))
    server = await start_native_server(broker, "127.0.0.1", args.port)
    print(f"READY {server.port}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    await server.stop(1)
    await core.close()
    store.close()
    metadata.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--setup", default="{}")
    parser.add_argument("--core", default="{}")
    asyncio.run(main(parser.parse_args()))
