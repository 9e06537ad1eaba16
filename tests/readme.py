"""The code blocks of README.md, as the tests that run them see them.

An HTML comment on the line before a fenced block says what a test does with it:

    <!-- test: run NAME -->     run it: a ``python`` block as a script, a ``sh``/``bash`` block
                                with ``bash -e`` (tests/integration/test_readme_examples.py)
    <!-- test: spark NAME -->   a PySpark block, run in the test session's Spark
                                (tests/analytics/test_readme_spark.py)
    <!-- test: file PATH -->    write it to PATH, for a later block to use (a Celery app module)
    <!-- test: cluster NAME --> run a ``python`` block against a three-node group while its
                                leader is killed (tests/cluster/test_readme_cluster.py)
    <!-- test: skip REASON -->  shown, not run (make targets, a second broker on the default
                                ports, commands that run until Ctrl+C)

Every ``python``, ``sh`` and ``bash`` block carries one of them, so a new example is run or
says why not. The README names the default ports; ``on_ports`` rewrites them to a test broker's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE_LANGUAGES = ("python", "sh", "bash")
_MARKER = re.compile(r"<!-- test: (run|spark|file|cluster|skip)\s+(.*?)\s*-->")
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text, where it starts, and its marker."""

    language: str
    code: str
    line: int
    action: str | None
    argument: str


def blocks(readme: Path = README) -> list[Block]:
    """Every fenced block of ``readme``, in order."""
    lines = readme.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.search(previous)
        found.append(Block(fence.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1,
                           marker.group(1) if marker else None,
                           marker.group(2) if marker else ""))
        i = end + 1
    return found


DEFAULT_PORTS = ("1883", "5672", "8080", "8081", "8083")
"""The ports the README's examples name: MQTT, AMQP, admin API, native gRPC, MQTT WebSocket."""


def on_ports(code: str, ports: dict[str, int]) -> str:
    """``code`` with each default port (a whole number in the text) replaced by ``ports``'s."""
    return re.sub(r"(?<![\d.])(" + "|".join(DEFAULT_PORTS) + r")(?!\d)",
                  lambda m: str(ports[m.group(1)]), code)
