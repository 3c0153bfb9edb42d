"""``/tiers``: CRUD by name and id, conflicts, and the error dialect for invalid bodies."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.bounds import (
    MAX_LIMIT,
    MAX_SHED_SLACK,
    MAX_SLO_MS,
    MAX_WEIGHT,
    MIN_LIMIT,
    MIN_SLO_MS,
    MIN_WEIGHT,
)

from .support import PREFIX, Admin, error


def test_tier_crud_by_name_and_id(admin: Admin) -> None:
    gold = admin.tier(rpm_limit=60, description="paying customers")
    assert gold["object"] == "tier" and gold["rpm_limit"] == 60 and gold["tpm_limit"] is None
    admin.tier("free", weight=1.0)
    assert admin.ok("GET", "/tiers/gold") == gold
    assert admin.ok("GET", f"/tiers/{gold['id']}") == gold
    listed = admin.ok("GET", "/tiers")
    assert listed["object"] == "list"
    assert [t["name"] for t in listed["data"]] == ["gold", "free"]  # most important first

    patched = admin.ok("PATCH", "/tiers/gold", {"weight": 5, "rpm_limit": None})
    assert (patched["weight"], patched["rpm_limit"]) == (5.0, None)
    assert patched["description"] == "paying customers"  # untouched: not sent
    assert admin.state.auth.invalidated == [None]  # every identity on the tier is stale

    deleted = admin.ok("DELETE", f"/tiers/{gold['id']}")
    assert deleted == {"object": "tier", "id": gold["id"], "name": "gold", "deleted": True}
    err = error(admin.call("GET", "/tiers/gold"), 404)
    assert err["code"] == "not_found" and err["param"] == "tier"


def test_noop_tier_patch_neither_audits_nor_invalidates(admin: Admin) -> None:
    admin.tier()
    admin.ok("PATCH", "/tiers/gold", {"weight": 3.0})
    assert admin.state.auth.invalidated == []
    assert [e["action"] for e in admin.audit(entity_type="tier")] == ["create"]


def test_a_number_is_an_id_never_a_name(admin: Admin) -> None:
    first = admin.tier("first")
    err = error(admin.call("POST", "/tiers", {"name": str(first["id"] + 1), "weight": 9.0}), 400)
    assert err["param"] == "name" and "digits only" in err["message"]
    assert admin.tier("2nd")["name"] == "2nd"  # digits then letters: a name
    assert admin.ok("GET", f"/tiers/{first['id']}")["name"] == "first"
    error(admin.call("GET", "/tiers/99999999999999999999"), 404)  # beyond any id: no 500


def test_tier_conflicts(admin: Admin) -> None:
    admin.tier()
    admin.tier("free", weight=1.0)
    assert (
        error(
            admin.call(
                "POST", "/tiers", {"name": "gold", "weight": 1.0, "ttft_ms": 1.0, "tpot_ms": 1.0}
            ),
            409,
        )["code"]
        == "already_exists"
    )
    err = error(admin.call("PATCH", "/tiers/free", {"name": "gold"}), 409)
    assert (err["code"], err["param"]) == ("already_exists", "name")
    admin.tenant()
    err = error(admin.call("DELETE", "/tiers/gold"), 409)
    assert err["code"] == "in_use" and "1 tenant" in err["message"]


INVALID_TIERS: list[tuple[dict[str, Any], str, str]] = [
    ({"weight": 0}, "weight", "invalid_value"),  # the data layer's rule
    ({"weight": "3"}, "weight", "invalid_type"),  # no coercion from strings
    ({"weight": True}, "weight", "invalid_type"),
    ({"rpm_limit": 2.5}, "rpm_limit", "invalid_type"),
    ({"rpm_limit": 0}, "rpm_limit", "invalid_value"),
    ({"rpm_limit": 2**40}, "rpm_limit", "invalid_value"),  # would overflow PostgreSQL's int
    ({"min_ttft_ms": 900.0}, "min_ttft_ms", "invalid_value"),  # above the default 800
    ({"name": "bad name"}, "name", "invalid_value"),
    ({"colour": "gold"}, "colour", "unknown_parameter"),
    # the bounds of gateway.bounds: beyond them a gain sum overflows
    ({"weight": 1e308}, "weight", "invalid_value"),
    ({"weight": 1e-308}, "weight", "invalid_value"),
    ({"ttft_ms": 1e300}, "ttft_ms", "invalid_value"),
    ({"tpot_ms": 1e-320}, "tpot_ms", "invalid_value"),
    ({"deadline_ms": 86_400_001.0}, "deadline_ms", "invalid_value"),
    ({"min_tpot_ms": 1e-4}, "min_tpot_ms", "invalid_value"),
]


def test_invalid_tier_input_is_400_naming_the_field(admin: Admin) -> None:
    for body, param, code in INVALID_TIERS:
        spec = {"name": "gold", "weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0, **body}
        err = error(admin.call("POST", "/tiers", spec), 400)
        assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert admin.ok("GET", "/tiers")["data"] == []
    admin.tier()
    for body, param, code in INVALID_TIERS:
        err = error(admin.call("PATCH", "/tiers/gold", body), 400)
        assert (err["param"], err["code"]) == (param, code), body
    assert [e["action"] for e in admin.audit()] == ["create"]


def test_tier_and_tenant_numbers_are_bounded_where_they_enter(admin: Admin) -> None:
    """Weights within [2**-10, 2**10] (the engine's priority clip), SLOs within [1 µs, 1 day],
    limits within [1, 2**31 - 1]: the edges are accepted, a step beyond is 400 naming the field,
    for a tier and for a tenant's overrides alike."""
    edges = {"weight": MIN_WEIGHT, "ttft_ms": MAX_SLO_MS, "tpot_ms": MIN_SLO_MS}
    tier = admin.tier("edge", **edges, deadline_ms=MAX_SLO_MS, rpm_limit=MAX_LIMIT)
    assert (tier["weight"], tier["tpot_ms"], tier["rpm_limit"]) == (MIN_WEIGHT, 1e-3, MAX_LIMIT)
    assert admin.ok("PATCH", "/tiers/edge", {"weight": MAX_WEIGHT})["weight"] == MAX_WEIGHT
    for field, value in (("weight", MAX_WEIGHT * 2), ("ttft_ms", MAX_SLO_MS * 2)):
        err = error(admin.call("PATCH", "/tiers/edge", {field: value}), 400)
        assert (err["param"], err["code"]) == (field, "invalid_value")
    admin.tenant(tier="edge", ttft_ms=MIN_SLO_MS, max_concurrency=MIN_LIMIT)
    for field, value in (("ttft_ms", 1e308), ("deadline_ms", 0.0), ("tpm_limit", 0)):
        err = error(admin.call("PATCH", "/tenants/acme", {field: value}), 400)
        assert (err["param"], err["code"]) == (field, "invalid_value")
        err = error(
            admin.call("POST", "/tenants", {"name": "t2", "tier": "edge", field: value}), 400
        )
        assert (err["param"], err["code"]) == (field, "invalid_value")
    assert admin.ok("GET", "/tiers/edge")["weight"] == MAX_WEIGHT


def test_missing_fields_malformed_json_and_non_objects(admin: Admin) -> None:
    err = error(admin.call("POST", "/tiers", {"name": "gold", "weight": 1.0}), 400)
    assert (err["param"], err["code"]) == ("ttft_ms", "missing_required_parameter")
    assert "more error" in err["message"]  # tpot_ms is missing too
    response = admin.client.post(
        f"{PREFIX}/tiers", content=b'{"name": "gold",', headers={"content-type": "application/json"}
    )
    assert error(response, 400)["code"] == "invalid_json"
    err = error(admin.call("POST", "/tiers", [1, 2]), 400)
    assert (err["param"], err["code"]) == (None, "invalid_type")  # the body as a whole
    assert error(admin.call("PATCH", "/tiers/gold", {"weight": None}), 404)["param"] == "tier"
    admin.tier()
    err = error(admin.call("PATCH", "/tiers/gold", {"weight": None}), 400)
    assert err["param"] == "weight"  # null only clears optional fields


_JSON_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=80)
    | st.lists(st.integers(), max_size=2)
)
_TIER_FIELDS = ["name", "weight", "ttft_ms", "tpot_ms", "rpm_limit", "deadline_ms", "x"]


