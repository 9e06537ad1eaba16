"""Core's broker-wide settings (the ``[core]`` section of the broker's configuration)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoreConfig:
    """Broker-wide behaviour of core. Durations in milliseconds."""

    max_message_bytes: int = 16 << 20
    """The largest message body a send may carry, on every protocol (RabbitMQ 4's default
    ``max_message_size``): AMQP refuses a larger one at its content header, native producers
    are told the limit, MQTT packets stay within their own ``max_packet_size``."""
    auto_create_groups: bool = True
    auto_create_topics: bool = True
    """A publish (MQTT) to a topic that does not exist creates it with ``auto_topic_queues``."""
    auto_topic_queues: int = 4
    heartbeat_timeout_ms: int = 30_000
    offset_commit_interval_ms: int = 1_000
    default_invisible_ms: int = 30_000
    max_long_poll_ms: int = 30_000
    recent_cache_bytes: int = 16 << 20
    """Newest messages kept in memory for consumers that keep up (`delivery.RecentMessages`):
    bodies plus 300 bytes each, about 40,000 messages of 100 bytes. Every one is an object the
    garbage collector scans, so a larger cache lengthens its pauses."""
    max_delay_ms: int = 3 * 86_400_000
    """The furthest in the future a delayed message may be due (RocketMQ's default, 3 days).
    Keep it below the store's retention age: a pending message lives in the log until due."""
    transaction_check_delay_ms: int = 6_000
    """How long a transaction may stay open before its producer is asked to decide it
    (RocketMQ's ``transactionTimeOut``)."""
    transaction_check_interval_ms: int = 30_000
    """How often an undecided transaction is asked about again."""
    transaction_check_max: int = 15
    """Checks without a decision after which a transaction's message is discarded (logged)."""
    max_open_transactions: int = 100_000
    """Transactions prepared and not decided yet; more are refused until some are decided
    (each costs about 200 bytes of memory)."""
    lite_topic_ttl_ms: int = 86_400_000
    """A lite topic that received no message for this long is deleted with its consumers'
    positions (its messages age out with retention)."""
    max_lite_topics: int = 1_000_000
    """Lite topics alive at once across all topics (about 150 bytes of memory each); a send
    creating one more is refused."""
    retention_check_interval_ms: int = 60_000
    """How often the store's retention runs and topics' own retention limits are applied."""
    memory_high_watermark: float = 0.4
    """The memory alarm goes on (publishers are blocked) while the broker's resident memory is
    above this fraction of the machine's memory, as RabbitMQ's ``vm_memory_high_watermark``."""
    message_trace: bool = False
    """Record each message's path (delivered to which group and client, acked, retried,
    dead-lettered) in the internal topic ``%SYS%trace`` (``core.trace``): about one more small
    record per delivery and per ack, so off unless asked for."""
