"""Budgets through the gateway: a request of a priced model reserves its maximum cost, the
usage record is charged exactly, and once the tenant's day is spent the next request is 429
``budget_exceeded`` with ``retry-after`` until midnight UTC, in the OpenAI error shape. With
Redis configured but unreachable, the same budget holds in process (``1/share`` of it), never a
500, and ``tiergate_budget_degraded`` says so."""

from __future__ import annotations

import re
import socket
from decimal import Decimal
from pathlib import Path

import httpx
from pydantic import SecretStr
from sqlalchemy import select

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.crud import budgets, prices
from gateway.db.models import Base, UsageRecord
from gateway.db.money import cost_of
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings

MODEL = "qwen2-7b"
SECRET = "budget-e2e-secret"
PRICE = Decimal("1000")  # per 1M tokens: a token costs 0.001


def test_a_spent_budget_refuses_with_429_until_the_period_ends(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as s:
        seed_defaults(s)
        crud.create_tenant(s, actor="t", name="acme", tier="standard")
        key = crud.create_key(s, actor="t", tenant="acme", secret=SECRET).plaintext
        prices.create_price(
            s, actor="t", model=MODEL, prompt_per_mtok=PRICE, completion_per_mtok=PRICE
        )
        budgets.create_budget(s, actor="t", tenant="acme", period="day", amount="0.2")
    settings = Settings(
        database_url=url, secret=SecretStr(SECRET), data_dir=tmp_path, redis_url=None
    )
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi."}]}
    headers = {"authorization": f"Bearer {key}"}
    answers = []
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)]) as engines:
        backends = [BackendSpec("e0", engines[0].url, MODEL, engines[0].spec.profile)]
        app = create_app(settings, backends=backends)
        with GatewayThread(app) as gw, httpx.Client(base_url=gw.base_url, timeout=30) as client:
            for _ in range(40):
                answer = client.post("/chat/completions", json=body, headers=headers)
                answers.append(answer)
                if answer.status_code != 200:
                    break
            state = app.state.gateway
            assert state.usage_writer.flush(10)
            metrics = state.metrics.render().decode()
    refused = answers[-1]
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded" and error["type"] == "rate_limit_exceeded"
    assert re.search(r"resets at \d{4}-\d\d-\d\dT00:00:00Z", error["message"])
    assert 1 <= int(refused.headers["retry-after"]) <= 86_400
    assert refused.headers["x-tiergate-reject-reason"] == "budget_exceeded"
    served = [a for a in answers if a.status_code == 200]
    assert len(served) >= 2
    with factory() as s:
        rows = s.execute(
            select(
                UsageRecord.prompt_tokens, UsageRecord.completion_tokens, UsageRecord.cost
            ).where(UsageRecord.status == "ok")
        ).all()
    assert len(rows) == len(served)
    for p, c, cost in rows:
        assert cost == cost_of(p, c, PRICE, PRICE)
    spent = sum((r[2] or Decimal(0) for r in rows), Decimal(0))
    # never past the budget by more than one request's maximum cost (the engine may count a
    # prompt's tokens above the gateway's estimate)
    most = max(cost_of(p, 16, PRICE, PRICE) for p, _, _ in rows)
    assert spent <= Decimal("0.2") + most, (spent, most)
    assert 'tiergate_spend_total{tier="standard"}' in metrics
    assert 'tiergate_budget_rejections_total{period="day",scope="tenant"} 1.0' in metrics
    engine.dispose()


def _closed_port() -> int:
    """A port nothing listens on (bound, then let go): every connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_with_redis_unreachable_the_budget_holds_in_process(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as s:
        seed_defaults(s)
        crud.create_tenant(s, actor="t", name="acme", tier="standard")
        key = crud.create_key(s, actor="t", tenant="acme", secret=SECRET).plaintext
        prices.create_price(
            s, actor="t", model=MODEL, prompt_per_mtok=PRICE, completion_per_mtok=PRICE
        )
        budgets.create_budget(s, actor="t", tenant="acme", period="day", amount="0.2")
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=f"redis://127.0.0.1:{_closed_port()}/0",
        limits_share=2,  # this process stands for one of two: half of the budget is its own
    )
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi."}]}
    headers = {"authorization": f"Bearer {key}"}
    answers = []
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)]) as engines:
        backends = [BackendSpec("e0", engines[0].url, MODEL, engines[0].spec.profile)]
        app = create_app(settings, backends=backends)
        with GatewayThread(app) as gw, httpx.Client(base_url=gw.base_url, timeout=30) as client:
            for _ in range(40):
                answer = client.post("/chat/completions", json=body, headers=headers)
                answers.append(answer)
                if answer.status_code != 200:
                    break
            state = app.state.gateway
            assert state.usage_writer.flush(10)
            metrics = state.metrics.render().decode()
    refused = answers[-1]
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded" and "briefly unavailable" in error["message"]
    assert refused.headers["retry-after"] == "2"  # the longest probe period: Redis may be back
    served = [a for a in answers if a.status_code == 200]
    assert len(served) >= 2
    with factory() as s:
        rows = s.execute(
            select(UsageRecord.prompt_tokens, UsageRecord.cost).where(UsageRecord.status == "ok")
        ).all()
    assert len(rows) == len(served)
    spent = sum((cost or Decimal(0) for _, cost in rows), Decimal(0))
    most = max(cost_of(p, 16, PRICE, PRICE) for p, _ in rows)
    # this process's half, past it by no more than the engine's count of a prompt's tokens
    # exceeds the gateway's estimate (as with Redis): never fail open
    assert spent <= Decimal("0.1") + most, (spent, most)
    assert "tiergate_budget_degraded 1.0" in metrics
    engine.dispose()
