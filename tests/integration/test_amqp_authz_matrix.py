"""The authorization matrix of AMQP 0-9-1: every operation × {admin, owner, publisher, other
user, no rights, anonymous}, with pika against a `sluice serve` process, on virtual host
``m-vhost``.

The roles' permissions are RabbitMQ's (configure / write / read expressions): the owner has
``^m-`` for all three, the publisher ``^m-`` for write only, the other user ``^o-`` for all
three, and the user with no rights has no permission on the virtual host (530 at
connection.open). No role has a topic grant: a publish into an exchange is decided by the
virtual host's write permission alone, as in RabbitMQ. AMQP has no anonymous login: an empty user name and password are
refused at login (403), even with anonymous access on for the other protocols.

The broker tiers its 1 MiB segments to a local directory and deletes them locally a second
later: the history of stream queues ``m-stream`` and ``o-stream`` is read from the tier, with
the same rights as local messages.

Refused means 403 ACCESS_REFUSED on the channel, 530 NOT_ALLOWED at connection.open, or the
login refused; allowed means anything else. The expected cells are written out, not derived from the rules.

Access rules on subjects hold for AMQP readers too: with a rule denying ``rules/secret/#`` to
everyone and one denying ``rules/hidden/#`` to the owner, a queue bound to ``amq.topic`` with
``rules.#`` (declared and bound by the admin, read by each role) is a row per subject and way
of reading (basic.consume, basic.get, a stream queue): the admin gets every subject, the owner
only ``rules/open/...``, the others nothing.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pika
import pika.exceptions
import pytest

from tests.conftest import Server
from tests.integration.amqp.conftest import parameters
from tests.integration.test_admin_api import Http
from tests.integration.tier_world import TierTarget, tier_config, wait_history_tiered

ROLES = ("admin", "owner", "publisher", "other", "none", "anonymous")
PASSWORD = "pw"
VHOST = "m-vhost"
RIGHTS = {  # role -> (configure, write, read) on m-vhost; "none" has no permission there
    "owner": ("^m-", "^m-", "^m-"),
    "publisher": ("", "^m-", ""),
    "other": ("^o-", "^o-", "^o-"),
}
MESSAGES = 3
"""Messages the fixture leaves in m-queue and o-queue."""


def allowed(*roles: str) -> dict[str, bool]:
    return {role: role in roles for role in ROLES}


@dataclass
class World:
    server: Server
    admin: Http
    counter: Iterator[int]
    read: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    """(reader, role) -> the bodies that role read from its queue bound to amq.topic"""

    def connect(self, role: str) -> pika.BlockingConnection:
        user, password = {"admin": ("sluice", "sluice"), "anonymous": ("", "")}.get(
            role, (role, PASSWORD))
        return pika.BlockingConnection(parameters(self.server, user, password, VHOST))


TIERED = {"m-stream": b"m-stream tiered", "o-stream": b"o-stream tiered"}
"""Stream queues whose history the fixture pushes out to the tier: name -> their first body."""


def fill_tiered_streams(world: World, data_dir) -> None:
    """As the admin: declare the ``TIERED`` streams and fill them past a 1 MiB segment, then
    wait until that segment is tiered and deleted locally."""
    with world.connect("admin") as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for name, first in TIERED.items():
            channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            channel.basic_publish("", name, first)
            for _ in range(70):
                channel.basic_publish("", name, bytes(8192))
    wait_history_tiered(world.server, data_dir, at_least=1)


def reads_tiered_stream(name: str) -> Callable[[str, World], bool]:
    """Consume stream ``name`` from the first offset (now in the tier): allowed only if its
    first message comes, intact."""
    def action(channel, _: str) -> None:
        channel.basic_qos(prefetch_count=10)
        for method, _, body in channel.consume(name, arguments={"x-stream-offset": "first"},
                                               inactivity_timeout=30):
            assert body == TIERED[name], body
            channel.basic_ack(method.delivery_tag)
            break
    return on_channel(action)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("amqp-matrix")
    server = Server(folder / "data", "--allow-anonymous",
                    config=tier_config(TierTarget(f"file://{folder / 'tier'}")))
    try:
        server.wait_ready()
        admin = Http(f"http://{server.admin}" if "://" not in server.admin else server.admin)
        assert admin("POST", "/vhosts", {"name": VHOST})[0] == 201
        for role in ("owner", "publisher", "other", "none"):
            assert admin("POST", "/users", {"name": role, "password": PASSWORD})[0] == 201
            if role in RIGHTS:
                configure, write, read = RIGHTS[role]
                body = {"configure": configure, "write": write, "read": read}
                assert admin("PUT", f"/vhosts/{VHOST}/permissions/{role}", body)[0] == 200
        world = World(server, admin, itertools.count())
        fill_tiered_streams(world, folder / "data")
        with world.connect("admin") as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for name in ("m-exchange", "m-exchange-2", "o-exchange"):
                channel.exchange_declare(name, "direct", durable=True)
            for name in ("m-queue", "o-queue"):
                channel.queue_declare(name, durable=True)
                for n in range(MESSAGES):
                    channel.basic_publish("", name, b"%s %d" % (name.encode(), n))
        for user, pattern in (("*", "rules/secret/#"), ("owner", "rules/hidden/#")):
            rule = {"user": user, "pattern": pattern, "actions": ["subscribe"], "effect": "deny"}
            assert admin("POST", "/acl", rule)[0] == 201
        yield world
    finally:
        server.kill()


# ------------------------------------------------------------------------------ operations

def on_channel(action: Callable[[pika.adapters.blocking_connection.BlockingChannel, str], None],
               fresh: str | None = None) -> Callable[[str, World], bool]:
    """An operation: connect as the role, open a channel, run ``action`` (given the name of a
    fresh exchange or queue the admin made for this call when ``fresh`` says which)."""
    def op(role: str, world: World) -> bool:
        name = f"m-fresh-{next(world.counter)}"
        if fresh is not None:
            with world.connect("admin") as connection:
                channel = connection.channel()
                if fresh == "exchange":
                    channel.exchange_declare(name, "fanout")
                else:
                    channel.queue_declare(name)
        try:
            connection = world.connect(role)
        except pika.exceptions.ProbableAuthenticationError:
            assert role == "anonymous"
            return False
        except pika.exceptions.ProbableAccessDeniedError as refused:
            assert "530" in str(refused) or "NOT_ALLOWED" in str(refused), refused
            return False
        except pika.exceptions.ConnectionClosedByBroker as refused:
            assert refused.reply_code == 530, refused
            return False
        try:
            action(connection.channel(), name)
            return True
        except pika.exceptions.ChannelClosedByBroker as refused:
            assert refused.reply_code == 403, refused
            assert refused.reply_text.startswith("ACCESS_REFUSED - access to "), refused
            return False
        finally:
            if connection.is_open:
                connection.close()
    return op


def publish(exchange: str) -> Callable[[str, World], bool]:
    def action(channel, _: str) -> None:
        channel.confirm_delivery()
        channel.basic_publish(exchange, "nowhere", b"x")
    return on_channel(action)


def get(queue: str) -> Callable[[str, World], bool]:
    return on_channel(lambda channel, _: channel.basic_get(queue, auto_ack=False))


def consume(queue: str) -> Callable[[str, World], bool]:
    return on_channel(lambda channel, _: channel.basic_consume(queue, lambda *a: None))


def purge(queue: str) -> Callable[[str, World], bool]:
    return on_channel(lambda channel, _: channel.queue_purge(queue))


@dataclass(frozen=True)
class Operation:
    name: str
    run: Callable[[str, World], bool]
    expect: dict[str, bool]


# ------------------------------------------------------------------------------ access rules

SUBJECT_KINDS = ("secret", "hidden", "open")
"""rules/secret/... is denied to everyone, rules/hidden/... to the owner, rules/open/... to no
one; each message's body is its kind."""
END = "end"


