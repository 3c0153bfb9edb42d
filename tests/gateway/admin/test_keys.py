"""``/keys``: the plaintext shown once, revocation, listing filters, expiry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from gateway.db import crud
from gateway.db.models import ApiKey, AuditLog, utcnow
from gateway.db.security import hash_key

from .support import Admin, error


def test_key_plaintext_is_shown_once_and_stored_nowhere(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    created = admin.key(name="ci")
    plaintext = created["key"]
    assert plaintext.startswith(created["prefix"] + "-")
    assert (created["tenant"], created["name"], created["status"]) == ("acme", "ci", "active")

    listed = admin.call("GET", "/keys")
    one = admin.call("GET", f"/keys/{created['prefix']}")
    audit = admin.call("GET", "/audit")
    for response in (listed, one, audit):
        assert response.status_code == 200
        assert plaintext not in response.text
        assert "key_hash" not in response.text
    assert "key" not in listed.json()["data"][0]
    assert {k: v for k, v in created.items() if k != "key"} == one.json()

    with admin.state.session_factory() as s:
        row = s.scalars(select(ApiKey)).one()
        stored = json.dumps([getattr(row, c.key) for c in ApiKey.__table__.columns], default=str)
        stored += json.dumps([(a.before, a.after) for a in s.scalars(select(AuditLog))])
        assert plaintext not in stored
        assert row.key_hash == hash_key(admin.state.secret, plaintext)
        identity = crud.authenticate(s, admin.state.secret, plaintext, touch=False)
        assert identity is not None and identity.tenant_name == "acme"


def test_revoke_invalidates_and_is_idempotent(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    key = admin.key()
    bare = key["prefix"].removeprefix("tg-")
    revoked = admin.ok("POST", f"/keys/{key['prefix']}/revoke")
    assert revoked["status"] == "revoked" and revoked["revoked_at"] is not None
    assert admin.state.auth.invalidated == [bare]
    with admin.state.session_factory() as s:
        assert crud.authenticate(s, admin.state.secret, key["key"], touch=False) is None
    again = admin.ok("POST", f"/keys/{bare}/revoke")  # the bare prefix works too
    assert again["revoked_at"] == revoked["revoked_at"]
    assert [e["action"] for e in admin.audit(entity_type="api_key")] == ["revoke", "create"]
    error(admin.call("POST", "/keys/tg-00000000/revoke"), 404)


def test_key_listing_filters_update_and_delete(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    admin.tenant("globex")
    a, b = admin.key(), admin.key("globex")
    admin.ok("POST", f"/keys/{b['prefix']}/revoke")

    def prefixes(**q: Any) -> set[str]:
        return {k["prefix"] for k in admin.ok("GET", "/keys", **q)["data"]}

    assert prefixes() == {a["prefix"], b["prefix"]}
    assert prefixes(tenant="globex") == {b["prefix"]}
    assert prefixes(active_only=True) == {a["prefix"]}

    past = (utcnow() - timedelta(minutes=1)).isoformat()
    admin.state.auth.invalidated.clear()
    expired = admin.ok("PATCH", f"/keys/{a['prefix']}", {"expires_at": past, "name": "old"})
    assert (expired["status"], expired["name"]) == ("expired", "old")
    assert admin.state.auth.invalidated == [a["prefix"].removeprefix("tg-")]
    assert prefixes(active_only=True) == set()

    admin.state.auth.invalidated.clear()
    deleted = admin.ok("DELETE", f"/keys/{a['prefix']}")
    assert deleted == {"object": "api_key", "id": a["id"], "name": a["prefix"], "deleted": True}
    assert admin.state.auth.invalidated == [a["prefix"].removeprefix("tg-")]
    error(admin.call("GET", f"/keys/{a['prefix']}"), 404)


def test_key_creation_errors(admin: Admin) -> None:
    admin.tier()
    admin.tenant()
    assert error(admin.call("POST", "/keys", {"tenant": "nope"}), 404)["param"] == "tenant"
    naive = datetime.now().replace(microsecond=0).isoformat()
    err = error(admin.call("POST", "/keys", {"tenant": "acme", "expires_at": naive}), 400)
    assert err["param"] == "expires_at"
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    err = error(admin.call("POST", "/keys", {"tenant": "acme", "expires_at": past}), 400)
    assert (err["param"], err["code"]) == ("expires_at", "invalid_value")
    assert admin.ok("GET", "/keys")["data"] == []
