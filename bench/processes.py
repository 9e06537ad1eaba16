"""Helpers for brokers the benchmark starts as child processes: ports, readiness, stopping."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"


class ServerUnavailable(RuntimeError):
    """A broker is not installed, or did not come up."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on loopback right now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(port: int, deadline: float, process: subprocess.Popen, name: str) -> None:
    """Return once ``port`` on loopback accepts a TCP connection.

    Raises ``ServerUnavailable`` as soon as ``process`` exits, or at ``deadline`` (a
    ``time.monotonic()`` value). Polls every 50 ms: a listening socket is the readiness event
    both brokers offer.
    """
    while True:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=1.0):
                return
        except OSError:
            pass
        if process.poll() is not None:
            raise ServerUnavailable(f"{name} exited with code {process.returncode} before "
                                    f"port {port} accepted a connection")
        if time.monotonic() >= deadline:
            raise ServerUnavailable(f"{name}: port {port} did not accept a connection in time")
        time.sleep(0.05)


def stop_process_group(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the group ``process`` leads (started with ``start_new_session``), SIGKILL after ``grace``."""
    if process.poll() is None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    process.wait()


def group_cpu_seconds(pgid: int) -> float | None:
    """User plus system CPU seconds used so far by the live processes of process group ``pgid``
    (every thread of each), from /proc; None where there is no /proc."""
    if not os.path.isdir("/proc"):
        return None
    ticks, total = os.sysconf("SC_CLK_TCK"), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                data = stat.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()  # fields[0] is field 3 of proc(5)
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def tail(paths: list[Path], lines: int = 20) -> str:
    """The last ``lines`` of each file that exists, for error messages."""
    parts = []
    for path in paths:
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if text:
            parts.append(f"--- {path.name}\n" + "\n".join(text))
    return "\n".join(parts)
