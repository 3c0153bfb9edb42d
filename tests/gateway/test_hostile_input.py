"""Hostile and careless input on the data plane: a 4xx in OpenAI's dialect, never a 500.

Through the official ``openai`` client where it can send the
input (it refuses to write ``Infinity`` or arbitrarily deep JSON itself: raw HTTP there):

* JSON nested too deeply is 400 ``invalid_json`` on ``/v1`` and the emulated engine (it was a
  ``RecursionError``: a plain-text 500 the metrics never saw);
* OpenAI's own types: strict booleans, finite numbers within OpenAI's ranges (``"stream":
  "yes"`` streamed, ``"temperature": Infinity`` was accepted), while valid requests and vLLM's
  extra fields pass as before;
* the context length is checked before the SLO's feasibility: 400 ``context_length_exceeded``,
  never a (retryable) ``503 slo_infeasible``;
* the bounds of the numbers that reach the gain, on the CLI (the admin API's are in
  ``admin/test_tiers.py``, the database's in ``test_db_migrations.py``).

One gateway (uvicorn in a thread) in front of one emulated engine with a 4096-token context.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import typer
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from gateway.app import BackendSpec, create_app
from gateway.app.backend_scrapes import CARD_REFRESH_S, ModelCard, read_card
from gateway.app.backends import ModelGroup
from gateway.app.context import ContextWindow, check_context, context_window
from gateway.app.schemas import ChatBody
from gateway.app.server import GatewayThread
from gateway.app.upstream import Upstream, UpstreamError
from gateway.cli import register
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.errors import ApiError
from gateway.jsonbody import MAX_JSON_DEPTH, json_depth_exceeds
from gateway.settings import Settings, get_settings
from gateway.tokens import count_chat_tokens
from priority.routing import make_router
from tests.gateway.offline_backends import offline_backends

MODEL = "qwen2-7b"
SECRET = "hostile-test-secret"
CONTEXT = 4096
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]


@dataclass
class Env:
    gateway: GatewayThread
    engine: RunningEngine
    keys: dict[str, str]

    def client(self, key: str = "standard") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url, api_key=self.keys[key], max_retries=0)

    def post(self, body: bytes, path: str = "/chat/completions", **headers: str) -> httpx.Response:
        auth = {"authorization": f"Bearer {self.keys['standard']}"}
        return httpx.post(
            f"{self.gateway.base_url}{path}",
            content=body,
            headers={**auth, "content-type": "application/json", **headers},
            timeout=30,
        )


def _seed(factory: sessionmaker[Session]) -> dict[str, str]:
    """The default tiers, plus a strict one (20 ms TTFT, no best effort)."""
    keys = {}
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tier(
            session, actor="test", name="strict", weight=3.0, ttft_ms=20.0, tpot_ms=50.0
        )
        for tier in ("standard", "strict"):
            crud.create_tenant(session, actor="test", name=f"t-{tier}", tier=tier)
            keys[tier] = crud.create_key(
                session, actor="test", tenant=f"t-{tier}", secret=SECRET
            ).plaintext
    return keys


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("hostile")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    keys = _seed(make_session_factory(engine))
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=root, redis_url=None)
    spec = EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL, max_model_len=CONTEXT)
    with EngineThread([spec]) as engines:
        backends = [BackendSpec("engine-0", engines[0].url, MODEL, spec.profile)]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            _await_cards(gateway)
            yield Env(gateway, engines[0], keys)
    engine.dispose()


def _await_cards(gateway: GatewayThread) -> None:
    """Until the first scrape has read each engine's model card, the engine alone judges the
    context (no check before the window is known)."""
    deadline = time.monotonic() + 30  # bounds only a failing test
    while any(b.card is None for b in gateway.state.pool.backends):
        assert time.monotonic() < deadline, "no model card read"
        time.sleep(0.01)


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _requests_with_status(env: Env, status: str) -> float:
    """``tiergate_requests_total`` of the standard tier with this status, whatever labels else."""
    total = 0.0
    for line in env.gateway.state.metrics.render().decode().splitlines():
        labels = (f'status="{status}"', 'tier="standard"')
        if line.startswith("tiergate_requests_total{") and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- item 3: JSON nested too deeply -----------------------------------------------------------


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_deeply_nested_json_is_400_invalid_json_and_counted(env: Env, path: str) -> None:
    """A few thousand nested arrays, far under the size limit: RecursionError before (a
    plain-text 500, missing from the metrics, the connection dropped)."""
    before = _requests_with_status(env, "400")
    body = b'{"model": "qwen2-7b", "messages": [], "prompt": ' + _nested(20_000) + b"}"
    error = _error(env.post(body, path), 400)
    assert (error["code"], error["param"], error["type"]) == (
        "invalid_json",
        None,
        "invalid_request_error",
    )
    assert f"deeper than {MAX_JSON_DEPTH} levels" in error["message"]
    assert _requests_with_status(env, "400") == before + 1


def test_json_up_to_the_depth_bound_still_works(env: Env) -> None:
    """A vLLM extra field nested to exactly the bound (the body's object is one more level)."""
    nested: Any = []
    for _ in range(MAX_JSON_DEPTH - 2):
        nested = [nested]
    reply = env.client().chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2, extra_body={"x_nested": nested}
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 2


def test_the_emulated_engine_refuses_deep_json_with_400(env: Env) -> None:
    body = b'{"model": "qwen2-7b", "prompt": ' + _nested(20_000) + b"}"
    response = httpx.post(f"{env.engine.url}/v1/completions", content=body, timeout=30)
    assert response.status_code == 400, response.text
    assert "deeper than" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("raw", "deep"),
    [
        (b"[" * 129, True),  # unclosed: the parser would recurse all the same
        (b"[" * 128 + b"]" * 128, False),
        (b"[" * 129 + b"]" * 129, True),
        (b'["' + b"[" * 500 + b'"]', False),  # brackets inside a string do not nest
        (b'["\\"' + b"[" * 500 + b'"]', False),  # nor after an escaped quote
        (b"{" + b'"a":{' * 128 + b"}" * 129, True),
        (json.dumps([[["x"]]] * 300).encode(), False),  # many arrays side by side
        (("[" * 129 + "]" * 129).encode("utf-16"), True),  # json.loads reads UTF-16 too
    ],
)
def test_the_depth_scan(raw: bytes, deep: bool) -> None:
    assert json_depth_exceeds(raw) is deep


