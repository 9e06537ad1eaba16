"""`sluice send` and `sluice consume`: produce and consume over the native gRPC SDK.

Both connect to ``--server HOST:PORT`` (default 127.0.0.1:8081) as ``--user``/``--password``
(default ``SLUICE_USER``/``SLUICE_PASSWORD``, then sluice/sluice) and run on their own event
loop. `send --count N` sends batches concurrently and keeps a progress line on stderr.
`consume --group G` pops and acks (a tail that ends on Ctrl+C, ``--count`` or ``--wait``);
`consume --earliest|--from-offset N` reads by offset with no group and commits nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TextIO

from .admin import START_HINT, CliError, add_credentials, plural

DEFAULT_SERVER = "127.0.0.1:8081"
SUBJECT_PROPERTY = "sluice.subject"
"""The full MQTT topic (or AMQP routing key as a subject) a message was published on."""


# --- send ---

def body_maker(args: argparse.Namespace) -> Callable[[int], bytes]:
    """Body of the i-th message: BODY (``{n}`` replaced by i), ``--size`` bytes, or stdin."""
    if args.body == "-" or (args.body is None and args.size is None and args.count == 1):
        if sys.stdin.isatty():
            raise CliError("give the message body as an argument, pipe it on stdin, or use --size B", 2)
        data = sys.stdin.buffer.read()
        return lambda i: data
    if args.body is not None:
        template = args.body
        return lambda i: template.replace("{n}", str(i)).encode()
    size = args.size if args.size is not None else 0

    def sized(i: int) -> bytes:
        head = f"message {i} ".encode()
        return (head + b"x" * max(0, size - len(head)))[:size] if size else head.strip()
    return sized


class Progress:
    """A progress line on stderr: redrawn in place on a terminal, one line a second otherwise."""

    def __init__(self, total: int, out: TextIO = sys.stderr) -> None:
        self.total, self.out, self.done = total, out, 0
        self.started = self._shown = time.monotonic()
        self.tty = out.isatty()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.done == self.total or now - self._shown >= (0.2 if self.tty else 1.0):
            self._shown = now
            start = "\r" if self.tty else ""
            end = "" if self.tty and self.done < self.total else "\n"
            print(f"{start}sent {self.done}/{self.total} ({self.rate():,.0f} msg/s)", end=end,
                  file=self.out, flush=True)

    def end(self) -> None:
        """Finish a line left open on a terminal (an interrupted run)."""
        if self.tty and self.done < self.total:
            print(file=self.out, flush=True)

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.started, 1e-9)


async def send(args: argparse.Namespace) -> int:
    from sluice.client.model import Message
    from sluice.client.producer import Producer

    make = body_maker(args)
    props = parse_properties(args.property)
    producer = Producer(client_config(args), [args.topic])

    def message(i: int) -> Message:
        keys = [key.replace("{n}", str(i)) for key in args.key or ()]
        return Message(args.topic, make(i), tag=args.tag or "", keys=keys, properties=props)

    async with connected(producer, args):
        if args.count == 1:
            receipt = await producer.send(message(0))
            print(f"sent {receipt.message_id} to {args.topic} queue {receipt.queue_id} "
                  f"offset {receipt.offset}")
            return 0
        progress = Progress(args.count)
        sizes = 0
        starts = iter(range(0, args.count, args.batch))

        async def worker() -> None:
            nonlocal sizes
            for start in starts:
                batch = [message(i) for i in range(start, min(start + args.batch, args.count))]
                await producer.send_batch(batch)
                sizes += sum(len(m.body) for m in batch)
                progress.add(len(batch))

        try:
            await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        finally:  # an interrupted run (Ctrl+C cancels it) says how far it got
            progress.end()
            seconds = time.monotonic() - progress.started
            what = (plural(args.count, "message") if progress.done == args.count else
                    f"{progress.done} of {args.count} messages before it was interrupted (a batch "
                    "in flight then may have been stored too)")
            print(f"sent {what} ({sizes} body bytes) to {args.topic} in {seconds:.2f} s "
                  f"({progress.rate():,.0f} msg/s)", flush=True)
    return 0


def parse_properties(pairs: list[str] | None) -> dict[str, str]:
    properties = {}
    for pair in pairs or ():
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"--property {pair!r} must look like NAME=VALUE", 2)
        properties[name] = value
    return properties


# --- consume ---

async def consume(args: argparse.Namespace) -> int:
    if args.group and (args.earliest or args.from_offset is not None):
        raise CliError("--group pops and acks; --earliest/--from-offset read without a group: "
                       "pick one", 2)
    if not args.group and not args.earliest and args.from_offset is None:
        raise CliError("pass --group G to consume as a group member, or --earliest / "
                       "--from-offset N to read by offset without one", 2)
    source = PopSource(args) if args.group else OffsetSource(args)
    received = 0
    opened = False  # a consumer that could not start has nothing to count
    try:
        async with connected(source.client, args, source.open), \
                contextlib.aclosing(source.messages()) as stream:
            opened = True
            async for message in stream:
                print(render(message, args.json), flush=True)
                await source.done(message)
                received += 1
                if args.count and received >= args.count:
                    break
                source.budget = args.count - received if args.count else 32
    finally:
        if opened:
            print(f"received {plural(received, 'message')} from {args.topic}", file=sys.stderr)
    return 0


class PopSource:
    """Pops for ``--group``; each message is acked once printed. Ends after ``--wait`` idle seconds."""

    def __init__(self, args: argparse.Namespace) -> None:
        from sluice.client.simple_consumer import SimpleConsumer

        self.args = args
        self.budget = min(args.count or 32, 32)
        self.client = SimpleConsumer(client_config(args), args.group, {args.topic: args.filter},
                                     await_duration=min(args.wait, 5.0) if args.wait else 5.0)

    async def open(self) -> None:
        """Join the group, once the topic is known to exist: joining creates the group, which
        a mistyped topic name must not leave behind."""
        await readable_queues(self.client, self.args.topic)
        await self.client.start()

    async def messages(self) -> AsyncGenerator[Any, None]:
        idle_since = time.monotonic()
        while True:
            batch = await self.client.receive(max_messages=max(1, min(self.budget, 32)))
            if batch:
                idle_since = time.monotonic()
            elif self.args.wait and time.monotonic() - idle_since >= self.args.wait:
                return
            for message in batch:
                yield message

    async def done(self, message: Any) -> None:
        if not self.args.no_ack:
            await self.client.ack(message)


class OffsetSource:
    """Reads every queue (or ``--queue``) by offset with no group: nothing joins, nothing commits.

    One fetch task per queue long-polls PullMessage and hands batches to ``messages()``, so a
    busy queue never waits behind an idle one. It uses the pull consumer's PullMessage and
    QueryOffset calls without ``start()``: starting would join the group (core ignores the
    group of a pull, so the placeholder name below is never created).
    """

    GROUP = "sluice-cli-reader"

    def __init__(self, args: argparse.Namespace) -> None:
        from sluice.client.pull_consumer import PullConsumer

        self.args = args
        self.budget = 32
        self.client = PullConsumer(client_config(args), self.GROUP, [args.topic],
                                   auto_commit_interval=None, batch_size=64,
                                   await_duration=min(args.wait, 5.0) if args.wait else 5.0)

    async def open(self) -> None:
        queues = await readable_queues(self.client, self.args.topic)
        self.queues = [q for q in queues if self.args.queue in (None, q.id)]
        if not self.queues:
            raise CliError(f"topic {self.args.topic} has no queue {self.args.queue}; "
                           f"`sluice topic describe {self.args.topic}` lists its queues", 2)

    async def messages(self) -> AsyncGenerator[Any, None]:
        inbox: asyncio.Queue[list[Any] | BaseException] = asyncio.Queue(maxsize=len(self.queues))
        fetchers = [asyncio.create_task(self._fetch(queue, inbox)) for queue in self.queues]
        try:
            while True:
                try:
                    batch = await asyncio.wait_for(inbox.get(), self.args.wait)
                except TimeoutError:
                    return
                if isinstance(batch, BaseException):
                    raise batch
                for message in batch:
                    yield message
        finally:
            for task in fetchers:
                task.cancel()
            await asyncio.gather(*fetchers, return_exceptions=True)

    async def _fetch(self, queue: Any, inbox: asyncio.Queue) -> None:
        from rocketmq.grpc_protocol.definition_pb2 import QueryOffsetPolicy

        try:
            offset = self.args.from_offset
            if offset is None:
                offset = await self.client.query_offset(queue, QueryOffsetPolicy.BEGINNING)
            while True:
                messages, offset = await self.client.read_queue(queue, offset)
                if messages:
                    await inbox.put(messages)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # hand it to the reader, which raises it
            await inbox.put(error)

    async def done(self, message: Any) -> None:
        """Nothing to settle: reading by offset commits nothing."""


async def readable_queues(client: Any, topic: str) -> list[Any]:
    """The queues of ``topic`` a consumer may read; a CliError if the topic does not exist
    (the broker answers a missing topic's lookup with write-only queues: reading creates no
    topic)."""
    from sluice.client.client import readable

    queues = readable(await client.route(topic))
    if not queues:
        raise CliError(f"topic {topic} does not exist; create it with `sluice topic create "
                       f"{topic}` (or send to it)")
    return queues


def render(message: Any, as_json: bool) -> str:
    try:
        text: str | None = message.body.decode()
    except UnicodeDecodeError:
        text = None
    if as_json:
        import base64

        return json.dumps({"topic": message.topic, "queue_id": message.queue_id,
                           "offset": message.offset, "msg_id": message.message_id,
                           "tag": message.tag, "keys": list(message.keys),
                           "subject": message.properties.get(SUBJECT_PROPERTY),
                           "properties": dict(message.properties),
                           "store_ts": message.store_timestamp, "attempt": message.delivery_attempt,
                           "body_base64": base64.b64encode(message.body).decode(),
                           "body_text": text}, ensure_ascii=False)
    subject = message.properties.get(SUBJECT_PROPERTY)
    extras = "".join([f" subject={subject}" if subject else "",
                      f" tag={message.tag}" if message.tag else "",
                      f" keys={','.join(message.keys)}" if message.keys else ""])
    body = text if text is not None else f"<{len(message.body)} binary bytes>"
    return f"[{message.queue_id}:{message.offset}]{extras} {body}"


# --- shared ---

def client_config(args: argparse.Namespace) -> Any:
    from sluice.client.config import ClientConfig

    try:
        return ClientConfig(endpoint=args.server, access_key=args.user, secret_key=args.password,
                            reconnect_timeout=args.connect_timeout, tls=args.tls,
                            ca_file=args.ca)
    except ValueError as error:
        flag = "--ca" if "ca_file" in str(error) else "--server"
        raise CliError(f"{flag}: {error}", 2) from None


class connected:
    """Start a client, turn SDK errors into CliErrors that say what to do, close it at the end."""

    def __init__(self, client: Any, args: argparse.Namespace,
                 opener: Callable[[], Awaitable[None]] | None = None) -> None:
        self.client, self.args = client, args
        self.opener = opener or client.start

    async def __aenter__(self) -> Any:
        try:
            await self.opener()
        except BaseException as error:
            await self.client.close()
            raise self.translate(error) from None
        return self.client

    async def __aexit__(self, kind: Any, error: BaseException | None, tb: Any) -> bool:
        await self.client.close()
        if error is not None and (translated := self.translate(error)) is not error:
            raise translated from None
        return False

    def translate(self, error: BaseException) -> BaseException:
        from sluice.client.errors import (ClientTimeoutError, SluiceClientError, UnauthorizedError,
                                        UnavailableError)

        if isinstance(error, (UnavailableError, ClientTimeoutError)):
            return CliError(f"cannot reach the native gRPC endpoint at {self.args.server} "
                            f"({error}); {START_HINT}, or pass --server HOST:PORT")
        if isinstance(error, UnauthorizedError):
            return CliError(f"{error}; pass --user/--password or set SLUICE_USER/SLUICE_PASSWORD")
        if isinstance(error, SluiceClientError):
            return CliError(str(error))
        return error


# --- parser ---

def data_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("native endpoint")
    group.add_argument("--server", metavar="HOST:PORT",
                       default=os.environ.get("SLUICE_SERVER", DEFAULT_SERVER),
                       help="native gRPC endpoint (default: $SLUICE_SERVER or %(default)s)")
    add_credentials(group)
    group.add_argument("--tls", action="store_true",
                       help="connect over TLS (implied by --ca)")
    group.add_argument("--ca", metavar="PEM", default=os.environ.get("SLUICE_CA"),
                       help="CA certificate(s) to verify the broker's TLS certificate with "
                       "(default: $SLUICE_CA, else the system's trusted CAs); turns TLS on")
    group.add_argument("--connect-timeout", type=float, default=5.0, metavar="SECONDS",
                       help="give up when the broker is unreachable this long (default: 5)")
    return common


def add_data_commands(commands: argparse._SubParsersAction) -> None:
    """Register `send` and `consume` under ``commands``."""
    common = data_options()
    text = ("Send messages to a topic. BODY may contain {n}, replaced by the message's number; "
            "without BODY, --size B makes B-byte bodies, and a single message is read from stdin.")
    sub = commands.add_parser("send", help="Send messages to a topic.", description=text,
                              parents=[common])
    sub.add_argument("topic", metavar="TOPIC")
    sub.add_argument("body", nargs="?", metavar="BODY", help="message body ('-' reads stdin)")
    sub.add_argument("--tag", help="message tag (consumers filter on it)")
    sub.add_argument("--key", action="append", metavar="KEY",
                     help="business key (repeatable); {n} is replaced as in BODY")
    sub.add_argument("--property", action="append", metavar="NAME=VALUE", help="user property (repeatable)")
    sub.add_argument("--count", type=positive, default=1, metavar="N", help="send N messages")
    sub.add_argument("--size", type=int, metavar="B", help="body size in bytes when BODY is not given")
    sub.add_argument("--batch", type=positive, default=32, metavar="N",
                     help="messages per request with --count (default: %(default)s)")
    sub.add_argument("--concurrency", type=positive, default=4, metavar="N",
                     help="requests in flight with --count (default: %(default)s)")
    sub.set_defaults(handler=lambda args: run(send, args))

    text = ("Print messages of a topic. With --group G: pop, print, ack (other members of G share "
            "the messages); with --earliest or --from-offset N: read every queue by offset, no "
            "group, nothing committed. Runs until Ctrl+C, --count N messages, or --wait S idle seconds.")
    sub = commands.add_parser("consume", help="Print messages of a topic.", description=text,
                              parents=[common])
    sub.add_argument("topic", metavar="TOPIC")
    sub.add_argument("--group", help="consumer group to consume as")
    sub.add_argument("--filter", default="*", help="tag filter, e.g. 'TagA || TagB' (default: *)")
    sub.add_argument("--earliest", action="store_true", help="read from each queue's first message")
    sub.add_argument("--from-offset", type=int, metavar="N", help="read from offset N of each queue")
    sub.add_argument("--queue", type=int, metavar="Q", help="with --earliest/--from-offset: only queue Q")
    sub.add_argument("--count", type=positive, metavar="N", help="stop after N messages")
    sub.add_argument("--wait", type=float, metavar="SECONDS",
                     help="stop after this long without a message (default: never)")
    sub.add_argument("--no-ack", action="store_true", help="with --group: print without acking")
    sub.add_argument("--json", action="store_true", help="one JSON object per message")
    sub.set_defaults(handler=lambda args: run(consume, args))


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return value


def run(command: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run an async data command; CliErrors print their message, Ctrl+C ends quietly."""
    import uvloop

    try:
        return uvloop.run(command(args))
    except CliError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        return 0
