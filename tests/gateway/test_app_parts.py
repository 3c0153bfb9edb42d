"""The gateway app's pure parts: token-time attribution, priority mapping, SLO resolution,
metric parsing and reconciliation, tenant-label bounds, the auth cache's miss coalescing, and
the pieces shared with the emulated engine (addresses, body-error wording)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from engine_emulated import RunningEngine
from engine_emulated.mapping import weight_from_priority
from engine_emulated.schemas import ChatCompletionRequest, describe_validation_error
from gateway.app.auth import AuthCache
from gateway.app.backend_scrapes import parse_vllm_gauges
from gateway.app.backends import BackendPool, BackendSpec
from gateway.app.metrics import OTHER_TENANT, GatewayMetrics, TenantLabels
from gateway.app.schemas import ChatBody
from gateway.app.server import GatewayThread
from gateway.app.slo import engine_priority, resolve_slo
from gateway.app.upstream import Upstream
from gateway.dataplane.accounting import per_token_times
from gateway.db import crud
from gateway.db.identity import EffectivePolicy
from gateway.db.models import Base
from gateway.db.security import hash_key
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.embedded import Listening
from gateway.errors import ApiError
from gateway.settings import Settings
from priority.request import SLO, RequestMeta

times_st = st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=40).map(sorted)


@given(times=times_st, tokens=st.integers(0, 200))
def test_token_times_attribute_every_token_to_a_chunk(times: list[float], tokens: int) -> None:
    out = per_token_times(times, tokens)
    assert len(out) == tokens
    assert out == sorted(out)
    assert set(out) <= set(times)
    if tokens >= len(times):
        assert set(out) == set(times)  # every chunk carried at least one token


@given(exponent=st.integers(-10, 10))
def test_engine_priority_inverts_the_engine_weight_mapping(exponent: int) -> None:
    weight = 2.0**exponent
    assert weight_from_priority(engine_priority(weight)) == weight


def _policy(**overrides: Any) -> EffectivePolicy:
    values: dict[str, Any] = dict(
        weight=2.0,
        ttft_ms=2000.0,
        tpot_ms=100.0,
        deadline_ms=None,
        min_ttft_ms=500.0,
        min_tpot_ms=None,
        min_deadline_ms=None,
        best_effort_allowed=False,
        rpm_limit=None,
        tpm_limit=None,
        max_concurrency=None,
    )
    values.update(overrides)
    return EffectivePolicy(**values)


def test_slo_defaults_and_looser_headers_are_accepted() -> None:
    meta = resolve_slo({}, _policy(), "standard", tenant="acme", arrival_unix_s=7.0)
    expected = RequestMeta(SLO(2.0, 0.1), weight=2.0, tier="standard", tenant="acme", arrival_s=7.0)
    assert meta == expected  # the tier's SLO in seconds, its weight, who and when
    headers = {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "150", "x-slo-deadline-ms": "9000"}
    meta = resolve_slo(headers, _policy(), "standard", tenant="acme", arrival_unix_s=7.0)
    assert meta.slo == SLO(ttft_s=0.5, tpot_s=0.15, deadline_s=9.0)


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"x-slo-ttft-ms": "499"}, "minimum is 500"),
        ({"x-slo-tpot-ms": "99"}, "default (the tier sets no minimum) is 100"),
        ({"x-slo-deadline-ms": "1999"}, "x-slo-deadline-ms=1999"),
        ({"x-slo-ttft-ms": "1e12"}, "up to"),
    ],
)
def test_slo_headers_tighter_than_allowed_are_refused(headers: dict[str, str], needle: str) -> None:
    with pytest.raises(ApiError) as info:
        resolve_slo(headers, _policy(), "standard", tenant="acme", arrival_unix_s=7.0)
    assert info.value.status == 400 and needle in info.value.message


METRICS_TEXT = """\
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:kv_cache_usage_perc KV usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
"""


def test_vllm_gauges_are_summed_over_engines() -> None:
    gauges = parse_vllm_gauges(METRICS_TEXT)
    assert gauges == {
        "vllm:num_requests_running": 5.0,
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.5,
    }


def _upstream() -> Upstream:
    return Upstream(read_timeout_s=5.0, connect_timeout_s=1.0)


def test_reconcile_counts_load_the_gateway_did_not_send() -> None:
    pool = BackendPool(Settings(), _upstream(), GatewayMetrics())
    pool.configure([BackendSpec("a", "http://a:8000", "m", "a100-qwen2-7b")])
    backend = pool.backends[0]
    backend.own_decoding = 2
    pool.reconcile(backend, {"vllm:num_requests_running": 6.0, "vllm:num_requests_waiting": 1.0})
    assert backend.view.num_decoding == 2 + 5  # ours, plus 5 others' requests
    pool.reconcile(backend, {"vllm:num_requests_running": 1.0})
    assert backend.view.num_decoding == 2  # never below our own


def test_breaker_opens_after_consecutive_failures_and_closes_on_success() -> None:
    pool = BackendPool(Settings(breaker_failures=2), _upstream(), GatewayMetrics())
    pool.configure([BackendSpec("a", "http://a:8000/v1", "m", "910b-qwen2-7b")])
    backend = pool.backends[0]
    assert backend.chat_url == "http://a:8000/v1/chat/completions"
    pool.record_failure(backend)
    assert backend.view.healthy
    pool.record_failure(backend)
    assert not backend.view.healthy and not pool.ready
    pool.record_success(backend)
    assert backend.view.healthy and pool.ready


def test_tenant_labels_are_bounded() -> None:
    labels = TenantLabels(max_tenants=2)
    assert [labels(t) for t in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER_TENANT, "a", "other"]


def test_auth_cache_coalesces_concurrent_misses(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'auth.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        seed_defaults(session)
        key = crud.create_key(session, actor="t", tenant="demo", secret="s").plaintext
    cache = AuthCache(factory, "s", ttl_s=1.0)
    loads = 0
    original = cache._load

    def counting(presented: str) -> Any:
        nonlocal loads
        loads += 1
        return original(presented)

    cache._load = counting  # type: ignore[method-assign,assignment]

    async def burst() -> list[str]:
        found = await asyncio.gather(*(cache.authenticate(f"Bearer {key}") for _ in range(50)))
        return [identity.tenant_name for identity in found]

    assert asyncio.run(burst()) == ["demo"] * 50
    assert loads == 1
    cache.invalidate()
    asyncio.run(burst())
    assert loads == 2
    assert cache.flush_last_used() == 1
    engine.dispose()


@given(
    secret=st.one_of(st.text(max_size=64), st.binary(max_size=64)),
    key=st.text(st.characters(blacklist_categories=("Cs",)), max_size=80),
)
def test_auth_cache_hashes_a_key_as_the_database_stores_it(secret: str | bytes, key: str) -> None:
    # the cache's entries and the preloaded keys (by their stored hash) must meet
    cache = AuthCache(cast(Any, None), secret)
    assert cache._digest(key) == hash_key(secret, key)
    assert cache._digest(key) == hash_key(secret, key)  # the keyed state is copied, not used up


class _StepClock:
    """A monotonic clock that moves only when a test steps it (thread-safe: a float read)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _SlowAuth:
    """An auth cache on a stepped clock whose database reads after the first one are held
    until ``gate`` is set. The read itself happens first (then ``read`` is set), so a held read
    returns what the database said before."""

    engine: Any
    cache: AuthCache
    key: str
    clock: _StepClock
    read: threading.Event = field(default_factory=threading.Event)
    gate: threading.Event = field(default_factory=threading.Event)
    loads: int = 0
    finished: int = 0

    async def refreshed(self) -> None:
        """Open the gate and wait for the background refreshes to end."""
        self.gate.set()
        await asyncio.gather(*self.cache._refreshing)


