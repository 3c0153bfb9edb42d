"""Text no database takes, refused before use or made storable: never a 500, never a lost record.

Found by the fuzz harness (``bench/fuzz_gateway.py``), each checked here at the depth it is fixed:

* a lone surrogate (``"\\ud800"``: valid JSON, not Unicode) in any body string is 400
  ``invalid_json`` on ``/v1`` and ``/admin/v1`` alike (it reached the database driver: a
  ``UnicodeEncodeError``, a plain-text 500); an escaped surrogate *pair* is an emoji and passes;
* a NUL (``\\u0000`` in a body, ``%00`` in a path or query parameter) is 400 ``invalid_value``
  on every admin operation, on SQLite and PostgreSQL alike (PostgreSQL refused it: a 500
  ``database_error``); a NUL that still reaches PostgreSQL is classified ``invalid``;
* a usage record is always storable (its text cleaned and cut to its column), and a batch the
  database refuses for one record writes every other (a ``/v1`` request for a model with a NUL
  cost its whole batch, other tenants' records with it).

The gateway here is the real app (``create_app``, no backends: every ``/v1`` request is refused
404 and recorded) on each database, one per module and database.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from seeded_app import app_settings, empty_postgres_schema, seed_database
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import create_app
from gateway.db.errors import DatabaseFailure, classify
from gateway.db.models import Base, UsageRecord
from gateway.db.session import make_session_factory
from gateway.db.usage import TEXT_LIMITS, UsageEvent, UsageWriter, storable_text
from gateway.errors import ApiError, database_error, parse_json_body
from gateway.jsonbody import lone_surrogate_at, nul_at
from priority.profiles import available_profiles

SECRET = "text-safety-secret"
ADMIN_KEY = "text-safety-admin-key"
TARGET = "target"
"""The tier, tenant and backend every admin case aims at (and a key of the tenant)."""
PROBE = "@@probe@@"
"""Where a case's body takes the raw JSON of the string under test."""
LONE = b'"\\ud800"'
PAIR = b'"\\ud83d\\ude00"'  # U+1F600, escaped as UTF-16 (json.dumps' default does so)
NUL = b'"a\\u0000b"'


# ---- the checks on raw bodies (gateway.jsonbody) --------------------------------------------


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"a": "\\ud800"}', ("a",)),
        (b'{"a": "x\\uDFFFy"}', ("a",)),  # a low one alone, upper case
        (b'{"a": [1, {"b": "\\ud83d\\u0041"}]}', ("a", 1, "b")),  # a high one, then no low one
        (b'{"a": "\\ude00\\ud83d"}', ("a",)),  # the pair's halves in the wrong order
        (b'{"a": "\xed\xa0\x80"}', ("a",)),  # the surrogate's own bytes: json.loads reads them
        (b'{"\\ud800": 1}', ("\\ud800",)),  # a key: named printable
        (b'"\\ud800"', ()),
        ('{"a": "\\ud800"}'.encode("utf-16"), ("a",)),  # json.loads reads UTF-16 too
    ],
)
def test_lone_surrogates_are_found_where_they_are(raw: bytes, where: tuple[Any, ...]) -> None:
    assert lone_surrogate_at(raw) == where
    assert lone_surrogate_at(raw, json.loads(raw)) == where


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\ud83d\\ude00"}',  # an escaped pair: one character
        b'{"a": "\\\\ud800"}',  # an escaped backslash, then text
        '{"a": "\ud7ff 한국어 😀"}'.encode(),  # 0xED lead bytes of real characters; 4-byte UTF-8
        b'{"a": "\\ud7ff\\ue000"}',  # the neighbours of the surrogate range
        b"\\ud800 is not JSON",  # not JSON: the parser refuses it in its own words
        b"",
    ],
)
def test_valid_text_has_no_lone_surrogate(raw: bytes) -> None:
    assert lone_surrogate_at(raw) is None


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'{"a": "a\\u0000b"}', ("a",)),
        (b'{"x": [1, {"k\\u0000": 2}]}', ("x", 1, "k\\u0000")),
        ('{"a": "\\u0000"}'.encode("utf-16-le"), ("a",)),
        (b'{"a": "a\\\\u0000b"}', None),  # an escaped backslash, then text
        (b'{"a": "ab"}', None),
    ],
)
def test_nul_characters_are_found_where_they_are(raw: bytes, where: tuple[Any, ...] | None) -> None:
    assert nul_at(raw) == where


def test_v1_bodies_are_parsed_in_one_place_that_refuses_lone_surrogates() -> None:
    with pytest.raises(ApiError) as refused:
        parse_json_body(b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}')
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "invalid_json", "messages.0.content")
    assert parse_json_body(b'{"content": ' + PAIR + b"}") == {"content": "\U0001f600"}


