"""Every admin write under 50 concurrent writers, on SQLite and PostgreSQL, through a real running
gateway (uvicorn in a thread, httpx): no 5xx, and every 2xx is exactly one change in the database.

Each scenario sends ``WRITERS`` requests of one write route at once and then reads the database:

* creates race for ``GROUPS`` names (or all make distinct keys): one 201 per name, the rest 409
  ``already_exists``, and as many new rows as 201s;
* updates all change one row: every one answers 200, writes one audit row, and the audit rows
  chain (each one's ``before`` is the previous one's ``after``: no change overwrote another it
  had not seen), ending at the row's final value;
* deletes race for ``GROUPS`` rows: one 200 per row, the rest 404;
* suspend, activate and revoke each change a row of their own: 200 and one audit row each.

Throughout, the audit rows the API wrote equal the 2xx answers. The logs of the whole run
(caplog at DEBUG, SQLAlchemy's statement log on, uvicorn's loggers attached) carry no API key,
plaintext or hash, and no SQL parameter: every string a scenario sends contains ``MARKER``.

Then what happens when the database does not cooperate: a write lock held past the busy
timeout (503 ``database_busy`` with ``Retry-After``), a missing schema behind ``/v1`` (a JSON
500, not a plain-text one), how database errors are classified and described, a foreign key
lost to a concurrent delete (409 ``conflict``, not a taken name), and gateways seeding one
database at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

import gateway.db.session as session_module
from gateway.app import create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.crud import keys as crud_keys
from gateway.db.errors import DatabaseFailure, classify, describe, is_unique_violation
from gateway.db.models import ApiKey, AuditLog, Backend, Base, LatencyProfile, Tenant, Tier
from gateway.db.security import hash_key
from gateway.db.seed import DEFAULT_TIERS, SeedResult, seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.errors import database_error
from gateway.settings import Settings
from priority.profiles import available_profiles, load_profile

WRITERS = 50
GROUPS = 10  # names (or rows) the racing creates (or deletes) compete for
ADMIN_KEY = "concurrency-admin-key"
SECRET = "concurrency-server-secret"
MARKER = f"m{uuid.uuid4().hex[:10]}"
"""In every string a scenario sends: it may reach the database, never a log line."""
SHIPPED = available_profiles()[0]
API_ACTOR = "admin-api:%"
SETUP_ACTOR = "setup"

Write = tuple[str, str, dict[str, Any] | None]  # method, path under /admin/v1, JSON body


# -- the running gateway and its logs ------------------------------------------------------


@dataclass
class Gateway:
    url: str
    factory: sessionmaker[Session]


@pytest.fixture
def gateway(db_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """The whole gateway app (no backends) on an empty schema, served by uvicorn."""
    engine = make_engine(db_url)
    Base.metadata.create_all(engine)
    settings = Settings(
        database_url=db_url,
        admin_key=SecretStr(ADMIN_KEY),
        secret=SecretStr(SECRET),
        data_dir=tmp_path / "data",
    )
    try:
        with GatewayThread(create_app(settings, backends=[])) as server:
            yield Gateway(server.url, make_session_factory(engine))
    finally:
        engine.dispose()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record of the run: root at DEBUG, SQLAlchemy's statements, uvicorn's loggers
    (which do not propagate to the root)."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")  # statements (and parameters)
    uvicorn = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    for logger in uvicorn:
        logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        for logger in uvicorn:
            logger.removeHandler(caplog.handler)


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


# -- scenarios ------------------------------------------------------------------------------


@dataclass
class Scenario:
    """One write route under ``WRITERS`` concurrent requests."""

    setup: Callable[[Session], Any]  # rows the writes need (actor SETUP_ACTOR)
    writes: Callable[[Any], list[Write]]  # from what setup returned
    entity: str  # the audit log's entity_type
    action: str  # the audit log's action
    ok: int  # the 2xx status
    refusals: frozenset[int] = frozenset()  # the other statuses allowed
    model: type[Base] | None = None  # creates and deletes: the table whose rows are counted
    expected_ok: int | None = None  # the exact number of 2xx, when it is known
    chain: str | None = None  # updates of one row: the field whose audit values must chain


def _tier(session: Session, name: str = "gold") -> Tier:
    return crud.create_tier(
        session, actor=SETUP_ACTOR, name=name, weight=3.0, ttft_ms=800.0, tpot_ms=40.0
    )


def _tenant(session: Session, name: str = "acme", tier: str = "gold") -> Tenant:
    return crud.create_tenant(session, actor=SETUP_ACTOR, name=name, tier=tier)


def _keys(session: Session, count: int) -> list[str]:
    _tier(session)
    _tenant(session)
    created = [
        crud.create_key(session, actor=SETUP_ACTOR, tenant="acme", secret=SECRET)
        for _ in range(count)
    ]
    return [c.api_key.prefix for c in created]


def _backend(session: Session, name: str) -> Backend:
    return crud.create_backend(
        session,
        actor=SETUP_ACTOR,
        name=name,
        base_url="http://10.0.0.1:8000",
        model="qwen2-7b",
        profile=SHIPPED,
    )


def _profile_document() -> dict[str, Any]:
    return load_profile(SHIPPED).to_dict()


def _tenants(session: Session, count: int, *, suspended: bool = False) -> None:
    _tier(session)
    for i in range(count):
        _tenant(session, f"t-{i}")
        if suspended:
            crud.suspend_tenant(session, f"t-{i}", actor=SETUP_ACTOR)


def _each(count: int, write: Callable[[int], Write]) -> list[Write]:
    return [write(i) for i in range(count)]


SCENARIOS: dict[str, Scenario] = {
    "tiers.create": Scenario(
        setup=lambda s: None,
        writes=lambda _: _each(
            WRITERS,
            lambda i: (
                "POST",
                "/tiers",
                {
                    "name": f"{MARKER}-{i % GROUPS}",
                    "weight": 2.0,
                    "ttft_ms": 500.0,
                    "tpot_ms": 50.0,
                    "description": MARKER,
                },
            ),
        ),
        entity="tier",
        action="create",
        ok=201,
        refusals=frozenset({409}),
        model=Tier,
        expected_ok=GROUPS,
    ),
    "tiers.update": Scenario(
        setup=_tier,
        writes=lambda _: _each(
            WRITERS,
            lambda i: ("PATCH", "/tiers/gold", {"weight": 10.0 + i, "description": f"{MARKER}{i}"}),
        ),
        entity="tier",
        action="update",
        ok=200,
        expected_ok=WRITERS,
        chain="weight",
    ),
    "tiers.delete": Scenario(
        setup=lambda s: [_tier(s, f"tier-{i}") for i in range(GROUPS)],
        writes=lambda _: _each(WRITERS, lambda i: ("DELETE", f"/tiers/tier-{i % GROUPS}", None)),
        entity="tier",
        action="delete",
        ok=200,
        refusals=frozenset({404}),
        model=Tier,
        expected_ok=GROUPS,
    ),
    "tenants.create": Scenario(
        setup=_tier,
        writes=lambda _: _each(
            WRITERS,
            lambda i: ("POST", "/tenants", {"name": f"{MARKER}-{i % GROUPS}", "tier": "gold"}),
        ),
        entity="tenant",
        action="create",
        ok=201,
        refusals=frozenset({409}),
        model=Tenant,
        expected_ok=GROUPS,
    ),
    "tenants.update": Scenario(
        setup=lambda s: (_tier(s), _tenant(s)),
        writes=lambda _: _each(
            WRITERS, lambda i: ("PATCH", "/tenants/acme", {"rpm_limit": 1000 + i})
        ),
        entity="tenant",
        action="update",
        ok=200,
        expected_ok=WRITERS,
        chain="rpm_limit",
    ),
    "tenants.suspend": Scenario(
        setup=lambda s: _tenants(s, WRITERS),
        writes=lambda _: _each(WRITERS, lambda i: ("POST", f"/tenants/t-{i}/suspend", None)),
        entity="tenant",
        action="suspend",
        ok=200,
        expected_ok=WRITERS,
    ),
    "tenants.activate": Scenario(
        setup=lambda s: _tenants(s, WRITERS, suspended=True),
        writes=lambda _: _each(WRITERS, lambda i: ("POST", f"/tenants/t-{i}/activate", None)),
        entity="tenant",
        action="activate",
        ok=200,
        expected_ok=WRITERS,
    ),
    "tenants.delete": Scenario(
        setup=lambda s: _tenants(s, GROUPS),
        writes=lambda _: _each(WRITERS, lambda i: ("DELETE", f"/tenants/t-{i % GROUPS}", None)),
        entity="tenant",
        action="delete",
        ok=200,
        refusals=frozenset({404}),
        model=Tenant,
        expected_ok=GROUPS,
    ),
    "keys.create": Scenario(
        setup=lambda s: (_tier(s), _tenant(s)),
        writes=lambda _: _each(
            WRITERS, lambda i: ("POST", "/keys", {"tenant": "acme", "name": MARKER})
        ),
        entity="api_key",
        action="create",
        ok=201,
        model=ApiKey,
        expected_ok=WRITERS,
    ),
    "keys.update": Scenario(
        setup=lambda s: _keys(s, 1),
        writes=lambda prefixes: _each(
            WRITERS, lambda i: ("PATCH", f"/keys/{prefixes[0]}", {"name": f"{MARKER}-{i}"})
        ),
        entity="api_key",
        action="update",
        ok=200,
        expected_ok=WRITERS,
        chain="name",
    ),
    "keys.revoke": Scenario(
        setup=lambda s: _keys(s, WRITERS),
        writes=lambda prefixes: [("POST", f"/keys/{p}/revoke", None) for p in prefixes],
        entity="api_key",
        action="revoke",
        ok=200,
        expected_ok=WRITERS,
    ),
    "keys.delete": Scenario(
        setup=lambda s: _keys(s, GROUPS),
        writes=lambda prefixes: _each(
            WRITERS, lambda i: ("DELETE", f"/keys/{prefixes[i % GROUPS]}", None)
        ),
        entity="api_key",
        action="delete",
        ok=200,
        refusals=frozenset({404}),
        model=ApiKey,
        expected_ok=GROUPS,
    ),
    "backends.create": Scenario(
        setup=lambda s: None,
        writes=lambda _: _each(
            WRITERS,
            lambda i: (
                "POST",
                "/backends",
                {
                    "name": f"{MARKER}-{i % GROUPS}",
                    "base_url": f"http://{MARKER}.example:8000",
                    "model": MARKER,
                    "profile": SHIPPED,
                },
            ),
        ),
        entity="backend",
        action="create",
        ok=201,
        refusals=frozenset({409}),
        model=Backend,
        expected_ok=GROUPS,
    ),
    "backends.update": Scenario(
        setup=lambda s: _backend(s, "b1"),
        writes=lambda _: _each(
            WRITERS,
            lambda i: ("PATCH", "/backends/b1", {"base_url": f"http://{MARKER}-{i}.example:8000"}),
        ),
        entity="backend",
        action="update",
        ok=200,
        expected_ok=WRITERS,
        chain="base_url",
    ),
    "backends.delete": Scenario(
        setup=lambda s: [_backend(s, f"b-{i}") for i in range(GROUPS)],
        writes=lambda _: _each(WRITERS, lambda i: ("DELETE", f"/backends/b-{i % GROUPS}", None)),
        entity="backend",
        action="delete",
        ok=200,
        refusals=frozenset({404}),
        model=Backend,
        expected_ok=GROUPS,
    ),
    "profiles.create": Scenario(
        setup=lambda s: None,
        writes=lambda _: _each(
            WRITERS,
            lambda i: (
                "POST",
                "/profiles",
                {"document": _profile_document(), "name": f"{MARKER}-{i % GROUPS}"},
            ),
        ),
        entity="profile",
        action="create",
        ok=201,
        refusals=frozenset({409}),
        model=LatencyProfile,
        expected_ok=GROUPS,
    ),
    "profiles.delete": Scenario(
        setup=lambda s: [
            crud.import_profile(s, _profile_document(), actor=SETUP_ACTOR, name=f"p-{i}")
            for i in range(GROUPS)
        ],
        writes=lambda _: _each(WRITERS, lambda i: ("DELETE", f"/profiles/p-{i % GROUPS}", None)),
        entity="profile",
        action="delete",
        ok=200,
        refusals=frozenset({404}),
        model=LatencyProfile,
        expected_ok=GROUPS,
    ),
}


# -- running a scenario ---------------------------------------------------------------------


async def _send(url: str, writes: list[Write]) -> list[httpx.Response]:
    """All ``writes`` at once, each on its own connection."""
    limits = httpx.Limits(max_connections=len(writes), max_keepalive_connections=len(writes))
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(
        base_url=f"{url}/admin/v1", headers=headers, limits=limits, timeout=120
    ) as client:
        return list(
            await asyncio.gather(
                *(client.request(method, path, json=body) for method, path, body in writes)
            )
        )


def run_writes(
    gateway: Gateway, writes: list[Write], *, at_least: int = WRITERS
) -> list[httpx.Response]:
    assert len(writes) >= at_least
    return asyncio.run(_send(gateway.url, writes))


def _count(session: Session, model: type[Base]) -> int:
    return int(session.scalar(select(func.count()).select_from(model)) or 0)


def _api_audit(session: Session, entity: str, action: str) -> list[AuditLog]:
    query = (
        select(AuditLog)
        .where(AuditLog.actor.like(API_ACTOR))
        .where(AuditLog.entity_type == entity, AuditLog.action == action)
        .order_by(AuditLog.id)
    )
    return list(session.scalars(query))


def assert_dialect_refusals(responses: list[httpx.Response], allowed: frozenset[int]) -> None:
    """No 5xx; every refusal one of ``allowed`` and in the gateway's error dialect."""
    statuses = Counter(r.status_code for r in responses)
    assert not [s for s in statuses if s >= 500], f"server errors: {statuses}"
    for response in responses:
        if response.is_success:
            continue
        assert response.status_code in allowed, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, response.text
        assert error["code"] in {"already_exists", "not_found", "conflict", "in_use"}