def test_no_tier_body_produces_a_server_error(admin: Admin) -> None:
    """Whatever JSON object arrives, the answer is 201 or an OpenAI-shaped 4xx, never a 500.

    (TestClient re-raises a server-side exception, so a 500 fails loudly here.)
    """
    admin.tier("target")
    headers = {"content-type": "application/json"}

    @settings(max_examples=40, deadline=None, derandomize=True)
    @given(body=st.dictionaries(st.sampled_from(_TIER_FIELDS), _JSON_VALUES))
    def check(body: dict[str, Any]) -> None:
        # Python's json writes (and FastAPI reads) NaN and Infinity: they must be refused too.
        content = json.dumps(body)
        response = admin.client.post(f"{PREFIX}/tiers", content=content, headers=headers)
        if response.status_code != 201:
            assert 400 <= error_status(response) < 500
        response = admin.client.patch(f"{PREFIX}/tiers/target", content=content, headers=headers)
        if response.status_code != 200:
            assert 400 <= error_status(response) < 500

    check()


def error_status(response: Any) -> int:
    error(response, response.status_code)
    return int(response.status_code)


def test_shed_slack_is_set_bounded_and_in_the_effective_policy(admin: Admin) -> None:
    """Overload: how late a predicted first token may be, as a fraction of the TTFT objective,
    in [0, 100]; 0 unless set; a tier's, shown in its tenants' effective policy."""
    assert admin.tier("plain")["shed_slack"] == 0.0
    gold = admin.tier(shed_slack=0.25)
    assert gold["shed_slack"] == 0.25
    assert admin.ok("PATCH", "/tiers/gold", {"shed_slack": MAX_SHED_SLACK})["shed_slack"] == 100.0
    for value in (-0.1, MAX_SHED_SLACK + 1, None, "0.5", True):
        err = error(admin.call("PATCH", "/tiers/gold", {"shed_slack": value}), 400)
        assert err["param"] == "shed_slack", value
    err = error(admin.call("POST", "/tiers", {**_TIER, "name": "x", "shed_slack": 101}), 400)
    assert err["param"] == "shed_slack"
    assert admin.tenant(tier="gold")["effective"]["shed_slack"] == 100.0


