"""``/usage``: summaries per tenant and tier over a window, checked against the seeded rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.db.models import UsageRecord, utcnow

from .support import Admin, error


def _seed_usage(admin: Admin) -> tuple[datetime, list[UsageRecord]]:
    """Records for two tenants over the last hours (and one a day old); returns now and them."""
    admin.tier()
    admin.tier("free", weight=1.0)
    acme, globex = admin.tenant(), admin.tenant("globex", "free")
    now = utcnow()
    spec = [
        # tenant, tier, age (h), status, prompt, completion, slo_met, gain, ideal
        (acme, "gold", 0.5, "ok", 100, 50, True, 3.0, 3.0),
        (acme, "gold", 1.5, "ok", 200, 20, False, 1.0, 3.0),
        (acme, "gold", 0.1, "rejected", 30, 0, False, 0.0, 3.0),
        (globex, "free", 0.2, "ok", 10, 5, True, 1.0, 1.0),
        (globex, "free", 0.3, "error", 10, 0, False, 0.0, 1.0),
        (globex, "free", 30.0, "ok", 999, 999, True, 1.0, 1.0),
    ]
    rows = [
        UsageRecord(
            request_id=f"r{i}",
            tenant_id=t["id"],
            tier=tier,
            status=status,
            prompt_tokens=p,
            completion_tokens=c,
            slo_met=met,
            gain=g,
            ideal_gain=ideal,
            created_at=now - timedelta(hours=age),
        )
        for i, (t, tier, age, status, p, c, met, g, ideal) in enumerate(spec)
    ]
    with admin.state.session_factory.begin() as s:
        s.add_all(rows)
    return now, rows


def _expected(rows: list[UsageRecord], since: datetime, until: datetime | None, key: Any) -> Any:
    """Totals per group computed straight from the seeded rows: tokens and SLO samples of
    finished requests only, gain of all but rejected ones (docs/usage.md)."""
    out: dict[Any, dict[str, Any]] = {}
    for r in rows:
        if r.created_at < since or (until is not None and r.created_at >= until):
            continue
        g = out.setdefault(
            key(r),
            {"requests": 0, "ok": 0, "tokens": 0, "met": 0, "gain": 0.0, "ideal": 0.0},
        )
        g["requests"] += 1
        if r.status == "ok":
            g["ok"] += 1
            g["tokens"] += r.prompt_tokens + r.completion_tokens
            g["met"] += int(r.slo_met)
        if r.status != "rejected":
            g["gain"] += r.gain
            g["ideal"] += r.ideal_gain
    return out


def test_usage_summaries_per_tenant_and_tier(admin: Admin) -> None:
    now, rows = _seed_usage(admin)
    names = {r.tenant_id: n for n, r in zip(["acme"] * 3 + ["globex"] * 3, rows, strict=True)}
    for path, params, field_name, key in [
        ("/usage/tenants", {}, "tenant", lambda r: names[r.tenant_id]),
        ("/usage/tenants", {"hours": 1}, "tenant", lambda r: names[r.tenant_id]),
        ("/usage/tiers", {"hours": 48}, "tier", lambda r: r.tier),
        ("/usage/tiers", {"hours": 1}, "tier", lambda r: r.tier),
    ]:
        report = admin.ok("GET", path, **params)
        since = datetime.fromisoformat(report["since"])
        hours = params.get("hours", 24)
        assert abs((now - since).total_seconds() - hours * 3600) < 60
        expected = _expected(rows, since, None, key)
        got = {g[field_name]: g for g in report["data"]}
        assert set(got) == set(expected), (path, params)
        for name, e in expected.items():
            g = got[name]
            assert (g["requests"], g["total_tokens"], g["slo_met"]) == (
                e["requests"],
                e["tokens"],
                e["met"],
            )
            assert g["slo_attainment"] == (pytest.approx(e["met"] / e["ok"]) if e["ok"] else None)
            assert g["tdg_ratio"] == pytest.approx(e["gain"] / e["ideal"])


def test_usage_window_by_since_and_until_and_filters(admin: Admin) -> None:
    now, rows = _seed_usage(admin)
    since, until = now - timedelta(hours=1), now - timedelta(minutes=15)
    report = admin.ok(
        "GET", "/usage/tiers", since=since.isoformat(), until=until.isoformat(), tier="free"
    )
    assert datetime.fromisoformat(report["until"]) == until
    expected = _expected(rows, since, until, lambda r: r.tier)
    [free] = report["data"]
    assert (free["tier"], free["requests"]) == ("free", expected["free"]["requests"])
    assert (free["errors"], free["ok"]) == (1, 0)  # the ok one (12 min old) is after until
    [acme] = admin.ok("GET", "/usage/tenants", tenant="acme", hours=2)["data"]
    assert (acme["tenant"], acme["requests"], acme["rejected"]) == ("acme", 3, 1)
    report = admin.ok(
        "GET", "/usage/tenants", hours=1, until=(now - timedelta(hours=1)).isoformat()
    )
    assert [(g["tenant"], g["requests"]) for g in report["data"]] == [("acme", 1)]


def test_a_time_without_an_offset_is_utc_as_on_the_dashboard(admin: Admin) -> None:
    """``since``/``until`` with no offset mean UTC (the dashboard's rule), on every route."""
    bare = {"since": "2024-01-01T00:00:00", "until": "2024-01-02T00:00"}
    for path in ("/usage/tenants", "/usage/tiers", "/usage/series"):
        report = admin.ok("GET", path, **bare)
        assert datetime.fromisoformat(report["since"]) == datetime(2024, 1, 1, tzinfo=UTC), path
        assert datetime.fromisoformat(report["until"]) == datetime(2024, 1, 2, tzinfo=UTC), path
    assert admin.call("GET", "/audit", since="2024-01-01T00:00:00").status_code == 200
    offset = admin.ok("GET", "/usage/tiers", since="2024-01-01T02:00:00+02:00")
    assert datetime.fromisoformat(offset["since"]) == datetime(2024, 1, 1, tzinfo=UTC)


def test_bad_usage_windows_are_4xx(admin: Admin) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hours": 1, "since": "2024-01-01T00:00:00Z"}, "hours"),
        ({"since": "yesterday"}, "since"),
        ({"hours": 0}, "hours"),
        ({"hours": 1e12}, "hours"),
        ({"since": "2024-01-02T00:00:00Z", "until": "2024-01-01T00:00:00Z"}, "since"),
        ({"until": "0001-01-01T00:30:00Z"}, "hours"),  # the window would start before year 1
    ]
    for params, param in cases:
        for path in ("/usage/tenants", "/usage/tiers"):
            assert error(admin.call("GET", path, **params), 400)["param"] == param, params
    assert error(admin.call("GET", "/usage/tenants", tenant="nobody"), 404)["param"] == "tenant"
