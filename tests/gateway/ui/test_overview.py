"""``/ui/``: gain and SLO attainment by tier from the usage records; live numbers."""

from __future__ import annotations

from datetime import timedelta

from gateway.app.ui.live import RateTracker
from gateway.db.models import UsageRecord, utcnow

from .conftest import UI


def _record(i: int, tier: str, *, status: str = "ok", met: bool = True, ago_h: float = 0.1):
    return UsageRecord(
        request_id=f"r{i}",
        tier=tier,
        prompt_tokens=10,
        completion_tokens=5,
        gain=1.0 if met else 0.5,
        ideal_gain=1.0 if status != "rejected" else 0.0,
        slo_met=met,
        status=status,
        reject_reason="rpm_limit" if status == "rejected" else None,
        created_at=utcnow() - timedelta(hours=ago_h),
    )


def test_empty_overview(signed_in: UI) -> None:
    page = signed_in.client.get("/ui/")
    assert page.status_code == 200
    assert page.text.count("No requests in this window.") == 2
    assert 'id="tdg-hour">—<' in page.text


def test_overview_with_usage(signed_in: UI) -> None:
    with signed_in.factory.begin() as session:
        session.add_all(
            [
                _record(1, "premium"),
                _record(2, "premium", met=False),
                _record(3, "standard"),
                _record(4, "standard", status="rejected", met=False),
                _record(5, "batch", ago_h=5),  # in the 24 h window only
            ]
        )
    page = signed_in.client.get("/ui/")
    # last hour: gain 2.5 of 3 ideal; 2 of 3 finished met their SLO
    assert 'id="tdg-hour">83.3%<' in page.text
    assert 'id="slo-hour">66.7%<' in page.text
    assert 'id="tdg-day">87.5%<' in page.text  # + the batch request: 3.5 / 4
    assert 'href="/ui/tiers/batch"' in page.text


def test_the_live_partial_reads_the_metrics(signed_in: UI) -> None:
    metrics = signed_in.app.state.gateway.metrics
    metrics.rejections.labels("", "premium", "rpm_limit").inc(3)
    metrics.requests.labels("", "premium", "200").inc(7)
    metrics.queue_depth.set(4)
    live = signed_in.client.get("/ui/overview/live", headers={"hx-request": "true"})
    assert live.status_code == 200
    assert "<html" not in live.text  # the partial alone
    assert 'id="live-queue">4<' in live.text
    assert 'id="live-rejected">3<' in live.text
    assert "<code>rpm_limit</code>" in live.text


def test_rate_from_two_polls() -> None:
    tracker = RateTracker(window_s=60)
    assert tracker.rate(100, now=0.0) is None
    assert tracker.rate(160, now=30.0) == 2.0
    assert tracker.rate(160, now=100.0) is not None