# ---- the real app on each database ------------------------------------------------------------


@dataclass
class Gateway:
    app: FastAPI
    client: TestClient
    engine: Engine
    tenant_key: str
    refs: dict[str, str] = field(default_factory=dict)
    """``{tier}``, ``{tenant}``, ``{backend}``, ``{prefix}`` in a case's path: the targets."""

    def admin(self, method: str, path: str, body: bytes | None = None) -> Any:
        headers = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
        return self.client.request(method, path.format(**self.refs), content=body, headers=headers)

    def v1(self, body: bytes) -> Any:
        headers = {"authorization": f"Bearer {self.tenant_key}"}
        headers["content-type"] = "application/json"
        return self.client.post("/v1/chat/completions", content=body, headers=headers)

    @property
    def writer(self) -> UsageWriter:
        return self.app.state.gateway.usage_writer  # type: ignore[no-any-return]

    def usage(self) -> list[UsageRecord]:
        assert self.writer.flush(timeout=30)
        with make_session_factory(self.engine)() as session:
            return list(session.scalars(select(UsageRecord).order_by(UsageRecord.id)))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    """The app on a seeded database, with the target entities; usage batched until flushed."""
    root: Path = tmp_path_factory.mktemp("text-safety")
    with _empty_database(request, root) as url:
        engine, key = seed_database(url, SECRET, tenant="user")
        settings = app_settings(
            url,
            root,
            SECRET,
            ADMIN_KEY,
            usage_flush_interval_s=60.0,  # one batch per flush: what one bad record costs
        )
        try:
            app = create_app(settings, backends=[])
            with TestClient(app) as client:
                gw = Gateway(app, client, engine, key)
                _create_targets(gw)
                yield gw
        finally:
            engine.dispose()


@contextmanager
def _empty_database(request: pytest.FixtureRequest, root: Path) -> Iterator[str]:
    """An empty database's URL: a SQLite file, or a PostgreSQL schema of its own (dropped
    afterwards; skipped where PostgreSQL is unreachable)."""
    if request.param == "sqlite":
        yield f"sqlite:///{root / 'tiergate.db'}"
        return
    server = str(request.getfixturevalue("postgres_database_url"))
    with empty_postgres_schema(server, "text") as url:
        yield url


def _create_targets(gw: Gateway) -> None:
    tier = {"name": TARGET, "weight": 1.0, "ttft_ms": 1000.0, "tpot_ms": 100.0}
    backend = {
        "name": TARGET,
        "base_url": "http://127.0.0.1:9/",
        "model": "qwen2-7b",
        "profile": available_profiles()[0],
    }
    for path, body in [
        ("/admin/v1/tiers", tier),
        ("/admin/v1/tenants", {"name": TARGET, "tier": TARGET}),
        ("/admin/v1/backends", backend),
    ]:
        response = gw.admin("POST", path, json.dumps(body).encode())
        assert response.status_code == 201, response.text
    created = gw.admin("POST", "/admin/v1/keys", json.dumps({"tenant": TARGET}).encode())
    assert created.status_code == 201, created.text
    gw.refs.update(tier=TARGET, tenant=TARGET, backend=TARGET, prefix=created.json()["prefix"])


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    payload = response.json()
    assert set(payload) == {"error"}, payload
    return dict(payload["error"])


def _with(template: dict[str, Any], raw_string: bytes) -> bytes:
    """``template`` as JSON with the raw JSON string ``raw_string`` where :data:`PROBE` is."""
    return json.dumps(template).encode().replace(f'"{PROBE}"'.encode(), raw_string)


# (method, path, body with PROBE in one string field, that field): every admin body string
# the fuzzer found reaching the database, created and updated
ADMIN_STRINGS: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "POST",
        "/admin/v1/tiers",
        {"name": "new", "weight": 1.0, "ttft_ms": 1e3, "tpot_ms": 1e2, "description": PROBE},
        "description",
    ),
    ("PATCH", "/admin/v1/tiers/{tier}", {"description": PROBE}, "description"),
    ("POST", "/admin/v1/keys", {"tenant": TARGET, "name": PROBE}, "name"),
    ("PATCH", "/admin/v1/keys/{prefix}", {"name": PROBE}, "name"),
    (
        "POST",
        "/admin/v1/backends",
        {"name": "new", "base_url": "http://127.0.0.1:9/", "model": PROBE, "profile": "x"},
        "model",
    ),
    ("PATCH", "/admin/v1/backends/{backend}", {"model": PROBE}, "model"),
    ("POST", "/admin/v1/tenants", {"name": "new", "tier": PROBE}, "tier"),
    ("PATCH", "/admin/v1/tenants/{tenant}", {"tier": PROBE}, "tier"),
]
_CASE_IDS = [f"{m} {p} {f}" for m, p, _, f in ADMIN_STRINGS]


