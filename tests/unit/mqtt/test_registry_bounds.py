"""What sessions leave behind in the MQTT session registry stays bounded, over an in-process broker."""
from __future__ import annotations

import tracemalloc

from core.assembly import Core
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.registry import SessionRegistry
from protocols.mqtt.session import Session
from protocols.mqtt.session_store import SessionStore, SubscriptionOptions
from tests.unit.core.test_broker import run_core


def test_shared_groups_left_empty_are_forgotten(tmp_path):
    """A client subscribing to and leaving 2,000 distinct shared groups leaves nothing behind
    (each group used to stay in the registry for good)."""
    async def scenario(core: Core) -> None:
        registry = SessionRegistry(core.broker, core.queues, core.state, MqttOptions(),
                                   SessionStore(core.state))
        session = Session(registry, "hopper", 0)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(2_000):
                options = SubscriptionOptions("t/" + "x" * 1_000, 1, share=f"g{i}")
                session.subscribe(options)
                assert session.unsubscribe(options.key)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert held < 512 << 10, f"{held} bytes left behind"
    run_core(tmp_path, scenario)
