"""Dead-lettering: a message past its group's maximum attempts moves to ``%DLQ%<group>``.

The copy keeps the body, tag, keys and properties and says where it came from
(``sluice.dlq.origin_*``); its subject is dropped, since it names the origin topic. Runs on the
event loop.
"""

from __future__ import annotations

import logging

from .engine import Engine
from .model import ORIGIN_SUBJECT_PROPERTY, SUBJECT_PROPERTY, Delivery, OutgoingMessage, TopicConfig

log = logging.getLogger(__name__)

DEAD_LETTER_PREFIX = "%DLQ%"


async def dead_letter(engine: Engine, consumer: str, message: Delivery) -> None:
    """Copy ``message``, which ``consumer`` (a group, or ``group@client``) failed to process,
    to the group's dead-letter topic, created on first use."""
    group = consumer.partition("@")[0]
    dlq = (await engine.topics.ensure(TopicConfig(DEAD_LETTER_PREFIX + group, queue_count=1))).name
    properties = dead_letter_properties(message, message.attempt)
    await engine.producer.send(engine.topics.get, [OutgoingMessage(
        dlq, message.body, message.tag, message.keys, properties, born_ts=message.born_ts)])
    engine.counters["dead_lettered", group] += 1
    if engine.tracer.on:
        engine.tracer.dead_lettered(consumer, message, dlq)
    log.info("message %s of topic %s moved to %s after %d attempts", message.msg_id,
             message.topic, dlq, message.attempt)


def dead_letter_properties(message: Delivery, attempts: int) -> dict[str, str]:
    """The properties of ``message``'s dead-letter copy: its own, its subject kept as the
    origin subject, and where it came from after how many ``attempts``."""
    properties = dict(message.properties)
    subject = properties.pop(SUBJECT_PROPERTY, None)
    if subject:
        properties[ORIGIN_SUBJECT_PROPERTY] = subject
    properties.update({"sluice.dlq.origin_topic": message.topic,
                       "sluice.dlq.origin_msg_id": message.msg_id,
                       "sluice.dlq.attempts": str(attempts)})
    return properties
