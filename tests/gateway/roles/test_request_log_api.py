"""``/admin/v1/requests`` on SQLite and PostgreSQL: newest first by keyset, the filters, one
request by id or request id, bad input as 400/404 JSON, and a tenant admin that sees its own
tenant's requests only — another tenant by id or name, another tenant's key or request is 403."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import insert

from gateway.db.models import RequestLog, utcnow

from .conftest import Team


def _seed(team: Team) -> dict[str, list[int]]:
    """Five acme requests and three globex ones (ids by tenant, oldest first)."""
    now = utcnow()
    rows: list[dict[str, Any]] = []
    specs = [
        ("acme", "ok", True, None, 50),
        ("acme", "ok", False, "queued", 40),
        ("globex", "ok", False, "engine_slow", 35),
        ("acme", "rejected", None, "hopeless", 30),
        ("globex", "error", None, None, 20),
        ("acme", "ok", False, "stalled", 10),
        ("globex", "ok", True, None, 5),
        ("acme", "cancelled", None, None, 1),
    ]
    for i, (tenant, status, met, why, minutes) in enumerate(specs):
        rows.append(
            {
                "request_id": f"chatcmpl-{tenant}-{i}",
                "created_at": now - timedelta(minutes=minutes),
                "tenant_id": team.tenant_ids[tenant],
                "tier": "standard",
                "model": "m",
                "backend": "b1",
                "status": status,
                "http_status": 200 if status == "ok" else 503,
                "attempts": 1,
                "gain": 1.0,
                "ideal_gain": 2.0,
                "slo_met": met,
                "miss_reason": why,
                "queue_ms": 12.5,
                "predicted_ttft_ms": 80.0,
            }
        )
    with team.factory.begin() as session:
        session.execute(insert(RequestLog), rows)
    ids: dict[str, list[int]] = {"acme": [], "globex": []}
    for page in _pages(team, "owner", limit=3):
        for item in page:
            ids[item["tenant"]].insert(0, item["id"])
    return ids


def _pages(team: Team, role: str, **params: Any) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        query = {**params, **({"before": cursor} if cursor else {})}
        response = team.api(role, "GET", "/requests", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append(body["data"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


def _ids(team: Team, role: str, **params: Any) -> list[int]:
    return [item["id"] for page in _pages(team, role, **params) for item in page]


def test_pages_run_newest_first_and_the_filters_apply(team: Team) -> None:
    ids = _seed(team)
    everyone = _ids(team, "viewer", limit=3)
    assert everyone == sorted(ids["acme"] + ids["globex"], reverse=True)
    assert [len(p) for p in _pages(team, "viewer", limit=3)] == [3, 3, 2]
    acme = ids["acme"][::-1]
    assert _ids(team, "viewer", tenant="acme") == acme
    assert _ids(team, "viewer", tenant=str(team.tenant_ids["acme"]), limit=2) == acme
    missed = [ids["acme"][1], ids["globex"][0], ids["acme"][2], ids["acme"][3]]
    assert _ids(team, "viewer", missed="true") == missed[::-1]
    newest_miss = missed[::-1][:1]
    assert _ids(team, "viewer", missed="true", tenant="acme", limit=1) == [
        *newest_miss,
        ids["acme"][2],
        ids["acme"][1],
    ]
    assert _ids(team, "viewer", reason="queued") == [ids["acme"][1]]
    assert _ids(team, "viewer", status="rejected") == [ids["acme"][2]]
    since = (utcnow() - timedelta(minutes=25)).isoformat()
    assert _ids(team, "viewer", since=since, tenant="globex") == ids["globex"][1:][::-1]
    first = team.api("viewer", "GET", "/requests", params={"reason": "queued"}).json()["data"][0]
    assert first["miss"] == "waited in the gateway queue beyond its TTFT"
    assert (first["queue_ms"], first["predicted_ttft_ms"], first["tenant"]) == (12.5, 80.0, "acme")
    assert "prompt" not in first and "messages" not in first


def test_one_request_by_id_or_request_id(team: Team) -> None:
    ids = _seed(team)
    by_id = team.api("viewer", "GET", f"/requests/{ids['acme'][1]}")
    assert by_id.status_code == 200 and by_id.json()["miss_reason"] == "queued"
    by_name = team.api("viewer", "GET", f"/requests/{by_id.json()['request_id']}")
    assert by_name.json() == by_id.json()
    for missing in ("999999", "chatcmpl-none", "0", "9" * 40):
        response = team.api("viewer", "GET", f"/requests/{missing}")
        assert response.status_code == 404, (missing, response.text)
        assert response.json()["error"]["code"] is not None


def test_bad_input_is_a_400_never_a_500(team: Team) -> None:
    _seed(team)
    for params in (
        {"limit": 0},
        {"limit": 201},
        {"before": 0},
        {"before": "x"},
        {"status": "nope"},
        {"reason": "nope"},
        {"missed": "maybe"},
        {"since": "yesterday"},
        {"since": "2026-01-02T00:00", "until": "2026-01-01T00:00"},
    ):
        response = team.api("owner", "GET", "/requests", params=params)
        assert response.status_code == 400, (params, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert team.api("owner", "GET", "/requests", params={"tenant": "nosuch"}).status_code == 404
    assert team.api("owner", "GET", "/requests", params={"key": "tg-nosuch0"}).status_code == 404


def test_a_tenant_admin_sees_its_own_tenants_requests_only(team: Team) -> None:
    ids = _seed(team)
    acme = ids["acme"][::-1]
    assert _ids(team, "tenant_admin") == acme  # without a filter: its own
    assert _ids(team, "tenant_admin", tenant="acme") == acme
    assert _ids(team, "tenant_admin", tenant=str(team.tenant_ids["acme"])) == acme
    globex_id = str(team.tenant_ids["globex"])
    for params in (
        {"tenant": "globex"},
        {"tenant": globex_id},
        {"tenant": "nosuch"},
        {"key": team.prefix("globex")},
        {"key": "tg-nosuch0"},
    ):
        response = team.api("tenant_admin", "GET", "/requests", params=params)
        assert response.status_code == 403, (params, response.text)
        assert response.json()["error"]["code"] == "other_tenant"
    for ref in (str(ids["globex"][0]), "chatcmpl-globex-2", "999999", "chatcmpl-none"):
        response = team.api("tenant_admin", "GET", f"/requests/{ref}")
        assert response.status_code == 403, (ref, response.text)
        assert response.json()["error"]["code"] == "other_tenant"
    own = team.api("tenant_admin", "GET", f"/requests/{ids['acme'][0]}")
    assert own.status_code == 200 and own.json()["tenant"] == "acme"
    mine = team.api("tenant_admin", "GET", "/requests", params={"key": team.prefix("acme")})
    assert mine.status_code == 200  # its own key: allowed (no rows carry it here)
