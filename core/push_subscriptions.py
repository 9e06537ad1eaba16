"""The push subscriptions of a broker: stored in the metadata database, kept in memory, edited
with authorization, and announced to the delivery engine as they change.

A subscription belongs to the user that created it and pushes with that user's rights; only
it and admins see or change it (to anyone else it does not exist). Creating one needs the
subscribe right on its topic (and on its subject filter), or the read right on its AMQP queue
(the owner's permission on the queue's virtual host), and the publish right on its reply topic
and on an explicit dead-letter topic. The signing secret (Standard Webhooks ``whsec_``)
is stored encrypted under the master key and shown once, in the answer to the create.
Runs on the event loop; database calls run on a thread.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .clock import now_ms
from .event_filters import compile_filters
from .event_transform import compile_transform
from .errors import AccessDenied, AlreadyExists, InvalidArgument, NotFound, NotSupported, TopicNotFound
from .metadata import MetadataRepository
from .model import SYSTEM, Action, Principal, TopicConfig
from .push_model import EDITABLE, PushSubscription, from_json
from .service import Broker
from .sink_policy import SinkPolicy
from .vhost_queue_reader import VhostQueueReader
from .untrusted import clip

log = logging.getLogger(__name__)

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24
Listener = Callable[[str, "PushSubscription | None", str], None]
"""``listener(name, subscription or None when deleted, its secret)``."""


def new_secret() -> str:
    """A fresh Standard Webhooks signing secret."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def check_secret(secret: Any) -> str:
    """``secret`` if it is ``whsec_`` + base64 of at least 24 bytes, else InvalidArgument."""
    if isinstance(secret, str) and secret.startswith(SECRET_PREFIX) and len(secret) < 512:
        try:
            if len(base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)) >= SECRET_BYTES:
                return secret
        except (binascii.Error, ValueError):
            pass
    raise InvalidArgument(f"secret must be {SECRET_PREFIX} followed by the base64 of at least "
                          f"{SECRET_BYTES} random bytes; leave it out and the broker makes one")


def compile_options(subscription: PushSubscription) -> tuple[Callable[[Mapping[str, str]], bool] | None,
                                                             Callable[[bytes], bytes] | None]:
    """The compiled filters and transform of ``subscription`` (None: none); InvalidArgument
    when either is invalid."""
    match = compile_filters(subscription.filters) if subscription.filters else None
    transform = compile_transform(subscription.transform) if subscription.transform else None
    return match, transform


