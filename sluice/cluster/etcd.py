"""What the coordinator needs from etcd v3, on aetcd's generated gRPC stubs: leases, gets and
transactions that report revisions (aetcd's own wrappers drop them), and watches.

Several endpoints become one gRPC channel balanced round robin over them, so a dead etcd member
is skipped without the caller noticing (the target form aetcd's own tests use with 3.4).
"""
from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import grpc
from aetcd import rpc

DEFAULT_PORT = 2379


class EtcdUnavailable(Exception):
    """etcd did not answer (down, partitioned, no quorum): nothing was decided."""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


def channel_target(urls: Sequence[str]) -> str:
    """The gRPC target for etcd client ``urls`` (``http://host:port``; the scheme may be left out)."""
    addresses = []
    for url in urls:
        parts = urlsplit(url if "//" in url else f"//{url}")
        if parts.scheme not in ("", "http") or not parts.hostname:
            raise ValueError(f"etcd endpoint {url!r}: give http://HOST:PORT (TLS to etcd is not supported)")
        addresses.append((parts.hostname, parts.port or DEFAULT_PORT))
    if not addresses:
        raise ValueError("no etcd endpoint given")
    if len(addresses) == 1:
        host, port = addresses[0]
        return f"{host}:{port}"
    for host, _ in addresses:
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"etcd endpoint {host!r}: several endpoints must be IPv4 addresses "
                             "(or give one name that resolves to every member)") from None
    return "ipv4:" + ",".join(f"{host}:{port}" for host, port in addresses)


# -- transaction parts ------------------------------------------------------------------------

def _compare(key: bytes, target: int, field: str, value: int | bytes) -> rpc.Compare:
    compare = rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=target)
    setattr(compare, field, value)
    return compare


def created_at(key: bytes, revision: int) -> rpc.Compare:
    """``key`` was created at ``revision`` (0: ``key`` does not exist)."""
    return _compare(key, rpc.Compare.CREATE, "create_revision", revision)


def modified_at(key: bytes, revision: int) -> rpc.Compare:
    """``key`` was last written at ``revision`` (0: ``key`` does not exist)."""
    return _compare(key, rpc.Compare.MOD, "mod_revision", revision)


def held_by(key: bytes, lease: int) -> rpc.Compare:
    """``key`` is attached to ``lease``."""
    return _compare(key, rpc.Compare.LEASE, "lease", lease)


def put(key: bytes, value: bytes, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def get(key: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def delete(key: bytes) -> rpc.RequestOp:
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=key))


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    """The store's revision after the transaction: a key it created has this create revision."""
    found: list[KeyValue]
    """The keys its ``get`` operations found, in order."""


# -- the client -------------------------------------------------------------------------------

class Etcd:
    """One channel to an etcd cluster; every call gives up after ``timeout_s``."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 2.0) -> None:
        self.target = channel_target(urls)
        self.timeout_s = timeout_s
        self._channel = rpc.insecure_channel(self.target, options=[("grpc.lb_policy_name", "round_robin")])
        self._kv = rpc.KVStub(self._channel)
        self._lease = rpc.LeaseStub(self._channel)
        self._watch = rpc.WatchStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (its id, the TTL etcd granted)."""
        reply = await self._call(self._lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s))
        return reply.ID, reply.TTL

    async def keep_alive(self, lease: int, timeout_s: float | None = None) -> int:
        """Renew ``lease``; the TTL it has now (0 or less: it expired, whatever was bound is gone)."""
        async def renew() -> int:
            async for reply in self._lease.LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=lease)]),
                                                          timeout=timeout_s or self.timeout_s):
                return reply.TTL
            return 0
        return await self._call(renew())

    async def revoke(self, lease: int) -> None:
        await self._call(self._lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=self.timeout_s))

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """``key`` (None if absent) and the store's revision when it was read."""
        reply = await self._call(self._kv.Range(rpc.RangeRequest(key=key), timeout=self.timeout_s))
        return (_key_value(reply.kvs[0]) if reply.kvs else None), reply.header.revision

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        reply = await self._call(self._kv.Range(rpc.RangeRequest(key=prefix, range_end=_prefix_end(prefix)),
                                                timeout=self.timeout_s))
        return [_key_value(kv) for kv in reply.kvs]

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        reply = await self._call(self._kv.Put(rpc.PutRequest(key=key, value=value, lease=lease),
                                              timeout=self.timeout_s))
        return reply.header.revision

    async def txn(self, compare: Sequence[rpc.Compare], success: Sequence[rpc.RequestOp] = (),
                  failure: Sequence[rpc.RequestOp] = ()) -> TxnResult:
        reply = await self._call(self._kv.Txn(rpc.TxnRequest(compare=compare, success=success, failure=failure),
                                              timeout=self.timeout_s))
        found = [_key_value(kv) for op in reply.responses if op.WhichOneof("response") == "response_range"
                 for kv in op.response_range.kvs]
        return TxnResult(reply.succeeded, reply.header.revision, found)

    async def changes(self, key: bytes, start_revision: int) -> AsyncIterator[KeyValue | None]:
        """Every later version of ``key`` from ``start_revision`` on: the new value, or None
        when it is deleted (a lease expiring deletes too). Ends with EtcdUnavailable."""
        request = rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=key, start_revision=start_revision))
        stream = self._watch.Watch(iter([request]))
        try:
            async for reply in stream:
                if reply.compact_revision:
                    raise EtcdUnavailable(f"etcd compacted past revision {start_revision}; read the key again")
                for event in reply.events:
                    yield None if event.type == rpc.Event.DELETE else _key_value(event.kv)
        except grpc.aio.AioRpcError as error:
            raise EtcdUnavailable(_describe(error)) from None
        finally:
            stream.cancel()

    async def _call(self, call):
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raise EtcdUnavailable(_describe(error)) from None


def _key_value(kv) -> KeyValue:
    return KeyValue(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def _prefix_end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _describe(error: grpc.aio.AioRpcError) -> str:
    return f"etcd: {error.code().name}: {error.details()}"