def fill_rules_queue(world: World, queue: str, arguments: dict | None = None) -> None:
    """As the admin: declare ``queue``, bind it to amq.topic with ``rules.#`` and publish one
    message of each kind, then an end marker, to amq.topic."""
    with world.connect("admin") as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments=arguments)
        channel.queue_bind(queue, "amq.topic", "rules.#")
        channel.confirm_delivery()
        for kind in (*SUBJECT_KINDS, END):
            channel.basic_publish("amq.topic", f"rules.{'open' if kind == END else kind}.x",
                                  kind.encode())


def read_consume(channel, queue: str) -> set[str]:
    bodies: set[str] = set()
    for _, _, body in channel.consume(queue, auto_ack=True, inactivity_timeout=10):
        assert body is not None, f"{END} never came; got {bodies}"
        bodies.add(body.decode())
        if body == END.encode():
            return bodies
    return bodies


def read_get(channel, queue: str) -> set[str]:
    bodies: set[str] = set()
    while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
        bodies.add(got[2].decode())
    return bodies


def read_stream(channel, queue: str) -> set[str]:
    channel.basic_qos(prefetch_count=100)
    bodies: set[str] = set()
    for method, _, body in channel.consume(queue, arguments={"x-stream-offset": "first"},
                                           inactivity_timeout=10):
        assert body is not None, f"{END} never came; got {bodies}"
        channel.basic_ack(method.delivery_tag)
        bodies.add(body.decode())
        if body == END.encode():
            return bodies
    return bodies


RULE_READERS = {  # name -> (how to read, the queue's declare arguments)
    "basic.consume": (read_consume, None),
    "basic.get": (read_get, None),
    "stream queue consume": (read_stream, {"x-queue-type": "stream"}),
}


