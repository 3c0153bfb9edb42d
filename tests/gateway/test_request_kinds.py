"""Request kinds and agent workflows through the official ``openai`` client.

Two gateways (uvicorn in threads, as two replicas) share one SQLite database and one Redis (a
fresh key prefix) in front of one emulated engine, which records the core request it builds from
each body's ``vllm_xargs`` — the same reader the vLLM plugins use. A workflow started on one
gateway is joined on the other: its state lives in Redis, not in either process.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import create_app
from gateway.app.kinds import WORKFLOW_DEADLINE_HEADER, WORKFLOW_ID_HEADER
from gateway.app.server import GatewayThread
from gateway.bounds import MIN_WEIGHT
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.request import Request as CoreRequest
from tests.gateway.engine_spy import spied_engine
from tests.gateway.seeded_app import create_agents_tier

MODEL = "qwen2-7b"
SECRET = "kinds-test-secret"
REDIS_URL = os.environ.get("TIERGATE_REDIS_URL") or "redis://127.0.0.1:6379/0"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Plan the next step."}]


def _redis_or_skip() -> None:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        reason = f"Redis unreachable at {REDIS_URL}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the shared-workflow tests must run)")
        pytest.skip(reason)


@dataclass
class Env:
    gateways: list[GatewayThread]
    keys: dict[str, str]
    factory: sessionmaker[Session]
    prefix: str
    submitted: list[CoreRequest] = field(default_factory=list)

    def client(self, tenant: str = "agents", gateway: int = 0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.gateways[gateway].base_url, api_key=self.keys[tenant], max_retries=0
        )

    def chat(self, tenant: str = "agents", gateway: int = 0, **headers: str) -> Any:
        return self.ask(tenant, 2, headers, gateway)

    def ask(self, tenant: str, max_tokens: int, headers: dict[str, str], gateway: int = 0) -> Any:
        return self.client(tenant, gateway).chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=max_tokens, extra_headers=headers
        )

    def last(self, tenant: str = "agents") -> CoreRequest:
        seen = [r for r in self.submitted if r.tenant == f"t-{tenant}"]
        assert seen, f"no request of {tenant} reached the engine"
        return seen[-1]


def _seed(factory: sessionmaker[Session]) -> dict[str, str]:
    keys = {}
    with factory.begin() as session:
        seed_defaults(session)
        create_agents_tier(session)  # workflows may be short here: a 1 ms deadline floor
        crud.create_tier(
            session,
            actor="test",
            name="nightly",
            weight=1.0,
            ttft_ms=5000.0,
            tpot_ms=200.0,
            deadline_ms=600_000.0,
            default_kind="best-effort",
        )
        crud.create_tier(  # no first token comes within 1 ms: latency requests are all shed
            session,
            actor="test",
            name="tight",
            weight=1.0,
            ttft_ms=1.0,
            tpot_ms=50.0,
            min_deadline_ms=1.0,
            best_effort_allowed=False,
        )
        tenants = (
            ("agents", "agents"),
            ("other", "agents"),
            ("nightly", "nightly"),
            ("tight", "tight"),
        )
        for tenant, tier in tenants:
            crud.create_tenant(session, actor="test", name=f"t-{tenant}", tier=tier)
            keys[tenant] = crud.create_key(
                session, actor="test", tenant=f"t-{tenant}", secret=SECRET
            ).plaintext
    return keys


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    _redis_or_skip()
    root: Path = tmp_path_factory.mktemp("kinds")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    keys = _seed(factory)
    prefix = f"tg-kinds-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=root,
        redis_url=REDIS_URL,
        redis_prefix=prefix,
        metrics_addr="127.0.0.1:0",
    )
    with (
        spied_engine(MODEL) as (backends, submitted),
        GatewayThread(create_app(settings, backends=backends)) as first,
        GatewayThread(create_app(settings, backends=backends)) as second,
    ):
        yield Env([first, second], keys, factory, prefix, submitted)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        stale = list(client.scan_iter(match=f"{prefix}:*"))
        if stale:
            client.delete(*stale)
    finally:
        client.close()
    engine.dispose()


def _workflow() -> str:
    return f"wf-{uuid.uuid4().hex[:12]}"


def _bad_request(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    return info.value


def _code(error: openai.APIStatusError) -> tuple[str | None, str | None]:
    body = error.body if isinstance(error.body, dict) else {}
    return body.get("code"), body.get("param")


# ---- single requests ---------------------------------------------------------------------------


def test_a_request_without_kind_headers_is_a_latency_request(env: Env) -> None:
    env.chat()
    seen = env.last()
    assert (seen.kind, seen.workflow_id, seen.stage) == ("latency", None, 0)
    assert seen.slo.ttft_s == pytest.approx(0.5) and seen.slo.deadline_s is None


def test_a_deadline_header_makes_a_deadline_request(env: Env) -> None:
    env.chat(**{"x-slo-deadline-ms": "9000"})
    seen = env.last()
    assert seen.kind == "deadline" and seen.slo.deadline_s == pytest.approx(9.0)


def test_a_tiers_default_kind_and_deadline_reach_the_engine(env: Env) -> None:
    env.chat("nightly")
    seen = env.last("nightly")
    assert seen.kind == "best-effort" and seen.slo.deadline_s == pytest.approx(600.0)
    env.chat("nightly", **{"x-slo-deadline-ms": "700000"})
    assert env.last("nightly").kind == "deadline"  # the header wins over the tier's default


# ---- admission: a deadline is judged by the finish, not the tier's TTFT ------------------------


def _refused(call: Any) -> openai.InternalServerError:
    with pytest.raises(openai.InternalServerError) as info:
        call()
    assert info.value.status_code == 503
    return info.value


def test_a_latency_request_is_still_shed_on_its_tiers_ttft(env: Env) -> None:
    error = _refused(lambda: env.chat("tight"))
    assert _code(error)[0] == "slo_infeasible" and "first token" in error.message
    assert error.response.headers["x-tiergate-reject-reason"] == "slo_infeasible"


def test_a_deadline_request_that_can_finish_in_time_is_admitted_despite_the_ttft(
    env: Env,
) -> None:
    env.ask("tight", 2, {"x-slo-deadline-ms": "60000"})  # the 1 ms TTFT would shed it
    seen = env.last("tight")
    assert seen.kind == "deadline" and seen.slo.deadline_s == pytest.approx(60.0)
    workflow = {WORKFLOW_ID_HEADER: _workflow(), WORKFLOW_DEADLINE_HEADER: "60000"}
    env.ask("tight", 2, workflow)  # a workflow call: judged by the workflow's deadline
    assert env.last("tight").kind == "compound"


def test_a_deadline_request_that_cannot_finish_in_time_is_refused_in_the_dialect(
    env: Env,
) -> None:
    # 1,000 tokens take ~11 s of decode steps on this profile even alone: 2 s cannot be met
    before = len(env.submitted)
    error = _refused(lambda: env.ask("tight", 1000, {"x-slo-deadline-ms": "2000"}))
    assert _code(error) == ("slo_infeasible", None)
    assert isinstance(error.body, dict) and error.body["type"]  # the OpenAI error shape
    assert "last token by its deadline" in error.message and "2000 ms" in error.message
    assert error.response.headers["x-tiergate-reject-reason"] == "slo_infeasible"
    assert "retry-after" not in error.response.headers  # even an idle backend is too slow
    assert len(env.submitted) == before  # refused at admission: the engine never saw it


def test_a_deadline_no_one_can_meet_on_a_best_effort_tier_is_demoted_and_served(
    env: Env,
) -> None:
    """Demoted at admission, it has given its deadline up: it waits for a best-effort slot like
    any best-effort request, not just until its (already missed) deadline — that was a 503
    ``queue_ttl`` 1 ms later (found by the fuzzer)."""
    env.chat("agents")  # a prefill just now: best effort waits for the backend to rest
    env.ask("agents", 100, {"x-slo-deadline-ms": "1.1"})  # 100 decode steps take ~1 s alone
    seen = env.last("agents")
    # the engine is told what the gateway decided: best effort, its lost deadline withheld (a
    # deadline-aware policy would otherwise drop it as hopeless), at the lowest weight
    assert seen.kind == "best-effort" and seen.slo.deadline_s is None
    assert seen.weight == pytest.approx(MIN_WEIGHT)


# ---- workflows ---------------------------------------------------------------------------------


def test_a_workflow_is_inherited_across_calls_and_gateways(env: Env) -> None:
    workflow = _workflow()
    env.chat(**{WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "120000"})
    first = env.last()
    assert (first.kind, first.workflow_id, first.stage) == ("compound", workflow, 0)
    assert 0 < first.slo.deadline_s <= 120.0  # the cold start: the time left, all of it
    env.chat(gateway=1, **{WORKFLOW_ID_HEADER: workflow})  # the other replica: Redis has it
    second = env.last()
    assert (second.kind, second.workflow_id, second.stage) == ("compound", workflow, 1)
    assert second.slo.deadline_s <= first.slo.deadline_s  # the same deadline, less time left
    # a later deadline header does not move the workflow's deadline
    env.chat(**{WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "900000"})
    third = env.last()
    assert third.stage == 2 and third.slo.deadline_s <= second.slo.deadline_s


def test_a_calls_own_deadline_caps_its_share(env: Env) -> None:
    workflow = _workflow()
    headers = {WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "300000"}
    env.chat(**headers, **{"x-slo-deadline-ms": "20000"})
    seen = env.last()
    assert seen.kind == "compound" and seen.slo.deadline_s == pytest.approx(20.0)


def test_an_unknown_workflow_is_a_clear_400_not_a_new_workflow(env: Env) -> None:
    workflow = _workflow()
    error = _bad_request(lambda: env.chat(**{WORKFLOW_ID_HEADER: workflow}))
    assert _code(error) == ("unknown_workflow", WORKFLOW_ID_HEADER)
    assert workflow in error.message and WORKFLOW_DEADLINE_HEADER in error.message
    again = _bad_request(lambda: env.chat(gateway=1, **{WORKFLOW_ID_HEADER: workflow}))
    assert _code(again)[0] == "unknown_workflow"  # the refusal created nothing


def test_workflows_are_per_tenant(env: Env) -> None:
    workflow = _workflow()
    env.chat(**{WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "60000"})
    error = _bad_request(lambda: env.chat("other", **{WORKFLOW_ID_HEADER: workflow}))
    assert _code(error)[0] == "unknown_workflow"


def test_an_expired_workflow_is_409(env: Env) -> None:
    workflow = _workflow()
    headers = {WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "200"}
    try:  # served or shed (200 ms is tight): either way the workflow now exists
        env.chat(**headers)
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, exc
    time.sleep(0.3)  # past the workflow's deadline (waiting, not a timed assertion)
    with pytest.raises(openai.ConflictError) as info:
        env.chat(gateway=1, **{WORKFLOW_ID_HEADER: workflow})
    assert _code(info.value) == ("workflow_expired", WORKFLOW_ID_HEADER)
    assert "expired" in info.value.message


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({WORKFLOW_ID_HEADER: "has space"}, WORKFLOW_ID_HEADER),
        ({WORKFLOW_ID_HEADER: "x" * 129}, WORKFLOW_ID_HEADER),
        ({WORKFLOW_ID_HEADER: "{tag}"}, WORKFLOW_ID_HEADER),
        ({WORKFLOW_ID_HEADER: "ok", WORKFLOW_DEADLINE_HEADER: "soon"}, WORKFLOW_DEADLINE_HEADER),
        ({WORKFLOW_ID_HEADER: "ok", WORKFLOW_DEADLINE_HEADER: "0"}, WORKFLOW_DEADLINE_HEADER),
        ({WORKFLOW_ID_HEADER: "ok", WORKFLOW_DEADLINE_HEADER: "nan"}, WORKFLOW_DEADLINE_HEADER),
        ({WORKFLOW_ID_HEADER: "ok", WORKFLOW_DEADLINE_HEADER: "1e12"}, WORKFLOW_DEADLINE_HEADER),
        ({WORKFLOW_DEADLINE_HEADER: "60000"}, WORKFLOW_DEADLINE_HEADER),  # no id to name
    ],
)
def test_bad_workflow_headers_are_400_invalid_value(
    env: Env, headers: dict[str, str], param: str
) -> None:
    error = _bad_request(lambda: env.chat(**headers))
    assert _code(error) == ("invalid_value", param)
    assert param in error.message


def test_a_workflow_deadline_tighter_than_the_tier_allows_is_400(env: Env) -> None:
    # the nightly tier sets no minimum: its 600 s default deadline is the floor
    headers = {WORKFLOW_ID_HEADER: _workflow(), WORKFLOW_DEADLINE_HEADER: "60000"}
    error = _bad_request(lambda: env.chat("nightly", **headers))
    assert _code(error)[1] == WORKFLOW_DEADLINE_HEADER and "nightly" in error.message


# ---- the length distribution (TIERGATE_LENGTH_MODEL) -------------------------------------------


@pytest.fixture(scope="module")
def length_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One gateway (no Redis) with a small trained length model, in front of one engine."""
    from priority.lengths.features import RequestFeatures
    from priority.lengths.model import ForestParams, LengthPredictor

    root: Path = tmp_path_factory.mktemp("lengths")
    words = ("list", "explain", "summarise", "name", "describe")
    requests = [
        RequestFeatures(prompt=f"{words[i % 5]} item {i}", model=MODEL, max_tokens=64)
        for i in range(60)
    ]
    lengths = [8 + 6 * (i % 5) for i in range(60)]
    params = ForestParams(n_estimators=5, min_samples_leaf=3)
    LengthPredictor.fit(requests, lengths, params=params).save(root / "model")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    keys = _seed(factory)
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=root,
        redis_url=None,
        metrics_addr="127.0.0.1:0",
        length_model=root / "model",
        length_budget_ms=1000.0,  # a loaded test machine: the point is the wiring, not speed
    )
    with (
        spied_engine(MODEL) as (backends, submitted),
        GatewayThread(create_app(settings, backends=backends)) as gateway,
    ):
        yield Env([gateway], keys, factory, "", submitted)
    engine.dispose()


def test_a_loaded_length_model_sends_each_request_its_distribution(length_env: Env) -> None:
    length_env.chat()  # max_tokens=2: the distribution is capped by it
    seen = length_env.last()
    assert seen.length is not None and seen.length.max_tokens == 2
    assert seen.length.bound(0.95) <= 2
    assert list(seen.length.levels) == sorted(seen.length.levels)  # what the model predicted
