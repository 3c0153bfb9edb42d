"""CRUD of tiers, tenants and backends on SQLite and PostgreSQL, with audit rows."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import crud
from gateway.db.errors import AlreadyExists, Conflict, InUse, InvalidInput, NotFound
from gateway.db.identity import effective_policy
from gateway.db.models import AuditLog, Tenant
from priority.profiles import Profile, available_profiles, load_profile

ACTOR = "test:alice"


def _tier(session: Session, name: str = "gold", **overrides: Any) -> Any:
    spec: dict[str, Any] = {"weight": 3.0, "ttft_ms": 800.0, "tpot_ms": 40.0}
    spec.update(overrides)
    return crud.create_tier(session, actor=ACTOR, name=name, **spec)


def _audit_rows(session: Session, entity_type: str) -> list[AuditLog]:
    return list(
        session.scalars(
            select(AuditLog).where(AuditLog.entity_type == entity_type).order_by(AuditLog.id)
        )
    )


def test_tier_lifecycle_is_audited(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as s:
        tier = _tier(s, rpm_limit=60, min_ttft_ms=200.0)
        tier_id = tier.id
    with session_factory.begin() as s:
        got = crud.get_tier(s, "gold")
        assert got.id == tier_id and crud.get_tier(s, tier_id).name == "gold"
        assert (got.weight, got.ttft_ms, got.rpm_limit, got.tpm_limit) == (3.0, 800.0, 60, None)
        assert got.created_at.tzinfo is not None
        crud.update_tier(s, "gold", {"weight": 5, "tpm_limit": 1000}, actor=ACTOR)
    with session_factory.begin() as s:
        assert crud.get_tier(s, tier_id).weight == 5.0
        crud.delete_tier(s, "gold", actor=ACTOR)
    with session_factory() as s:
        with pytest.raises(NotFound, match="tier 'gold' does not exist"):
            crud.get_tier(s, "gold")
        create, update, delete = _audit_rows(s, "tier")
    assert (create.action, create.before, create.actor) == ("create", None, ACTOR)
    assert create.after is not None and create.after["name"] == "gold"
    assert create.entity_id == str(tier_id)
    assert update.action == "update"
    assert update.before is not None and update.after is not None
    assert (update.before["weight"], update.after["weight"]) == (3.0, 5.0)
    assert (update.before["tpm_limit"], update.after["tpm_limit"]) == (None, 1000)
    assert delete.action == "delete" and delete.after is None
    assert delete.before is not None and delete.before["weight"] == 5.0


def test_noop_update_writes_no_audit_row(db_session: Session) -> None:
    _tier(db_session)
    crud.update_tier(db_session, "gold", {"weight": 3.0}, actor=ACTOR)
    assert [r.action for r in _audit_rows(db_session, "tier")] == ["create"]


@pytest.mark.parametrize(
    ("overrides", "param"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"weight": float("nan")}, "weight"),
        ({"weight": True}, "weight"),
        ({"ttft_ms": 0}, "ttft_ms"),
        ({"deadline_ms": -5}, "deadline_ms"),
        ({"rpm_limit": 0}, "rpm_limit"),
        ({"tpm_limit": 2.5}, "tpm_limit"),
        ({"min_ttft_ms": 900.0}, "min_ttft_ms"),  # tighter bound above the default (800)
        ({"name": "bad name"}, "name"),
        ({"name": ""}, "name"),
    ],
)
def test_invalid_tiers_are_refused_precisely(
    db_session: Session, overrides: dict[str, Any], param: str
) -> None:
    spec = dict(overrides)  # the parameter dict is shared by both databases' runs
    name = spec.pop("name", "gold")
    with pytest.raises(InvalidInput) as info:
        _tier(db_session, name, **spec)
    assert info.value.param == param
    assert param in info.value.message
    assert db_session.scalar(select(func.count()).select_from(AuditLog)) == 0


def test_duplicate_and_unknown_names(db_session: Session) -> None:
    _tier(db_session)
    with pytest.raises(AlreadyExists, match="tier 'gold' already exists"):
        _tier(db_session)
    _tier(db_session, "silver", weight=2.0)
    with pytest.raises(AlreadyExists, match="tier 'gold' already exists"):
        crud.update_tier(db_session, "silver", {"name": "gold"}, actor=ACTOR)
    with pytest.raises(InvalidInput, match="cannot update tier field"):
        crud.update_tier(db_session, "silver", {"colour": "red"}, actor=ACTOR)
    with pytest.raises(NotFound, match="tier 'bronze'"):
        crud.create_tenant(db_session, actor=ACTOR, name="acme", tier="bronze")
    assert [t.name for t in crud.list_tiers(db_session)] == ["gold", "silver"]  # by weight


def test_tenant_lifecycle_and_effective_policy(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as s:
        _tier(s, rpm_limit=60, tpm_limit=10_000, min_ttft_ms=500.0)
        _tier(s, "silver", weight=1.5, ttft_ms=1500.0, tpot_ms=80.0, max_concurrency=4)
        tenant = crud.create_tenant(
            s, actor=ACTOR, name="acme", tier="gold", rpm_limit=120, ttft_ms=600.0
        )
        policy = effective_policy(tenant, tenant.tier)
        assert (policy.weight, policy.rpm_limit, policy.tpm_limit) == (3.0, 120, 10_000)
        assert (policy.ttft_ms, policy.tpot_ms, policy.max_concurrency) == (600.0, 40.0, None)
    with (
        pytest.raises(InvalidInput, match="tighter than tier 'gold' allows"),
        session_factory.begin() as s,
    ):
        crud.update_tenant(s, "acme", {"ttft_ms": 100.0}, actor=ACTOR)
    with session_factory.begin() as s:
        moved = crud.update_tenant(s, "acme", {"tier": "silver", "ttft_ms": None}, actor=ACTOR)
        policy = effective_policy(moved, moved.tier)
        assert (policy.weight, policy.ttft_ms, policy.max_concurrency) == (1.5, 1500.0, 4)
        assert (policy.rpm_limit, policy.tpm_limit) == (120, None)
        crud.suspend_tenant(s, "acme", actor=ACTOR)
        with pytest.raises(InUse, match="still has 1 tenant"):
            crud.delete_tier(s, "silver", actor=ACTOR)
    with session_factory.begin() as s:
        assert [t.name for t in crud.list_tenants(s, status="suspended")] == ["acme"]
        assert crud.list_tenants(s, tier="gold") == []
        crud.activate_tenant(s, "acme", actor=ACTOR)
        crud.delete_tenant(s, "acme", actor=ACTOR)
        assert s.scalar(select(func.count()).select_from(Tenant)) == 0
    with session_factory() as s:
        actions = [r.action for r in _audit_rows(s, "tenant")]
        assert actions == ["create", "update", "suspend", "activate", "delete"]
        move = _audit_rows(s, "tenant")[1]
        assert move.before is not None and move.after is not None
        assert move.before["tier_id"] != move.after["tier_id"]
        assert (move.before["ttft_ms"], move.after["ttft_ms"]) == (600.0, None)


def test_tier_minimum_raised_later_still_bounds_the_tenant(db_session: Session) -> None:
    tier = _tier(db_session)
    tenant = crud.create_tenant(db_session, actor=ACTOR, name="acme", tier="gold", tpot_ms=20.0)
    crud.update_tier(db_session, "gold", {"min_tpot_ms": 30.0}, actor=ACTOR)
    assert effective_policy(tenant, tier).tpot_ms == 30.0


def test_failed_mutation_rolls_back_with_its_transaction(
    session_factory: sessionmaker[Session],
) -> None:
    with pytest.raises(AlreadyExists), session_factory.begin() as s:
        _tier(s)
        _tier(s)  # the whole unit of work fails, the first tier and its audit row too
    with session_factory() as s:
        assert crud.list_tiers(s) == []
        assert s.scalar(select(func.count()).select_from(AuditLog)) == 0


def test_backend_lifecycle(session_factory: sessionmaker[Session]) -> None:
    profile = available_profiles()[0]
    with session_factory.begin() as s:
        b = crud.create_backend(
            s,
            actor=ACTOR,
            name="gpu-0",
            base_url="http://10.0.0.5:8000/",
            model="qwen2-7b",
            profile=profile,
            kind="emulated",
        )
        assert (b.base_url, b.enabled, b.kind) == ("http://10.0.0.5:8000", True, "emulated")
        crud.create_backend(
            s,
            actor=ACTOR,
            name="npu-0",
            base_url="https://npu:8000",
            model="qwen2-7b",
            profile=profile,
            kind="vllm-ascend",
        )
    with session_factory.begin() as s:
        crud.set_backend_enabled(s, "gpu-0", False, actor=ACTOR)
        assert [b.name for b in crud.list_backends(s, enabled=True)] == ["npu-0"]
        assert [b.name for b in crud.list_backends(s, model="qwen2-7b")] == ["gpu-0", "npu-0"]
        crud.delete_backend(s, "npu-0", actor=ACTOR)
    with session_factory() as s:
        actions = [r.action for r in _audit_rows(s, "backend")]
        assert actions == ["create", "create", "disable", "delete"]
        assert [b.name for b in crud.list_backends(s)] == ["gpu-0"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("profile", "no-such-profile", "unknown profile 'no-such-profile'; known profiles: "),
        ("kind", "triton", "kind must be one of vllm, vllm-ascend, emulated"),
        ("base_url", "ftp://host", "base_url must be an http(s) URL"),
        ("base_url", "http://", "base_url must be an http(s) URL"),
        ("base_url", "http://[::1:8000", "base_url is not a valid URL"),  # was a 500
        ("base_url", "http://host:99999", "base_url is not a valid URL"),
        ("model", "", "model must be a non-empty name"),
    ],
)
def test_invalid_backends_are_refused(
    db_session: Session, field: str, value: str, message: str
) -> None:
    spec: dict[str, Any] = {
        "name": "b",
        "base_url": "http://h:1",
        "model": "m",
        "profile": available_profiles()[0],
        "kind": "vllm",
    }
    spec[field] = value
    with pytest.raises(InvalidInput, match=re.escape(message)) as info:
        crud.create_backend(db_session, actor=ACTOR, **spec)
    assert info.value.param == field


def _calibrated(name: str = "site-a100", **engine: int) -> dict[str, Any]:
    """An operator's profile document: a shipped one re-measured, under a new name."""
    document = load_profile("a100-qwen2-7b").to_dict()
    document["engine"] = {**document["engine"], **engine}
    return {**document, "name": name, "hardware": "site A100 #3"}


