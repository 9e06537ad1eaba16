"""Virtual hosts keep durable exchanges, queues and bindings across a restart (a new
``VirtualHosts`` over the same metadata database), drop transient and exclusive ones, stay
isolated from each other, and refuse what RabbitMQ refuses."""
from __future__ import annotations

import asyncio

import pytest

from core.errors import AccessDenied, AlreadyExists, NotFound, PreconditionFailed, ResourceLocked
from core.exchanges import Destination
from core.metadata import MetadataRepository
from core.vhosts import DEFAULT_VHOST, QueueSettings, VirtualHosts, named_queue


def reopened(metadata: MetadataRepository) -> VirtualHosts:
    """What a restarted broker rebuilds from the metadata database."""
    hosts = VirtualHosts(metadata)
    hosts.load(metadata.topology())
    return hosts


@pytest.fixture
def metadata(tmp_path):
    repo = MetadataRepository.for_data_dir(str(tmp_path))
    yield repo
    repo.close()


def test_durable_topology_survives_a_restart_and_transient_does_not(metadata):
    async def build() -> None:
        hosts = VirtualHosts(metadata)
        await hosts.ensure_default()
        await hosts.declare_exchange("/", "orders", "topic")
        await hosts.declare_exchange("/", "scratch", "fanout", durable=False)
        await hosts.declare_queue("/", QueueSettings("billing"))
        await hosts.declare_queue("/", QueueSettings("tmp", durable=False))
        await hosts.declare_queue("/", QueueSettings("mine", owner="conn-1"))
        await hosts.bind("/", "orders", Destination("billing"), "order.*.created")
        await hosts.bind("/", "orders", Destination("tmp"), "#")
        await hosts.bind("/", "amq.fanout", Destination("orders", is_exchange=True), "")
        host = hosts.get("/")
        assert hosts.route("/", "amq.fanout", "order.eu.created") == [
            host.named("billing"), host.named("tmp")]
        return host.named("billing")
    billing = asyncio.run(build())

    hosts = reopened(metadata)
    assert hosts.names() == [DEFAULT_VHOST]
    host = hosts.get("/")
    assert sorted(host.queues) == ["billing"]
    assert "orders" in host.graph and "scratch" not in host.graph
    assert hosts.route("/", "amq.fanout", "order.eu.created") == [billing]
    assert host.named("billing") == billing, "a restart keeps the queue's incarnation"
    assert hosts.route("/", "orders", "order.eu.cancelled") == []


def test_deleting_removes_rows_so_a_restart_does_not_bring_them_back(metadata):
    async def build_and_delete() -> None:
        hosts = VirtualHosts(metadata)
        await hosts.ensure_default()
        await hosts.declare_exchange("/", "logs", "fanout")
        await hosts.declare_queue("/", QueueSettings("all-logs"))
        await hosts.bind("/", "logs", Destination("all-logs"), "")
        named = hosts.get("/").named("all-logs")
        assert await hosts.delete_queue("/", "all-logs") == named
        await hosts.declare_queue("/", QueueSettings("again"))
        await hosts.bind("/", "logs", Destination("again"), "")
        await hosts.unbind("/", "logs", Destination("again"), "")
        await hosts.delete_exchange("/", "logs")
    asyncio.run(build_and_delete())
    hosts = reopened(metadata)
    host = hosts.get("/")
    assert sorted(host.queues) == ["again"] and "logs" not in host.graph
    assert host.graph.bindings() == []


def test_virtual_hosts_are_isolated_namespaces(metadata):
    async def scenario() -> None:
        hosts = VirtualHosts(metadata)
        await hosts.ensure_default()
        await hosts.create("shop")
        with pytest.raises(AlreadyExists):
            await hosts.create("shop")
        await hosts.declare_queue("shop", QueueSettings("orders"))
        orders = hosts.get("shop").named("orders")
        assert hosts.route("shop", "", "orders") == [orders]
        assert hosts.route("/", "", "orders") == []
        assert named_queue("shop", "orders") != named_queue("/", "orders")
        with pytest.raises(NotFound, match="no virtual host 'nowhere'"):
            hosts.get("nowhere")
        assert await hosts.delete("shop") == [orders]
    asyncio.run(scenario())
    assert reopened(metadata).names() == [DEFAULT_VHOST]


def test_queue_declarations_follow_rabbitmq(metadata):
    async def scenario() -> None:
        hosts = VirtualHosts(metadata)
        await hosts.ensure_default()
        generated = await hosts.declare_queue("/", QueueSettings("", durable=False, owner="c1"))
        assert generated.name.startswith("amq.gen-")
        await hosts.declare_queue("/", QueueSettings("jobs", arguments={"x-max-length": 10}))
        same = await hosts.declare_queue("/", QueueSettings("jobs", arguments={"x-max-length": 10}))
        assert same.arguments == {"x-max-length": 10}
        with pytest.raises(PreconditionFailed, match="^inequivalent arg 'x-max-length' for queue "
                           "'jobs' in vhost '/': received '5' but current is '10'$"):
            await hosts.declare_queue("/", QueueSettings("jobs", arguments={"x-max-length": 5}))
        with pytest.raises(PreconditionFailed, match="arg 'durable' .* received 'false'"):
            await hosts.declare_queue("/", QueueSettings("jobs", durable=False,
                                                         arguments={"x-max-length": 10}))
        with pytest.raises(ResourceLocked):
            await hosts.declare_queue("/", QueueSettings(generated.name, durable=False, owner="c2"))
        with pytest.raises(AccessDenied):
            await hosts.declare_queue("/", QueueSettings("amq.mine"))
        with pytest.raises(NotFound):
            await hosts.declare_queue("/", QueueSettings("absent"), passive=True)
    asyncio.run(scenario())


def test_a_core_restores_its_virtual_hosts_at_start(tmp_path):
    from tests.unit.core.test_broker import run_core

    async def declare(core) -> None:
        assert core.vhosts.names() == [DEFAULT_VHOST]
        await core.vhosts.declare_queue("/", QueueSettings("kept"))

    async def check(core) -> None:
        assert "kept" in core.vhosts.get("/").queues
    run_core(tmp_path, declare, store="file")
    run_core(tmp_path, check, store="file")


def test_a_queue_declared_again_after_a_delete_is_a_new_incarnation(metadata):
    async def scenario() -> tuple[str, str]:
        hosts = VirtualHosts(metadata)
        await hosts.ensure_default()
        await hosts.declare_queue("/", QueueSettings("jobs"))
        first = await hosts.delete_queue("/", "jobs")
        await hosts.declare_queue("/", QueueSettings("jobs"))
        return first, hosts.get("/").named("jobs")
    first, second = asyncio.run(scenario())
    assert first != second
    assert reopened(metadata).get("/").named("jobs") == second


def test_a_queue_row_from_before_incarnations_keeps_its_named_queue(metadata):
    metadata.put_topology("/", "vhost", "", "{}")
    metadata.put_topology("/", "queue", "old", '{"arguments": {}, "auto_delete": false}')
    assert reopened(metadata).get("/").named("old") == named_queue("/", "old")
