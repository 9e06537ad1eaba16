"""Interop: RabbitMQ's permissions, the same pika script against a throwaway RabbitMQ node
(users set with ``rabbitmqctl``) and against Sluice (``sluice vhost permit``), comparing what
the client observes: which operations pass and the reply codes and texts of those refused."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions as errors
import pytest

from bench import rabbitmq as rabbitmq_starter
from bench.processes import ServerUnavailable
from tests.conftest import Server
from tests.integration.test_admin_api import Http

USERS = {"ann": ("^m-", "^m-", ""), "cy": ("", "", "^m-"), "bob": None}
"""user -> (configure, write, read) on /, or None: no permission."""
PASSWORD = "pw"

Connect = Callable[[str], pika.BlockingConnection]


def _connector(port: int) -> Connect:
    def connect(user: str) -> pika.BlockingConnection:
        password = "guest" if user == "guest" else PASSWORD
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, "/", pika.PlainCredentials(user, password),
            connection_attempts=1, socket_timeout=10))
    return connect


@pytest.fixture(scope="module")
def rabbitmq(tmp_path_factory) -> Iterator[Connect]:
    if rabbitmq_starter.find_server() is None:
        reason = f"rabbitmq-server is not installed; {rabbitmq_starter.INSTALL_HINT}"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    try:
        with rabbitmq_starter.throwaway_node(tmp_path_factory.mktemp("rabbitmq"),
                                             lambda line: None, prefix="perms") as node:
            for user, rights in USERS.items():
                node.ctl("add_user", user, PASSWORD)
                if rights is not None:
                    node.ctl("set_permissions", "-p", "/", user, *rights)
            yield _connector(node.amqp_port)
    except ServerUnavailable as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def sluice(tmp_path_factory) -> Iterator[Connect]:
    server = Server(Path(tmp_path_factory.mktemp("sluice-perms")) / "data")
    try:
        server.wait_ready()
        admin = Http(server.admin)
        for user, rights in USERS.items():
            assert admin("POST", "/users", {"name": user, "password": PASSWORD})[0] == 201
            grant = {"kind": "topic", "pattern": "amqp.*", "actions": ["publish"]}
            assert admin("POST", f"/users/{user}/permissions", grant)[0] == 201
            if rights is not None:
                body = dict(zip(("configure", "write", "read"), rights))
                assert admin("PUT", f"/vhosts/%2F/permissions/{user}", body)[0] == 200
        yield _connector(int(server.amqp.rpartition(":")[2]))
    finally:
        server.kill()


OPERATIONS: list[tuple[str, str, Callable[[Any], Any]]] = [
    ("ann", "declare m-q", lambda ch: ch.queue_declare("m-q")),
    ("ann", "declare q", lambda ch: ch.queue_declare("q")),
    ("ann", "declare server-named", lambda ch: ch.queue_declare("")),
    ("ann", "declare with a dead-letter exchange",
     lambda ch: ch.queue_declare("m-dl", arguments={"x-dead-letter-exchange": "m-dlx"})),
    ("ann", "declare m-q passively", lambda ch: ch.queue_declare("m-q", passive=True)),
    ("ann", "declare exchange m-x", lambda ch: ch.exchange_declare("m-x", "fanout")),
    ("ann", "bind m-q to m-x", lambda ch: ch.queue_bind("m-q", "m-x")),
    ("ann", "publish to m-x", lambda ch: ch.basic_publish("m-x", "", b"x")),
    ("ann", "publish to the default exchange", lambda ch: ch.basic_publish("", "m-q", b"x")),
    ("ann", "get from m-q", lambda ch: ch.basic_get("m-q")),
    ("ann", "consume m-q", lambda ch: ch.basic_consume("m-q", lambda *a: None)),
    ("ann", "purge m-q", lambda ch: ch.queue_purge("m-q")),
    ("cy", "bind m-q to m-x", lambda ch: ch.queue_bind("m-q", "m-x")),
    ("cy", "get from m-q", lambda ch: ch.basic_get("m-q")),
    ("cy", "purge m-q", lambda ch: ch.queue_purge("m-q")),
    ("cy", "delete m-q", lambda ch: ch.queue_delete("m-q")),
    ("ann", "delete exchange m-x", lambda ch: ch.exchange_delete("m-x")),
    ("ann", "delete m-q", lambda ch: ch.queue_delete("m-q")),
]
"""Run in order on one broker; ann may configure and write ``^m-``, cy may read ``^m-``."""

EXPECTED = {
    "bob opens /": "530 NOT_ALLOWED - access to vhost '/' refused for user 'bob'",
    "ann declare m-q": "ok",
    "ann declare q": "403 ACCESS_REFUSED - access to queue 'q' in vhost '/' refused for user "
                     "'ann'",
    "ann declare server-named": "403 ACCESS_REFUSED - access to queue 'amq.gen-*' in vhost '/' "
                                "refused for user 'ann'",
    "ann declare with a dead-letter exchange": "403 ACCESS_REFUSED - access to queue 'm-dl' in "
                                               "vhost '/' refused for user 'ann'",
    "ann declare m-q passively": "ok",
    "ann declare exchange m-x": "ok",
    "ann bind m-q to m-x": "403 ACCESS_REFUSED - access to exchange 'm-x' in vhost '/' refused "
                           "for user 'ann'",
    "ann publish to m-x": "ok",
    "ann publish to the default exchange": "403 ACCESS_REFUSED - access to exchange "
                                           "'amq.default' in vhost '/' refused for user 'ann'",
    "ann get from m-q": "403 ACCESS_REFUSED - access to queue 'm-q' in vhost '/' refused for "
                        "user 'ann'",
    "ann consume m-q": "403 ACCESS_REFUSED - access to queue 'm-q' in vhost '/' refused for "
                       "user 'ann'",
    "ann purge m-q": "403 ACCESS_REFUSED - access to queue 'm-q' in vhost '/' refused for user "
                     "'ann'",
    "cy bind m-q to m-x": "403 ACCESS_REFUSED - access to queue 'm-q' in vhost '/' refused for "
                          "user 'cy'",
    "cy get from m-q": "ok",
    "cy purge m-q": "ok",
    "cy delete m-q": "403 ACCESS_REFUSED - access to queue 'm-q' in vhost '/' refused for user "
                     "'cy'",
    "ann delete exchange m-x": "ok",
    "ann delete m-q": "ok",
}


def observe(connect: Connect) -> dict[str, str]:
    """What the script sees on one broker: 'ok', or the reply code and text of a refusal."""
    seen: dict[str, str] = {}
    try:
        connect("bob").close()
        seen["bob opens /"] = "ok"
    except errors.ProbableAccessDeniedError as refused:
        seen["bob opens /"] = re.sub(r'^ConnectionClosedByBroker: \((\d+)\) "(.*)"$', r"\1 \2",
                                     str(refused))
    connections = {user: connect(user) for user in ("ann", "cy")}
    try:
        for user, name, operation in OPERATIONS:
            channel = connections[user].channel()
            channel.confirm_delivery()
            try:
                operation(channel)
                seen[f"{user} {name}"] = "ok"
                channel.close()
            except errors.ChannelClosedByBroker as refused:
                text = re.sub(r"amq\.gen-[\w-]+", "amq.gen-*", refused.reply_text)
                seen[f"{user} {name}"] = f"{refused.reply_code} {text}"
    finally:
        for connection in connections.values():
            connection.close()
    return seen


@pytest.mark.parametrize("broker", ["rabbitmq", "sluice"])
def test_the_same_script_sees_the_same_permissions(request, broker):
    assert observe(request.getfixturevalue(broker)) == EXPECTED
