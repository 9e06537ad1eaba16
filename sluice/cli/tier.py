"""`sluice tier status|run`: tiered storage of the broker (admin API: /tier)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import Any

from .admin import AdminClient, Commands, plural, show, table


def _size(count: int | None) -> str:
    value = float(count or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""


def _when(ms: int | None) -> str:
    if not ms:
        return "never"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(status: dict[str, Any]) -> str:
    """The status as `sluice tier status` prints it: a summary, then a row per topic."""
    lines = [f"location       {status['description']}",
             f"tiered end     {status.get('tiered_end', 0)}",
             f"tiered         {plural(status.get('segments') or 0, 'segment')}, "
             f"{plural(status.get('files') or 0, 'file')}, {_size(status.get('bytes'))}",
             f"pending        {plural(status.get('pending_segments') or 0, 'segment')}, "
             f"{_size(status.get('pending_bytes'))}",
             f"lag            {status['lag_ms'] / 1000:.1f} s (degraded above "
             f"{status['max_lag_ms'] / 1000:.0f} s)",
             f"last success   {_when(status.get('last_success_ms'))}",
             f"last error     {status.get('last_error') or 'none'}"]
    if status.get("stopped"):
        lines.append(f"stopped        {status['stopped']}")
    topics = status.get("topics") or {}
    rows = [(name, t.get("files", 0), t.get("rows", 0), _size(t.get("bytes")))
            for name, t in sorted(topics.items())]
    lines += ["", table(rows, ["TOPIC", "FILES", "MESSAGES", "BYTES"]) if rows
              else "nothing tiered yet"]
    return "\n".join(lines)


def _ran(status: dict[str, Any]) -> str:
    """`sluice tier run`'s answer: what local retention deleted, then the status."""
    deleted = status.get("local_retention") or {}
    return (f"tiered everything pending; local retention deleted "
            f"{plural(deleted.get('deleted_segments') or 0, 'segment')} "
            f"({_size(deleted.get('deleted_bytes'))}), the local log starts at offset "
            f"{deleted.get('log_start', 0)}\n\n" + render(status))


def tier_status(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("GET", "/tier"), render)


def tier_run(client: AdminClient, args: argparse.Namespace) -> int:
    return show(args, client.call("POST", "/tier/run"), _ran)


def add_tier_commands(commands: argparse._SubParsersAction) -> None:
    """Register `sluice tier status` and `sluice tier run`."""
    c = Commands(commands)
    tier = c.section("tier", "Tiered storage: sealed segments copied to object storage as "
                     "Parquet (the broker's tier.url).")
    c.add(tier, "status", "Show where the tier is, what it holds per topic, what waits, the "
          "lag, the last success and the last error.", tier_status)
    c.add(tier, "run", "Tier every pending sealed segment, apply tier retention, then run "
          "local retention now, so segments tiered and past store.retention_max_age_ms or "
          "store.retention_max_bytes leave the local disk at once (admin).", tier_run)
