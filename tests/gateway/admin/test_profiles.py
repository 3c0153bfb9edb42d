"""``/profiles``: imported latency profiles beside the shipped ones; backends name them."""

from __future__ import annotations

from typing import Any

from priority.profiles import available_profiles, load_profile

from .support import ACTOR, Admin, error


def _calibrated(name: str = "site-a100") -> dict[str, Any]:
    """An operator's measured profile document: a shipped one, re-measured and renamed."""
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], "max_num_seqs": 7}
    return {**document, "name": name, "hardware": "site A100"}


def test_profile_round_trip(admin: Admin) -> None:
    created = admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    assert (created["object"], created["name"], created["source"]) == (
        "latency_profile",
        "site-a100",
        "custom",
    )
    assert created["document"] == _calibrated() and created["created_by"] == ACTOR
    assert (created["hardware"], created["model"], created["tensor_parallel"]) == (
        "site A100",
        "Qwen2-7B",
        1,
    )
    renamed = admin.ok(
        "POST", "/profiles", {"document": _calibrated(), "name": "site-a100-b"}, expect=201
    )
    assert renamed["document"]["name"] == "site-a100-b"

    listed = {p["name"]: p for p in admin.ok("GET", "/profiles")["data"]}
    assert set(listed) == {*available_profiles(), "site-a100", "site-a100-b"}
    assert "document" not in listed["site-a100"]
    assert listed["site-a100"]["id"] == created["id"]
    shipped = listed["a100-qwen2-7b"]
    assert (shipped["source"], shipped["id"], shipped["created_by"]) == ("shipped", None, None)

    assert admin.ok("GET", "/profiles/site-a100") == created
    assert admin.ok("GET", f"/profiles/{created['id']}") == created
    one_shipped = admin.ok("GET", "/profiles/a100-qwen2-7b")
    assert one_shipped["document"] == load_profile("a100-qwen2-7b").to_dict()

    admin.backend(profile="site-a100")
    in_use = error(admin.call("DELETE", "/profiles/site-a100"), 409)
    assert (in_use["code"], in_use["param"]) == ("in_use", "profile")
    assert "used by backend(s) b1" in in_use["message"]
    admin.ok("DELETE", "/backends/b1")
    deleted = admin.ok("DELETE", f"/profiles/{created['id']}")
    assert deleted == {
        "object": "latency_profile",
        "id": created["id"],
        "name": "site-a100",
        "deleted": True,
    }
    assert error(admin.call("GET", "/profiles/site-a100"), 404)["param"] == "profile"
    assert admin.state.pool.reloads == 2  # the backend's create and delete; profiles need none
    actions = [e["action"] for e in admin.audit(entity_type="profile")]
    assert actions == ["delete", "create", "create"]


def test_invalid_profiles_are_refused_with_the_admin_error_conventions(admin: Admin) -> None:
    shipped = load_profile("a100-qwen2-7b").to_dict()
    for body, status, code, param in [
        ({"document": shipped}, 409, "already_exists", "name"),
        ({"document": _calibrated(), "name": "a100-qwen2-7b"}, 409, "already_exists", "name"),
        ({"document": {**_calibrated(), "coefficients": {}}}, 400, "invalid_value", "document"),
        ({"document": _calibrated("no spaces allowed")}, 400, "invalid_value", "name"),
        ({"document": [1, 2]}, 400, "invalid_type", "document"),
        ({"document": _calibrated(), "extra": 1}, 400, "unknown_parameter", "extra"),
        ({"name": "x"}, 400, "missing_required_parameter", "document"),
    ]:
        err = error(admin.call("POST", "/profiles", body), status)
        assert (err["code"], err["param"]) == (code, param), body
    admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    err = error(admin.call("POST", "/profiles", {"document": _calibrated()}), 409)
    assert err["message"] == "profile 'site-a100' already exists"
    err = error(admin.call("DELETE", "/profiles/a100-qwen2-7b"), 409)
    assert err["code"] == "conflict" and "shipped with tiergate" in err["message"]
    assert error(admin.call("DELETE", "/profiles/nope"), 404)["code"] == "not_found"
    assert [p["name"] for p in admin.ok("GET", "/profiles")["data"] if p["source"] == "custom"] == [
        "site-a100"
    ]


def test_backends_name_stored_profiles(admin: Admin) -> None:
    unknown = error(
        admin.call("POST", "/backends", {"name": "b1", "base_url": "http://h:1", "model": "m",
                                         "profile": "site-a100"}),
        400,
    )  # fmt: skip
    assert unknown["param"] == "profile" and "unknown profile 'site-a100'" in unknown["message"]
    admin.ok("POST", "/profiles", {"document": _calibrated()}, expect=201)
    admin.ok("POST", "/profiles", {"document": _calibrated("site-h100")}, expect=201)
    assert admin.backend(profile="site-a100")["profile"] == "site-a100"
    patched = admin.ok("PATCH", "/backends/b1", {"profile": "site-h100"})
    assert patched["profile"] == "site-h100"