def reads_rules_queue(reader: str, kind: str) -> Callable[[str, World], bool]:
    """An operation: whether the role, reading its own queue bound to amq.topic with
    ``rules.#``, gets the message of ``kind``. Each reader runs once per role."""
    read, arguments = RULE_READERS[reader]

    def op(role: str, world: World) -> bool:
        if (reader, role) not in world.read:
            queue = f"m-rules-{reader.replace(' ', '-').replace('.', '-')}-{role}"
            fill_rules_queue(world, queue, arguments)
            got: set[str] = set()
            world.read[(reader, role)] = got
            on_channel(lambda channel, _: got.update(read(channel, queue)))(role, world)
        return kind in world.read[(reader, role)]
    return op


RULE_ROWS = [
    Operation(f"{reader} of a queue bound to amq.topic gets a subject {what}",
              reads_rules_queue(reader, kind), expect)
    for reader in RULE_READERS
    for kind, what, expect in (
        ("secret", "a rule denies everyone", allowed("admin")),
        ("hidden", "a rule denies the owner", allowed("admin")),
        ("open", "no rule denies", allowed("admin", "owner")))
]


TABLE = [
    Operation("connection.open", on_channel(lambda channel, _: None),
              allowed("admin", "owner", "publisher", "other")),
    Operation("exchange.declare", on_channel(
        lambda channel, name: channel.exchange_declare(name, "topic")), allowed("admin", "owner")),
    Operation("exchange.declare passive", on_channel(
        lambda channel, _: channel.exchange_declare("m-exchange", passive=True)),
        allowed("admin", "owner", "publisher", "other")),
    Operation("exchange.delete", on_channel(
        lambda channel, name: channel.exchange_delete(name), fresh="exchange"),
        allowed("admin", "owner")),
    Operation("exchange.bind (write on destination, read on source)", on_channel(
        lambda channel, _: channel.exchange_bind("m-exchange-2", "m-exchange", "k")),
        allowed("admin", "owner")),
    Operation("queue.declare", on_channel(lambda channel, name: channel.queue_declare(name)),
              allowed("admin", "owner")),
    Operation("queue.declare of another user's name", on_channel(
        lambda channel, _: channel.queue_declare("o-queue", durable=True)),
        allowed("admin", "other")),
    Operation("queue.declare passive", on_channel(
        lambda channel, _: channel.queue_declare("m-queue", passive=True)),
        allowed("admin", "owner", "publisher", "other")),
    Operation("queue.delete", on_channel(
        lambda channel, name: channel.queue_delete(name), fresh="queue"),
        allowed("admin", "owner")),
    Operation("queue.bind (write on queue, read on exchange)", on_channel(
        lambda channel, _: channel.queue_bind("m-queue", "m-exchange", "k")),
        allowed("admin", "owner")),
    Operation("queue.bind from another user's exchange", on_channel(
        lambda channel, _: channel.queue_bind("m-queue", "o-exchange", "k")), allowed("admin")),
    Operation("basic.publish", publish("m-exchange"), allowed("admin", "owner", "publisher")),
    Operation("basic.publish to the default exchange", publish(""), allowed("admin")),
    Operation("basic.publish to another user's exchange", publish("o-exchange"),
              allowed("admin", "other")),
    Operation("basic.get", get("m-queue"), allowed("admin", "owner")),
    Operation("basic.get from another user's queue", get("o-queue"), allowed("admin", "other")),
    Operation("basic.consume", consume("m-queue"), allowed("admin", "owner")),
    Operation("basic.consume on another user's queue", consume("o-queue"),
              allowed("admin", "other")),
    Operation("stream consume of tiered history", reads_tiered_stream("m-stream"),
              allowed("admin", "owner")),
    Operation("stream consume of another user's tiered history", reads_tiered_stream("o-stream"),
              allowed("admin", "other")),
    Operation("queue.purge", purge("m-fresh-purge"), allowed("admin", "owner")),
    Operation("queue.purge of another user's queue", purge("o-queue"), allowed("admin", "other")),
    *RULE_ROWS,
]
"""The default exchange is checked as ``amq.default``, which no role's expression matches."""


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("operation", TABLE, ids=lambda o: o.name)
def test_matrix(world, operation, role):
    if "purge" in operation.name and "another" not in operation.name:
        with world.connect("admin") as connection:
            connection.channel().queue_declare("m-fresh-purge")
    assert operation.run(role, world) is operation.expect[role], (operation.name, role)


def test_the_table_covers_every_role():
    assert all(set(o.expect) == set(ROLES) for o in TABLE)