def _slow_auth_cache(tmp_path: Path, ttl_s: float) -> _SlowAuth:
    engine = make_engine(f"sqlite:///{tmp_path / 'auth.db'}")
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        seed_defaults(session)
        key = crud.create_key(session, actor="t", tenant="demo", secret="s").plaintext
    clock = _StepClock()
    slow = _SlowAuth(engine, AuthCache(factory, "s", ttl_s=ttl_s, clock=clock), key, clock)
    original = slow.cache._load

    def held(presented: str) -> Any:
        slow.loads += 1
        entry = original(presented)
        if slow.loads > 1:
            slow.read.set()
            slow.gate.wait(60.0)  # a bound only so that a failed test cannot hang the run
        slow.finished += 1
        return entry

    slow.cache._load = held  # type: ignore[method-assign,assignment]
    return slow


def test_auth_cache_refreshes_a_busy_key_without_making_requests_wait(tmp_path: Path) -> None:
    slow = _slow_auth_cache(tmp_path, ttl_s=1.0)
    cache, bearer = slow.cache, f"Bearer {slow.key}"

    async def scenario() -> None:
        await cache.authenticate(bearer)  # a miss: the one read a request waits for
        slow.clock.now += 0.75  # past half the TTL, before its end
        try:
            identity = await cache.authenticate(bearer)  # a hit that starts a refresh
            assert identity.tenant_name == "demo"
            await asyncio.to_thread(slow.read.wait, 60.0)
            assert (slow.loads, slow.finished) == (2, 1)  # the refresh's read is held ...
            identity = await cache.authenticate(bearer)
            assert identity.tenant_name == "demo"
            assert slow.finished == 1  # ... and requests are served from the cache meanwhile
        finally:
            await slow.refreshed()
        slow.clock.now += 0.375  # past the first entry's TTL, before the refreshed one's half
        await cache.authenticate(bearer)
        assert (slow.loads, slow.finished) == (2, 2)  # the refresh stored its entry

    asyncio.run(scenario())
    slow.engine.dispose()


