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
    """A consumer naming a group that does not exist creates it."""
    auto_create_topics: bool = True
    """A publish (MQTT) to a topic that does not exist creates it with ``auto_topic_queues``."""
    auto_topic_queues: int = 4
    """Queues of a topic created by its first publish."""
    heartbeat_timeout_ms: int = 30_000
    """A group member silent this long loses its queues to the others."""
    offset_commit_interval_ms: int = 1_000
    """How often consumer offsets are saved."""
    replicated_state: bool = False
    """This broker is a node of a replica group, whose log is the truth: consumer offsets are
    kept in the log (compacted topic ``%SYS%offsets``, a record per consumer whose offsets
    changed, every ``offset_commit_interval_ms``) instead of ``offsets.json``, so is the delayed
    messages' fired-up-to mark (``%SYS%timer-mark``, not ``timer.json``), and a topic the
    log holds that the metadata database does not know is taken as it is in the log (its
    queues, default settings). Set by the broker for every node of a cluster."""
    default_invisible_ms: int = 30_000
    """How long a popped message stays invisible to its group when the consumer names no
    duration."""
    max_long_poll_ms: int = 30_000
    """The longest a receive or pull waits for messages."""
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
    """Lite topics alive at once across all topics (about 250 bytes of memory each); a send
    creating one more is refused. A backstop: the quotas below keep one tenant from filling it."""
    max_lite_topics_per_topic: int = 250_000
    """Lite topics alive at once in one parent topic."""
    max_lite_topics_per_user: int = 100_000
    """Lite topics alive at once that one user's sends created."""
    max_bindings_per_queue: int = 10_000
    """AMQP bindings leading to one queue; one more is refused (406 PRECONDITION_FAILED)."""
    max_bindings_per_exchange: int = 10_000
    """AMQP bindings from one exchange, and those to one exchange; a headers exchange examines
    at most this many of its bindings per publish."""
    max_bindings_per_vhost: int = 100_000
    """AMQP bindings in one virtual host (each costs about 1 KB of memory)."""
    retention_check_interval_ms: int = 60_000
    """How often the store's retention runs and topics' own retention limits are applied."""
    memory_high_watermark: float = 0.4
    """The memory alarm goes on (publishers are blocked) while the broker's resident memory is
    above this fraction of the machine's memory, as RabbitMQ's ``vm_memory_high_watermark``."""
    message_trace: bool = False
    """Record each message's path (delivered to which group and client, acked, retried,
    dead-lettered) in the internal topic ``%SYS%trace`` (``core.trace``): about one more small
    record per delivery and per ack, so off unless asked for."""
    login_failure_delay_ms: int = 1_000
    """A failed login (a wrong password or signature, an unknown user) is answered this late,
    as RabbitMQ answers one 3 s late: a client guessing over one connection at a time tries
    about one password a second. Refusals of a banned peer are answered at once."""
    login_failure_window_ms: int = 60_000
    """Failed logins are counted per peer address, per (peer address, user name) and per user
    name in windows of this length: a count starts at its first failure and is forgotten when
    its window ends (``core.login_throttle``)."""
    login_max_failures_per_peer: int = 30
    """Failures from one peer address (IPv6: its /64) in a window, after which every login
    from it, right or wrong, is refused without a check for ``login_ban_ms``."""
    login_max_failures_per_peer_user: int = 10
    """Failures from one peer address for one user name in a window, after which that user
    name is refused from that address without a check for ``login_ban_ms``."""
    login_max_failures_per_user: int = 100
    """Failures for one user name in a window, from any peers, after which password checks for
    it are run only for peers with no failure in their own window; the others are refused
    without a check. A peer with a clean record is never refused for this, so nobody can lock
    a user out by failing on purpose."""
    login_ban_ms: int = 300_000
    """How long a peer address, or a (peer address, user name) pair, is refused once it failed
    too often (EMQX's flapping ban is 5 minutes too)."""
    login_check_threads: int = 2
    """Threads that check passwords (scrypt, about 40 ms each) and look up credentials not yet
    held in memory; at most this many such checks run at once, never on the event loop."""
    login_max_pending_checks: int = 1_024
    """Checks waiting for a thread; beyond it a login is refused at once as busy (so is one
    from a peer that already has 8 checks waiting or running)."""
    login_throttle_bytes: int = 4 << 20
    """Memory for failure counts, about 200 bytes each (some 20,000 peers and user names);
    beyond it the oldest are forgotten first."""
