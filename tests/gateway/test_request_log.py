"""The request log: migration 0014 on SQLite and PostgreSQL, rows written beside the usage
records by the usage writer (never holding a usage record back), trimmed by age and count, the
miss reason derived from what the stages knew, and rows a real request leaves."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import insert, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.accounting import MissReason, Outcome, miss_reason
from gateway.app.server import GatewayThread
from gateway.db import crud, migrate
from gateway.db.models import Base, RequestLog, UsageRecord, utcnow
from gateway.db.request_log import RequestExplain, trim
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageEvent, UsageWriter
from gateway.settings import Settings

# ---- migration 0014 --------------------------------------------------------------------------


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _indexes(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {str(i["name"]) for i in inspect(engine).get_indexes("request_log")}
    finally:
        engine.dispose()


def test_0014_adds_the_request_log_and_its_downgrade_keeps_the_usage_records(db_url: str) -> None:
    migrate.upgrade(db_url, "0013")
    assert "request_log" not in _tables(db_url)
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO usage_records (request_id, prompt_tokens, completion_tokens, "
                    "gain, ideal_gain, slo_met, status, created_at) VALUES "
                    "('r0', 1, 2, 0, 0, false, 'ok', CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(db_url, "0014")
        assert "request_log" in _tables(db_url)
        indexes = _indexes(db_url)
        assert {
            "uq_request_log_request_id",
            "ix_request_log_tenant_id_id",
            "ix_request_log_created_at",
            "ix_request_log_missed",
            "ix_request_log_tenant_missed",
        } <= indexes
        row = {"request_id": "r1", "status": "ok", "attempts": 1, "gain": 1.0, "ideal_gain": 2.0}
        with engine.begin() as conn:
            conn.execute(insert(RequestLog), [row])
        with pytest.raises(IntegrityError), engine.begin() as conn:  # one row per request
            conn.execute(insert(RequestLog), [row])
        with pytest.raises(IntegrityError), engine.begin() as conn:  # no such status
            conn.execute(insert(RequestLog), [{**row, "request_id": "r2", "status": "x"}])
        engine.dispose()
        migrate.downgrade("0013", db_url)
        assert "request_log" not in _tables(db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM usage_records")).scalar_one() == 1
        migrate.upgrade(db_url)
        assert "request_log" in _tables(db_url)
    finally:
        engine.dispose()


# ---- the writer --------------------------------------------------------------------------------


def _explain(**overrides: Any) -> RequestExplain:
    fields: dict[str, Any] = {
        "arrival_unix": utcnow().timestamp() - 1.0,
        "http_status": 200,
        "slo_met": False,
        "miss_reason": "queued",
        "admission": "admit",
        "admission_ttft_ms": 120.0,
        "predicted_ttft_ms": 80.0,
        "queue_ms": 900.0,
        "engine_ttft_ms": 85.0,
        "slo_ttft_ms": 500.0,
        "slo_tpot_ms": 50.0,
        "attempts": 1,
    }
    return RequestExplain(**{**fields, **overrides})


def _event(request_id: str, explain: RequestExplain | None, **overrides: Any) -> UsageEvent:
    fields: dict[str, Any] = {"status": "ok", "tier": "standard", "model": "m", "ttft_ms": 990.0}
    return UsageEvent(request_id=request_id, explain=explain, **{**fields, **overrides})


def test_the_writer_stores_each_explanation_beside_its_usage_record(
    session_factory: sessionmaker[Session],
) -> None:
    with UsageWriter(session_factory, flush_interval_s=0.05) as writer:
        writer.submit(_event("a", _explain()))
        writer.submit(_event("b", None))  # no explanation: a usage record only
        writer.submit(_event("c", _explain(queue_ms=float("inf"), slo_met=None)))
        assert writer.flush(10)
        assert writer.log_written == 2
    with session_factory() as session:
        usage = set(session.scalars(select(UsageRecord.request_id)))
        rows = {r.request_id: r for r in session.scalars(select(RequestLog))}
    assert usage == {"a", "b", "c"}
    assert set(rows) == {"a", "c"}
    a = rows["a"]
    assert (a.status, a.tier, a.model, a.ttft_ms, a.queue_ms) == ("ok", "standard", "m", 990.0, 900)
    assert (a.miss_reason, a.admission, a.slo_met, a.http_status) == ("queued", "admit", False, 200)
    assert abs((utcnow() - a.created_at).total_seconds() - 1.0) < 60  # the arrival, not the write
    assert rows["c"].queue_ms is None and rows["c"].slo_met is None  # infinity is not stored


def test_a_log_the_database_refuses_never_holds_a_usage_record_back(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory.begin() as session:
        session.execute(text("DROP TABLE request_log"))
    try:
        with UsageWriter(session_factory, flush_interval_s=0.05) as writer:
            writer.submit(_event("a", _explain()))
            assert writer.flush(10)
            assert (writer.written, writer.log_dropped, writer.failing) == (1, 1, False)
    finally:
        Base.metadata.create_all(session_factory.kw["bind"])
    with session_factory() as session:
        assert session.scalars(select(UsageRecord.request_id)).all() == ["a"]


# ---- retention ---------------------------------------------------------------------------------


def _log_rows(factory: sessionmaker[Session], ages_days: list[float]) -> None:
    now = utcnow()
    rows = [
        {
            "request_id": f"r{i}",
            "status": "ok",
            "attempts": 1,
            "gain": 0.0,
            "ideal_gain": 0.0,
            "created_at": now - timedelta(days=age),
        }
        for i, age in enumerate(ages_days)
    ]
    with factory.begin() as session:
        session.execute(insert(RequestLog), rows)


def _kept(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(RequestLog.request_id).order_by(RequestLog.id)))


def test_trim_deletes_rows_past_the_age_and_then_the_oldest_past_the_count(
    session_factory: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.db.request_log.TRIM_BATCH", 2)  # several batches
    _log_rows(session_factory, [10, 9, 8, 0.5, 9.5, 0.4, 0.3, 0.2, 0.1])
    assert trim(session_factory, days=7, max_rows=None) == 4
    assert _kept(session_factory) == ["r3", "r5", "r6", "r7", "r8"]
    assert trim(session_factory, days=7, max_rows=3) == 2
    assert _kept(session_factory) == ["r6", "r7", "r8"]
    assert trim(session_factory, days=None, max_rows=3) == 0
    with session_factory() as session:  # the usage records are never trimmed
        assert session.scalar(select(UsageRecord.id)) is None


def test_the_writer_trims_on_its_own_thread_when_due(
    session_factory: sessionmaker[Session],
) -> None:
    _log_rows(session_factory, [30, 20, 0.1])
    clock = [0.0]
    writer = UsageWriter(
        session_factory,
        flush_interval_s=0.05,
        request_log_days=7,
        request_log_rows=1000,
        trim_interval_s=60,
        clock=lambda: clock[0],
    )
    try:
        assert writer.flush(10)
        assert writer.trimmed == 0  # not due yet
        clock[0] = 61.0
        writer.submit(_event("a", None))
        assert writer.flush(10)
        for _ in range(200):
            if writer.trimmed:
                break
            writer.flush(1)
        assert writer.trimmed == 2
    finally:
        writer.close()
    assert _kept(session_factory) == ["r2"]


# ---- why an SLO was missed ---------------------------------------------------------------------


def _why(outcome: Outcome = Outcome.OK, **overrides: Any) -> MissReason | None:
    fields: dict[str, Any] = {
        "reject_reason": None,
        "slo_met": False,
        "demoted": False,
        "queue_ms": 5.0,
        "attempts": 1,
        "ttft_ms": 700.0,
        "slo_ttft_ms": 500.0,
        "tpot_ms": 20.0,
        "slo_tpot_ms": 50.0,
        "engine_ttft_ms": 690.0,
        "predicted_ttft_ms": 100.0,
    }
    return miss_reason(outcome, **{**fields, **overrides})


def test_the_miss_reason_is_the_first_stage_that_explains_it() -> None:
    assert _why(Outcome.REJECTED, reject_reason="slo_infeasible") is MissReason.HOPELESS
    assert _why(Outcome.REJECTED, reject_reason="slo_declined") is MissReason.HOPELESS
    assert _why(Outcome.REJECTED, reject_reason="rate_limit_rpm") is None  # not its SLO's
    assert _why(slo_met=True) is None
    assert _why(Outcome.FAILED, slo_met=None) is None
    assert _why(Outcome.CANCELLED, slo_met=None) is None
    assert _why(demoted=True, queue_ms=900.0) is MissReason.DEMOTED
    assert _why(queue_ms=600.0, attempts=2) is MissReason.QUEUED
    assert _why(attempts=2) is MissReason.FAILOVER
    assert _why() is MissReason.ENGINE_SLOW
    assert _why(predicted_ttft_ms=600.0) is MissReason.UNKNOWN  # as slow as predicted
    assert _why(predicted_ttft_ms=None) is MissReason.UNKNOWN
    assert _why(ttft_ms=300.0, tpot_ms=80.0) is MissReason.STALLED
    assert _why(ttft_ms=300.0, tpot_ms=20.0) is MissReason.UNKNOWN  # a deadline, say


# ---- a real request's row ----------------------------------------------------------------------

MODEL = "qwen2-7b"
SECRET = "request-log-test-secret"


@dataclass
class Env:
    gateway: GatewayThread
    factory: sessionmaker[Session]
    keys: dict[str, str]

    def chat(self, key: str, content: str, max_tokens: int = 4) -> httpx.Response:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
        return httpx.post(
            f"{self.gateway.base_url}/chat/completions",
            json={**body, "max_tokens": max_tokens},
            headers={"Authorization": f"Bearer {self.keys[key]}"},
            timeout=30,
        )

    def last_log(self) -> RequestLog:
        assert self.gateway.state.usage_writer.flush(timeout=10)
        with self.factory() as session:
            row = session.scalars(select(RequestLog).order_by(RequestLog.id.desc())).first()
        assert row is not None
        return row


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("request-log")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    keys = {}
    with factory.begin() as session:
        seed_defaults(session)
        for name, best_effort in (("strict", False), ("strict-be", True)):
            crud.create_tier(
                session,
                actor="test",
                name=name,
                weight=3.0,
                ttft_ms=20.0,
                tpot_ms=50.0,
                best_effort_allowed=best_effort,
            )
        for name, tier in (("standard", "standard"), ("strict", "strict"), ("be", "strict-be")):
            crud.create_tenant(session, actor="test", name=f"t-{name}", tier=tier)
            keys[name] = crud.create_key(
                session, actor="test", tenant=f"t-{name}", secret=SECRET
            ).plaintext
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=root, redis_url=None)
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)]) as engines:
        backends = [BackendSpec("engine-0", e.url, MODEL, e.spec.profile) for e in engines]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            yield Env(gateway, factory, keys)
    engine.dispose()


def test_a_served_request_leaves_a_row_with_what_each_stage_knew(env: Env) -> None:
    response = env.chat("standard", "Say something.")
    assert response.status_code == 200
    row = env.last_log()
    assert (row.status, row.http_status, row.backend) == ("ok", 200, "engine-0")
    assert row.tier == "standard"
    assert row.admission == "admit" and row.attempts == 1
    assert row.ttft_ms is not None and row.ttft_ms > 0 and row.engine_ttft_ms is not None
    assert row.queue_ms is not None and row.queue_ms >= 0
    assert row.admission_ttft_ms is not None and row.slo_ttft_ms is not None
    assert row.slo_met is not None and row.gain >= 0 and row.ideal_gain > 0
    assert (row.miss_reason is None) == row.slo_met
    assert abs((utcnow() - row.created_at).total_seconds()) < 60


def test_a_shed_request_is_logged_as_hopeless(env: Env) -> None:
    response = env.chat("strict", "x" * 32_000, max_tokens=2)
    assert response.status_code == 503
    row = env.last_log()
    assert (row.status, row.http_status, row.reject_reason) == ("rejected", 503, "slo_infeasible")
    assert (row.admission, row.miss_reason, row.attempts) == ("shed", "hopeless", 0)
    assert row.admission_ttft_ms is not None and row.admission_ttft_ms > 20.0


def test_a_demoted_request_that_misses_is_logged_as_demoted(env: Env) -> None:
    response = env.chat("be", "x" * 32_000, max_tokens=2)
    assert response.status_code == 200
    row = env.last_log()
    assert row.admission == "demote" and row.reject_reason is not None
    assert row.slo_met is False and row.miss_reason == "demoted"