def _summary(name: str, responses: list[httpx.Response], changes: int) -> str:
    statuses = dict(sorted(Counter(r.status_code for r in responses).items()))
    return f"{name}: {len(responses)} writers, statuses {statuses}, changes {changes}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_concurrent_admin_writes(
    name: str, gateway: Gateway, logs: pytest.LogCaptureFixture, db_url: str
) -> None:
    scenario = SCENARIOS[name]
    with gateway.factory.begin() as session:
        context = scenario.setup(session)
        before = _count(session, scenario.model) if scenario.model is not None else 0
    responses = run_writes(gateway, scenario.writes(context))

    assert_dialect_refusals(responses, scenario.refusals)
    ok = [r for r in responses if r.status_code == scenario.ok]
    assert len(ok) + sum(r.status_code in scenario.refusals for r in responses) == len(responses)
    if scenario.expected_ok is not None:
        assert len(ok) == scenario.expected_ok, Counter(r.status_code for r in responses)
    with gateway.factory() as session:
        audit = _api_audit(session, scenario.entity, scenario.action)
        assert len(audit) == len(ok), "a 2xx without its change, or a change without a 2xx"
        if scenario.model is not None:
            after = _count(session, scenario.model)
            change = after - before if scenario.action == "create" else before - after
            assert change == len(ok), f"{change} rows changed for {len(ok)} answers"
        if scenario.chain is not None:
            _assert_chain(session, audit, scenario.chain)
    print(_summary(f"{name} [{db_url.split(':')[0]}]", responses, len(audit)))
    _assert_clean_logs(logs, responses)


