"""The dashboard's Prices and Budgets pages on SQLite and PostgreSQL: staff set and delete
prices and budgets through forms (audited as the dashboard's operator), a refusal shows the
page again with the API's words, a viewer sees no form, a tenant admin its own budgets only."""

from __future__ import annotations

import re

from sqlalchemy import select

from gateway.db.models import AuditLog, Budget, ModelPrice

from .conftest import Team


def _flash_ok(response: object) -> None:
    assert getattr(response, "status_code", None) == 303, getattr(response, "text", "")


def test_prices_are_set_changed_and_deleted_from_the_page(team: Team) -> None:
    team.sign_in("operator")
    body = {"model": "Qwen/Qwen2-7B", "prompt_per_mtok": "0.15", "completion_per_mtok": "0.6"}
    _flash_ok(team.post("/ui/prices/-/new", body))
    _flash_ok(team.post("/ui/prices/-/new", {**body, "completion_per_mtok": "0.7"}))  # changed
    page = team.get("/ui/prices").text
    assert "Qwen/Qwen2-7B" in page and "0.700000" in page and 'id="price-form"' in page
    refused = team.post("/ui/prices/-/new", {**body, "prompt_per_mtok": "-1"})
    assert refused.status_code == 400 and 'id="error-form"' in refused.text
    assert "prompt_per_mtok" in refused.text
    with team.factory() as s:
        price_id = s.scalar(select(ModelPrice.id))
        actions = s.scalars(
            select(AuditLog.action).where(AuditLog.entity_type == "price").order_by(AuditLog.id)
        ).all()
    assert actions == ["create", "update"]
    team.sign_in("viewer")
    seen = team.get("/ui/prices").text
    assert "Qwen/Qwen2-7B" in seen and 'id="price-form"' not in seen
    team.sign_in("owner")
    _flash_ok(team.post(f"/ui/prices/{price_id}/delete"))
    assert 'id="prices-empty"' in team.get("/ui/prices").text


def test_budgets_from_the_page_and_a_tenant_admins_view(team: Team) -> None:
    team.sign_in("owner")
    _flash_ok(team.post("/ui/budgets/-/new", {"tenant": "acme", "period": "day", "amount": "5"}))
    _flash_ok(
        team.post(
            "/ui/budgets/-/new",
            {"tenant": "globex", "period": "month", "amount": "7", "soft_fraction": "0.8"},
        )
    )
    refused = team.post("/ui/budgets/-/new", {"tenant": "acme", "period": "day", "amount": "5"})
    assert refused.status_code == 409 and 'id="error-form"' in refused.text
    bad = team.post("/ui/budgets/-/new", {"tenant": "acme", "period": "day", "amount": "x"})
    assert bad.status_code == 400
    page = team.get("/ui/budgets").text
    assert "acme" in page and "globex" in page and "5.000000000" in page
    team.sign_in("tenant_admin")
    mine = team.get("/ui/budgets").text
    rows = re.findall(r'<th scope="row">([^<]+)</th>', mine)
    assert rows == ["acme"] and 'id="budget-form"' not in mine
    team.sign_in("operator")
    with team.factory() as s:
        globex = s.scalar(select(Budget.id).where(Budget.period == "month"))
    _flash_ok(team.post(f"/ui/budgets/{globex}/delete"))
    assert team.post("/ui/budgets/99999/delete").status_code == 404
    assert "globex" not in re.findall(r'<th scope="row">([^<]+)</th>', team.get("/ui/budgets").text)
