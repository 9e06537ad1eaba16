"""The broker's log: one line per event on stderr, as text for people or JSON for collectors.

``[log] level`` (``--log-level``) is the least severe level written; ``[log] format``
(``--log-format``) is ``text`` (``time LEVEL logger: message``) or ``json`` (one object per
line with ``ts``, ``level``, ``logger``, ``message`` and, for an exception, ``exc``), the form
log shippers such as Vector, Fluent Bit or Loki's promtail read without a parsing rule.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class LogConfig:
    """How much the broker logs and in which form."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level written (``--log-level``)."""
    format: Literal["text", "json"] = "text"
    """``text`` for people, ``json`` (one object per line) for log shippers (``--log-format``)."""


class JsonFormatter(logging.Formatter):
    """Each record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": datetime.fromtimestamp(record.created, timezone.utc)
                 .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                 "level": record.levelname.lower(), "logger": record.name,
                 "message": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(config: LogConfig, stream: TextIO = sys.stderr) -> None:
    """Send every logger's records at ``config.level`` and above to ``stream``."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if config.format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level.upper())