MODELS: dict[str, type[Base]] = {
    "tier": Tier,
    "tenant": Tenant,
    "api_key": ApiKey,
    "backend": Backend,
    "profile": LatencyProfile,
}


def _assert_chain(session: Session, audit: list[AuditLog], key: str) -> None:
    """The audit rows of one row's updates, in order: each saw the one before it, and the last
    one's value is the row's (no write was lost)."""
    for previous, current in itertools.pairwise(audit):
        assert current.before is not None and previous.after is not None
        assert current.before[key] == previous.after[key], "an update overwrote one it never saw"
    last = audit[-1]
    row = session.get(MODELS[last.entity_type], int(last.entity_id))
    assert last.after is not None and getattr(row, key) == last.after[key]


def _assert_clean_logs(logs: pytest.LogCaptureFixture, responses: list[httpx.Response]) -> None:
    """No SQL parameter, no key (plaintext or hash), no traceback in any log line."""
    text = _log_text(logs)
    assert text, "the log capture saw nothing: is SQLAlchemy's statement log on?"
    assert MARKER not in text, "a request's value reached the log (SQL parameters?)"
    assert "[parameters:" not in text
    for response in responses:
        plaintext = response.json().get("key") if response.status_code == 201 else None
        if plaintext:
            assert plaintext not in text and hash_key(SECRET, plaintext) not in text
    assert not [r for r in logs.records if r.exc_info], "a traceback was logged"