def _backend(session: Session, name: str, profile: str) -> Any:
    return crud.create_backend(
        session, actor=ACTOR, name=name, base_url="http://h:1", model="m", profile=profile
    )


def test_profile_lifecycle_is_audited(session_factory: sessionmaker[Session]) -> None:
    with session_factory.begin() as s:
        own = crud.import_profile(s, _calibrated(max_num_seqs=7), actor=ACTOR)
        renamed = crud.import_profile(s, _calibrated(), actor=ACTOR, name="site-a100-b")
        own_id = own.id
        assert (own.name, own.created_by, renamed.name) == ("site-a100", ACTOR, "site-a100-b")
        assert own.created_at.tzinfo is not None
    with session_factory.begin() as s:
        assert [p.name for p in crud.list_profiles(s)] == ["site-a100", "site-a100-b"]
        assert crud.get_profile(s, own_id).name == "site-a100"
        stored = crud.load_stored_profiles(s, ["site-a100", "site-a100-b", "a100-qwen2-7b", "x"])
        assert set(stored) == {"site-a100", "site-a100-b"}  # shipped and unknown names: absent
        assert stored["site-a100"] == Profile.from_dict(_calibrated(max_num_seqs=7))
        assert stored["site-a100-b"].name == "site-a100-b"  # the override renames the document
        _backend(s, "b1", "site-a100")
        _backend(s, "b2", "site-a100")
    with session_factory.begin() as s:
        with pytest.raises(InUse, match=r"'site-a100' is used by backend\(s\) b1, b2; point"):
            crud.delete_profile(s, "site-a100", actor=ACTOR)  # refused before any write
        crud.delete_backend(s, "b1", actor=ACTOR)
        crud.set_backend_enabled(s, "b2", False, actor=ACTOR)  # disabled still counts as a user
        with pytest.raises(InUse, match="used by backend"):
            crud.delete_profile(s, own_id, actor=ACTOR)
    with session_factory.begin() as s:
        crud.delete_backend(s, "b2", actor=ACTOR)
        crud.delete_profile(s, own_id, actor=ACTOR)
    with session_factory() as s:
        with pytest.raises(NotFound, match="profile 'site-a100' does not exist"):
            crud.get_profile(s, "site-a100")
        create, _, delete = _audit_rows(s, "profile")
    assert (create.action, create.actor, create.entity_id) == ("create", ACTOR, str(own_id))
    assert create.after is not None and json.loads(create.after["document"])["name"] == "site-a100"
    assert delete.action == "delete" and delete.before is not None  # the deleted document kept
    assert delete.before["document"] == create.after["document"]