def test_auth_cache_drops_a_refresh_that_raced_an_invalidation(tmp_path: Path) -> None:
    slow = _slow_auth_cache(tmp_path, ttl_s=1.0)
    cache, bearer, prefix = slow.cache, f"Bearer {slow.key}", slow.key.split("-")[1]
    factory = make_session_factory(slow.engine)

    async def scenario() -> None:
        await cache.authenticate(bearer)
        slow.clock.now += 0.75
        try:
            await cache.authenticate(bearer)  # starts a refresh ...
            await asyncio.to_thread(slow.read.wait, 60.0)  # ... that has read "valid"
            with factory.begin() as session:
                crud.revoke_key(session, prefix, actor="t")
            cache.invalidate(prefix)
        finally:
            await slow.refreshed()  # the stale read completes now, after the invalidation
        with pytest.raises(ApiError) as refused:
            await cache.authenticate(bearer)
        assert refused.value.status == 401 and "revoked" in refused.value.message

    asyncio.run(scenario())
    slow.engine.dispose()


label_values = st.text(alphabet=st.sampled_from('ab }{"\\\n=,'), max_size=6)


@given(
    samples=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc",
                    "vllm:num_requests_running_total",
                ]
            ),
            label_values,
            st.floats(0, 1e4, allow_nan=False),
        ),
        max_size=12,
    )
)
def test_vllm_gauge_scan_agrees_with_prometheus_parser(
    samples: list[tuple[str, str, float]],
) -> None:
    """The fast line scan reads what ``prometheus_client``'s full parser reads, from text
    ``prometheus_client`` itself wrote (label values with quotes, braces and escapes)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    gauges: dict[str, Gauge] = {}
    for index, (name, label, value) in enumerate(samples):
        if name not in gauges:
            gauges[name] = Gauge(name, "h", ["engine", "model_name"], registry=registry)
        gauges[name].labels(str(index), label).set(value)
    text = generate_latest(registry).decode()
    expected: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        values = [s.value for s in family.samples if s.name == family.name]
        if family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            expected[family.name] = float(sum(values))
        elif family.name == "vllm:kv_cache_usage_perc" and values:
            expected[family.name] = max(values)
    assert parse_vllm_gauges(text) == pytest.approx(expected)


class _Served(Listening):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port


def test_served_addresses_bracket_ipv6_hosts_for_gateway_and_engines() -> None:
    assert issubclass(GatewayThread, Listening) and issubclass(RunningEngine, Listening)
    assert _Served("127.0.0.1", 8000).url == "http://127.0.0.1:8000"
    assert _Served("127.0.0.1", 8000).base_url == "http://127.0.0.1:8000/v1"
    assert _Served("::1", 9).base_url == "http://[::1]:9/v1"


def test_gateway_and_engine_word_body_errors_alike() -> None:
    body = {"model": "m", "messages": [], "max_tokens": 0}
    messages = []
    for model in (ChatBody, ChatCompletionRequest):  # lenient gateway body, strict engine body
        with pytest.raises(ValidationError) as info:
            model.model_validate(body)
        message, param = describe_validation_error(info.value)
        assert param == "max_tokens" and message.startswith("max_tokens: ")
        assert message.endswith(" (and 1 more error)")
        messages.append(message)
    assert messages[0] == messages[1]
