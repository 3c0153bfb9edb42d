"""Gain, attainment and usage accounting: only work an engine accepted is accounted.

The pure rules (:mod:`gateway.app.accounting`) as properties over any sequence of accepted,
rejected, cancelled and failed requests — through the metrics and through the usage report — and
end to end: a request with an absurd ``max_tokens``, refused, leaves its tier's gain and usage
as they were.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageParam
from pydantic import SecretStr
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from engine_emulated import EngineSpec, EngineThread
from gateway.app import BackendSpec, create_app
from gateway.app.accounting import NOTHING, Account, Outcome, account, record_gain
from gateway.app.metrics import GatewayMetrics
from gateway.app.server import GatewayThread
from gateway.bounds import MAX_OUTPUT_TOKENS, MAX_SLO_MS, MAX_WEIGHT, MIN_SLO_MS, MIN_WEIGHT
from gateway.db import crud, migrate
from gateway.db.crud.usage import UsageSummary
from gateway.db.models import Base, UsageRecord
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.db.usage import UsageEvent, UsageWriter
from gateway.settings import Settings
from priority.gain import GainWeights, ideal_tdg, slo_attained, tdg
from priority.request import SLO

MODEL = "qwen2-7b"
SECRET = "accounting-test-secret"
TIER = "standard"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
ARRIVAL = 1_000.0


# ---- the rules, as properties over any sequence of ended requests ----------------------------


@dataclass(frozen=True)
class Ended:
    """What the proxy knows of a request when it ends (the inputs of :func:`account`)."""

    outcome: Outcome
    accepted: bool
    weight: float
    slo: SLO
    budget: int
    prompt: int
    offsets: list[float] = field(default_factory=list)
    """Egress times of the delivered tokens, in seconds after arrival."""

    def account(self, weights: GainWeights) -> Account:
        return account(
            self.outcome,
            accepted=self.accepted,
            arrival_s=ARRIVAL,
            slo=self.slo,
            weight=self.weight,
            token_times=self.token_times,
            output_budget=self.budget,
            prompt_tokens=self.prompt,
            weights=weights,
        )

    @property
    def token_times(self) -> list[float]:
        return [ARRIVAL + t for t in self.offsets]

    @property
    def counts(self) -> bool:
        """Work an engine accepted (a rejection never is, whatever the flag says)."""
        return self.accepted and self.outcome is not Outcome.REJECTED


slo_ms = st.floats(MIN_SLO_MS, MAX_SLO_MS)
slos = st.one_of(
    st.builds(lambda t, p: SLO(ttft_s=t / 1e3, tpot_s=p / 1e3), slo_ms, slo_ms),
    st.builds(lambda d: SLO(deadline_s=d / 1e3), slo_ms),
    st.builds(lambda t, p, d: SLO(t / 1e3, p / 1e3, d / 1e3), slo_ms, slo_ms, slo_ms),
)
ended = st.builds(
    Ended,
    outcome=st.sampled_from(Outcome),
    accepted=st.booleans(),
    weight=st.floats(MIN_WEIGHT, MAX_WEIGHT),
    slo=slos,
    budget=st.integers(1, MAX_OUTPUT_TOKENS),
    prompt=st.integers(1, 1_000_000),
    offsets=st.lists(st.floats(0.0, 1e5), max_size=24).map(sorted),
)
gain_weights = st.builds(GainWeights, st.floats(1e-2, 1e2), st.floats(1e-2, 1e2))


@given(e=ended, weights=gain_weights)
def test_a_request_is_accounted_by_its_outcome(e: Ended, weights: GainWeights) -> None:
    got = e.account(weights)
    if not e.counts:  # refused, or no engine took it: counted by outcome, nothing else
        assert got == NOTHING
        return
    delivered = len(e.offsets)
    assert got.accepted and (got.prompt_tokens, got.completion_tokens) == (e.prompt, delivered)
    assert math.isfinite(got.ideal_gain) and 0.0 <= got.gain <= got.ideal_gain
    assert got.gain == (tdg(ARRIVAL, e.slo, e.weight, e.token_times, weights) if delivered else 0)
    # the ideal: what it got if it finished or its client left, its budget if it failed
    accounted = max(delivered, e.budget) if e.outcome is Outcome.FAILED else delivered
    assert got.ideal_gain == ideal_tdg(e.weight, accounted, weights)
    if e.outcome is Outcome.OK:  # the only attainment sample
        assert got.slo_met == slo_attained(ARRIVAL, e.slo, e.token_times)
    else:
        assert got.slo_met is None


def _metric_totals(requests: Sequence[Ended], weights: GainWeights) -> tuple[float, ...]:
    """The tier's gain, ideal gain and attainment samples after ``requests`` were recorded."""
    metrics = GatewayMetrics()
    for e in requests:
        record_gain(metrics, TIER, e.account(weights))

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"tier": TIER, **labels}) or 0.0

    return (
        value("tiergate_gain_total"),
        value("tiergate_ideal_gain_total"),
        value("tiergate_slo_requests_total", attained="true"),
        value("tiergate_slo_requests_total", attained="false"),
    )