@pytest.mark.parametrize(
    ("document", "name", "error", "message", "param"),
    [
        (
            ["not", "an", "object"],
            None,
            InvalidInput,
            "must be a JSON object, got list",
            "document",
        ),
        (
            {"name": "x", "hardware": "h", "model": "m"},
            None,
            InvalidInput,
            "lacks coefficients",
            "document",
        ),
        (
            {**_calibrated(), "coefficients": {"a_p": 1e-9}},
            None,
            InvalidInput,
            "invalid profile document: malformed profile",
            "document",
        ),
        (
            {**_calibrated(), "coefficients": {**_calibrated()["coefficients"], "a_p": -1}},
            None,
            InvalidInput,
            "coefficient a_p must be finite and >= 0, got -1.0",
            "document",
        ),
        (
            {**_calibrated(), "coefficients": "fast"},
            None,
            InvalidInput,
            "the profile document's coefficients must be a JSON object, got 'fast'",
            "document",
        ),
        (
            {**_calibrated(), "engine": {"max_num_seqs": 0}},
            None,
            InvalidInput,
            "max_num_seqs must be >= 1",
            "document",
        ),
        (_calibrated("has space"), None, InvalidInput, "invalid profile name 'has space'", "name"),
        (
            _calibrated(),
            "a100-qwen2-7b",
            AlreadyExists,
            "profile name 'a100-qwen2-7b' is a shipped profile's",
            "name",
        ),
        (
            load_profile("a100-qwen2-7b").to_dict(),
            None,
            AlreadyExists,
            "is a shipped profile's",
            "name",
        ),
    ],
)
def test_invalid_profiles_are_refused_precisely(
    db_session: Session,
    document: Any,
    name: str | None,
    error: type[Exception],
    message: str,
    param: str,
) -> None:
    with pytest.raises(error, match=re.escape(message)) as info:
        crud.import_profile(db_session, document, actor=ACTOR, name=name)
    assert getattr(info.value, "param", None) == param
    assert crud.list_profiles(db_session) == []