@pytest.mark.slow
def test_concurrent_key_creation_while_the_tenant_is_deleted(
    gateway: Gateway, logs: pytest.LogCaptureFixture
) -> None:
    """Keys issued for a tenant that concurrent requests delete: each key answered 201 was
    created (and then went with its tenant), each refused one is a clear 409/404, never a 5xx."""
    with gateway.factory.begin() as session:
        _tier(session)
        _tenant(session)
    writes: list[Write] = [
        ("DELETE", "/tenants/acme", None)
        if i % 10 == 5
        else ("POST", "/keys", {"tenant": "acme", "name": MARKER})
        for i in range(WRITERS)
    ]
    responses = run_writes(gateway, writes)

    assert_dialect_refusals(responses, frozenset({404, 409}))
    created = [r for r in responses if r.request.method == "POST" and r.status_code == 201]
    deleted = [r for r in responses if r.request.method == "DELETE" and r.status_code == 200]
    assert len(deleted) == 1
    with gateway.factory() as session:
        audited = len(_api_audit(session, "api_key", "create"))
        assert audited == len(created)
        assert _count(session, Tenant) == 0 and _count(session, ApiKey) == 0
    print(_summary("keys.create + tenants.delete", responses, audited + len(deleted)))
    _assert_clean_logs(logs, responses)