def test_a_user_with_few_rights_neither_reads_nor_purges_another_users_queue(world):
    with world.connect("admin") as connection:
        channel = connection.channel()
        channel.queue_declare("o-secret", durable=True)
        channel.confirm_delivery()
        for n in range(MESSAGES):
            channel.basic_publish("", "o-secret", b"secret %d" % n)
    for role in ("owner", "publisher", "none", "anonymous"):
        for attempt in (get("o-secret"), consume("o-secret"), purge("o-secret")):
            assert attempt(role, world) is False, role
    queue = world.admin("GET", f"/queues/{VHOST}/o-secret")[1]
    assert (queue["messages_ready"], queue["messages_unacknowledged"]) == (MESSAGES, 0)
    with world.connect("other") as connection:
        assert connection.channel().queue_purge("o-secret").method.message_count == MESSAGES


def _queue_counts(world: World, queue: str) -> tuple[int, int]:
    shown = world.admin("GET", f"/queues/{VHOST}/{queue}")[1]
    return shown["messages_ready"], shown["messages_unacknowledged"]


def _next_body(messages) -> str:
    _, _, body = next(messages)
    assert body is not None, "no message came"
    return body.decode()


def test_denied_messages_are_dropped_from_the_readers_queue_counted_and_never_block_it(world):
    """A denied message at the head of a queue read with prefetch 1 and manual acks neither
    reaches the reader nor holds up what follows; it leaves the queue (not requeued, not
    dead-lettered) and is counted in ``sluice_messages_withheld``."""
    queue = "m-rules-dropped"
    with world.connect("admin") as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "amq.topic", "rules.#")
        channel.confirm_delivery()
        for key, body in (("rules.secret.1", b"secret-1"), ("rules.open.1", b"open-1"),
                          ("rules.hidden.1", b"hidden-1"), ("rules.open.2", b"open-2")):
            channel.basic_publish("amq.topic", key, body)
    with world.connect("owner") as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=1)
        messages = channel.consume(queue, inactivity_timeout=10)
        got = []
        for _ in range(2):
            method, _, body = next(messages)
            assert body is not None, f"only {got} came"
            got.append(body.decode())
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
        assert got == ["open-1", "open-2"]
    assert _queue_counts(world, queue) == (0, 0)
    metrics = world.admin("GET", "/metrics")[1]
    withheld = [line for line in metrics.splitlines()
                if line.startswith("sluice_messages_withheld_total{")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in withheld) >= 2, withheld


def test_a_rule_added_while_a_consumer_waits_applies_to_its_next_delivery(world):
    queue = "m-rules-late"
    with world.connect("admin") as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "amq.topic", "rules.late.#")
    rule = {"user": "owner", "pattern": "rules/late/denied/#", "actions": ["subscribe"],
            "effect": "deny"}
    with world.connect("owner") as reader, world.connect("admin") as writer:
        messages = reader.channel().consume(queue, auto_ack=True, inactivity_timeout=10)
        publisher = writer.channel()
        publisher.confirm_delivery()
        publisher.basic_publish("amq.topic", "rules.late.denied", b"before the rule")
        assert _next_body(messages) == "before the rule"
        assert world.admin("POST", "/acl", rule)[0] == 201
        publisher.basic_publish("amq.topic", "rules.late.denied", b"under the rule")
        publisher.basic_publish("amq.topic", "rules.late.open", b"sibling")
        assert _next_body(messages) == "sibling"
        assert world.admin("DELETE", "/acl?user=owner&pattern=rules/late/denied/%23"
                                     "&effect=deny")[0] == 204
        publisher.basic_publish("amq.topic", "rules.late.denied", b"after the rule")
        assert _next_body(messages) == "after the rule"


def test_binding_amq_topic_with_a_key_a_rule_denies_whole_is_refused(world):
    """The binding is checked at bind time against the rules that cover the whole key (what
    it would read is all denied); one broader than the rule is allowed and filtered per
    message (above)."""
    assert world.admin("PUT", f"/vhosts/{VHOST}/permissions/owner",
                       {"configure": "^m-", "write": "^m-", "read": "^(m-|amq\\.topic$)"})[0] == 200
    assert world.admin("POST", "/users/owner/permissions",
                       {"kind": "topic", "pattern": "rules", "actions": ["subscribe"]})[0] in (200, 201)
    try:
        with world.connect("owner") as connection:
            channel = connection.channel()
            channel.queue_declare("m-rules-bind", durable=True)
            channel.queue_bind("m-rules-bind", "amq.topic", "rules.#")  # broader: allowed
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
                channel.queue_bind("m-rules-bind", "amq.topic", "rules.secret.#")
            assert refused.value.reply_code == 403
    finally:
        configure, write, read = RIGHTS["owner"]
        world.admin("PUT", f"/vhosts/{VHOST}/permissions/owner",
                    {"configure": configure, "write": write, "read": read})
        world.admin("DELETE", "/users/owner/permissions?kind=topic&pattern=rules")