def test_a_profile_name_is_taken_once_and_ensure_reuses_the_same_document(
    db_session: Session,
) -> None:
    first = crud.import_profile(db_session, _calibrated(), actor=ACTOR)
    with pytest.raises(AlreadyExists, match="profile 'site-a100' already exists"):
        crud.import_profile(db_session, _calibrated(max_num_seqs=9), actor=ACTOR)
    assert crud.ensure_profile(db_session, _calibrated(), actor=ACTOR) is first
    with pytest.raises(AlreadyExists, match="a different profile named 'site-a100'"):
        crud.ensure_profile(db_session, _calibrated(max_num_seqs=9), actor=ACTOR)
    assert [r.action for r in _audit_rows(db_session, "profile")] == ["create"]


def test_shipped_profiles_are_listed_but_cannot_be_deleted(db_session: Session) -> None:
    crud.import_profile(db_session, _calibrated(), actor=ACTOR)
    catalog = {e.name: e.source for e in crud.profile_catalog(db_session)}
    assert catalog == {**dict.fromkeys(available_profiles(), "shipped"), "site-a100": "custom"}
    entry = crud.get_profile_entry(db_session, "a100-qwen2-7b")
    assert entry.row is None and entry.profile == load_profile("a100-qwen2-7b")
    with pytest.raises(Conflict, match="is shipped with tiergate and cannot be deleted"):
        crud.delete_profile(db_session, "a100-qwen2-7b", actor=ACTOR)
    with pytest.raises(NotFound, match="profile 'nope' does not exist"):
        crud.get_profile_entry(db_session, "nope")


def test_backends_accept_stored_profile_names(db_session: Session) -> None:
    with pytest.raises(InvalidInput, match="unknown profile 'site-a100'") as info:
        _backend(db_session, "b1", "site-a100")
    assert info.value.param == "profile"
    crud.import_profile(db_session, _calibrated(), actor=ACTOR)
    crud.import_profile(db_session, _calibrated("site-h100"), actor=ACTOR)
    assert _backend(db_session, "b1", "site-a100").profile == "site-a100"
    assert crud.update_backend(db_session, "b1", {"profile": "site-h100"}, actor=ACTOR).profile == (
        "site-h100"
    )
    with pytest.raises(
        InvalidInput, match=r"known profiles: .*a100-qwen2-7b.*site-a100, site-h100"
    ):
        crud.update_backend(db_session, "b1", {"profile": "site-b200"}, actor=ACTOR)


def test_actor_is_required(db_session: Session) -> None:
    with pytest.raises(InvalidInput, match="actor"):
        crud.create_tier(db_session, actor=" ", name="x", weight=1, ttft_ms=1, tpot_ms=1)
