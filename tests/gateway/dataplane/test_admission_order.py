"""Admission's stages: their order (refusals before charges, charges before waiting), how the
stage list runs, and — through a running gateway — that a request refused before the limits
stage (by its body, SLO, model or spent budget) is never charged to its tenant's rate limit."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.dataplane import admission
from gateway.dataplane.admission import ADMISSION, Stage, admit
from gateway.db import crud
from gateway.db.crud import budgets, prices
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings

NAMES = [stage.name for stage in ADMISSION]
REFUSE_ONLY = ("body", "slo", "kind", "conversation", "model", "context", "length", "core")
"""Stages that take nothing a refusal would have to give back."""


def test_the_stage_order_is_pinned() -> None:
    assert NAMES == [
        "body",
        "slo",
        "kind",
        "conversation",
        "model",
        "context",
        "length",
        "core",
        "budgets",
        "limits",
        "shed",
        "queue",
        "planners",
    ]


def test_refusals_come_before_charges_and_charges_before_waiting() -> None:
    at = NAMES.index
    assert len(set(NAMES)) == len(NAMES)
    assert max(at(name) for name in REFUSE_ONLY) < at("budgets")
    # a spent budget refuses before the rate limits are charged for the request
    assert at("budgets") < at("limits") < at("shed") < at("queue") < at("planners")


def test_the_stage_list_is_built_once() -> None:
    """The per-request loop walks a tuple made at import, not a list built per request."""
    assert isinstance(ADMISSION, tuple)
    assert tuple(stage.run for stage in ADMISSION) == admission._RUNS


def test_admit_runs_stages_in_order_awaits_only_awaitables_and_stops_at_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []

    def sync(job: Any, http: Any) -> None:
        ran.append(f"sync:{job}:{http}")

    async def waits(job: Any, http: Any) -> None:
        await asyncio.sleep(0)
        ran.append("async")

    def refuses(job: Any, http: Any) -> None:
        ran.append("refuses")
        raise LookupError("refused")

    def never(job: Any, http: Any) -> None:
        ran.append("never")

    stages = (Stage("a", sync), Stage("b", waits), Stage("c", refuses), Stage("d", never))
    monkeypatch.setattr(admission, "_RUNS", tuple(s.run for s in stages))
    with pytest.raises(LookupError):
        asyncio.run(admit("job", "http"))  # type: ignore[arg-type]
    assert ran == ["sync:job:http", "async", "refuses"]


# ---- through a running gateway ---------------------------------------------------------------

MODEL = "qwen2-7b"
SECRET = "order-test-secret"
RPM = 2


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """The gateway's URL, a key of a tenant limited to ``RPM`` requests a minute, and a second
    key of that tenant whose own daily budget is below any request's price (a priced model)."""
    root: Path = tmp_path_factory.mktemp("admission-order")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    with make_session_factory(engine).begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="t", tier="standard", rpm_limit=RPM)
        key = crud.create_key(session, actor="test", tenant="t", secret=SECRET).plaintext
        broke = crud.create_key(session, actor="test", tenant="t", secret=SECRET)
        prices.create_price(
            session, actor="test", model=MODEL, prompt_per_mtok="1", completion_per_mtok="1"
        )
        budgets.create_budget(
            session, actor="test", key=broke.api_key.id, period="day", amount="0.000001"
        )
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=root, redis_url=None)
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)]) as engines:
        backends = [BackendSpec("engine-0", engines[0].url, MODEL, engines[0].spec.profile)]
        with GatewayThread(create_app(settings, backends=backends)) as running:
            yield running.base_url, key, broke.plaintext
    engine.dispose()


def test_requests_refused_before_the_limits_stage_are_not_charged(
    gateway: tuple[str, str, str],
) -> None:
    base, key, broke = gateway
    auth = {"authorization": f"Bearer {key}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    refused: list[tuple[bytes | dict[str, Any], dict[str, str], int, str | None]] = [
        # (body, extra headers, status, code): one per refusing stage before the limits
        (b"{not json", {}, 400, None),  # body
        (chat, {"x-slo-tpot-ms": "fast"}, 400, None),  # slo
        ({**chat, "model": "no-such-model"}, {}, 404, "model_not_found"),  # model
    ]
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(RPM + 1):  # more refusals than the limit allows requests
            for body, headers, status, code in refused:
                sent: dict[str, Any] = (
                    {"content": body} if isinstance(body, bytes) else {"json": body}
                )
                answer = client.post("/chat/completions", headers={**auth, **headers}, **sent)
                assert answer.status_code == status, answer.text
                if code is not None:
                    assert answer.json()["error"]["code"] == code
            spent = client.post(  # budgets: refused before the limits stage charges the tenant
                "/chat/completions", headers={"authorization": f"Bearer {broke}"}, json=chat
            )
            assert spent.status_code == 429, spent.text
            assert spent.headers["x-tiergate-reject-reason"] == "budget_exceeded"
        for _ in range(RPM):  # the limit is whole: nothing refused was charged to it
            assert client.post("/chat/completions", headers=auth, json=chat).status_code == 200
        over = client.post("/chat/completions", headers=auth, json=chat)
        assert over.status_code == 429
        assert over.headers["x-tiergate-reject-reason"] == "rate_limit_rpm"