@given(requests=st.lists(ended, max_size=30), weights=gain_weights)
def test_gain_totals_are_finite_sums_of_per_request_gains(
    requests: list[Ended], weights: GainWeights
) -> None:
    accounts = [e.account(weights) for e in requests]
    gain, ideal, met, missed = _metric_totals(requests, weights)
    assert math.isfinite(gain) and math.isfinite(ideal)
    assert gain == pytest.approx(math.fsum(a.gain for a in accounts), rel=1e-9)
    assert ideal == pytest.approx(math.fsum(a.ideal_gain for a in accounts), rel=1e-9)
    assert 0.0 <= gain <= ideal * (1 + 1e-9)
    finished = [
        a for e, a in zip(requests, accounts, strict=True) if e.counts and e.outcome is Outcome.OK
    ]
    assert (met, missed) == (
        sum(a.slo_met is True for a in finished),
        sum(a.slo_met is False for a in finished),
    )
    # rejected, never-accepted requests leave the totals exactly as they would be without them
    assert _metric_totals([e for e in requests if e.counts], weights) == (gain, ideal, met, missed)


@given(
    e=ended,
    weight=st.floats(allow_nan=True, allow_infinity=True),
    budget=st.integers(min_value=-(10**40), max_value=10**40),
    prompt=st.integers(min_value=-(10**40), max_value=10**40),
)
def test_any_input_gives_a_finite_storable_account(
    e: Ended, weight: float, budget: int, prompt: int
) -> None:
    """Bounds are enforced where values enter; the accounting holds without them too, and its
    result is always a usage record the table takes."""
    got = Ended(e.outcome, e.accepted, weight, e.slo, budget, prompt, e.offsets).account(
        GainWeights()
    )
    assert 0.0 <= got.gain < math.inf and 0.0 <= got.ideal_gain < math.inf
    UsageEvent(request_id="r", status=e.outcome.value, **got.usage_fields())


@pytest.mark.parametrize(
    "values",
    [
        {"ideal_gain": math.inf},
        {"gain": math.nan},
        {"gain": -1.0},
        {"prompt_tokens": -1},
        {"completion_tokens": 2**31},
    ],
)
def test_a_usage_record_refuses_what_would_poison_the_sums(values: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(values))):
        UsageEvent(request_id="r", status="ok", **values)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def usage_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('usage') / 'usage.db'}")
    Base.metadata.create_all(engine)
    yield make_session_factory(engine)
    engine.dispose()


