"""PUBLISHes from one client into the store: checked as read, stored in order, then acked.

Each PUBLISH is authorised and mapped as it is read (`add`); those read in one chunk are
stored with one core send (`flush`). A chunk does not wait for the previous one to be durable:
core appends sends in the order they are made and makes them durable in that order, so chunks
land in the log in the order read, their fsyncs overlap, and their PUBACK/PUBREC go out in
order once stored (durable under ``sync`` flush). The QoS 2 ids of a persistent session that
await PUBREL are saved in the same append, and retained messages become retained once stored.
One task per chunk, none per message; a PUBREL is completed once every chunk read before it is
stored and the session's QoS 2 state is saved.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from core.bounded_cache import BoundedCache
from core.errors import SluiceError
from core.model import Action, OutgoingMessage, Principal, SharedProperties
from core.service import Broker
from core.untrusted import DenialLog, clip

from .codec import MQTT_5
from .connection import ServerConnection
from .errors import reason_for
from .events import MessagePublished
from .flow_control import FlowControl
from .mapping import RETAIN_PROPERTY, now_ms, to_outgoing
from .properties import NO_PROPERTIES
from .reason_codes import ReasonCode
from .retained import RetainedMessages, as_retained
from .session import Session
from .topics import DELAYED_PREFIX, split_delayed

log = logging.getLogger(__name__)

_Batch = list[tuple[MessagePublished, OutgoingMessage]]
_Template = tuple[str, SharedProperties, int, bool]
"""A client's plain PUBLISHes to one topic: (core topic, stored properties, the rights
generation it was decided in, whether the client may publish there)."""
_TEMPLATE_OVERHEAD = 400
"""Bytes one template costs beyond its key: the tuple, the properties dict and its strings."""


class IntakeServices(Protocol):
    """What an intake needs from the session registry."""

    @property
    def broker(self) -> Broker: ...

    @property
    def denials(self) -> DenialLog: ...

    @property
    def retained(self) -> RetainedMessages: ...

    @property
    def plain_templates(self) -> BoundedCache[_Template]:
        """(QoS, user, client id, MQTT topic) -> template of PUBLISHes with no MQTT 5
        properties and no retain flag, shared by every connection of the front end."""

    def may_retain(self, client_id: str, topic: str, payload: bytes) -> bool:
        """Whether a retained PUBLISH fits the retained limits (room is then reserved)."""

    async def save_qos2(self, session: Session) -> None:
        """Save a persistent session's QoS 2 state."""

    def save_qos2_soon(self, session: Session) -> None:
        """Save it in the background."""

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` as a task the registry keeps."""


class PublishIntake:
    """The inbound PUBLISHes of one connection, from `start` (its CONNACK) on."""

    def __init__(self, services: IntakeServices, conn: ServerConnection, flow: FlowControl,
                 write: Callable[[bytes], None], kick: Callable[[ReasonCode], None]) -> None:
        self._services = services
        self._conn = conn
        self._flow = flow
        self._write = write
        self._kick = kick
        self._principal: Principal | None = None
        self._client_id = ""
        self._session: Session | None = None
        self._batch: _Batch = []
        self._now = 0
        """The time the current batch was read (ms since the epoch): its messages' born time."""
        self._key_prefix = ("0\0\0", "1\0\0", "2\0\0")
        """Per QoS, the start of this client's keys in ``plain_templates`` (its user and
        client id)."""
        self._storing: set[asyncio.Task] = set()
        """Chunks being stored."""

    def start(self, principal: Principal, client_id: str, session: Session) -> None:
        """The connection was accepted for ``principal`` as ``client_id``."""
        self._principal, self._client_id, self._session = principal, client_id, session
        self._key_prefix = tuple(f"{qos}{principal.user}\0{client_id}\0" for qos in range(3))

    def add(self, event: MessagePublished) -> None:
        """A PUBLISH read from the client: answered now if refused, else batched."""
        services, client_id = self._services, self._client_id
        assert self._principal is not None
        if event.properties is NO_PROPERTIES and not event.retain:
            if not event.topic.startswith(DELAYED_PREFIX):
                self._add_plain(event)
                return
        topic, delay_ms = event.topic, 0
        if topic.startswith(DELAYED_PREFIX):
            delayed = split_delayed(topic)
            if delayed is None or delayed[0] * 1000 > services.broker.config.max_delay_ms:
                self._refuse_delayed(event)
                return
            delay_ms, topic = delayed[0] * 1000, delayed[1]
        if not services.broker.subject_allowed(self._principal, Action.PUBLISH, topic):
            self._deny(event)
            return
        if not self._batch:
            self._now = now_ms()
        message = to_outgoing(services.broker.topic_of_subject(topic), topic,
                              event.payload, event.qos, event.retain and not delay_ms, client_id,
                              event.properties, self._now)
        if event.properties.payload_format_indicator == 1:
            try:
                event.payload.decode()
            except UnicodeDecodeError:
                self._answer(event, ReasonCode.PayloadFormatInvalid)
                return
        if delay_ms:  # held by core's timer; a retain flag is not applied to it
            message.delivery_ts = self._now + delay_ms
            self._batch.append((event, message))
            return
        if event.retain:
            if services.may_retain(client_id, event.topic, event.payload):
                message = as_retained(message, event.topic)
            elif self._conn.version == MQTT_5:
                self._answer(event, ReasonCode.QuotaExceeded)
                return
            else:  # 3.1.1 has no way to say why: stored and delivered, but not retained
                message = replace(message, properties={
                    k: v for k, v in message.properties.items() if k != RETAIN_PROPERTY})
        self._batch.append((event, message))

    def _add_plain(self, event: MessagePublished) -> None:
        """A PUBLISH with neither properties nor retain flag: its core topic, stored
        properties and publish decision come from the client's template for the topic
        (``plain_templates``), made by its first message and again once rights change; the
        properties are shared by its messages and never changed."""
        services = self._services
        key = self._key_prefix[event.qos] + event.topic
        template = services.plain_templates.get(key)
        if template is None or template[2] != services.broker.rights_generation:
            template = self._plain_template(event, key)
        if not template[3]:
            self._deny(event)
            return
        if not self._batch:
            self._now = now_ms()
        self._batch.append((event, OutgoingMessage(template[0], event.payload,
                                                   properties=template[1], born_ts=self._now)))

    def _plain_template(self, event: MessagePublished, key: str) -> _Template:
        broker = self._services.broker
        assert self._principal is not None
        generation = broker.rights_generation  # read first: a change meanwhile redoes it
        allowed = broker.subject_allowed(self._principal, Action.PUBLISH, event.topic)
        message = to_outgoing(broker.topic_of_subject(event.topic), event.topic, b"", event.qos,
                              False, self._client_id, NO_PROPERTIES, 0)
        template = (message.topic, SharedProperties(message.properties), generation, allowed)
        if allowed:  # kept only once authorized, as every cache on the publish path
            self._services.plain_templates.put(key, template,
                                               len(key) + len(message.topic) + _TEMPLATE_OVERHEAD)
        return template

    def _refuse_delayed(self, event: MessagePublished) -> None:
        limit = self._services.broker.config.max_delay_ms // 1000
        self._services.denials.denied(
            self._client_id, "delayed", "client %s published to %s: use $delayed/<seconds, at "
            "most %d>/<topic>", clip(self._client_id), clip(event.topic), limit)
        self._answer(event, ReasonCode.TopicNameInvalid)

    def _deny(self, event: MessagePublished) -> None:
        client_id = self._client_id
        self._services.denials.denied(client_id, "publish", "client %s may not publish to %s",
                                      clip(client_id), clip(event.topic))
        self._answer(event, ReasonCode.NotAuthorized)

    def flush(self) -> None:
        """Store what was batched since the last flush, behind the previous chunk."""
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        task = asyncio.get_running_loop().create_task(self._store(batch))
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)
        self._flow.storing(len(batch))

    async def _store(self, batch: _Batch) -> None:
        try:
            await self._store_batch(batch)
        except Exception:  # unexpected: the client resends what was not acknowledged
            log.exception("client %s: storing %d messages failed; closing the connection",
                          self._client_id, len(batch))
            self._kick(ReasonCode.UnspecifiedError)
        finally:
            self._flow.stored(len(batch))

    async def _store_batch(self, batch: _Batch) -> None:
        services, session = self._services, self._session
        messages = [message for _, message in batch]
        exactly_once = [event.packet_id for event, _ in batch if event.qos == 2] \
            if session is not None and session.persistent else []
        stored = False
        try:
            if exactly_once:
                # The messages and, right behind them, the QoS 2 ids awaiting PUBREL go into
                # the same append: the log is durable as a prefix, so a saved id implies its
                # message is stored, and a restart in between cannot store a resent message
                # twice.
                storing = asyncio.ensure_future(services.broker.send_decided(messages))
                session.qos2.awaiting_release.update(exactly_once)
                saved = asyncio.ensure_future(services.save_qos2(session))
                await storing
                stored = True
                await saved
            else:
                await services.broker.send_decided(messages)
                stored = True
        except SluiceError as error:
            log.info("client %s: %d messages not stored: %s", clip(self._client_id), len(batch),
                     error)
            if exactly_once:
                session.qos2.awaiting_release.difference_update(exactly_once)
                services.save_qos2_soon(session)
            if self._conn.version != MQTT_5:
                self._kick(ReasonCode.UnspecifiedError)
                return
            for event, _ in batch:
                self._answer(event, reason_for(error))
            return
        finally:
            self._settle_retained(batch, stored)
        ack = self._conn.ack_publish
        acks = [ack(event.packet_id) for event, _ in batch if event.qos]
        if acks:
            self._write(b"".join(acks))

    def release_requested(self, packet_id: int) -> None:
        """A PUBREL: PUBCOMP once every earlier message is stored and the session's QoS 2
        state saved without ``packet_id``."""
        session = self._session
        assert session is not None
        session.qos2.awaiting_release.discard(packet_id)
        self._services.spawn(self._complete_after_saving(session, packet_id))

    async def _complete_after_saving(self, session: Session, packet_id: int) -> None:
        if self._storing:  # the chunks read before the PUBREL, flushed by now
            await asyncio.wait(tuple(self._storing))
        await self._services.save_qos2(session)
        self._write(self._conn.complete(packet_id))  # nothing once the connection closed

    def _settle_retained(self, batch: _Batch, stored: bool) -> None:
        """Retained messages of ``batch`` become retained if stored; else their room is freed."""
        retained_messages = self._services.retained
        for event, message in batch:
            if message.also_into:
                if stored:
                    retained_messages.update(event.topic, message.body, message.properties)
                else:
                    retained_messages.cancel(event.topic)

    def _answer(self, event: MessagePublished, reason: ReasonCode) -> None:
        if event.qos:
            self._write(self._conn.ack_publish(event.packet_id, reason))
