"""Sluice's Python client SDK for the native protocol (Apache RocketMQ 5's gRPC API).

Asyncio-first (``grpc.aio``), with blocking facades in ``sync``. It imports nothing from the
broker (``core``, ``store`` or other protocols), so Spark executors and scripts can use it with
no broker in the process::

    async with Producer(ClientConfig("127.0.0.1:8081")) as producer:
        receipt = await producer.send(Message("orders", b"{...}", tag="created"))
        await producer.send_packed("telemetry", [b"r1", b"r2", b"r3"])
"""

from .config import ClientConfig
from .errors import (BadRequestError, ClientClosedError, ClientTimeoutError, ForbiddenError,
                     GroupNotFoundError, InvalidReceiptHandleError, NotFoundError,
                     PackedBatchError, PayloadTooLargeError, ServerError, SluiceClientError,
                     TooManyRequestsError, TopicNotFoundError, UnauthorizedError,
                     UnavailableError, UnsupportedError)
from .model import Message, ReceivedMessage, SendReceipt, Sql92, TopicQueue
from .packing import BATCH_PROPERTY, pack_bodies, unpack_bodies
from .lite_consumer import LiteSimpleConsumer
from .producer import Producer
from .pull_consumer import PullConsumer
from .push_consumer import PushConsumer, RetryPolicy
from .simple_consumer import SimpleConsumer
from .transaction import Transaction, TransactionChecker
from .sync import SyncProducer, SyncSimpleConsumer

__all__ = [
    "BATCH_PROPERTY", "BadRequestError", "ClientClosedError", "ClientConfig", "ClientTimeoutError",
    "ForbiddenError", "GroupNotFoundError", "InvalidReceiptHandleError", "LiteSimpleConsumer",
    "Message", "NotFoundError",
    "PackedBatchError", "PayloadTooLargeError", "Producer", "PullConsumer", "PushConsumer",
    "ReceivedMessage", "RetryPolicy", "SendReceipt", "ServerError", "SimpleConsumer",
    "SluiceClientError", "Sql92", "SyncProducer", "SyncSimpleConsumer", "TooManyRequestsError",
    "TopicNotFoundError", "TopicQueue", "Transaction", "TransactionChecker", "UnauthorizedError",
    "UnavailableError", "UnsupportedError", "pack_bodies", "unpack_bodies",
]
