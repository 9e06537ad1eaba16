"""Cluster tests start real etcd (Debian's etcd-server; with CI set a missing etcd fails the
tests rather than skipping them)."""
from __future__ import annotations

import os

import pytest

from bench.processes import free_ports
from sluice.cluster.local_etcd import INSTALL_HINT, LocalEtcd, find_etcd


@pytest.fixture
def etcd_installed() -> None:
    """Skip (fail under CI) when etcd is not installed."""
    if find_etcd() is None:
        if os.environ.get("CI"):
            pytest.fail(f"etcd is not installed; {INSTALL_HINT}")
        pytest.skip(f"etcd is not installed; {INSTALL_HINT}")


@pytest.fixture
def etcd(tmp_path, etcd_installed):
    """A fresh one-member etcd on 127.0.0.1."""
    client, peer = free_ports(2)
    with LocalEtcd(tmp_path / "etcd", client, peer) as server:
        yield server
