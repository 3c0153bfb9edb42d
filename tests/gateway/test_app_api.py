"""The gateway's OpenAI API through the official ``openai`` client, against a running server.

One gateway (uvicorn in a thread) in front of two emulated engines — an A100 and an Ascend
910B profile serving the same model — on a temporary SQLite database seeded through the CRUD
layer. Covers the happy paths (streaming and not, chat and completions, usage, models), the
SLO headers and what reaches the engine, every error path, health and metrics.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.server import GatewayThread
from gateway.db import crud
from gateway.db.models import Base, utcnow
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.request import Request as CoreRequest
from tests.gateway.engine_spy import record_submissions

MODEL = "qwen2-7b"
SECRET = "app-test-secret"
CACHE_TTL_S = 0.3


@dataclass
class Env:
    gateway: GatewayThread
    engines: list[RunningEngine]
    factory: sessionmaker[Session]
    keys: dict[str, str]
    submitted: list[CoreRequest] = field(default_factory=list)

    def client(self, key: str = "standard", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gateway.base_url, api_key=self.keys[key], max_retries=0, **kwargs
        )

    def new_key(self, tenant: str, **kwargs: Any) -> str:
        with self.factory.begin() as session:
            created = crud.create_key(session, actor="test", tenant=tenant, secret=SECRET, **kwargs)
            return created.plaintext


def _seed(factory: sessionmaker[Session]) -> dict[str, str]:
    """Default tiers, plus a strict tier (20 ms TTFT) with and without best effort."""
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
        tenants: dict[str, dict[str, Any]] = {
            "standard": {"tier": "standard"},
            "premium": {"tier": "premium"},
            "strict": {"tier": "strict"},
            "strict-be": {"tier": "strict-be"},
            "limited": {"tier": "standard", "rpm_limit": 3},
        }
        for name, options in tenants.items():
            crud.create_tenant(session, actor="test", name=f"t-{name}", **options)
            keys[name] = crud.create_key(
                session, actor="test", tenant=f"t-{name}", secret=SECRET
            ).plaintext
    return keys


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("gateway-app")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    keys = _seed(factory)
    specs = [
        EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL),
        EngineSpec("910b-qwen2-7b", "vllm-v1-priority", MODEL),
    ]
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=root,
        redis_url=None,
        auth_cache_ttl_s=CACHE_TTL_S,
        max_body_bytes=64 * 1024,
        metrics_addr="127.0.0.1:0",  # the operator listener, on a free port
    )
    with EngineThread(specs) as engines:
        submitted = record_submissions(engines)  # what each engine receives
        backends = [
            BackendSpec(f"engine-{i}", e.url, MODEL, e.spec.profile) for i, e in enumerate(engines)
        ]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            yield Env(gateway, engines, factory, keys, submitted)
    engine.dispose()


CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]


# ---- happy paths -----------------------------------------------------------------------------


def test_chat_non_streaming_returns_text_and_usage(env: Env) -> None:
    reply = env.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    assert reply.usage.prompt_tokens > 0


def test_chat_streaming_with_usage(env: Env) -> None:
    stream = env.client().chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason == "length"


def test_streaming_without_include_usage_gets_no_usage_chunk(env: Env) -> None:
    chunks = list(
        env.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, stream=True)
    )
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_completions_streaming_and_not(env: Env) -> None:
    client = env.client()
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=3)
    assert reply.choices[0].text and reply.usage is not None
    assert reply.usage.completion_tokens == 3
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_models_lists_the_served_model(env: Env) -> None:
    models = env.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_models_retrieve_answers_one_model_and_404_for_others(env: Env) -> None:
    client = env.client()
    model = client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "tiergate")
    assert model == client.models.list().data[0]
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.code == "model_not_found" and "/v1/models" in missing.value.message
    unknown = openai.OpenAI(base_url=env.gateway.base_url, api_key="sk-123", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        unknown.models.retrieve(MODEL)


# ---- SLOs and what reaches the engine ---------------------------------------------------------


def _last_submitted(env: Env, tenant: str) -> CoreRequest:
    matching = [r for r in env.submitted if r.tenant == tenant]
    assert matching, f"no request of {tenant} reached an engine"
    return matching[-1]


def test_tier_slo_and_weight_reach_the_engine(env: Env) -> None:
    env.client("premium").chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    seen = _last_submitted(env, "t-premium")
    assert seen.weight == 4.0 and seen.tier == "premium"
    assert seen.slo.ttft_s == pytest.approx(1.0) and seen.slo.tpot_s == pytest.approx(0.05)
    assert seen.slo.deadline_s is None


def test_a_clients_own_protocol_keys_never_reach_the_engine(env: Env) -> None:
    forged = {"tiergate_deadline_ms": 5, "tiergate_weight": 64.0, "tiergate_tier": "gold"}
    env.client("premium").chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_body={"vllm_xargs": forged}
    )
    seen = _last_submitted(env, "t-premium")
    assert seen.slo.deadline_s is None  # the tier sets none; the client may not
    assert seen.weight == 4.0 and seen.tier == "premium"


def test_accepted_slo_headers_reach_the_engine(env: Env) -> None:
    env.client("premium").chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=2,
        extra_headers={"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "80", "x-slo-deadline-ms": "9000"},
    )
    seen = _last_submitted(env, "t-premium")
    assert seen.slo.ttft_s == pytest.approx(0.3)
    assert seen.slo.tpot_s == pytest.approx(0.08)
    assert seen.slo.deadline_s == pytest.approx(9.0)


@pytest.mark.parametrize(
    ("header", "value", "minimum"),
    [("x-slo-ttft-ms", "100", "250"), ("x-slo-tpot-ms", "10", "25")],
)
def test_slo_header_tighter_than_tier_minimum_is_400(
    env: Env, header: str, value: str, minimum: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client("premium").chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, extra_headers={header: value}
        )
    message = info.value.message
    assert header in message and minimum in message and "premium" in message


def test_slo_header_tighter_than_default_without_minimum_is_400(env: Env) -> None:
    # the strict tier sets no minimum: its 20 ms default is the floor
    with pytest.raises(openai.BadRequestError) as info:
        env.client("strict").chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, extra_headers={"x-slo-ttft-ms": "10"}
        )
    assert "x-slo-ttft-ms" in info.value.message and "20" in info.value.message


@pytest.mark.parametrize("value", ["fast", "-5", "nan", "0"])
def test_malformed_slo_header_is_400(env: Env, value: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, extra_headers={"x-slo-tpot-ms": value}
        )
    assert "x-slo-tpot-ms" in info.value.message


def test_infeasible_slo_is_shed_with_503(env: Env) -> None:
    """A 20 ms TTFT for an ~8k-token prompt: no profile can prefill it in time."""
    long_prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 32_000}]
    with pytest.raises(openai.InternalServerError) as info:
        env.client("strict").chat.completions.create(
            model=MODEL, messages=long_prompt, max_tokens=2
        )
    response = info.value.response
    assert response.status_code == 503
    assert response.headers["x-tiergate-reject-reason"] == "slo_infeasible"
    assert "strict" in info.value.message


def test_infeasible_slo_is_served_best_effort_when_the_tier_allows(env: Env) -> None:
    long_prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "x" * 32_000}]
    reply = env.client("strict-be").chat.completions.create(
        model=MODEL, messages=long_prompt, max_tokens=2
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 2


# ---- authentication ---------------------------------------------------------------------------


def test_missing_and_malformed_authorization_are_401(env: Env) -> None:
    body = {"model": MODEL, "messages": CHAT}
    for headers in ({}, {"authorization": "Basic abc"}, {"authorization": "Bearer"}):
        response = httpx.post(
            f"{env.gateway.base_url}/chat/completions", json=body, headers=headers
        )
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and error["message"]


def test_unknown_key_is_401(env: Env) -> None:
    client = openai.OpenAI(base_url=env.gateway.base_url, api_key="tg-abcdefgh-nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.models.list()
    assert "tg-abcdefgh" in info.value.message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env.gateway.base_url, api_key="sk-123", max_retries=0).models.list()


def test_revoked_key_is_refused_within_the_cache_ttl(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = env.new_key("t-standard")
    client = openai.OpenAI(base_url=env.gateway.base_url, api_key=key, max_retries=0)
    auth = env.gateway.state.auth
    frozen = auth.clock()  # the cache's clock stands still, then steps over the TTL
    monkeypatch.setattr(auth, "clock", lambda: frozen)
    client.models.list()  # cached now
    with env.factory.begin() as session:
        crud.revoke_key(session, key.split("-")[1], actor="test")
    client.models.list()  # still served from the cache: the revocation waits for the TTL
    frozen += CACHE_TTL_S
    with pytest.raises(openai.AuthenticationError) as info:
        client.models.list()
    assert "revoked" in info.value.message


def test_invalidate_makes_a_revocation_immediate(env: Env) -> None:
    key = env.new_key("t-standard")
    prefix = key.split("-")[1]
    client = openai.OpenAI(base_url=env.gateway.base_url, api_key=key, max_retries=0)
    client.models.list()
    with env.factory.begin() as session:
        crud.revoke_key(session, prefix, actor="test")
    env.gateway.state.auth.invalidate(prefix)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_expired_key_is_401(env: Env) -> None:
    key = env.new_key("t-standard")
    with env.factory.begin() as session:
        crud.update_key(
            session,
            key.split("-")[1],
            {"expires_at": utcnow() - timedelta(seconds=1)},
            actor="test",
        )
    client = openai.OpenAI(base_url=env.gateway.base_url, api_key=key, max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert "expired" in info.value.message


# ---- malformed requests -----------------------------------------------------------------------


def _post(env: Env, content: bytes, path: str = "/chat/completions") -> httpx.Response:
    return httpx.post(
        f"{env.gateway.base_url}{path}",
        content=content,
        headers={
            "authorization": f"Bearer {env.keys['standard']}",
            "content-type": "application/json",
        },
    )


def test_invalid_json_is_400(env: Env) -> None:
    response = _post(env, b"{not json")
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
    assert response.json()["error"]["code"] == "invalid_json"


def test_schema_violations_are_400_naming_the_field(env: Env) -> None:
    response = _post(env, b'{"model": "qwen2-7b", "messages": []}')
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages"
    response = _post(env, b'{"model": "qwen2-7b", "messages": [{"role": "user"}], "max_tokens": 0}')
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    assert response.json()["error"]["code"] == "invalid_value"
    with pytest.raises(openai.BadRequestError):  # as OpenAI answers it
        env.client().completions.create(model=MODEL, prompt="x", max_tokens=-1)


def test_unknown_model_is_404(env: Env) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        env.client().chat.completions.create(model="gpt-nope", messages=CHAT, max_tokens=2)
    assert "gpt-nope" in info.value.message


def test_body_too_large_is_413(env: Env) -> None:
    big = b'{"model": "qwen2-7b", "prompt": "' + b"x" * (70 * 1024) + b'"}'
    response = _post(env, big, "/completions")
    assert response.status_code == 413
    assert "65536" in response.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no content-length: the limit applies as it streams
        yield big[:1000]
        yield big[1000:]

    response = httpx.post(
        f"{env.gateway.base_url}/completions",
        content=chunks(),
        headers={"authorization": f"Bearer {env.keys['standard']}"},
    )
    assert response.status_code == 413


def test_rpm_limit_gives_429_with_reason_and_retry_after(env: Env) -> None:
    client = env.client("limited")
    for _ in range(3):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    headers = info.value.response.headers
    assert headers["x-tiergate-reject-reason"] == "rate_limit_rpm"
    assert 1 <= int(headers["retry-after"]) <= 60
    assert "3 requests per minute" in info.value.message


# ---- health and metrics -----------------------------------------------------------------------


def test_health_endpoints(env: Env) -> None:
    assert httpx.get(f"{env.gateway.url}/health/liveliness").status_code == 200
    ready = httpx.get(f"{env.gateway.url}/health/readiness")
    assert ready.status_code == 200
    assert sorted(ready.json()["healthy_backends"]) == ["engine-0", "engine-1"]


def test_openapi_docs_list_the_endpoints(env: Env) -> None:
    paths = httpx.get(f"{env.gateway.url}/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)
    assert httpx.get(f"{env.gateway.url}/docs").status_code == 200


def test_metrics_expose_requests_latency_gain_and_backends(env: Env) -> None:
    list(
        env.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, stream=True)
    )
    text = httpx.get(env.gateway.app.state.metrics_listener.metrics_url).text
    assert "t-standard" not in text  # tenant labels are off unless the operator turns them on
    for name in (
        'tiergate_requests_total{status="200",tier="standard"}',
        'tiergate_time_to_first_token_seconds_count{tier="standard"}',
        'tiergate_inter_token_latency_seconds_count{tier="standard"}',
        'tiergate_gain_total{tier="standard"}',
        'tiergate_ideal_gain_total{tier="standard"}',
        'tiergate_slo_requests_total{attained="true",tier="standard"}',
        'tiergate_backend_healthy{backend="engine-1"} 1.0',
        "tiergate_routing_decision_seconds_count",
        "tiergate_gateway_overhead_seconds_count",
        "tiergate_queue_depth",
    ):
        assert name in text, name
