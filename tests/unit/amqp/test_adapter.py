"""The AMQP adapter and front end driven through fake wires over a real core on `MemoryStore`
(see ``fake_wire.py``): login, vhosts, the topology methods and their refusals, what is not
built yet, exclusive queues, kicks, timeouts and garbage."""
from __future__ import annotations

import time

from pamqp.commands import Basic, Channel, Connection, Exchange, Queue, Tx

from protocols.amqp.frames import PROTOCOL_HEADER, encode_content
from protocols.amqp.options import AmqpOptions
from tests.unit.amqp.client import amqplain_start_ok, plain_start_ok
from tests.unit.amqp.fake_wire import ADMIN, PASSWORD, USER, Client, run

# ---------------------------------------------------------------- login and vhosts


def test_a_login_pauses_reading_until_it_is_answered_then_opens(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        client.send(PROTOCOL_HEADER)
        await client.expect(Connection.Start)
        client.send(plain_start_ok(ADMIN, PASSWORD))
        assert not client.wire.reading, "reading goes on while the login is checked"
        tune = await client.expect(Connection.Tune)
        assert client.wire.reading
        assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
        client.send_method(0, Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.send_method(0, Connection.Open("/"))
        await client.expect(Connection.OpenOk)
        [view] = frontend.clients()
        assert (view.protocol, view.user, view.client_id) == ("amqp", ADMIN, client.adapter.id)
        assert view.details["vhost"] == "/" and frontend.connected_count() == 1
    run(tmp_path, scenario)


def test_amqplain_logs_in_and_a_wrong_password_is_403(tmp_path):
    async def scenario(frontend, core):
        good = await Client(frontend).login(start_ok=amqplain_start_ok(USER, PASSWORD))
        assert isinstance(good, Connection.Tune)
        bad = Client(frontend)
        close = await bad.login(USER, "wrong")
        assert isinstance(close, Connection.Close) and close.reply_code == 403
        assert "ACCESS_REFUSED" in close.reply_text and "PLAIN" in close.reply_text
        bad.send_method(0, Connection.CloseOk())
        await bad.closed()
    run(tmp_path, scenario)


def test_a_login_that_fails_inside_core_is_refused_not_left_waiting(tmp_path, monkeypatch):
    async def scenario(frontend, core):
        async def broken(user, password):
            raise RuntimeError("metadata is gone")
        monkeypatch.setattr(core.broker, "authenticate", broken)
        close = await Client(frontend).login()
        assert isinstance(close, Connection.Close) and close.reply_code == 403
    run(tmp_path, scenario)


def test_guest_logs_in_only_from_loopback(tmp_path):
    async def scenario(frontend, core):
        core.broker.users.create_user("guest", "guest", admin=True)
        local = await Client(frontend, "127.0.0.1").login("guest", "guest")
        assert isinstance(local, Connection.Tune)
        remote = await Client(frontend, "10.1.2.3").login("guest", "guest")
        assert isinstance(remote, Connection.Close) and remote.reply_code == 403
        assert "user 'guest' can only connect via localhost" in remote.reply_text
        mapped = await Client(frontend, "::ffff:127.0.0.1").login("guest", "guest")
        assert isinstance(mapped, Connection.Tune)
    run(tmp_path, scenario)


def test_guest_is_a_user_like_any_when_guest_from_loopback_is_off(tmp_path):
    async def scenario(frontend, core):
        core.broker.users.create_user("guest", "guest")
        remote = await Client(frontend, "10.1.2.3").login("guest", "guest")
        assert isinstance(remote, Connection.Tune)
    run(tmp_path, scenario, AmqpOptions(guest_from_loopback=False))


def test_an_unknown_vhost_is_530_not_allowed(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        tune = await client.login()
        client.send_method(0, Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        close = await client.call(0, Connection.Open("nope"))
        assert close.reply_code == 530 and close.reply_text == "NOT_ALLOWED - vhost nope not found"
        client.send_method(0, Connection.CloseOk())
        await client.closed()
        assert frontend.connected_count() == 0
    run(tmp_path, scenario)


# ---------------------------------------------------------------- topology


def test_exchanges_queues_and_bindings_are_declared_in_the_vhost(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert isinstance(await client.call(1, Exchange.Declare(
            exchange="logs", exchange_type="topic", durable=True,
            arguments={"note": bytearray(b"\xff\x00")})), Exchange.DeclareOk)
        ok = await client.call(1, Queue.Declare(queue="", durable=False))
        assert ok.queue.startswith("amq.gen-") and (ok.message_count, ok.consumer_count) == (0, 0)
        assert isinstance(await client.call(1, Queue.Bind(queue=ok.queue, exchange="logs",
                                                          routing_key="a.*")), Queue.BindOk)
        assert isinstance(await client.call(1, Exchange.Bind(destination="logs",
                                                             source="amq.topic",
                                                             routing_key="#")), Exchange.BindOk)
        host = core.vhosts.get("/")
        assert host.graph.get("logs").arguments == {"note": {"$base64": "/wA="}}
        assert core.vhosts.route("/", "logs", "a.b") and core.vhosts.route("/", "amq.topic", "a.c")
        client.send_method(1, Queue.Declare(queue="quiet", nowait=True))
        assert isinstance(await client.call(1, Basic.Qos(prefetch_count=10)), Basic.QosOk)
        assert "quiet" in host.queues
        assert isinstance(await client.call(1, Queue.Unbind(queue=ok.queue, exchange="logs",
                                                            routing_key="a.*")), Queue.UnbindOk)
        assert isinstance(await client.call(1, Queue.Delete(queue="")), Queue.DeleteOk)
        assert "quiet" not in host.queues, "an empty name is the channel's last declared queue"
        assert isinstance(await client.call(1, Exchange.Delete(exchange="logs")), Exchange.DeleteOk)
        assert "logs" not in host.graph
    run(tmp_path, scenario)


async def refused(client: Client, channel: int, m) -> Channel.Close:
    """Send ``m``, expect a channel.close naming it, confirm it and reopen the channel."""
    close = await client.call(channel, m)
    assert isinstance(close, Channel.Close), close
    assert (close.class_id << 16 | close.method_id) == m.index
    client.send_method(channel, Channel.CloseOk())
    client.send_method(channel, Channel.Open())
    await client.expect(Channel.OpenOk, channel)
    return close


def test_refusals_close_the_channel_with_rabbitmqs_codes(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await client.call(1, Exchange.Declare(exchange="x", exchange_type="direct"))
        other = await refused(client, 1, Exchange.Declare(exchange="x", exchange_type="fanout"))
        assert other.reply_code == 406 and other.reply_text.startswith("PRECONDITION_FAILED - ")
        missing = await refused(client, 1, Queue.Declare(queue="none", passive=True))
        assert missing.reply_code == 404
        assert (await refused(client, 1, Queue.Bind(queue="none", exchange="x"))).reply_code == 404
        assert (await refused(client, 1, Exchange.Delete(exchange="amq.topic"))).reply_code == 403
        await client.call(1, Queue.Declare(queue="mine", exclusive=True))
        assert isinstance(await client.call(1, Queue.Declare(queue="mine", passive=True)),
                          Queue.DeclareOk), "its own connection uses it without saying exclusive"
        other_client = Client(frontend)
        await other_client.open()
        assert (await refused(other_client, 1, Queue.Declare(queue="mine"))).reply_code == 405
        assert (await refused(other_client, 1, Queue.Delete(queue="mine"))).reply_code == 405
        assert isinstance(await client.call(1, Queue.Delete(queue="mine")), Queue.DeleteOk)
    run(tmp_path, scenario)


def test_only_a_publish_names_the_default_exchange_and_amq_exchanges_stay(tmp_path):
    """RabbitMQ's answers: a declare (passive too), delete or binding naming the default
    exchange is 403, and so is deleting any `amq.` exchange, there or not."""
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        await client.call(1, Queue.Declare(queue="q"))
        for method in (Exchange.Declare(exchange="", passive=True),
                       Exchange.Declare(exchange="", exchange_type="direct", durable=True),
                       Exchange.Delete(exchange=""), Queue.Bind(queue="q", exchange=""),
                       Queue.Unbind(queue="q", exchange=""),
                       Exchange.Bind(destination="", source="amq.direct")):
            close = await refused(client, 1, method)
            assert (close.reply_code, close.reply_text) == (
                403, "ACCESS_REFUSED - operation not permitted on the default exchange"), method
        for name in ("amq.direct", "amq.nothing"):
            close = await refused(client, 1, Exchange.Delete(exchange=name))
            assert (close.reply_code, close.reply_text) == (
                403, f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '/' not "
                     "allowed")
    run(tmp_path, scenario)


def test_a_user_without_a_permission_on_the_vhost_is_refused_at_connection_open(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        tune = await client.login(USER, PASSWORD)
        client.send_method(0, Connection.TuneOk(tune.channel_max, tune.frame_max, 0))
        client.send_method(0, Connection.Open(virtual_host="/"))
        close = await client.expect(Connection.Close)
        assert close.reply_code == 530
        assert close.reply_text == f"NOT_ALLOWED - access to vhost '/' refused for user '{USER}'"
    run(tmp_path, scenario)


def test_rights_follow_the_users_expressions_and_change_at_once(tmp_path):
    async def scenario(frontend, core):
        await core.vhost_admin.permit(USER, "/", "^app\\.", "^app\\.", "")
        client = Client(frontend)
        await client.open(USER)
        assert isinstance(await client.call(1, Queue.Declare(queue="app.q")), Queue.DeclareOk)
        denied = await refused(client, 1, Queue.Declare(queue="q"))
        assert denied.reply_code == 403
        assert denied.reply_text == (f"ACCESS_REFUSED - access to queue 'q' in vhost '/' "
                                     f"refused for user '{USER}'")
        bind = await refused(client, 1, Queue.Bind(queue="app.q", exchange="amq.direct"))
        assert bind.reply_code == 403 and "exchange 'amq.direct'" in bind.reply_text, \
            "binding needs read on the exchange, and '' grants no read"
        assert (await refused(client, 1, Queue.Purge(queue="app.q"))).reply_code == 403
        assert isinstance(await client.call(1, Exchange.Declare(exchange="amq.direct",
                                                                passive=True)), Exchange.DeclareOk)
        await core.vhost_admin.permit(USER, "/", "^app\\.", "^app\\.", ".*")
        assert isinstance(await client.call(1, Queue.Bind(queue="app.q", exchange="amq.direct")),
                          Queue.BindOk)
        assert isinstance(await client.call(1, Queue.Purge(queue="app.q")), Queue.PurgeOk)
    run(tmp_path, scenario)


def test_a_publish_in_a_transaction_is_refused_when_read_not_at_commit(tmp_path):
    async def scenario(frontend, core):
        await core.vhost_admin.permit(USER, "/", "", "^app\\.", "")
        client = Client(frontend)
        await client.open(USER)
        assert isinstance(await client.call(1, Tx.Select()), Tx.SelectOk)
        client.send(encode_content(1, Basic.Publish(exchange="amq.direct", routing_key="k"),
                                   Basic.Properties(), b"x", 4096))
        close = await client.expect(Channel.Close)
        assert close.reply_code == 403 and "exchange 'amq.direct'" in close.reply_text
    run(tmp_path, scenario)


def test_a_revoked_read_cancels_consumers_and_a_cleared_permission_closes(tmp_path):
    async def scenario(frontend, core):
        await core.vhost_admin.permit(USER, "/", ".*", ".*", ".*")
        client = Client(frontend)
        await client.open(USER)
        assert isinstance(await client.call(1, Queue.Declare(queue="app.q")), Queue.DeclareOk)
        client.send_method(1, Basic.Consume(queue="app.q", consumer_tag="c1"))
        await client.expect(Basic.ConsumeOk)
        await core.vhost_admin.permit(USER, "/", ".*", ".*", "^other")
        cancel = await client.expect(Basic.Cancel)
        assert cancel.consumer_tag == "c1"
        assert frontend.consumer_count(core.vhosts.get("/").named("app.q")) == 0
        await core.vhost_admin.unpermit(USER, "/")
        close = await client.expect(Connection.Close)
        assert close.reply_code == 320
    run(tmp_path, scenario)


def test_a_server_named_queue_is_checked_under_the_name_it_got_and_not_kept(tmp_path):
    async def scenario(frontend, core):
        await core.vhost_admin.permit(USER, "/", "^app\\.", ".*", ".*")
        client = Client(frontend)
        await client.open(USER)
        denied = await refused(client, 1, Queue.Declare(queue=""))
        assert denied.reply_code == 403 and "'amq.gen-" in denied.reply_text
        assert core.vhosts.get("/").queues == {}
    run(tmp_path, scenario)


def test_a_publish_with_immediate_is_540_as_in_rabbitmq(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        client.send(encode_content(1, Basic.Publish(exchange="", routing_key="q", immediate=True),
                                   Basic.Properties(), b"hello", 4096))
        close = (await client.next())[1]
        assert close.reply_code == 540 and close.reply_text == "NOT_IMPLEMENTED - immediate=true"
    run(tmp_path, scenario)


# ---------------------------------------------------------------- connection life


def test_exclusive_queues_go_when_their_connection_closes(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        ok = await client.call(1, Queue.Declare(queue="", exclusive=True))
        await client.call(1, Queue.Declare(queue="kept", durable=True))
        host = core.vhosts.get("/")
        assert ok.queue in host.queues
        client.adapter.connection_lost()
        await frontend.settled()
        assert ok.queue not in host.queues and "kept" in host.queues
    run(tmp_path, scenario)


def test_a_kick_closes_with_320_and_the_connection_leaves_the_list(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        assert frontend.kick(client.adapter.id) and not frontend.kick("amqp-none")
        close = await client.expect(Connection.Close)
        assert close.reply_code == 320 and "closed by an administrator" in close.reply_text
        client.send_method(0, Connection.CloseOk())
        await client.closed()
        assert list(frontend.clients()) == []
    run(tmp_path, scenario)


def test_garbage_closes_only_that_connection(tmp_path):
    async def scenario(frontend, core):
        good, bad = Client(frontend), Client(frontend)
        await good.open()
        bad.send(b"GET / HTTP/1.1\r\n\r\n")
        await bad.closed()
        assert bytes(bad.wire.written) == PROTOCOL_HEADER, "the header we speak, then close"
        framed = Client(frontend)
        await framed.open()
        framed.send(b"\x01\x00\x01\x00\x00\x00\x00\x42")  # a frame-end octet that is not 0xCE
        [close] = await framed.closed()
        assert close.reply_code == 501
        assert isinstance(await good.call(1, Queue.Declare(queue="still")), Queue.DeclareOk)
    run(tmp_path, scenario)


def test_a_slow_handshake_is_closed_by_the_timeout_check(tmp_path):
    async def scenario(frontend, core):
        client = Client(frontend)
        client.send(PROTOCOL_HEADER)
        await client.expect(Connection.Start)
        client.adapter.check_timeouts(time.monotonic() + 11)
        await client.closed()
    run(tmp_path, scenario)


def test_connections_beyond_max_connections_are_closed_at_once(tmp_path):
    async def scenario(frontend, core):
        first, second = Client(frontend), Client(frontend)
        assert not first.wire.closed and second.wire.closed
    run(tmp_path, scenario, AmqpOptions(max_connections=1))


def test_a_queue_of_a_deleted_vhost_answers_404_not_a_crash(tmp_path):
    async def scenario(frontend, core):
        await core.vhosts.create("v")
        client = Client(frontend)
        await client.open(vhost="v")
        await core.vhosts.delete("v")
        close = await refused(client, 1, Queue.Declare(queue="q"))
        assert close.reply_code == 404
    run(tmp_path, scenario)


def test_one_line_per_connection_closed_for_an_error(tmp_path, caplog):
    async def scenario(frontend, core):
        client = Client(frontend)
        await client.open()
        client.send(b"\x01\x00\x01\x00\x00\x00\x00\x42")
        await client.closed()
        quiet = Client(frontend)
        await quiet.open()
        quiet.send_method(0, Connection.Close(200, "bye", 0, 0))
        await quiet.closed()
    caplog.set_level("INFO")
    run(tmp_path, scenario)
    closed = [r.getMessage() for r in caplog.records if "closed: FRAME_ERROR" in r.getMessage()]
    assert len(closed) == 1 and "AMQP connection amqp-" in closed[0]
    gone = [r.getMessage() for r in caplog.records if "disconnected" in r.getMessage()]
    assert len(gone) == 2 and "closed by the client" in gone[1]