# -- a database that stays busy, or has no schema: answered in the dialect, never logged raw -


@pytest.fixture
def busy_gateway(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Gateway, sqlite3.Connection]]:
    """The gateway on SQLite with a 0.2 s busy timeout, and a connection (as another process
    would hold it) that can take the database's write lock."""
    monkeypatch.setattr(session_module, "SQLITE_BUSY_TIMEOUT_MS", 200, raising=False)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        yield from _serve(sqlite_url, tmp_path, holder)
    finally:
        holder.close()


def _serve(
    url: str, tmp_path: Path, holder: sqlite3.Connection
) -> Iterator[tuple[Gateway, sqlite3.Connection]]:
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    settings = Settings(
        database_url=url,
        admin_key=SecretStr(ADMIN_KEY),
        secret=SecretStr(SECRET),
        data_dir=tmp_path / "data",
    )
    try:
        with GatewayThread(create_app(settings, backends=[])) as server:
            yield Gateway(server.url, make_session_factory(engine)), holder
    finally:
        engine.dispose()


def test_a_write_that_stays_busy_is_a_503_with_retry_after(
    busy_gateway: tuple[Gateway, sqlite3.Connection], logs: pytest.LogCaptureFixture
) -> None:
    running, holder = busy_gateway
    tier = {"name": f"{MARKER}-t", "weight": 2.0, "ttft_ms": 500.0, "tpot_ms": 50.0}
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock past our busy timeout
    try:
        (busy,) = run_writes(running, [("POST", "/tiers", tier)], at_least=1)
    finally:
        holder.rollback()
    assert busy.status_code == 503, busy.text
    assert busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "database_busy"
    (created,) = run_writes(running, [("POST", "/tiers", tier)], at_least=1)  # the retry
    assert created.status_code == 201, created.text
    with running.factory() as session:
        assert _count(session, Tier) == 1
    _assert_clean_logs(logs, [busy, created])
    assert "database busy" in _log_text(logs)  # the operator hears of it, without values


