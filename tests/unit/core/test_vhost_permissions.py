"""RabbitMQ's permissions in core: expressions matched anywhere in a name, '' matching nothing,
administrators allowed everything, bad expressions refused, every expression compiled by
RE2 (linear in the name), stored ones RE2 refuses denying their right; changes kept in metadata; and the
purge of a named queue, which settles what is ready and keeps what is delivered."""
from __future__ import annotations

import pytest
import re2

from core.assembly import Core
from core.errors import InvalidArgument, NotFound, UserNotFound
from core.model import SYSTEM, Principal
from core.vhost_permissions import Right, VhostPermission
from tests.unit.core.test_broker import run_core, topic
from tests.unit.core.test_fanout import subject

ANN = Principal("ann")


def test_an_expression_matches_anywhere_and_the_empty_one_matches_nothing():
    permission = VhostPermission("ann", "/", "^app\\.", "orders", "")
    assert permission.allows(Right.CONFIGURE, "app.jobs")
    assert not permission.allows(Right.CONFIGURE, "my.app.jobs")
    assert permission.allows(Right.WRITE, "eu-orders-2"), "unanchored, as RabbitMQ's re:run"
    assert not permission.allows(Right.READ, "") and not permission.allows(Right.READ, "x")


def test_a_bad_expression_is_refused_with_its_right_named():
    with pytest.raises(InvalidArgument, match="the write expression '\\(' cannot be used: it is "
                                              "not a regular expression RE2 accepts"):
        VhostPermission("ann", "/", ".*", "(", ".*")


@pytest.mark.parametrize("expression, construct", [
    ("^(a+)\\1$", "a backreference"),
    ("^(?=app)", "a lookahead"),
    ("^(?!tmp)", "a negative lookahead"),
    ("(?<=app)\\.q", "a lookbehind"),
    ("(?<!tmp)\\.q", "a negative lookbehind"),
    ("(?>a+)b", "an atomic group"),
    ("a++b", "a possessive quantifier"),
])
def test_an_expression_needing_backtracking_is_refused_naming_its_construct(expression, construct):
    with pytest.raises(InvalidArgument, match=f"the read expression .* uses {construct}.*, which "
                                              "Sluice does not run"):
        VhostPermission("ann", "/", ".*", ".*", expression)


CATASTROPHIC = "^([a-z0-9]+-?)+$"
"""Exponential in Python's backtracking ``re``: 26 letters and a ``!`` took 3.5 s."""


@pytest.mark.parametrize("length", [26, 255])
def test_a_catastrophic_expression_is_compiled_by_re2_and_decides_adversarial_names(length):
    permission = VhostPermission("ann", "/", CATASTROPHIC, CATASTROPHIC, CATASTROPHIC)
    pattern = permission.pattern(Right.READ)
    assert isinstance(pattern, re2._Regexp), "compiled by RE2, which never backtracks"
    # RE2 simulates an automaton of ``programsize`` instructions once per character: the work
    # of a match is at most programsize x len(name), whatever the name.
    assert pattern.programsize < 32
    assert not permission.allows(Right.READ, "a" * (length - 1) + "!")
    assert not permission.allows(Right.READ, "a-" * (length // 2) + "-")
    assert permission.allows(Right.READ, "a" * length)
    assert permission.allows(Right.READ, "ab-" * (length // 3))


def test_a_stored_expression_re2_refuses_denies_its_right_and_start_up_goes_on(tmp_path, caplog):
    async def stored_by_an_older_version(core: Core) -> None:
        core.broker.users.create_user("ann", "pw")
        await core.vhosts.create("shop")
        core._metadata.put_vhost_permission("ann", "shop", "^(?!amq\\.)", "^(a)\\1", "^q")

    async def restarted(core: Core) -> None:
        rights = core.vhost_permissions
        assert rights.may_open(ANN, "shop")
        assert not rights.allows(ANN, "shop", Right.CONFIGURE, "jobs")
        assert not rights.allows(ANN, "shop", Right.WRITE, "aa")
        assert rights.allows(ANN, "shop", Right.READ, "queue"), "the other rights hold"
        assert [p.as_json() for p in rights.list()][0]["configure"] == "^(?!amq\\.)", \
            "what is stored is shown as it is, for the administrator to fix"

    run_core(tmp_path, stored_by_an_older_version)
    with caplog.at_level("WARNING", logger="core.vhost_permissions"):
        run_core(tmp_path, restarted)
    warnings = [r.getMessage() for r in caplog.records if r.name == "core.vhost_permissions"]
    assert len(warnings) == 2 and "the configure right of user 'ann' on vhost 'shop' denies " \
        "everything until it is set again" in warnings[0] and "negative lookahead" in warnings[0]


def test_permissions_decide_per_vhost_and_survive_a_restart(tmp_path):
    async def first(core: Core) -> None:
        core.broker.users.create_user("ann", "pw")
        await core.vhosts.create("shop")
        admin = core.vhost_admin
        with pytest.raises(NotFound):
            await admin.permit("ann", "nowhere", ".*", ".*", ".*")
        with pytest.raises(UserNotFound):
            await admin.permit("bob", "shop", ".*", ".*", ".*")
        await admin.permit("ann", "shop", "", "", "^q")
        rights = core.vhost_permissions
        assert rights.may_open(ANN, "shop") and not rights.may_open(ANN, "/")
        assert rights.allows(ANN, "shop", Right.READ, "queue")
        assert not rights.allows(ANN, "/", Right.READ, "queue")
        assert not rights.allows(ANN, "shop", Right.CONFIGURE, "queue")
        assert rights.allows(Principal("root", admin=True), "/", Right.CONFIGURE, "anything")

    async def second(core: Core) -> None:
        rights = core.vhost_permissions
        assert [p.as_json() for p in rights.list()] == [
            {"user": "ann", "vhost": "shop", "configure": "", "write": "", "read": "^q"}]
        version = rights.version
        await core.vhost_admin.unpermit("ann", "shop")
        assert not rights.may_open(ANN, "shop") and rights.version > version
        with pytest.raises(NotFound):
            await core.vhost_admin.unpermit("ann", "shop")
        await core.vhost_admin.permit("ann", "shop", ".*", ".*", ".*")
        core.broker.users.delete_user("ann")
        assert rights.list() == [], "a deleted user's permissions go with it"
        await core.vhost_admin.delete_vhost("shop")

    run_core(tmp_path, first)
    run_core(tmp_path, second)


def test_a_purge_settles_ready_and_released_messages_and_keeps_delivered_ones(tmp_path):
    async def scenario(core: Core) -> None:
        await topic(core.broker, "work")
        queues = core.queues
        queues.bind("work/#", "q")
        await core.broker.send(SYSTEM, [subject("work", b"%d" % i, "work/x") for i in range(6)])
        held, released = queues.pop("q", 2, 60_000)
        queues.release("q", released.queue_offset)
        assert (queues.ready("q"), queues.unsettled("q")) == (5, 1)  # released: ready
        assert queues.purge("q") == 5
        assert queues.pop("q", 10, 60_000) == [] and queues.unsettled("q") == 1
        queues.release("q", held.queue_offset)
        assert [m.body for m in queues.pop("q", 10, 60_000)] == [b"0"]
        await core.broker.send(SYSTEM, [subject("work", b"later", "work/x")])
        assert [m.body for m in queues.pop("q", 10, 60_000)] == [b"later"]
        assert queues.purge("q") == 0
    run_core(tmp_path, scenario)
