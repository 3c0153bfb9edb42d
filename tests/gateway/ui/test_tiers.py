"""``/ui/tiers``: list, create, edit, delete — the API's validation beside the field."""

from __future__ import annotations

from gateway.db import crud

from .conftest import UI, field_errors, flash

GOLD = {"name": "gold", "weight": "3", "ttft_ms": "800", "tpot_ms": "40", "shed_slack": "0"}


def _tier(ui: UI, name: str) -> object:
    with ui.factory() as session:
        return crud.get_tier(session, name)


def test_the_list_renders_with_the_seeded_tiers(signed_in: UI) -> None:
    page = signed_in.client.get("/ui/tiers")
    assert page.status_code == 200
    assert "<h1>Tiers</h1>" in page.text
    for name in ("premium", "standard", "batch"):
        assert f'href="/ui/tiers/{name}"' in page.text
    assert 'id="page-count">1–3 of 3<' in page.text
    assert page.headers["cache-control"] == "no-store"


def test_an_empty_list_says_so(signed_in: UI) -> None:
    page = signed_in.client.get("/ui/tiers?offset=50")
    assert page.status_code == 200
    assert "No tiers on this page" in page.text


def test_create_every_field_then_edit_and_delete(signed_in: UI) -> None:
    form = {
        **GOLD,
        "description": "gold <b>customers</b>",
        "deadline_ms": "60000",
        "min_ttft_ms": "200",
        "min_tpot_ms": "20",
        "min_deadline_ms": "1000",
        "rpm_limit": "600",
        "tpm_limit": "100000",
        "max_concurrency": "8",
        "best_effort_allowed": "true",
        "shed_slack": "0.25",
    }
    created = signed_in.post("/ui/tiers/-/new", form)
    assert created.status_code == 303, created.text
    assert flash(signed_in.client.get("/ui/tiers")) == "Tier gold created."
    tier = _tier(signed_in, "gold")
    assert (tier.weight, tier.rpm_limit, tier.best_effort_allowed, tier.shed_slack) == (
        3.0,
        600,
        True,
        0.25,
    )
    assert "gold &lt;b&gt;customers&lt;/b&gt;" in signed_in.client.get("/ui/tiers").text
    edit = signed_in.client.get("/ui/tiers/gold")
    assert 'value="600"' in edit.text and 'value="0.25"' in edit.text
    # clear a limit, change the weight: blank means unlimited
    saved = signed_in.post("/ui/tiers/gold", {**form, "rpm_limit": "", "weight": "5"})
    assert saved.status_code == 303
    tier = _tier(signed_in, "gold")
    assert (tier.weight, tier.rpm_limit) == (5.0, None)
    gold = [e for e in signed_in.audit() if e.entity_type == "tier" and e.entity_id == str(tier.id)]
    assert [(e.actor, e.action) for e in gold] == [
        ("admin-ui:operator", "create"),
        ("admin-ui:operator", "update"),
    ]
    assert signed_in.post("/ui/tiers/gold/delete").status_code == 303
    assert "gold" not in [t.name for t in _list(signed_in)]


def _list(ui: UI) -> list:  # type: ignore[type-arg]
    with ui.factory() as session:
        return crud.list_tiers(session)


def test_validation_errors_beside_the_field_with_the_apis_message(signed_in: UI) -> None:
    cases = {
        "weight": ({**GOLD, "weight": "abc"}, "weight: Input should be a valid number"),
        "name": ({**GOLD, "name": "no spaces"}, "name: use 1-64 letters"),
        "ttft_ms": ({**GOLD, "ttft_ms": "-1"}, "ttft_ms:"),
        "shed_slack": ({**GOLD, "shed_slack": "-0.5"}, "shed_slack:"),
        "min_ttft_ms": ({**GOLD, "min_ttft_ms": "900"}, "exceeds the tier's default ttft_ms"),
        "rpm_limit": ({**GOLD, "rpm_limit": "1.5"}, "rpm_limit:"),
    }
    for field, (form, message) in cases.items():
        response = signed_in.post("/ui/tiers/-/new", form)
        assert response.status_code == 400, (field, response.status_code)
        errors = field_errors(response)
        assert field in errors and message in errors[field], (field, errors)
        assert f'value="{form[field]}"' in response.text  # what was typed stays
    assert "gold" not in [t.name for t in _list(signed_in)]


def test_a_taken_name_is_409_beside_the_name(signed_in: UI) -> None:
    response = signed_in.post("/ui/tiers/-/new", {**GOLD, "name": "premium"})
    assert response.status_code == 409
    assert "already exists" in field_errors(response)["name"]


def test_a_tier_with_tenants_cannot_be_deleted(signed_in: UI) -> None:
    response = signed_in.post("/ui/tiers/standard/delete")
    assert response.status_code == 409
    assert "still has 2 tenant" in field_errors(response)["form"]


def test_an_unknown_tier_is_a_404_page(signed_in: UI) -> None:
    response = signed_in.client.get("/ui/tiers/nope")
    assert response.status_code == 404
    assert "tier 'nope' does not exist" in response.text.replace("&#39;", "'")


def test_an_edit_drops_cached_identities(signed_in: UI) -> None:
    state = signed_in.app.state.gateway
    seen: list[object] = []
    original = state.auth.invalidate
    state.auth.invalidate = lambda prefix=None: (seen.append(prefix), original(prefix))
    form = {**GOLD, "name": "standard", "weight": "2.5", "ttft_ms": "2000", "tpot_ms": "100"}
    assert signed_in.post("/ui/tiers/standard", form).status_code == 303
    assert seen == [None]


def test_pagination_links(signed_in: UI) -> None:
    for i in range(4):
        signed_in.post("/ui/tiers/-/new", {**GOLD, "name": f"t{i}"})
    first = signed_in.client.get("/ui/tiers?limit=3")
    assert 'id="page-count">1–3 of 7<' in first.text
    assert 'href="/ui/tiers?limit=3&amp;offset=3" rel="next"' in first.text
    last = signed_in.client.get("/ui/tiers?limit=3&offset=6")
    assert 'id="page-count">7–7 of 7<' in last.text
    assert 'href="/ui/tiers?limit=3&amp;offset=3" rel="prev"' in last.text
    assert 'rel="next"' not in last.text
    assert signed_in.client.get("/ui/tiers?limit=500").status_code == 400
    assert signed_in.client.get("/ui/tiers?offset=-1").status_code == 400
