"""``/tier``: tiered storage's status, and a pass run now (``core.tiering``).

Without a tier configured (``tier.url``) both answer 404 saying how to turn it on.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.model import Principal

from .errors import HttpProblem
from .handlers import deps


def _tier(request: web.Request) -> Any:
    tier = deps(request).tier
    if tier is None:
        raise HttpProblem(404, "tier_off", "this broker tiers nothing: set tier.url "
                          "(SLUICE_TIER_URL, [tier] url) to file:///DIR or s3://BUCKET/PREFIX "
                          "and restart it (docs: tiering)")
    return tier


async def tier_status(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Where the tier is, what it holds per topic, what waits, the lag and the last error."""
    return _tier(request).status()


async def tier_run(request: web.Request, principal: Principal) -> dict[str, Any]:
    """Tier every pending segment, apply tier retention, then run local retention now (which
    may delete the segments just tiered); the status afterwards, with what local retention
    deleted. 503 when the object store fails (the answer says why), 409 when a newer leader
    tiers."""
    tier = _tier(request)
    try:
        report = await tier.run_now()
    except Exception:  # noqa: BLE001 - the loop recorded what failed; answer with it
        if tier.stopped is not None:
            raise HttpProblem(409, "tiering_stopped", tier.stopped) from None
        raise HttpProblem(503, "object_store_unavailable",
                          f"tiering to {tier.description} failed: {tier.failure}; the broker "
                          "keeps the segments locally and retries on its own") from None
    status = tier.status()
    if report is not None:
        status["local_retention"] = {"deleted_segments": len(report.deleted_segments),
                                     "deleted_bytes": report.deleted_bytes,
                                     "log_start": report.log_min_offset}
    return status