@settings(max_examples=40, deadline=None)
@given(requests=st.lists(ended, max_size=20), weights=gain_weights)
def test_the_usage_report_keeps_each_outcome_apart(
    usage_db: sessionmaker[Session], requests: list[Ended], weights: GainWeights
) -> None:
    """Through the usage writer and the report: tokens and attainment of finished requests,
    cancelled and failed work apart, refused work in no total but its count."""
    with usage_db.begin() as session:
        session.execute(delete(UsageRecord))
    accounts = [e.account(weights) for e in requests]
    with UsageWriter(usage_db, flush_interval_s=0.01) as writer:
        for i, (e, a) in enumerate(zip(requests, accounts, strict=True)):
            writer.submit(
                UsageEvent(
                    request_id=f"r{i}", status=e.outcome.value, tier=TIER, **a.usage_fields()
                )
            )
    with usage_db() as session:
        report = crud.usage_by_tier(session, tier=TIER)
    if not requests:
        assert report == []
        return
    (u,) = report

    def of(outcome: Outcome) -> list[Account]:
        return [a for e, a in zip(requests, accounts, strict=True) if e.outcome is outcome]

    ok = of(Outcome.OK)
    assert (u.requests, u.ok, u.errors, u.rejected, u.cancelled) == (
        len(requests),
        len(ok),
        len(of(Outcome.FAILED)),
        len(of(Outcome.REJECTED)),
        len(of(Outcome.CANCELLED)),
    )
    assert (u.prompt_tokens, u.completion_tokens) == (
        sum(a.prompt_tokens for a in ok),
        sum(a.completion_tokens for a in ok),
    )
    assert u.cancelled_tokens == sum(a.total_tokens for a in of(Outcome.CANCELLED))
    assert u.failed_tokens == sum(a.total_tokens for a in of(Outcome.FAILED))
    assert all(a == NOTHING for a in of(Outcome.REJECTED))
    assert u.slo_met == sum(a.slo_met is True for a in ok)
    assert u.slo_attainment == (u.slo_met / len(ok) if ok else None)
    assert math.isfinite(u.gain) and math.isfinite(u.ideal_gain)
    assert u.gain == pytest.approx(math.fsum(a.gain for a in accounts), rel=1e-9)
    assert u.ideal_gain == pytest.approx(math.fsum(a.ideal_gain for a in accounts), rel=1e-9)


# ---- end to end: the official client against the app and an emulated engine ------------------


@dataclass
class Env:
    gateway: GatewayThread
    factory: sessionmaker[Session]
    key: str
    limited_key: str  # a tenant of the same tier allowed 1 request a minute

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.base_url, api_key=key or self.key, max_retries=0)

    def gain_metrics(self) -> tuple[float, float, float, float]:
        """The tier's gain, ideal gain and attainment samples (met, missed) in ``/metrics``."""
        registry = self.gateway.state.metrics.registry

        def value(name: str, **labels: str) -> float:
            return registry.get_sample_value(name, {"tier": TIER, **labels}) or 0.0

        return (
            value("tiergate_gain_total"),
            value("tiergate_ideal_gain_total"),
            value("tiergate_slo_requests_total", attained="true"),
            value("tiergate_slo_requests_total", attained="false"),
        )

    def usage(self) -> UsageSummary:
        assert self.gateway.state.usage_writer.flush(timeout=10)
        with self.factory() as session:
            (summary,) = crud.usage_by_tier(session, tier=TIER)
        return summary


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    root: Path = tmp_path_factory.mktemp("gateway-accounting")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        seed_defaults(session)
        crud.create_tenant(session, actor="test", name="t-acct", tier=TIER)
        key = crud.create_key(session, actor="test", tenant="t-acct", secret=SECRET).plaintext
        crud.create_tenant(session, actor="test", name="t-limited", tier=TIER, rpm_limit=1)
        limited = crud.create_key(session, actor="test", tenant="t-limited", secret=SECRET)
    settings = Settings(database_url=url, secret=SecretStr(SECRET), data_dir=root, redis_url=None)
    with EngineThread([EngineSpec("a100-qwen2-7b", "vllm-v1-priority", MODEL)]) as engines:
        backends = [BackendSpec("engine-0", e.url, MODEL, e.spec.profile) for e in engines]
        with GatewayThread(create_app(settings, backends=backends)) as gateway:
            yield Env(gateway, factory, key, limited.plaintext)
    engine.dispose()