# ---- item 7: OpenAI's own types -------------------------------------------------------------


LAX: list[tuple[dict[str, Any], str, str]] = [
    ({"stream": "yes"}, "stream", "invalid_type"),  # streamed before
    ({"stream": 1}, "stream", "invalid_type"),
    ({"stream_options": {"include_usage": "no"}}, "stream_options.include_usage", "invalid_type"),
    ({"temperature": "0.7"}, "temperature", "invalid_type"),
    ({"temperature": 2.5}, "temperature", "invalid_value"),  # OpenAI's range is [0, 2]
    ({"temperature": -0.1}, "temperature", "invalid_value"),
    ({"top_p": 1.5}, "top_p", "invalid_value"),
    ({"top_p": 0}, "top_p", "invalid_value"),  # vLLM's range (0, 1]: its 400 before
    ({"stream": None}, "stream", "invalid_type"),  # as before
    ({"presence_penalty": -3}, "presence_penalty", "invalid_value"),
    ({"frequency_penalty": 2.5}, "frequency_penalty", "invalid_value"),
    ({"n": 0}, "n", "invalid_value"),
    ({"max_tokens": "5"}, "max_tokens", "invalid_type"),  # coerced to 5 before
    ({"max_tokens": True}, "max_tokens", "invalid_type"),
    ({"max_tokens": 2.5}, "max_tokens", "invalid_type"),
    ({"max_tokens": 2**31}, "max_tokens", "invalid_value"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_value"),
    ({"logprobs": "true"}, "logprobs", "invalid_type"),
    ({"seed": "1"}, "seed", "invalid_type"),
    ({"stop": 5}, "stop", "invalid_type"),
    ({"logit_bias": {"50256": "x"}}, "logit_bias.50256", "invalid_type"),
    ({"vllm_xargs": [1]}, "vllm_xargs", "invalid_type"),  # a 500 when the payload was built
    ({"messages": [{"role": 1, "content": "hi"}]}, "messages.0.role", "invalid_type"),
]


@pytest.mark.parametrize(("fields", "param", "code"), LAX, ids=[p for _, p, _ in LAX])
def test_lax_types_and_out_of_range_values_are_400(
    env: Env, fields: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, extra_body=fields
        )
    assert (info.value.code, info.value.param) == (code, param), info.value.message


@pytest.mark.parametrize("value", [b"Infinity", b"-Infinity", b"NaN", b"1e999"])
def test_non_finite_numbers_are_400(env: Env, value: bytes) -> None:
    """Python's json reads ``Infinity`` and ``NaN`` (and ``1e999`` overflows to infinity)."""
    body = b'{"model": "qwen2-7b", "messages": [{"role": "user", "content": "hi"}], '
    error = _error(env.post(body + b'"temperature": ' + value + b"}"), 400)
    assert (error["code"], error["param"]) == ("invalid_value", "temperature")


def test_a_number_of_too_many_digits_is_400_not_500(env: Env) -> None:
    error = _error(env.post(b'{"model": "qwen2-7b", "max_tokens": ' + b"9" * 5000 + b"}"), 400)
    assert error["code"] == "invalid_json"


def test_valid_requests_and_vllm_extras_still_work(env: Env) -> None:
    """OpenAI's edge values, a whole number written ``3.0``, nulls where they were allowed,
    and vLLM's own parameters (passed through untouched)."""
    reply = env.client().chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=3,
        temperature=2,
        top_p=1,
        presence_penalty=-2,
        frequency_penalty=2,
        n=1,
        seed=7,
        stop=["\n\n"],
        logit_bias={"50256": -100},
        logprobs=False,
        user="u-1",
        extra_body={"top_k": 5, "min_tokens": 1, "repetition_penalty": 1.1},
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 3
    body = b'{"model": "qwen2-7b", "prompt": "hi", "max_tokens": 3.0, "temperature": null}'
    response = env.post(body, "/completions")
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    chunks = list(
        env.client().completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True)
    )
    assert chunks
    nulls = {"n": None, "stop": None, "temperature": None, "top_p": None, "seed": None}
    assert ChatBody.model_validate({"model": MODEL, "messages": CHAT, **nulls}).n is None


