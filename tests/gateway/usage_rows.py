"""Hand-made usage records for the usage series tests (crud, admin API, dashboard page): the
numbers each test expects are computed by hand from these rows, in their comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from gateway.db import crud

ACTOR = "test:series"
T0 = datetime(2030, 1, 1, tzinfo=UTC)  # a bucket boundary for minutes, hours and days
HOUR = timedelta(hours=1)

_ids = iter(range(1, 10**9))


def row(at: datetime, status: str = "ok", **values: Any) -> dict[str, Any]:
    """A usage record at ``at`` (defaults: an SLO-met ok request of gold without tokens)."""
    base: dict[str, Any] = {
        "request_id": f"r-{next(_ids)}",
        "tenant_id": None,
        "api_key_id": None,
        "tier": "gold",
        "model": "m",
        "backend": "b",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "ttft_ms": None,
        "tpot_ms": None,
        "gain": 0.0,
        "ideal_gain": 0.0,
        "slo_met": status == "ok",
        "status": status,
        "reject_reason": None,
        "created_at": at,
    }
    base.update(values)
    return base


def make_tenants(session: Session) -> tuple[int, int]:
    crud.create_tier(session, actor=ACTOR, name="gold", weight=2, ttft_ms=500, tpot_ms=50)
    crud.create_tier(session, actor=ACTOR, name="silver", weight=1, ttft_ms=900, tpot_ms=90)
    acme = crud.create_tenant(session, actor=ACTOR, name="acme", tier="gold")
    beta = crud.create_tenant(session, actor=ACTOR, name="beta", tier="silver")
    session.flush()
    return acme.id, beta.id


def hand_rows(acme: int, beta: int) -> list[dict[str, Any]]:
    """The hand-computed set: hour 0 and hour 1 of T0, plus rows just outside the window."""
    a = {"tenant_id": acme, "tier": "gold"}
    b = {"tenant_id": beta, "tier": "silver"}
    m = timedelta(minutes=1)
    return [
        # hour 0, acme: four finished requests (ttft 100/200/400/800, tpot 10/20/40/80),
        # three of them met their SLO; gains 2/4, 1/1, 1/2, 0/1 -> 4 / 8
        row(
            T0 + m,
            ttft_ms=100,
            tpot_ms=10,
            prompt_tokens=10,
            completion_tokens=20,
            gain=2,
            ideal_gain=4,
            **a,
        ),
        row(
            T0 + 2 * m,
            ttft_ms=200,
            tpot_ms=20,
            prompt_tokens=5,
            completion_tokens=5,
            gain=1,
            ideal_gain=1,
            slo_met=False,
            **a,
        ),
        row(
            T0 + 3 * m,
            ttft_ms=400,
            tpot_ms=40,
            prompt_tokens=1,
            completion_tokens=1,
            gain=1,
            ideal_gain=2,
            **a,
        ),
        # at 00:59:59.9999: still hour 0 (SQLite's own parser would round it into hour 1)
        row(
            T0 + HOUR - timedelta(microseconds=100),
            ttft_ms=800,
            tpot_ms=80,
            gain=0,
            ideal_gain=1,
            **a,
        ),
        # not samples: a rejection (an old row still carrying gains: left out of the sums),
        # a failure with a huge TTFT (left out of the percentiles), a cancellation
        row(
            T0 + 4 * m,
            "rejected",
            reject_reason="rpm_limit",
            gain=9,
            ideal_gain=9,
            slo_met=True,
            **a,
        ),
        row(
            T0 + 5 * m,
            "error",
            ttft_ms=5000,
            tpot_ms=500,
            prompt_tokens=7,
            gain=0.5,
            ideal_gain=3,
            slo_met=False,
            **a,
        ),
        row(T0 + 6 * m, "cancelled", prompt_tokens=3, completion_tokens=2, slo_met=False, **a),
        # hour 0, beta: one finished request
        row(
            T0 + 7 * m,
            ttft_ms=50,
            tpot_ms=5,
            prompt_tokens=2,
            completion_tokens=3,
            gain=1,
            ideal_gain=1,
            **b,
        ),
        # hour 1, beta: two finished requests, one met
        row(T0 + HOUR, ttft_ms=300, tpot_ms=30, gain=1, ideal_gain=2, **b),
        row(T0 + HOUR + m, ttft_ms=100, tpot_ms=10, gain=1, ideal_gain=1, slo_met=False, **b),
        # hour 1, a deleted tenant's record (tenant NULL, tier gold)
        row(T0 + HOUR + 2 * m, ttft_ms=10, tpot_ms=1, tier="gold"),
        # outside [T0, T0 + 2h): just before and exactly at the end
        row(T0 - timedelta(microseconds=1), ttft_ms=1, **a),
        row(T0 + 2 * HOUR, ttft_ms=1, **a),
    ]
