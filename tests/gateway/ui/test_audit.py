"""``/ui/audit``: filters (actor, entity, time range), changes shown as a diff."""

from __future__ import annotations

from .conftest import UI, field_errors


def test_changes_are_listed_with_their_diff(signed_in: UI) -> None:
    form = {"name": "acme", "tier": "premium", "rpm_limit": "42"}
    assert signed_in.post("/ui/tenants/acme", form).status_code == 303
    page = signed_in.client.get("/ui/audit?actor=admin-ui:operator&entity_type=tenant")
    assert page.status_code == 200
    assert 'id="page-count">1–1 of 1<' in page.text
    assert '<strong>rpm_limit</strong>: <span class="removed">null</span> → ' in page.text
    assert '<span class="added">42</span>' in page.text
    assert "<strong>name</strong>" not in page.text  # unchanged fields are left out


def test_filters(signed_in: UI) -> None:
    everything = signed_in.client.get("/ui/audit")
    assert "signin" in everything.text and "seed" in everything.text
    seeded = signed_in.client.get("/ui/audit?actor=seed")
    assert "signin" not in seeded.text
    one = signed_in.client.get("/ui/audit?entity_type=tier&entity_id=1")
    assert 'id="page-count">1–1 of 1<' in one.text
    future = signed_in.client.get("/ui/audit?since=2999-01-01T00:00")
    assert future.status_code == 200 and "No entry matches these filters." in future.text
    past = signed_in.client.get("/ui/audit?until=2000-01-01T00:00%2B00:00")
    assert "No entry matches" in past.text
    window = signed_in.client.get("/ui/audit?since=2000-01-01T00:00&until=2999-01-01T00:00")
    assert "signin" in window.text


def test_bad_times_are_400_beside_the_field(signed_in: UI) -> None:
    bad = signed_in.client.get("/ui/audit?since=yesterday")
    assert bad.status_code == 400 and "since" in field_errors(bad)
    backwards = signed_in.client.get("/ui/audit?since=2030-01-01T00:00&until=2020-01-01T00:00")
    assert backwards.status_code == 400
    assert "since must be before until" in field_errors(backwards)["since"]


def test_pagination(signed_in: UI) -> None:
    page = signed_in.client.get("/ui/audit?limit=2")
    assert 'rel="next"' in page.text and 'rel="prev"' not in page.text