_TIER = {"weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}


def test_a_tiers_default_kind_is_set_checked_and_shown(admin: Admin) -> None:
    """Request kinds: ``default_kind`` (latency by default); deadline and best-effort need the
    tier's default deadline, and the tenants' effective policy carries it."""
    gold = admin.tier()
    assert gold["default_kind"] == "latency"
    err = error(admin.call("PATCH", "/tiers/gold", {"default_kind": "deadline"}), 400)
    assert err["code"] == "invalid_value" and err["param"] == "default_kind"
    assert "deadline_ms" in err["message"]
    patched = admin.ok(
        "PATCH", "/tiers/gold", {"default_kind": "best-effort", "deadline_ms": 60000}
    )
    assert patched["default_kind"] == "best-effort"
    assert admin.tenant()["effective"]["default_kind"] == "best-effort"
    err = error(admin.call("PATCH", "/tiers/gold", {"deadline_ms": None}), 400)
    assert err["param"] == "default_kind"  # the deadline the kind schedules to stays
    for bad in ("compound", "urgent"):
        err = error(admin.call("PATCH", "/tiers/gold", {"default_kind": bad}), 400)
        assert err["code"] == "invalid_value" and err["param"] == "default_kind"
    err = error(admin.call("PATCH", "/tiers/gold", {"default_kind": 3}), 400)
    assert err["code"] == "invalid_type"
    created = admin.tier("batch", weight=1.0, deadline_ms=600000, default_kind="deadline")
    assert created["default_kind"] == "deadline"
