"""``/ui/``: the fleet at a glance — gain (TDG ratio) and SLO attainment by tier over the last
hour and 24 hours (from the usage records, :func:`gateway.db.crud.usage_by_tier`), and live:
request rate, rejections by reason, queue depth, requests in flight, backends up.

The live panel is a partial (``/ui/overview/live``) that htmx re-fetches every few seconds; its
numbers come from the gateway's own metrics (:mod:`gateway.app.ui.live`), read-only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from gateway.app.state import GatewayState
from gateway.app.ui.deps import OperatorDep, SessionDep, StateDep, UiRoute
from gateway.app.ui.live import LiveNumbers, RateTracker, read_live
from gateway.app.ui.render import render
from gateway.db import crud
from gateway.db.models import utcnow

router = APIRouter(route_class=UiRoute)

WINDOWS = (("hour", "Last hour", timedelta(hours=1)), ("day", "Last 24 h", timedelta(hours=24)))
POLL_S = 5


@dataclass(frozen=True, slots=True)
class TierRow:
    """One tier's numbers in one window (the fleet's row has tier None)."""

    tier: str | None
    requests: int
    ok: int
    rejected: int
    tdg_ratio: float | None
    slo_attainment: float | None


@dataclass(frozen=True, slots=True)
class WindowSummary:
    key: str
    label: str
    fleet: TierRow
    tiers: list[TierRow]


def _summaries(session: Session) -> list[WindowSummary]:
    now = utcnow()
    out = []
    for key, label, span in WINDOWS:
        rows = crud.usage_by_tier(session, since=now - span, until=None)
        tiers = [
            TierRow(r.group, r.requests, r.ok, r.rejected, r.tdg_ratio, r.slo_attainment)
            for r in rows
        ]
        gain = sum(r.gain for r in rows)
        ideal = sum(r.ideal_gain for r in rows)
        ok = sum(r.ok for r in rows)
        met = sum(r.slo_met for r in rows)
        fleet = TierRow(
            None,
            sum(r.requests for r in rows),
            ok,
            sum(r.rejected for r in rows),
            gain / ideal if ideal > 0 else None,
            met / ok if ok else None,
        )
        out.append(WindowSummary(key, label, fleet, tiers))
    return out


def _tracker(request: Request) -> RateTracker:
    tracker = getattr(request.app.state, "ui_rate_tracker", None)
    if tracker is None:
        tracker = request.app.state.ui_rate_tracker = RateTracker()
    return tracker


async def _live(request: Request, state: GatewayState) -> LiveNumbers:
    return await asyncio.to_thread(read_live, state, _tracker(request))


@router.get("/")
async def overview(
    request: Request, operator: OperatorDep, session: SessionDep, state: StateDep
) -> HTMLResponse:
    summaries = await asyncio.to_thread(_summaries, session)
    live = await _live(request, state)
    return render(
        request,
        "overview.html",
        active="overview",
        title="Overview",
        summaries=summaries,
        live=live,
        poll_s=POLL_S,
    )


@router.get("/overview/live")
async def overview_live(request: Request, operator: OperatorDep, state: StateDep) -> HTMLResponse:
    """The live panel alone, for htmx's poll."""
    live = await _live(request, state)
    return render(request, "partials/overview_live.html", live=live, poll_s=POLL_S)