@pytest.mark.parametrize(("method", "path", "body", "param"), ADMIN_STRINGS, ids=_CASE_IDS)
def test_a_lone_surrogate_in_an_admin_body_is_invalid_json(
    gateway: Gateway, method: str, path: str, body: dict[str, Any], param: str
) -> None:
    error = _error(gateway.admin(method, path, _with(body, LONE)), 400)
    assert (error["code"], error["param"]) == ("invalid_json", param)
    assert "surrogate" in error["message"]


def test_a_lone_surrogate_in_a_v1_body_is_invalid_json_as_on_admin(gateway: Gateway) -> None:
    chat = {"model": PROBE, "messages": [{"role": "user", "content": "hi"}]}
    error = _error(gateway.v1(_with(chat, LONE)), 400)
    assert (error["code"], error["param"]) == ("invalid_json", "model")


def test_an_escaped_surrogate_pair_is_text_on_both_planes(gateway: Gateway) -> None:
    created = gateway.admin("PATCH", "/admin/v1/tiers/{tier}", _with({"description": PROBE}, PAIR))
    assert created.status_code == 200, created.text
    assert created.json()["description"] == "\U0001f600"
    assert gateway.admin("GET", "/admin/v1/tiers/{tier}").json()["description"] == "\U0001f600"
    chat = {"model": "qwen2-7b", "messages": [{"role": "user", "content": PROBE}]}
    assert _error(gateway.v1(_with(chat, PAIR)), 404)["code"] == "model_not_found"  # no backends


@pytest.mark.parametrize(("method", "path", "body", "param"), ADMIN_STRINGS, ids=_CASE_IDS)
def test_a_nul_in_an_admin_body_string_is_invalid_value(
    gateway: Gateway, method: str, path: str, body: dict[str, Any], param: str
) -> None:
    error = _error(gateway.admin(method, path, _with(body, NUL)), 400)
    assert (error["code"], error["param"]) == ("invalid_value", param)
    assert "NUL" in error["message"]


# (method, path with a NUL, the parameter named): every operation that takes a string
NUL_PARAMETERS: list[tuple[str, str, str]] = [
    *[(m, "/admin/v1/tiers/a%00b", "ref") for m in ("GET", "PATCH", "DELETE")],
    *[(m, "/admin/v1/tenants/a%00b", "ref") for m in ("GET", "PATCH", "DELETE")],
    *[(m, "/admin/v1/backends/a%00b", "ref") for m in ("GET", "PATCH", "DELETE")],
    *[(m, "/admin/v1/keys/a%00b", "prefix") for m in ("GET", "PATCH", "DELETE")],
    *[(m, "/admin/v1/profiles/a%00b", "ref") for m in ("GET", "DELETE")],
    ("POST", "/admin/v1/tenants/a%00b/suspend", "ref"),
    ("POST", "/admin/v1/tenants/a%00b/activate", "ref"),
    ("POST", "/admin/v1/keys/a%00b/revoke", "prefix"),
    ("GET", "/admin/v1/tenants?tier=a%00b", "tier"),
    ("GET", "/admin/v1/keys?tenant=a%00b", "tenant"),
    ("GET", "/admin/v1/backends?model=a%00b", "model"),
    *[(m, f"/admin/v1/audit?{p}=a%00b", p) for m in ("GET",) for p in ("entity_type", "actor")],
    ("GET", "/admin/v1/audit?entity_id=a%00b", "entity_id"),
    ("GET", "/admin/v1/usage/tenants?tenant=a%00b", "tenant"),
    ("GET", "/admin/v1/usage/tiers?tier=a%00b", "tier"),
    ("GET", "/admin/v1/tiers?unknown=a%00b", "unknown"),  # any parameter, even one not read
]


@pytest.mark.parametrize(("method", "path", "param"), NUL_PARAMETERS)
def test_a_nul_in_a_path_or_query_parameter_is_invalid_value(
    gateway: Gateway, method: str, path: str, param: str
) -> None:
    body = b"{}" if method == "PATCH" else None
    error = _error(gateway.admin(method, path, body), 400)
    assert (error["code"], error["param"]) == ("invalid_value", param)


def test_refused_text_changes_nothing(gateway: Gateway) -> None:
    for raw in (LONE, NUL):
        gateway.admin("POST", "/admin/v1/tiers", _with({**ADMIN_STRINGS[0][2]}, raw))
    assert _error(gateway.admin("GET", "/admin/v1/tiers/new"), 404)["code"] == "not_found"
    assert gateway.admin("GET", "/admin/v1/tenants/{tenant}").json()["tier"] == TARGET


