"""``/overview``: the broker at a glance, the console's first page.

Any user may ask: everyone gets the health status, the node's role, open connections per
protocol, message totals since start and the alarms (disk, memory) with their state, which
``/health`` and ``/metrics`` show without credentials anyway. Admins also get the detail:
what each alarm says, the health checks, the replica group, the store's size and the disk's
free space (which name the host's state, not only the broker's).
"""

from __future__ import annotations

import shutil
from typing import Any

from aiohttp import web

from core.model import Principal

from .handlers import AdminDeps, blocking, deps, health_report
from .history import totals


async def overview(request: web.Request, principal: Principal) -> dict[str, Any]:
    """The summary; the detail for admins only."""
    d = deps(request)
    report = await health_report(d)
    now = totals(d)
    cluster = report.get("cluster")
    alarms = [_disk_alarm(d, report), _memory_alarm(report)]
    body: dict[str, Any] = {
        "status": report["status"],
        "role": cluster["role"] if cluster else "standalone",
        "connections": {**now.connections, "total": sum(now.connections.values())},
        "messages": {"published": now.published, "delivered": now.delivered,
                     "acked": now.acked},
        "alarms": [{"name": a["name"], "on": a["on"]} for a in alarms],
    }
    if principal.admin:
        body |= {"alarms": alarms, "health": report, "cluster": cluster,
                 "store": {"bytes": now.store_bytes, **await blocking(_disk_space, d.store)}}
    return body


def _disk_alarm(d: AdminDeps, report: dict[str, Any]) -> dict[str, Any]:
    """On while the store or the metadata database cannot write (a full disk, I/O errors)."""
    store = getattr(d.store, "degraded", None)
    metadata = report["metadata"].get("error") if report["metadata"]["status"] == "degraded" else None
    reason = store or metadata
    return {"name": "disk", "on": reason is not None,
            "detail": reason or "the store and the metadata database write"}


def _memory_alarm(report: dict[str, Any]) -> dict[str, Any]:
    """On while resident memory is above the high watermark (publishers are blocked)."""
    memory = report["memory"]
    if "alarm" not in memory:
        return {"name": "memory", "on": False, "detail": "no memory alarm is set up"}
    return {"name": "memory", "on": memory["alarm"],
            "detail": f"resident {memory['resident_bytes']} bytes, high watermark "
                      f"{memory['high_watermark_bytes']} bytes"}


def _disk_space(store: Any) -> dict[str, int]:
    """Free and total bytes of the disk holding the store's files (none for a memory store).
    Blocks on the file system: runs off the event loop."""
    directory = getattr(store, "directory", None)
    if directory is None:
        return {}
    usage = shutil.disk_usage(directory)
    return {"disk_free_bytes": usage.free, "disk_total_bytes": usage.total}
