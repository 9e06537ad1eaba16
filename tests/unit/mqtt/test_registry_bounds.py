"""What sessions leave behind in the MQTT session registry stays bounded, over an in-process broker."""
from __future__ import annotations

import tracemalloc

from core.assembly import Core
from protocols.mqtt import registry as registry_module
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.packets import PubAck, Publish
from protocols.mqtt.reason_codes import ReasonCode
from protocols.mqtt.registry import SessionRegistry
from protocols.mqtt.session import Session
from protocols.mqtt.session_store import SessionStore, SubscriptionOptions
from tests.unit.core.test_broker import run_core
from tests.unit.mqtt.fake_wire import Client, run
from tests.unit.mqtt.test_adapter import subscribed


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


def test_what_publishes_to_ever_new_topics_leave_in_the_mapping_caches_stays_in_budget(tmp_path, monkeypatch):
    """A client publishing to thousands of long, distinct topics: every message is delivered,
    while the (client, topic) templates and the subscribers' views of them hold no more than
    their budgets, the oldest going first."""
    monkeypatch.setattr(registry_module, "PLAIN_TEMPLATE_BYTES", 256 << 10)
    monkeypatch.setattr(registry_module, "VIEW_CACHE_BYTES", 256 << 10)

    async def scenario(frontend, broker):
        sub = await subscribed(frontend, "sub", ("devices/#", 0))
        pub = Client(frontend)
        await pub.connect("pub")
        topics = [f"devices/{i:04d}/" + "x" * 900 for i in range(1_000)]
        for start in range(0, len(topics), 100):
            pub.send(*(Publish(topic, b"reading") for topic in topics[start:start + 100]))
        assert [(await sub.expect(Publish)).topic for _ in topics] == topics
        registry = frontend.registry
        assert 0 < registry.plain_templates.size <= 256 << 10
        assert 0 < registry.views.size <= 256 << 10
        assert len(registry.plain_templates) < len(topics) // 2
    run(tmp_path, scenario)


def test_refused_publishes_leave_nothing_in_the_template_cache(tmp_path):
    async def scenario(frontend, broker):
        broker.users.create_user("nobody", "pw")
        pub = Client(frontend)
        assert (await pub.connect("pub", username="nobody", password=b"pw")).reason_code == 0
        pub.send(*(Publish(f"t/{i}", b"x", 1, packet_id=i + 1) for i in range(100)))
        acks = [await pub.expect(PubAck) for _ in range(100)]
        assert {ack.reason_code for ack in acks} == {ReasonCode.NotAuthorized}
        assert len(frontend.registry.plain_templates) == 0
    run(tmp_path, scenario)
