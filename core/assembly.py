"""One core over one store: the shared ``Engine`` and the three faces adapters are given.

- ``broker``: the authenticated client API (``core.service.Broker``);
- ``queues``: named queues fed by subject fan-out (``core.named_queues.NamedQueues``);
- ``state``: compacted state (``core.state_store.StateStore``);
- ``vhosts``: AMQP virtual hosts, their exchanges, queues and bindings (``core.vhosts``);
- ``vhost_permissions``: who may configure, write and read what in each of them;
- ``vhost_admin``: what the admin API lists and does with them (``core.vhost_admin``);
- ``queue_reader``: their queues read message by message outside the AMQP adapter, on the
  reader's vhost permission (``core.vhost_queue_reader``).

The composition root builds one ``Core`` and passes each adapter only the faces it uses.
``await start()`` on the event loop that will call it; ``await close()`` before closing the
store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from store.api import RetentionReport, Store

from .auth import Users
from .engine import Engine
from .exchanges import BindingLimits
from .metadata import MetadataRepository
from .named_queues import NamedQueues
from .routing import TopicSyntax
from .service import Broker
from .settings import CoreConfig
from .state_store import StateStore
from .topic_map import SubjectTopics
from .vhost_admin import VhostAdmin
from .vhost_permissions import VhostPermissions
from .vhost_queue_reader import VhostQueueReader
from .vhosts import VirtualHosts


class Core:
    """The engine and its faces. Runs on the event loop; not thread-safe."""

    def __init__(self, store: Store, metadata: MetadataRepository, data_dir: str,
                 config: CoreConfig = CoreConfig(), *, subject_syntax: TopicSyntax,
                 topic_rules: Sequence[tuple[str, str]] = (),
                 flush: str = "sync") -> None:
        """``subject_syntax``: how adapters write the subject filters they bind (MQTT's);
        ``topic_rules``: (subject filter, topic) pairs storing matching subjects in that topic
        instead of their first level's (``core.topic_map``)."""
        subject_topics = SubjectTopics(subject_syntax, topic_rules)
        self.engine = Engine(store, metadata, data_dir, config, flush=flush,
                             subject_syntax=subject_syntax, subject_topics=subject_topics)
        self.broker = Broker(self.engine, Users(metadata, subject_syntax, subject_topics))
        self.queues = NamedQueues(self.engine, data_dir)
        self.state = StateStore(self.engine)
        self.vhosts = VirtualHosts(metadata, BindingLimits(
            config.max_bindings_per_queue, config.max_bindings_per_exchange,
            config.max_bindings_per_vhost))
        self.vhost_permissions = VhostPermissions(metadata)
        self.broker.users.add_listener(self.vhost_permissions.user_changed)
        self.vhost_admin = VhostAdmin(self.vhosts, self.vhost_permissions, self.queues)
        self.queue_reader = VhostQueueReader(self.broker, self.vhosts, self.vhost_permissions,
                                             self.queues)
        self._metadata = metadata
        self.first_start = False
        """Whether ``start`` found no virtual host and created ``/`` (RabbitMQ's first start)."""

    async def start(self) -> None:
        """Load metadata and start the timers."""
        await self.engine.start()
        self.vhosts.load(await asyncio.to_thread(self._metadata.topology))
        self.first_start = await self.vhosts.ensure_default()
        self.vhost_permissions.load(await asyncio.to_thread(self._metadata.vhost_permissions))

    def begin_shutdown(self) -> None:
        """Answer every pending long poll at once and refuse new sends; acks still count."""
        self.engine.begin_shutdown()

    async def close(self) -> None:
        """Stop timers, wake every long poll, persist offsets."""
        await self.engine.close()
        self.queues.close()
        self.broker.logins.close()

    async def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Apply the store's and every topic's retention now (it also runs on a timer)."""
        return await self.engine.apply_retention(now_ms)
