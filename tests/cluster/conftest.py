"""Cluster tests start real etcd (Debian's etcd-server; with CI set a missing etcd fails the
tests rather than skipping them)."""
from __future__ import annotations

import os
import socket

import pytest

from sluice.cluster.local_etcd import INSTALL_HINT, LocalEtcd, find_etcd


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture
def etcd(tmp_path):
    """A fresh one-member etcd on 127.0.0.1."""
    if find_etcd() is None:
        if os.environ.get("CI"):
            pytest.fail(f"etcd is not installed; {INSTALL_HINT}")
        pytest.skip(f"etcd is not installed; {INSTALL_HINT}")
    client, peer = free_ports(2)
    with LocalEtcd(tmp_path / "etcd", client, peer) as server:
        yield server