def test_a_database_error_outside_the_admin_api_is_answered_in_the_dialect(
    sqlite_url: str, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    """An API key checked against a database with no schema: a JSON 500 naming the problem,
    not Starlette's plain-text one with a logged traceback holding the key's hash."""
    settings = Settings(database_url=sqlite_url, secret=SecretStr(SECRET), data_dir=tmp_path)
    key = f"tg-abcd1234-{MARKER}"
    with GatewayThread(create_app(settings, backends=[])) as server:
        response = httpx.get(
            f"{server.url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["code"] == "database_error" and "tiergate db upgrade" in error["message"]
    text = _log_text(logs)
    assert key not in text and hash_key(SECRET, key) not in text
    assert not [r for r in logs.records if r.exc_info], "a traceback was logged"


# -- what a database error means, on both databases -------------------------------------------


def _raises(factory: sessionmaker[Session], work: Callable[[Session], object]) -> SQLAlchemyError:
    with pytest.raises(SQLAlchemyError) as caught, factory.begin() as session:
        work(session)
    return caught.value


def test_database_errors_are_classified_and_described_without_their_values(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        _tier(session)
        _tenant(session)
        key = crud.create_key(session, actor=SETUP_ACTOR, tenant="acme", secret=SECRET)
    taken_hash = key.api_key.key_hash

    def same_hash(session: Session) -> None:
        tenant_id = session.scalar(select(Tenant.id))
        session.add(ApiKey(tenant_id=tenant_id, prefix="zzzzzzzz", key_hash=taken_hash))
        session.flush()

    def no_tenant(session: Session) -> None:
        session.add(ApiKey(tenant_id=10**6, prefix="yyyyyyyy", key_hash=MARKER))
        session.flush()

    def no_table(session: Session) -> None:
        session.execute(text(f"SELECT * FROM missing_{MARKER}"))

    unique = _raises(session_factory, same_hash)
    foreign = _raises(session_factory, no_tenant)
    schema = _raises(session_factory, no_table)
    assert isinstance(unique, IntegrityError) and is_unique_violation(unique)
    assert isinstance(foreign, IntegrityError) and not is_unique_violation(foreign)
    assert classify(unique) is classify(foreign) is DatabaseFailure.CONFLICT
    assert classify(schema) is DatabaseFailure.SCHEMA
    for exc in (unique, foreign, schema):
        described = describe(exc)
        assert taken_hash not in described and MARKER not in described, described
        assert "[parameters:" not in str(exc)  # hide_parameters=True


def test_a_held_write_lock_and_an_unreachable_server_are_told_apart(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "SQLITE_BUSY_TIMEOUT_MS", 100, raising=False)
    engine = make_engine(sqlite_url)
    Base.metadata.create_all(engine)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        busy = _raises(make_session_factory(engine), lambda s: None)
    finally:
        holder.rollback()
        holder.close()
        engine.dispose()
    assert classify(busy) is DatabaseFailure.BUSY
    assert describe(busy) == "OperationalError (OperationalError SQLITE_BUSY)"

    nowhere = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    try:
        with pytest.raises(SQLAlchemyError) as caught:
            nowhere.connect()
    finally:
        nowhere.dispose()
    assert classify(caught.value) is DatabaseFailure.UNAVAILABLE


def test_a_key_for_a_tenant_deleted_meanwhile_is_a_conflict_not_a_taken_name(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the tenant goes between the key's read of it and its insert. The foreign key
    refuses the insert; that is a concurrent change (409 ``conflict``), not a taken prefix."""
    engine = make_engine(postgres_url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        _tier(session)
        _tenant(session)
    generate = crud_keys.generate_key

    def delete_the_tenant_first() -> Any:
        with factory.begin() as other:
            crud.delete_tenant(other, "acme", actor="other")
        return generate()

    monkeypatch.setattr(crud_keys, "generate_key", delete_the_tenant_first)
    try:
        with pytest.raises(IntegrityError) as caught, factory.begin() as session:
            crud.create_key(session, actor=SETUP_ACTOR, tenant="acme", secret=SECRET)
    finally:
        engine.dispose()
    assert not is_unique_violation(caught.value)
    answer = database_error(caught.value)
    assert (answer.status, answer.code) == (409, "conflict")


def test_concurrent_seeding_creates_each_default_once(
    session_factory: sessionmaker[Session],
) -> None:
    """Gateways starting together seed one database at once: every seeder succeeds, and each
    default tier and the demo tenant exist once, created (and audited) by one of them."""
    seeders = 8
    start = threading.Barrier(seeders)
    results: list[SeedResult] = []
    failures: list[BaseException] = []

    def seed() -> None:
        start.wait()
        try:
            with session_factory.begin() as session:
                results.append(seed_defaults(session, actor=SETUP_ACTOR))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=seed) for _ in range(seeders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, [describe(f) if isinstance(f, SQLAlchemyError) else f for f in failures]
    names = sorted(spec["name"] for spec in DEFAULT_TIERS)
    assert sorted(name for r in results for name in r.created_tiers) == names
    assert sum(r.created_demo_tenant for r in results) == 1
    with session_factory() as session:
        assert sorted(session.scalars(select(Tier.name))) == names
        assert _count(session, Tenant) == 1
        assert _count(session, AuditLog) == len(names) + 1
