"""`sluice serve` as a process: uvloop, signals, the interpreter's knobs, and whether it runs
alone (``app.start``) or as a node of a replica group (``cluster_node``)."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import signal
import sys
from collections.abc import Sequence

from core.errors import SluiceError
from store.errors import StoreError

from .app import StartupError, print_endpoints, start
from .cluster_node import run_cluster_node
from .config import Config
from .logs import configure_logging

log = logging.getLogger("sluice")


async def run_until_signalled(config: Config) -> None:
    """Start, print the endpoints, wait for SIGTERM/SIGINT, stop gracefully; SIGHUP reloads
    the TLS certificate."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    loop.add_signal_handler(signal.SIGUSR2, log_tasks)
    loop.add_signal_handler(signal.SIGHUP, lambda: log.info("SIGHUP while starting: ignored"))
    if config.cluster.enabled:
        await run_cluster_node(config, stopping)
        print("Sluice stopped.", flush=True)
        return
    running = await start(config)
    loop.add_signal_handler(signal.SIGHUP,
                            lambda: loop.create_task(running.reload_tls(), name="reload-tls"))
    freeze_startup_objects()
    print_endpoints(running)
    await stopping.wait()
    log.info("stopping: closing listeners, saving offsets, checkpointing the store")
    await running.stop()
    print("Sluice stopped.", flush=True)


def log_tasks() -> None:
    """Log where every unfinished asyncio task waits (SIGUSR2), for a broker that seems stuck."""
    tasks = [task for task in asyncio.all_tasks() if not task.done()]
    lines = [f"{len(tasks)} unfinished tasks:"]
    lines += [f"  {task.get_name()}: {_await_chain(task.get_coro())}" for task in tasks]
    log.warning("\n".join(lines))


def _await_chain(awaitable: object) -> str:
    """``outer:line -> inner:line -> ... -> what the innermost one awaits``."""
    parts = []
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is None:
            parts.append(repr(awaitable)[:200])
            break
        parts.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    return " -> ".join(parts)


def tune_interpreter() -> None:
    """Set the two interpreter knobs a broker process depends on.

    The collector looks at young objects every 50,000 allocations instead of 700: a broker
    keeps hundreds of thousands of small objects alive (recent messages, sessions), and at the
    default thresholds it rescans them so often that it costs a third of the throughput, while
    message objects die young and are freed by reference counting anyway.

    The thread switch interval is 1 ms instead of 5: the store's flusher thread needs the GIL
    for a moment between its write, its fsync and its dispatch, and while the event loop is
    busy each of those moments waited up to the whole interval, so under a flood of QoS 0
    publishes durability fell 40-60 ms behind the log (and every acknowledgement with it)."""
    gc.set_threshold(50_000, 50, 100)
    sys.setswitchinterval(0.001)


def freeze_startup_objects() -> None:
    """Collect what starting left behind, then move every object alive now (modules, classes,
    configuration, the broker's own structure) out of the collector's way for good, so a full
    collection later scans only what serving made (CPython's ``gc.freeze``)."""
    gc.collect()
    gc.freeze()


def serve(config: Config, warnings: Sequence[str] = ()) -> int:
    """`sluice serve`: run until signalled on uvloop; 0 after a clean stop, 1 if it cannot start.
    ``warnings`` (about the configuration) are logged first. SIGHUP reloads the TLS
    certificate and key into every TLS listener. SIGUSR1 prints every thread's
    stack to stderr and SIGUSR2 logs where every asyncio task waits, for a broker that seems
    stuck."""
    import uvloop

    tune_interpreter()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    configure_logging(config.log)
    for warning in warnings:
        log.warning(warning)
    try:
        uvloop.run(run_until_signalled(config))
    except (StartupError, SluiceError, StoreError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