def test_absurd_max_tokens_is_refused_and_leaves_gain_and_usage_unchanged(env: Env) -> None:
    client = env.client()
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    metrics, usage = env.gain_metrics(), env.usage()
    assert metrics[1] > 0 and usage.ideal_gain > 0 and usage.tdg_ratio is not None

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10**12)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10**15, stream=True)

    assert env.gain_metrics() == metrics  # gain, ideal gain and attainment samples
    after = env.usage()
    assert (after.requests, after.rejected) == (usage.requests + 2, usage.rejected + 2)
    for name in ("ok", "errors", "cancelled", "prompt_tokens", "completion_tokens", "slo_met"):
        assert getattr(after, name) == getattr(usage, name), name
    assert (after.gain, after.ideal_gain) == (usage.gain, usage.ideal_gain)
    assert (after.tdg_ratio, after.slo_attainment) == (usage.tdg_ratio, usage.slo_attainment)


def test_a_tenants_own_429s_are_neither_usage_nor_slo_misses(env: Env) -> None:
    client = env.client(env.limited_key)
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    assert reply.usage is not None
    for _ in range(2):
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    assert env.gateway.state.usage_writer.flush(timeout=10)
    with env.factory() as session:
        (usage,) = crud.usage_by_tenant(session, tenant="t-limited")
    assert (usage.requests, usage.ok, usage.rejected) == (3, 1, 2)
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    assert usage.slo_attainment == usage.slo_met / 1  # the one answered request is the sample


# ---- history: revision 0004 brings rows recorded before these rules in line -----------------


def test_revision_0004_repairs_usage_recorded_before_it(db_url: str) -> None:
    migrate.upgrade(db_url, "0003")
    table = UsageRecord.metadata.tables[UsageRecord.__tablename__]
    old = [c for c in table.c if c.name != "cost"]  # the columns before 0013
    columns = ("status", "reject_reason", "ttft_ms", "prompt_tokens", "completion_tokens")
    rows = {  # as the gateway recorded them before: ... + (gain, ideal_gain)
        "ok": ("ok", None, 120.0, 11, 4, 3.0, 4.0),
        "engine-4xx": ("error", "upstream_rejected", None, 11, 0, 0.0, 2e15),
        "429": ("rejected", "rate_limit_rpm", None, 11, 0, 0.0, 4.0),
        "gone-while-queued": ("cancelled", None, None, 11, 0, 0.0, 8.0),
        "broken-stream": ("error", None, 150.0, 11, 2, 2.0, 5.0),
        "left-mid-stream": ("cancelled", None, 90.0, 11, 3, 3.0, 3.0),
    }
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                table.insert(),
                [
                    {
                        "request_id": rid,
                        "tier": TIER,
                        "slo_met": rid == "ok",
                        **dict(zip((*columns, "gain", "ideal_gain"), values, strict=True)),
                    }
                    for rid, values in rows.items()
                ],
            )
        migrate.upgrade(db_url, "0004")
        with engine.connect() as conn:
            got = {r.request_id: r for r in conn.execute(select(*old))}
        migrate.upgrade(db_url)  # the summaries read today's schema
        with make_session_factory(engine)() as session:
            (usage,) = crud.usage_by_tier(session, tier=TIER)
        migrate.downgrade("0003", db_url)  # keeps the repaired rows
        with engine.connect() as conn:
            assert {r.request_id: r for r in conn.execute(select(*old))} == got
    finally:
        engine.dispose()

    def values(rid: str) -> tuple[object, ...]:
        r = got[rid]
        return (r.status, r.prompt_tokens, r.completion_tokens, r.gain, r.ideal_gain)

    for rid in ("ok", "broken-stream", "left-mid-stream"):  # accepted work: untouched
        status, _, _, p, c, gain, ideal = rows[rid]
        assert values(rid) == (status, p, c, gain, ideal)
    assert values("engine-4xx") == ("rejected", 0, 0, 0.0, 0.0)
    assert got["engine-4xx"].reject_reason == "upstream_rejected"
    assert values("429") == ("rejected", 0, 0, 0.0, 0.0)
    assert values("gone-while-queued") == ("cancelled", 0, 0, 0.0, 0.0)
    assert (usage.requests, usage.ok, usage.rejected, usage.errors, usage.cancelled) == (
        6,
        1,
        2,
        1,
        2,
    )
    assert usage.tdg_ratio == pytest.approx((3.0 + 2.0 + 3.0) / (4.0 + 5.0 + 3.0))
    assert usage.slo_attainment == 1.0
