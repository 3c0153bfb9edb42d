"""``/backends``: CRUD, and a pool reload after every committed change (only then)."""

from __future__ import annotations

from typing import Any

from priority.profiles import available_profiles

from .support import Admin, error


def test_backend_crud_reloads_the_pool(admin: Admin) -> None:
    b1 = admin.backend()
    assert b1["base_url"] == "http://10.0.0.1:8000" and b1["enabled"] and b1["kind"] == "vllm"
    assert admin.state.pool.reloads == 1
    admin.backend("b2", model="llama")
    assert admin.state.pool.reloads == 2
    assert admin.ok("GET", f"/backends/{b1['id']}") == admin.ok("GET", "/backends/b1")

    disabled = admin.ok("PATCH", "/backends/b1", {"enabled": False})
    assert disabled["enabled"] is False and admin.state.pool.reloads == 3
    admin.ok("PATCH", "/backends/b1", {"enabled": False})  # no change: no reload
    assert admin.state.pool.reloads == 3

    def names(**q: Any) -> list[str]:
        return [b["name"] for b in admin.ok("GET", "/backends", **q)["data"]]

    assert names() == ["b1", "b2"]
    assert names(enabled=True) == ["b2"]
    assert names(model="qwen2-7b") == ["b1"]

    assert admin.ok("DELETE", "/backends/b1")["deleted"] is True
    assert admin.state.pool.reloads == 4
    assert names() == ["b2"]


def test_invalid_backends_are_400_and_do_not_reload(admin: Admin) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"profile": "no-such-profile"}, "profile"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"kind": "tgi"}, "kind"),
        ({"model": ""}, "model"),
        ({"enabled": "yes"}, "enabled"),
    ]
    spec = {"name": "b1", "base_url": "http://h:1", "model": "m"}
    spec["profile"] = available_profiles()[0]
    for body, param in cases:
        assert error(admin.call("POST", "/backends", {**spec, **body}), 400)["param"] == param
    assert admin.state.pool.reloads == 0
    admin.ok("POST", "/backends", spec, expect=201)
    for body, param in cases:
        assert error(admin.call("PATCH", "/backends/b1", body), 400)["param"] == param
    assert admin.state.pool.reloads == 1


def test_backend_conflicts_and_missing(admin: Admin) -> None:
    admin.backend()
    admin.backend("b2")
    assert error(admin.call("PATCH", "/backends/b2", {"name": "b1"}), 409)["param"] == "name"
    spec = {
        "name": "b1",
        "base_url": "http://h:1",
        "model": "m",
        "profile": available_profiles()[0],
    }
    assert error(admin.call("POST", "/backends", spec), 409)["code"] == "already_exists"
    assert error(admin.call("DELETE", "/backends/b9"), 404)["param"] == "backend"
    assert admin.state.pool.reloads == 2