def test_a_v1_request_for_a_model_with_a_nul_loses_no_usage_record(gateway: Gateway) -> None:
    """The request is refused (no such model) and recorded, in one batch with a good one."""
    before = len(gateway.usage())
    chat = {"model": PROBE, "messages": [{"role": "user", "content": "hi"}]}
    for model in (NUL, b'"qwen2-7b"'):
        assert _error(gateway.v1(_with(chat, model)), 404)["code"] == "model_not_found"
    records = gateway.usage()[before:]
    expected = [("a\ufffdb", "rejected"), ("qwen2-7b", "rejected")]  # NUL replaced
    assert [(r.model, r.status) for r in records] == expected
    writer = gateway.writer
    assert (writer.dropped, writer.written) == (0, writer.submitted)


# ---- the database's own refusal: the safety net ---------------------------------------------


@pytest.mark.parametrize("db_engine", ["postgresql"], indirect=True)
@pytest.mark.parametrize("value", ["a\x00b", "x" * 65], ids=["nul", "too long"])
def test_text_postgresql_refuses_is_an_invalid_value(db_engine: Engine, value: str) -> None:
    with pytest.raises(SQLAlchemyError) as refused, db_engine.begin() as conn:
        conn.execute(
            Base.metadata.tables["tiers"].insert(),
            {"name": value, "weight": 1.0, "ttft_ms": 1.0, "tpot_ms": 1.0},
        )
    assert classify(refused.value) is DatabaseFailure.INVALID
    error = database_error(refused.value)
    assert (error.status, error.code) == (400, "invalid_value")


# ---- usage records: always storable, never lost for another's sake -------------------------


@pytest.mark.parametrize(
    ("value", "limit", "stored"),
    [
        ("qwen2-7b", 256, "qwen2-7b"),
        ("a\x00b", 256, "a\ufffdb"),  # replaced, not removed: never reads as a real "ab"
        ("\ud800x\udfff", 256, "\ufffdx\ufffd"),
        ("😀 한국어", 256, "😀 한국어"),
        ("m" * 300, 256, "m" * 256),
        ("ab\x00", 2, "ab"),
    ],
)
def test_storable_text(value: str, limit: int, stored: str) -> None:
    assert storable_text(value, limit) == stored


def test_usage_events_store_only_storable_text() -> None:
    event = UsageEvent(
        request_id="r" * 200,
        status="rejected",
        tier="t\x00",
        model="\ud800" + "m" * 300,
        backend="b" * 100,
        reject_reason="x\x00",
    )
    assert (event.tier, event.reject_reason) == ("t\ufffd", "x\ufffd")
    assert event.model == "\ufffd" + "m" * (TEXT_LIMITS["model"] - 1)
    assert len(event.request_id) == TEXT_LIMITS["request_id"]
    assert len(event.backend or "") == TEXT_LIMITS["backend"]
    good = UsageEvent(request_id="ok", status="ok", tier="gold", model="qwen2-7b")
    assert (good.tier, good.model) == ("gold", "qwen2-7b")


def _poisoned(request_id: str, **fields: Any) -> UsageEvent:
    """An event with values that slip past :class:`UsageEvent`'s cleaning (as a future field or
    a bug would): the database refuses its row."""
    event = UsageEvent(request_id=request_id, status="ok")
    for name, value in fields.items():
        object.__setattr__(event, name, value)
    return event


@pytest.mark.parametrize(
    ("poison", "kept"),
    [({"model": "\ud800"}, False), ({"tenant_id": 2**31 - 1}, True)],
    ids=["unencodable text", "a tenant gone"],
)
def test_a_batch_with_a_refused_record_writes_every_other(
    session_factory: sessionmaker[Session],
    poison: dict[str, Any],
    kept: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refused row is isolated in its batch: every other row is written. One refused only
    for its tenant (deleted while it was buffered) is kept without it; any other is dropped."""
    good = [UsageEvent(request_id=f"good-{i}", status="ok", model="m") for i in range(40)]
    events = [*good[:17], _poisoned("bad", **poison), *good[17:]]
    writer = UsageWriter(session_factory, batch_size=1000, flush_interval_s=60, max_retries=3)
    with caplog.at_level(logging.WARNING, logger="gateway.db.usage"):
        for event in events:
            writer.submit(event)
        writer.close(timeout=60)
    with session_factory() as session:
        stored = {r.request_id: r.tenant_id for r in session.scalars(select(UsageRecord))}
    assert set(stored) == {e.request_id for e in good} | ({"bad"} if kept else set())
    assert stored.get("bad") is None
    assert (writer.written, writer.dropped) == ((41, 0) if kept else (40, 1))
    assert not any("retrying" in r.getMessage() for r in caplog.records)  # isolated, not retried
    dropped = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    if kept:
        assert dropped == []
        return
    assert len(dropped) == 1 and "dropping 1 usage record" in dropped[0]
    assert not any(str(v) in dropped[0] for v in poison.values())  # never the content