# ---- item 6: context length before SLO feasibility ------------------------------------------


def _chat_of(tokens: int) -> list[ChatCompletionMessageParam]:
    """One user message whose prompt counts ``tokens`` (the gateway's and the engine's count)."""
    text = "x" * 4 * (tokens - count_chat_tokens([""]))
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": text}]
    assert count_chat_tokens([text]) == tokens
    return messages


def test_a_prompt_beyond_the_context_is_400_under_a_tight_default_slo(env: Env) -> None:
    """503 ``slo_infeasible`` before, which the ``openai`` client retries."""
    with pytest.raises(openai.BadRequestError) as info:
        env.client("strict").chat.completions.create(
            model=MODEL, messages=_chat_of(CONTEXT + 500), max_tokens=2
        )
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")
    assert f"maximum context length is {CONTEXT} tokens" in info.value.message


def test_a_prompt_beyond_the_context_is_the_same_400_under_a_loose_slo(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(
            model=MODEL,
            messages=_chat_of(CONTEXT + 500),
            max_tokens=2,
            extra_headers={"x-slo-ttft-ms": "600000"},
        )
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "messages")


def test_max_tokens_beyond_the_context_is_400(env: Env) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10**9)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "max_tokens")
    with pytest.raises(openai.BadRequestError) as info:
        env.client().chat.completions.create(
            model=MODEL, messages=CHAT, max_completion_tokens=CONTEXT
        )
    assert info.value.param == "max_completion_tokens"


def test_token_id_prompts_are_checked_exactly_at_the_boundary(env: Env) -> None:
    fits = env.client().completions.create(model=MODEL, prompt=[1] * 4000, max_tokens=96)
    assert fits.usage is not None and fits.usage.completion_tokens == 96
    with pytest.raises(openai.BadRequestError) as info:
        env.client().completions.create(model=MODEL, prompt=[1] * 4000, max_tokens=97)
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "prompt")
    assert "4097 tokens (4000 in the prompt, 97 in the completion)" in info.value.message


