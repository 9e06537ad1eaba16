"""The data directory's fixed geometry, written once when the directory is created.

``<data>/store.json`` records what every later opener (the broker after a config change, a
read-only reader inside a Spark executor) must agree on to find entries in consume-queue files.
"""
from __future__ import annotations

import json
import logging
import os

from .durable_files import replace_file

log = logging.getLogger(__name__)

FORMAT = 1
_NAME = "store.json"


def queue_entries_per_file(directory: str, configured: int | None) -> int:
    """Entries per consume-queue file of ``directory``; records ``configured`` on first use.

    A reader passes ``configured=None`` and gets what the directory says.
    """
    path = os.path.join(directory, _NAME)
    try:
        with open(path) as file:
            layout = json.load(file)
    except FileNotFoundError:
        if configured is None:
            raise FileNotFoundError(f"{directory} holds no Sluice store ({_NAME} is missing)") from None
        _write(path, {"format": FORMAT, "queue_entries_per_file": configured})
        return configured
    stored = int(layout["queue_entries_per_file"])
    if configured is not None and configured != stored:
        log.warning("%s was created with %d entries per consume-queue file; keeping that, not %d",
                    directory, stored, configured)
    return stored


def _write(path: str, layout: dict) -> None:
    replace_file(path, json.dumps(layout).encode(), site="layout")
