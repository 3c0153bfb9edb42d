"""The overview's admission-planner panel (:mod:`gateway.app.slo_admission`'s decisions, from
``tiergate_slo_admission_total`` and ``tiergate_slo_declines_total``)."""

from __future__ import annotations

from .conftest import UI


def test_no_panel_where_no_engine_runs_the_planner(signed_in: UI) -> None:
    live = signed_in.client.get("/ui/overview/live", headers={"hx-request": "true"})
    assert live.status_code == 200 and 'id="planner"' not in live.text


def test_the_panel_shows_the_planners_decisions_and_declines_by_engine(signed_in: UI) -> None:
    metrics = signed_in.app.state.gateway.metrics
    metrics.slo_admission.labels("gold", "admitted").inc(8)
    metrics.slo_admission.labels("gold", "rerouted").inc(3)
    metrics.slo_admission.labels("gold", "shed").inc(5)
    metrics.slo_declines.labels("e0").inc(8)
    metrics.slo_declines.labels("e1").inc(5)
    metrics.rejections.labels("", "gold", "slo_declined").inc(5)
    live = signed_in.client.get("/ui/overview/live", headers={"hx-request": "true"})
    text = live.text
    assert 'id="planner"' in text
    for outcome, count in (("admitted", 8), ("rerouted", 3), ("demoted", 0), ("shed", 5)):
        assert f'<code>{outcome}</code></td><td class="num">{count}<' in text
    assert "<code>e0</code> 8, <code>e1</code> 5" in text
    assert "<code>slo_declined</code>" in text  # in the rejections by reason as well