def test_an_estimated_overflow_is_left_to_the_engine_not_shed(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against a real engine a text prompt's count is an estimate: beyond the context by the
    estimate, the request is neither refused by the gateway nor shed as SLO-infeasible; the
    engine's tokenizer decides (here the emulated engine, taken for a real one)."""
    for backend in env.gateway.state.pool.backends:  # a real engine's card: no emulated flag
        assert backend.card is not None and backend.card.emulated
        monkeypatch.setattr(backend, "card", ModelCard(CONTEXT, False, time.monotonic()))
    with pytest.raises(openai.BadRequestError) as info:
        env.client("strict").chat.completions.create(
            model=MODEL, messages=_chat_of(CONTEXT + 500), max_tokens=2
        )
    assert info.value.code != "context_length_exceeded"  # the engine's own 400
    assert "maximum context length" in info.value.message


class FakeUpstream:
    """Answers ``get_text`` from a list (text, or an exception to raise), counting the calls."""

    def __init__(self, *answers: str | Exception) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def get_text(self, url: str, timeout_s: float) -> str:
        assert url.endswith("/v1/models")
        self.calls += 1
        await asyncio.sleep(0.01)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _group(*names: str) -> ModelGroup:
    backends = offline_backends(MODEL, *names)
    return ModelGroup(MODEL, backends, make_router("round-robin", [b.view for b in backends]))


def _models(max_model_len: int, *, emulated: bool = False, model: str = MODEL) -> str:
    card: dict[str, Any] = {"id": model, "object": "model", "max_model_len": max_model_len}
    if emulated:
        card["tiergate"] = {"emulated": True}
    return json.dumps({"object": "list", "data": [card]})


def test_a_card_gives_the_window_and_a_failed_refresh_keeps_it() -> None:
    async def scenario() -> None:
        group = _group("a")
        backend = group.backends[0]
        assert context_window(group) is None  # no card read yet: the engine decides
        fake = FakeUpstream(_models(8192), UpstreamError("down"))
        upstream = cast(Upstream, fake)
        card = await read_card(backend, upstream, 1.0)
        assert context_window(group) == ContextWindow(8192, exact=False)
        assert not card.due(card.read_at + CARD_REFRESH_S - 1)
        assert card.due(card.read_at + CARD_REFRESH_S)
        await read_card(backend, upstream, 1.0)  # the refresh fails: the known length is kept
        assert fake.calls == 2 and backend.card is not None and backend.card.max_model_len == 8192
        assert context_window(group) == ContextWindow(8192, exact=False)

    asyncio.run(scenario())


def test_a_window_needs_every_healthy_backends_card() -> None:
    async def scenario() -> None:
        group = _group("a", "b")
        fake = FakeUpstream(_models(4096, emulated=True), _models(8192, model="other"))
        upstream = cast(Upstream, fake)
        a, b = group.backends
        await read_card(a, upstream, 1.0)
        assert context_window(group) is None  # b's card is not read yet
        card = await read_card(b, upstream, 1.0)
        assert context_window(group) is None  # b serves no card for the model
        assert card.max_model_len is None and not card.due(card.read_at + 1)  # asked again later
        b.view.healthy = False  # out of routing: its window does not count
        assert context_window(group) == ContextWindow(4096, exact=True)

    asyncio.run(scenario())


WINDOW = ContextWindow(tokens=100, exact=False)


def _check(window: ContextWindow, prompts: list[int], max_tokens: int | None, exact: bool) -> bool:
    return check_context(
        window,
        prompts,
        max_tokens,
        exact_prompt=exact,
        prompt_param="prompt",
        output_param="max_tokens",
    )


def test_check_context_rules() -> None:
    assert _check(WINDOW, [90], 10, exact=True)
    assert _check(WINDOW, [99], None, exact=True)
    assert not _check(WINDOW, [95], 10, exact=False)  # an estimate: the engine decides
    for exact in (True, False):  # max_tokens alone leaves no room for any prompt
        with pytest.raises(ApiError) as info:
            _check(WINDOW, [1], 100, exact=exact)
        assert (info.value.status, info.value.code, info.value.param) == (
            400,
            "context_length_exceeded",
            "max_tokens",
        )
    with pytest.raises(ApiError):
        _check(WINDOW, [100], None, exact=True)
    with pytest.raises(ApiError):
        _check(ContextWindow(100, exact=True), [60, 95], 10, exact=False)  # each sequence counts


# ---- item 5: bounds on the CLI ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--weight", "1e308"),
        ("--weight", "1e-308"),
        ("--ttft-ms", "1e300"),
        ("--tpot-ms", "1e-320"),
        ("--deadline-ms", "inf"),
        ("--max-concurrency", "4294967296"),  # SQLite would store it; PostgreSQL's int cannot
    ],
)
def test_cli_refuses_tier_numbers_out_of_bounds(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, option: str, value: str
) -> None:
    monkeypatch.setenv("TIERGATE_DATABASE_URL", sqlite_url)
    get_settings.cache_clear()
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    spec = {"--weight": "2", "--ttft-ms": "500", "--tpot-ms": "50", option: value}
    args = ["tiers", "create", "gold", *[part for item in spec.items() for part in item]]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert "gold" not in runner.invoke(app, ["tiers", "list"]).output
    edge = ["--weight", "1024", "--ttft-ms", "0.001", "--tpot-ms", "86400000", "--rpm", "1"]
    created = runner.invoke(app, [*args[:3], *edge])
    assert created.exit_code == 0, created.output