class PushSubscriptions:
    """Every push subscription, by name, with its secret."""

    def __init__(self, broker: Broker, metadata: MetadataRepository, policy: SinkPolicy,
                 queues: VhostQueueReader | None = None) -> None:
        """``queues``: the virtual hosts' queues (None: AMQP queue sources are refused)."""
        self._broker = broker
        self._queues = queues
        self._metadata = metadata
        self.policy = policy
        self._subscriptions: dict[str, tuple[PushSubscription, str]] = {}
        self._listeners: list[Listener] = []

    async def load(self) -> None:
        """Read every stored subscription (at start, and when a node starts to lead)."""
        rows = await asyncio.to_thread(self._metadata.push_subscriptions)
        found = {}
        for spec, secret in rows:
            try:
                subscription = from_json(json.loads(spec))
            except (ValueError, InvalidArgument) as error:
                log.error("a stored push subscription is invalid and is not served (%s): %s",
                          error, clip(spec, 300))
                continue
            found[subscription.name] = (subscription, secret)
        self._subscriptions = found

    def on_change(self, listener: Listener) -> None:
        """Call ``listener`` after every create, pause, resume and delete. Runs on the event loop."""
        self._listeners.append(listener)

    def all(self) -> list[tuple[PushSubscription, str]]:
        """Every subscription with its secret, by name (for the engine)."""
        return [self._subscriptions[name] for name in sorted(self._subscriptions)]

    def visible(self, principal: Principal) -> list[PushSubscription]:
        """The subscriptions ``principal`` may see: all for an admin, else its own."""
        return [s for s, _ in self.all() if principal.admin or s.owner == principal.user]

    def get(self, principal: Principal, name: str) -> PushSubscription:
        """The subscription ``name`` if ``principal`` owns it or is an admin; NotFound otherwise
        (so names of others' subscriptions do not leak)."""
        found = self._subscriptions.get(name)
        if found is None or not (principal.admin or found[0].owner == principal.user):
            raise NotFound(f"push subscription {clip(name)} does not exist (or is not yours); "
                           "`sluice push list` shows yours")
        return found[0]

    async def create(self, principal: Principal, fields: Mapping[str, Any]) -> tuple[PushSubscription, str]:
        """Create a subscription owned by ``principal`` from the request ``fields`` (``EDITABLE``
        and ``secret``); (it, its secret)."""
        unknown = sorted(set(fields) - set(EDITABLE) - {"name", "secret"})
        if unknown:
            raise InvalidArgument(f"unknown field(s) {', '.join(map(clip, unknown))}; a push "
                                  f"subscription takes name, secret and {', '.join(EDITABLE)}")
        secret = check_secret(fields["secret"]) if fields.get("secret") is not None else new_secret()
        data = {k: v for k, v in fields.items() if k != "secret"}
        data.update(owner=principal.user, created_ms=now_ms(), paused=False)
        subscription = from_json(data)
        self._authorize(principal, subscription)
        compile_options(subscription)
        with contextlib.suppress(AlreadyExists):  # there to read from the start
            await self._broker.create_topic(SYSTEM, TopicConfig(subscription.dead_letters,
                                                                queue_count=1))
        await asyncio.to_thread(self._metadata.create_push_subscription, subscription.name,
                                subscription.owner, _spec(subscription), secret)
        self._subscriptions[subscription.name] = (subscription, secret)
        self._changed(subscription.name)
        return subscription, secret

    def _authorize(self, principal: Principal, subscription: PushSubscription) -> None:
        broker = self._broker
        if subscription.queue and self._queues is None:
            raise NotSupported("this broker runs without AMQP queues: push from a topic")
        self.policy.check_sink_host(_host_of(subscription.sink))
        topic = subscription.topic
        if subscription.queue:
            assert self._queues is not None
            self._queues.check(principal, subscription.vhost, subscription.queue)
        elif not broker.allowed(principal, Action.SUBSCRIBE, topic):
            raise AccessDenied(f"user {clip(principal.user)} may not subscribe to topic "
                               f"{clip(topic)}; a push subscription reads it with its owner's "
                               "rights: ask an administrator to grant subscribe on it")
        if subscription.subject_filter and not broker.filter_allowed(principal, subscription.subject_filter):
            raise AccessDenied(f"user {clip(principal.user)} may not subscribe to "
                               f"{clip(subscription.subject_filter)}")
        for what, name in (("reply topic", subscription.reply_topic),
                           ("dead-letter topic", subscription.dead_letter_topic)):
            if name and not broker.allowed(principal, Action.PUBLISH, name):
                raise AccessDenied(f"user {clip(principal.user)} may not publish to the {what} "
                                   f"{clip(name)}: ask an administrator to grant publish on it")
        default_dlq = subscription.dead_letters
        if not subscription.dead_letter_topic and _exists(broker, default_dlq) \
                and not broker.allowed(principal, Action.PUBLISH, default_dlq):
            raise AccessDenied(f"the default dead-letter topic {clip(default_dlq)} exists and user "
                               f"{clip(principal.user)} may not publish to it: choose another "
                               "subscription name or a dead_letter_topic you may publish to")

    async def set_paused(self, principal: Principal, name: str, paused: bool) -> PushSubscription:
        """Pause or resume a subscription; the updated one."""
        current = self.get(principal, name)
        changed = dataclasses.replace(current, paused=paused)
        if not await asyncio.to_thread(self._metadata.update_push_subscription, name, _spec(changed)):
            raise NotFound(f"push subscription {clip(name)} was deleted meanwhile")
        self._subscriptions[name] = (changed, self._subscriptions[name][1])
        self._changed(name)
        return changed

    async def delete(self, principal: Principal, name: str) -> None:
        """Delete a subscription; the engine stops it and removes its group's position."""
        self.get(principal, name)
        await asyncio.to_thread(self._metadata.delete_push_subscription, name)
        self._subscriptions.pop(name, None)
        self._changed(name)

    def _changed(self, name: str) -> None:
        found = self._subscriptions.get(name)
        for listener in self._listeners:
            try:
                listener(name, found[0] if found else None, found[1] if found else "")
            except Exception:  # noqa: BLE001 - a failing listener must not undo the change
                log.exception("reacting to a change of push subscription %s failed", name)


def _spec(subscription: PushSubscription) -> str:
    return json.dumps(subscription.to_json() | {"dead_letter_topic": subscription.dead_letter_topic},
                      separators=(",", ":"))


def _host_of(sink: str) -> str:
    return urlsplit(sink).hostname or ""


def _exists(broker: Broker, topic: str) -> bool:
    try:
        broker.get_topic(topic)
    except TopicNotFound:
        return False
    return True
