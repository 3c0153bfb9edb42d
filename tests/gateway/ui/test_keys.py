"""``/ui/keys``: create (the secret shown once), revoke, rotate with a grace period."""

from __future__ import annotations

import html
import re

import pytest
from openai import AuthenticationError, OpenAI

from gateway.db import crud
from gateway.db.crud import keys as keys_crud
from gateway.db.crud.keys import form_token_hash

from .conftest import SECRET, UI, field_errors


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


# ---- a re-sent create or rotate form issues no second key ------------------------------------

_FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')


def _form_token(ui: UI, path: str) -> str:
    match = _FORM_TOKEN.search(ui.client.get(path).text)
    assert match is not None, f"no form token on {path}"
    return match.group(1)


def _keys_of(ui: UI, tenant: str) -> list[str]:
    with ui.factory() as session:
        return [k.prefix for k in crud.list_keys(session, tenant=tenant)]


def _assert_repeated(response, prefix: str, secret: str) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 409, response.text
    assert response.headers["cache-control"] == "no-store"
    assert 'id="new-secret"' not in response.text and secret not in response.text
    assert f'id="repeated-prefix">{prefix}<' in response.text
    assert "acme" in response.text and "shown once" in response.text
    assert f'href="/ui/keys/{prefix}#rotate"' in response.text
    assert f'href="/ui/keys/{prefix}#revoke"' in response.text


def test_the_create_form_sent_twice_issues_one_key(signed_in: UI) -> None:
    before = _keys_of(signed_in, "acme")
    audited = len(signed_in.audit())
    token = _form_token(signed_in, "/ui/keys")
    assert token != _form_token(signed_in, "/ui/keys")  # a fresh token per rendered form
    form = {"tenant": "acme", "name": "once", "form_token": token}
    first = signed_in.post("/ui/keys/new", form)
    assert first.status_code == 201
    secret = _secret(first)
    prefix = "tg-" + secret.split("-")[1]
    again = signed_in.post("/ui/keys/new", form)  # what a reload of the answer re-posts
    _assert_repeated(again, prefix, secret)
    assert sorted(_keys_of(signed_in, "acme")) == sorted([*before, prefix[3:]])
    with signed_in.factory() as session:  # only the token's keyed hash is stored
        stored = crud.get_key(session, prefix).form_token_hash
        assert stored == form_token_hash(SECRET, token) and token not in stored
    assert [e.action for e in signed_in.audit()[audited:]] == ["create"]
    # a new form (new token) is a deliberate second key
    other = {**form, "form_token": _form_token(signed_in, "/ui/keys")}
    assert signed_in.post("/ui/keys/new", other).status_code == 201
    assert len(_keys_of(signed_in, "acme")) == len(before) + 2


def test_the_rotate_form_sent_twice_rotates_once(signed_in: UI) -> None:
    old = _secret(signed_in.post("/ui/keys/new", {"tenant": "acme", "name": "app"}))
    prefix = "tg-" + old.split("-")[1]
    before = _keys_of(signed_in, "acme")
    form = {"grace_s": "0", "form_token": _form_token(signed_in, f"/ui/keys/{prefix}")}
    rotated = signed_in.post(f"/ui/keys/{prefix}/rotate", form)
    assert rotated.status_code == 201
    new = _secret(rotated)
    # the old key has expired now (grace 0), yet the answer is "already done", not "expired"
    again = signed_in.post(f"/ui/keys/{prefix}/rotate", form)
    _assert_repeated(again, "tg-" + new.split("-")[1], new)
    assert len(_keys_of(signed_in, "acme")) == len(before) + 1
    rotations = [e for e in signed_in.audit() if e.action == "rotate"]
    assert len(rotations) == 1


def test_two_racing_posts_of_one_form_issue_one_key(
    signed_in: UI, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = _form_token(signed_in, "/ui/keys")
    form = {"tenant": "acme", "form_token": token}
    first = signed_in.post("/ui/keys/new", form)
    secret = _secret(first)
    before = _keys_of(signed_in, "acme")
    # the second post's check ran before the first committed: only the unique index stops it
    monkeypatch.setattr(keys_crud, "_issued_by", lambda session, digest: None)
    raced = signed_in.post("/ui/keys/new", form)
    _assert_repeated(raced, "tg-" + secret.split("-")[1], secret)
    assert _keys_of(signed_in, "acme") == before
    prefix = "tg-" + secret.split("-")[1]
    rotate = {"grace_s": "60", "form_token": _form_token(signed_in, f"/ui/keys/{prefix}")}
    assert signed_in.post(f"/ui/keys/{prefix}/rotate", rotate).status_code == 201
    after_rotation = _keys_of(signed_in, "acme")
    raced = signed_in.post(f"/ui/keys/{prefix}/rotate", rotate)
    assert raced.status_code == 409 and 'id="new-secret"' not in raced.text
    assert _keys_of(signed_in, "acme") == after_rotation
    assert len([e for e in signed_in.audit() if e.action == "rotate"]) == 1
