"""The replication port over TLS (a certificate configured, ``cluster.tls`` on): followers and
relays verify the leader against the certificate itself or ``tls.client_ca`` and get the log
and relayed bytes; one that does not trust the leader's certificate gets nothing."""
from __future__ import annotations

import asyncio
import ssl

import pytest

from protocols.tls import ServerTls, TlsConfig, peer_context
from sluice.cli.dev_cert import write_dev_certs
from sluice.cluster.relay import Relay, RelayIngress
from sluice.cluster.replication import LogFollower, LogShipper
from tests.cluster.test_relay import EchoListener
from tests.cluster.test_replication import (SECRET, WAIT, bodies, confirmed, durable,  # noqa: F401
                                           nodes, publish)


@pytest.mark.parametrize("trust", ["client_ca", "the certificate itself"])
def test_a_follower_replicates_over_tls_verifying_the_leader(nodes, tmp_path, trust):
    certs = write_dev_certs(tmp_path / "certs")
    config = TlsConfig(certs.cert, certs.key, certs.ca if trust == "client_ca" else None)
    n1, n2, _ = nodes

    async def scenario():
        shipper = LogShipper(n1.store, n1.epochs, 2, SECRET, "n1", lambda: ["n1", "n2"],
                             tls=ServerTls(config).context())
        port = await shipper.start("127.0.0.1", 0)
        end = publish(n1.store, 100)
        await durable(n1.store, end)
        follower = LogFollower(n2.store, n2.epochs, "n2", SECRET, tls=peer_context(config))
        task = asyncio.ensure_future(follower.follow("127.0.0.1", port))
        await confirmed(shipper, end)
        await confirmed(follower, end)  # the next heartbeat tells the follower
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await shipper.close()
        for node in (n1, n2):  # both dispatch what is confirmed, in the background
            assert await asyncio.to_thread(node.store.wait_visible, end, WAIT)
        assert bodies(n2.store, 1) == bodies(n1.store, 1)
    asyncio.run(scenario())


def test_a_follower_or_relay_that_does_not_trust_the_leader_gets_nothing(nodes, tmp_path):
    certs = write_dev_certs(tmp_path / "certs")
    stranger = write_dev_certs(tmp_path / "stranger")
    n1, n2, _ = nodes

    async def scenario():
        listener = EchoListener()
        shipper = LogShipper(n1.store, n1.epochs, 2, SECRET, "n1", lambda: ["n1"],
                             relays=RelayIngress({"mqtt": ("127.0.0.1", await listener.start())}),
                             tls=ServerTls(TlsConfig(certs.cert, certs.key)).context())
        port = await shipper.start("127.0.0.1", 0)
        await durable(n1.store, publish(n1.store, 10))
        follower = LogFollower(n2.store, n2.epochs, "n2", SECRET,
                               tls=peer_context(TlsConfig(stranger.cert, stranger.key)))
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.wait_for(follower.follow("127.0.0.1", port), WAIT)
        trusted = Relay("mqtt", "n2", SECRET, tls=ServerTls(TlsConfig(certs.cert, certs.key)).peer)
        relay_port = await trusted.start("127.0.0.1", 0)
        await trusted.retarget(("127.0.0.1", port))
        reader, writer = await asyncio.open_connection("127.0.0.1", relay_port)
        writer.write(b"through tls")
        assert await asyncio.wait_for(reader.readexactly(11), WAIT) == b"through tls"
        writer.close()
        await trusted.close()
        await shipper.close()
        listener.server.close()
    asyncio.run(scenario())
    assert n2.store.appended_end == 0
