"""``/ui/keys``: create (the secret shown once), revoke, rotate with a grace period."""

from __future__ import annotations

import html
import re

from openai import AuthenticationError, OpenAI

from gateway.db import crud

from .conftest import UI, field_errors


def _secret(response) -> str:  # type: ignore[no-untyped-def]
    match = re.search(r'<code id="new-secret">([^<]+)</code>', response.text)
    assert match is not None, response.text
    return html.unescape(match.group(1))


def test_create_shows_the_secret_once_and_it_works(signed_in: UI) -> None:
    response = signed_in.post("/ui/keys/new", {"tenant": "acme", "name": "app"})
    assert response.status_code == 201
    assert response.headers["cache-control"] == "no-store"
    secret = _secret(response)
    prefix = secret.split("-")[1]
    listing = signed_in.client.get("/ui/keys")
    assert f"tg-{prefix}" in listing.text and secret not in listing.text
    detail = signed_in.client.get(f"/ui/keys/tg-{prefix}")
    assert secret not in detail.text and 'id="new-secret"' not in detail.text
    client = OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=signed_in.client)
    assert client.models.list().data == []  # authenticated (no backends in this app)
    entry = signed_in.audit()[-1]
    assert (entry.actor, entry.action, entry.entity_type) == (
        "admin-ui:operator",
        "create",
        "api_key",
    )


def test_revoke_then_the_key_is_refused(signed_in: UI) -> None:
    secret = _secret(signed_in.post("/ui/keys/new", {"tenant": "acme"}))
    prefix = "tg-" + secret.split("-")[1]
    client = OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=signed_in.client)
    client.models.list()
    assert signed_in.post(f"/ui/keys/{prefix}/revoke").status_code == 303
    try:
        client.models.list()
    except AuthenticationError as exc:
        assert exc.status_code == 401
    else:
        raise AssertionError("a revoked key still authenticates")
    assert 'id="key-status">revoked<' in signed_in.client.get(f"/ui/keys/{prefix}").text


def test_rotate_with_a_grace_period(signed_in: UI) -> None:
    old = _secret(signed_in.post("/ui/keys/new", {"tenant": "acme", "name": "app"}))
    prefix = "tg-" + old.split("-")[1]
    rotated = signed_in.post(f"/ui/keys/{prefix}/rotate", {"grace_s": "3600"})
    assert rotated.status_code == 201
    new = _secret(rotated)
    assert new != old and "keeps working until" in rotated.text
    with signed_in.factory() as session:
        old_row = crud.get_key(session, prefix)
        assert old_row.expires_at is not None
    for key in (old, new):  # both work during the grace period
        headers = {"Authorization": f"Bearer {key}"}
        assert signed_in.client.get("/v1/models", headers=headers).status_code == 200
    now = signed_in.post(f"/ui/keys/tg-{new.split('-')[1]}/rotate", {"grace_s": "0"})
    assert now.status_code == 201
    headers = {"Authorization": f"Bearer {new}"}
    assert signed_in.client.get("/v1/models", headers=headers).status_code == 401


def test_form_errors_beside_the_field(signed_in: UI) -> None:
    missing = signed_in.post("/ui/keys/new", {"tenant": "nobody"})
    assert missing.status_code == 404
    assert "tenant 'nobody' does not exist" in field_errors(missing)["tenant"]
    past = signed_in.post("/ui/keys/new", {"tenant": "acme", "expires_at": "2001-01-01T00:00"})
    assert past.status_code == 400
    assert "expires_at must be in the future" in field_errors(past)["expires_at"]
    garbled = signed_in.post("/ui/keys/new", {"tenant": "acme", "expires_at": "soon"})
    assert garbled.status_code == 400 and "expires_at" in field_errors(garbled)
    with signed_in.factory() as session:
        assert crud.count_keys(session) == 1  # the seeded key only
        prefix = crud.list_keys(session)[0].prefix
    grace = signed_in.post(f"/ui/keys/tg-{prefix}/rotate", {"grace_s": "-5"})
    assert grace.status_code == 400 and "grace_s:" in field_errors(grace)["grace_s"]


def test_filters_and_empty_states(signed_in: UI) -> None:
    assert signed_in.client.get("/ui/keys?tenant=acme").status_code == 200
    assert signed_in.client.get("/ui/keys?tenant=nobody").status_code == 404
    signed_in.post("/ui/tenants/-/new", {"name": "empty", "tier": "batch"})
    page = signed_in.client.get("/ui/keys?tenant=empty")
    assert "No key matches." in page.text
