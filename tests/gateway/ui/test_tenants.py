"""``/ui/tenants``: list and search, create, edit, suspend/activate, delete."""

from __future__ import annotations

from gateway.db import crud

from .conftest import UI, field_errors, flash


def _tenant(ui: UI, name: str):  # type: ignore[no-untyped-def]
    with ui.factory() as session:
        return crud.get_tenant(session, name)


def test_list_search_and_filters(signed_in: UI) -> None:
    for name, tier in (("globex", "premium"), ("Initech", "batch"), ("globe_2", "batch")):
        assert signed_in.post("/ui/tenants/-/new", {"name": name, "tier": tier}).status_code == 303
    page = signed_in.client.get("/ui/tenants")
    assert page.status_code == 200 and 'id="page-count">1–5 of 5<' in page.text
    found = signed_in.client.get("/ui/tenants?q=GLOB")
    assert 'id="page-count">1–2 of 2<' in found.text
    assert 'href="/ui/tenants/globex"' in found.text and "Initech" not in found.text
    literal = signed_in.client.get("/ui/tenants?q=e_")  # '_' is not a wildcard
    assert 'id="page-count">1–1 of 1<' in literal.text
    batch = signed_in.client.get("/ui/tenants?tier=batch")
    assert 'id="page-count">1–2 of 2<' in batch.text
    none = signed_in.client.get("/ui/tenants?q=zzz")
    assert "No tenant matches." in none.text
    paged = signed_in.client.get("/ui/tenants?limit=2&q=")
    assert 'href="/ui/tenants?limit=2&amp;q=&amp;offset=2" rel="next"' in paged.text


def test_create_edit_suspend_activate_delete(signed_in: UI) -> None:
    created = signed_in.post(
        "/ui/tenants/-/new", {"name": "globex", "tier": "premium", "rpm_limit": "60"}
    )
    assert created.status_code == 303
    assert flash(signed_in.client.get("/ui/tenants")) == "Tenant globex created."
    assert _tenant(signed_in, "globex").rpm_limit == 60
    form = {"name": "globex", "tier": "batch", "rpm_limit": "", "ttft_ms": "6000"}
    assert signed_in.post("/ui/tenants/globex", form).status_code == 303
    tenant = _tenant(signed_in, "globex")
    assert (tenant.tier.name, tenant.rpm_limit, tenant.ttft_ms) == ("batch", None, 6000.0)
    assert signed_in.post("/ui/tenants/globex/suspend").status_code == 303
    assert _tenant(signed_in, "globex").status == "suspended"
    assert 'id="tenant-status">suspended<' in signed_in.client.get("/ui/tenants/globex").text
    assert signed_in.post("/ui/tenants/globex/activate").status_code == 303
    assert _tenant(signed_in, "globex").status == "active"
    assert signed_in.post("/ui/tenants/globex/delete").status_code == 303
    actions = [
        (e.actor, e.action)
        for e in signed_in.audit()
        if e.entity_type == "tenant" and e.entity_id == str(tenant.id)
    ]
    assert actions == [
        ("admin-ui:operator", a) for a in ("create", "update", "suspend", "activate", "delete")
    ]


def test_suspending_stops_the_tenants_keys_at_once(signed_in: UI) -> None:
    headers = {"Authorization": f"Bearer {signed_in.tenant_key}"}
    assert signed_in.client.get("/v1/models", headers=headers).status_code == 200
    assert signed_in.post("/ui/tenants/acme/suspend").status_code == 303
    assert signed_in.client.get("/v1/models", headers=headers).status_code == 401


def test_validation_errors_beside_the_field(signed_in: UI) -> None:
    cases = {
        "name": ({"name": "", "tier": "batch"}, "name:"),
        "tier": ({"name": "x1", "tier": "nope"}, "tier 'nope' does not exist"),
        "rpm_limit": ({"name": "x1", "tier": "batch", "rpm_limit": "0"}, "rpm_limit:"),
        "ttft_ms": (
            {"name": "x1", "tier": "premium", "ttft_ms": "100"},
            "is tighter than tier 'premium' allows",
        ),
    }
    for field, (form, message) in cases.items():
        response = signed_in.post("/ui/tenants/-/new", form)
        assert response.status_code in (400, 404), (field, response.status_code)
        errors = field_errors(response)
        assert field in errors and message in errors[field], (field, errors)
    taken = signed_in.post("/ui/tenants/-/new", {"name": "acme", "tier": "batch"})
    assert taken.status_code == 409 and "already exists" in field_errors(taken)["name"]
    bad_edit = signed_in.post(
        "/ui/tenants/acme", {"name": "acme", "tier": "standard", "tpm_limit": "x"}
    )
    assert bad_edit.status_code == 400
    assert "tpm_limit: Input should be a valid integer" in field_errors(bad_edit)["tpm_limit"]
    assert _tenant(signed_in, "acme").tpm_limit is None


def test_empty_list(signed_in: UI) -> None:
    for name in ("acme", "demo"):
        assert signed_in.post(f"/ui/tenants/{name}/delete").status_code == 303
    page = signed_in.client.get("/ui/tenants")
    assert page.status_code == 200 and "No tenants." in page.text


def test_resources_named_like_the_pages_actions_can_be_edited(signed_in: UI) -> None:
    """``new``, ``live`` and ``import`` are valid names; the pages' own actions live under
    ``/-/`` (a name cannot start with ``-``), so such a tenant's page is its own."""
    for name in ("new", "live", "import"):
        assert (
            signed_in.post("/ui/tenants/-/new", {"name": name, "tier": "batch"}).status_code == 303
        )
        page = signed_in.client.get(f"/ui/tenants/{name}")
        assert page.status_code == 200 and f'value="{name}"' in page.text
        form = {"name": name, "tier": "premium", "rpm_limit": "7"}
        assert signed_in.post(f"/ui/tenants/{name}", form).status_code == 303
        assert _tenant(signed_in, name).rpm_limit == 7
    # The create form is still the create form.
    assert 'action="/ui/tenants/-/new"' in signed_in.client.get("/ui/tenants/-/new").text
