"""Emulated engine: OpenAI API over real uvicorn servers, vLLM metrics, scheduling, aborts.

Servers run in a background thread (``EngineThread``); clients are the official ``openai``
package and ``httpx``. Timing facts are asserted on the engine's own (emulated) timeline or as
orderings, never as wall-clock bounds beyond "not faster than the profile".
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import httpx
import numpy as np
import openai
import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine_emulated import EngineSpec, EngineThread, RunningEngine
from engine_emulated.cli import engine_sim_command
from engine_emulated.filler import filler_text
from engine_emulated.loop import WallClockEngine
from engine_emulated.mapping import (
    OutputLengthSampler,
    RequestMappingError,
    build_request,
    plan_output,
    read_meta,
    trace_output_lengths,
    weight_from_priority,
)
from gateway.tokens import count_chat_tokens, count_text_tokens
from priority.estimator import LatencyCoefficients
from priority.policies import SchedulerInput, SchedulingPolicy, StepPlan, make_policy
from priority.profiles import EngineConfig, Profile
from priority.request import SLO, Request, RequestMeta
from priority.sim.engine import EngineCore

WAIT_S = 10.0


def tiny_profile(*, max_num_seqs: int = 256, num_kv_blocks: int = 512) -> Profile:
    """An 8 ms decode step, cheap prefill: fast tests with real batching and limits."""
    return Profile(
        name="test-tiny",
        hardware="test",
        model="tiny",
        tensor_parallel=1,
        coefficients=LatencyCoefficients(a_p=0.0, b_p=0.0, c_p=1e-5, a_d=1e-7, b_d=1e-4, t_c=0.008),
        engine=EngineConfig(
            block_size=16,
            num_kv_blocks=num_kv_blocks,
            max_num_batched_tokens=2048,
            max_num_seqs=max_num_seqs,
        ),
    )


SPECS = {
    "main": EngineSpec("a100-qwen2-7b", "slide", "qwen-test", max_model_len=4096),
    "burst": EngineSpec(tiny_profile(max_num_seqs=2), "vllm-v1-priority", "burst"),
    "slide": EngineSpec(
        tiny_profile(max_num_seqs=2),
        "slide",
        "slide",
        policy_params={"starvation_prevention": False},
    ),
    "abort": EngineSpec(tiny_profile(), "vllm-v1-priority", "abort"),
    "load": EngineSpec(tiny_profile(num_kv_blocks=4096), "slide", "load"),
    "fast": EngineSpec(tiny_profile(), "slide", "fast", time_scale=25.0),
}


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, RunningEngine]]:
    with EngineThread(list(SPECS.values())) as running:
        yield dict(zip(SPECS, running, strict=True))


@pytest.fixture(scope="module")
def main(engines: dict[str, RunningEngine]) -> RunningEngine:
    return engines["main"]


def client(engine: RunningEngine) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0)


def scrape(engine: RunningEngine) -> dict[str, float]:
    """``/metrics`` as ``{"name{labels}": value}``."""
    text = httpx.get(f"{engine.url}/metrics").text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def wait_until(check: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def idle(engine: RunningEngine) -> bool:
    samples = scrape(engine)
    return (
        metric(samples, "vllm:kv_cache_usage_perc") == 0.0
        and metric(samples, "vllm:num_requests_running") == 0.0
        and metric(samples, "vllm:num_requests_waiting") == 0.0
    )


# ---- OpenAI API --------------------------------------------------------------------------


def test_chat_non_streaming_reports_usage_and_filler(main: RunningEngine) -> None:
    content = "Tell me about tiered serving, please."
    reply = client(main).chat.completions.create(
        model="qwen-test",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        max_tokens=17,
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 17
    assert reply.usage.prompt_tokens == count_chat_tokens(["Be brief.", content])
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 17
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == filler_text(0, 17)
    assert choice.finish_reason == "length"
    assert reply.model == "qwen-test"
    assert reply.id.startswith("chatcmpl-")


def test_chat_streaming_deltas_usage_and_done(main: RunningEngine) -> None:
    stream = client(main).chat.completions.create(
        model="qwen-test",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=23,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content_chunks = [c for c in chunks if c.choices]
    assert content_chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in content_chunks[1:])
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == filler_text(0, 23)
    finishes = [c.choices[0].finish_reason for c in content_chunks]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 23
    assert usage_chunk.usage.prompt_tokens == count_chat_tokens(["hi"])


def test_sse_wire_format_ends_with_done(main: RunningEngine) -> None:
    body = {"model": "qwen-test", "prompt": "abc", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{main.base_url}/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert "usage" not in events[-2]  # no include_usage, no usage chunk


def test_completions_streaming_and_not(main: RunningEngine) -> None:
    c = client(main)
    prompt = "x" * 41
    full = c.completions.create(model="qwen-test", prompt=prompt, max_tokens=9)
    assert full.choices[0].text == filler_text(0, 9)
    assert full.usage is not None
    assert (full.usage.prompt_tokens, full.usage.completion_tokens) == (11, 9)
    assert full.object == "text_completion"

    chunks = list(
        c.completions.create(
            model="qwen-test",
            prompt=[1, 2, 3, 4, 5],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == filler_text(0, 12)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == 5  # token ids count as themselves


def test_length_without_max_tokens_is_drawn_from_the_trace(
    engines: dict[str, RunningEngine],
) -> None:
    lengths = set(trace_output_lengths().tolist())
    c = client(engines["fast"])  # time scale 25: a few hundred tokens in a fraction of a second
    for _ in range(3):
        reply = c.completions.create(model="fast", prompt="tell me a story")
        assert reply.usage is not None
        assert reply.usage.completion_tokens in lengths
        assert reply.choices[0].finish_reason == "stop"
        assert reply.choices[0].text == filler_text(0, reply.usage.completion_tokens)


def test_models_card_says_emulated(main: RunningEngine) -> None:
    models = client(main).models.list().data
    assert [m.id for m in models] == ["qwen-test"]
    card: dict[str, Any] = httpx.get(f"{main.base_url}/models").json()["data"][0]
    assert card["max_model_len"] == 4096
    assert card["tiergate"]["emulated"] is True
    assert card["tiergate"]["profile"] == "a100-qwen2-7b"
    assert card["tiergate"]["policy"] == "slide"
    assert "filler" in card["tiergate"]["note"]
    assert httpx.get(f"{main.url}/health").status_code == 200


def test_engines_side_by_side_get_their_own_ports(engines: dict[str, RunningEngine]) -> None:
    spec = EngineSpec(tiny_profile(), "vllm-v0-fcfs", "qwen-test")  # the same model name as "main"
    with EngineThread([spec, spec]) as more:
        ports = {e.port for e in [*engines.values(), *more]}
        assert len(ports) == len(engines) + 2
        for engine in more:
            reply = client(engine).completions.create(model="qwen-test", prompt="p", max_tokens=2)
            assert reply.usage is not None and reply.usage.completion_tokens == 2
            assert (
                httpx.get(f"{engine.base_url}/models").json()["data"][0]["tiergate"]["policy"]
                == "vllm-v0-fcfs"
            )


# ---- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "qwen-test"}, "messages"),
        ({"model": "qwen-test", "messages": []}, "messages"),
        (
            {"model": "qwen-test", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
        ),
        (
            {"model": "qwen-test", "messages": [{"role": "robot", "content": "x"}]},
            "messages.0.role",
        ),
        ({"model": "qwen-test", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        (
            {
                "model": "qwen-test",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 5000,
            },
            "max_tokens",
        ),  # beyond max_model_len 4096
        (
            {"model": "qwen-test", "messages": [{"role": "user", "content": "x"}], "priority": 1.5},
            "priority",
        ),  # vLLM's API server checks the types of these two
        (
            {
                "model": "qwen-test",
                "messages": [{"role": "user", "content": "x"}],
                "vllm_xargs": {"tiergate_tier": None},
            },
            "vllm_xargs.tiergate_tier.str",
        ),
    ],
)
def test_bad_chat_body_is_openai_400(main: RunningEngine, body: dict[str, Any], param: str) -> None:
    response = httpx.post(f"{main.base_url}/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param
    assert error["message"]


def test_invalid_json_and_batched_prompt_are_400(main: RunningEngine) -> None:
    bad = httpx.post(
        f"{main.base_url}/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
    batch = httpx.post(
        f"{main.base_url}/completions", json={"model": "qwen-test", "prompt": ["a", "b"]}
    )
    assert batch.status_code == 400 and batch.json()["error"]["param"] == "prompt"
    with pytest.raises(openai.BadRequestError):
        client(main).completions.create(model="qwen-test", prompt="x" * 20000, max_tokens=1)


def test_unknown_model_is_404(main: RunningEngine) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client(main).chat.completions.create(
            model="gpt-nope", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.status_code == 404
    body = httpx.post(
        f"{main.base_url}/completions", json={"model": "gpt-nope", "prompt": "x"}
    ).json()
    assert body["error"]["type"] == "NotFoundError" and body["error"]["param"] == "model"


# ---- metrics -----------------------------------------------------------------------------


VLLM_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_count",
    "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:request_queue_time_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
)


def test_metrics_gauges_and_counters_move_in_a_burst(engines: dict[str, RunningEngine]) -> None:
    engine = engines["burst"]  # max_num_seqs = 2: a burst of 8 must queue
    before = scrape(engine)
    for name in VLLM_NAMES:
        assert any(k.startswith(name) and 'model_name="burst"' in k for k in before), name
    n, tokens = 8, 30
    seen: dict[str, float] = {"running": 0.0, "waiting": 0.0, "kv": 0.0}

    async def burst() -> None:
        async with openai.AsyncOpenAI(base_url=engine.base_url, api_key="x") as c:
            calls = [
                c.completions.create(model="burst", prompt="y" * 40, max_tokens=tokens)
                for _ in range(n)
            ]
            done = asyncio.gather(*calls)
            while not done.done():
                samples = await asyncio.to_thread(scrape, engine)
                seen["running"] = max(seen["running"], metric(samples, "vllm:num_requests_running"))
                seen["waiting"] = max(seen["waiting"], metric(samples, "vllm:num_requests_waiting"))
                seen["kv"] = max(seen["kv"], metric(samples, "vllm:kv_cache_usage_perc"))
                await asyncio.sleep(0.01)
            await done

    asyncio.run(burst())
    assert seen["running"] == 2.0  # the engine's max_num_seqs
    assert seen["waiting"] > 0
    assert 0 < seen["kv"] <= 1.0
    after = scrape(engine)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == n
    assert delta("vllm:generation_tokens_total") == n * tokens
    assert delta("vllm:prompt_tokens_total") == n * count_text_tokens("y" * 40)
    assert delta("vllm:time_to_first_token_seconds_count") == n
    assert delta("vllm:request_queue_time_seconds_count") == n
    assert delta("vllm:e2e_request_latency_seconds_count") == n
    assert delta("vllm:inter_token_latency_seconds_count") == n * (tokens - 1)
    assert wait_until(lambda: idle(engine))


# ---- scheduling --------------------------------------------------------------------------


def _first_token_order(
    engine: RunningEngine, high: dict[str, Any], low: dict[str, Any], n: int = 16
) -> list[str]:
    """Fill both slots with blockers, queue ``n`` requests (alternating high/low), abort the
    blockers once all ``n`` wait, and return the classes in the order their first tokens came.

    SlideBatching orders by weight (density) only among URGENT requests; waiting until every
    queued request is overdue makes them all URGENT, so the order is the weights' alone."""

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=engine.base_url, api_key="x", max_retries=0) as c:

            async def one(extra: dict[str, Any], tokens: int) -> float:
                stream = await c.completions.create(
                    model=engine.spec.model_name,
                    prompt="z" * 40,
                    max_tokens=tokens,
                    stream=True,
                    extra_body=extra,
                )
                first = math.inf
                async for _ in stream:
                    first = min(first, time.monotonic())
                return first

            def counts() -> tuple[float, float]:
                samples = scrape(engine)
                return (
                    metric(samples, "vllm:num_requests_running"),
                    metric(samples, "vllm:num_requests_waiting"),
                )

            blockers = [asyncio.create_task(one(low, 5000)) for _ in range(2)]
            assert await asyncio.to_thread(wait_until, lambda: counts() == (2.0, 0.0))
            classes = ["high" if i % 2 else "low" for i in range(n)]
            burst = asyncio.gather(*(one(high if k == "high" else low, 6) for k in classes))
            assert await asyncio.to_thread(wait_until, lambda: counts() == (2.0, float(n)))
            await asyncio.sleep(0.25)  # past every burst request's 50 ms TTFT: all overdue
            for blocker in blockers:  # disconnect: the engine aborts them and frees both slots
                blocker.cancel()
            firsts = await burst
        return [k for _, k in sorted(zip(firsts, classes, strict=True))]

    return asyncio.run(run())


def test_slide_serves_higher_weight_first_in_overload(engines: dict[str, RunningEngine]) -> None:
    slo = {"tiergate_ttft_ms": 50, "tiergate_tpot_ms": 20}
    order = _first_token_order(
        engines["slide"],
        high={"vllm_xargs": {**slo, "tiergate_weight": 8}},
        low={"vllm_xargs": {**slo, "tiergate_weight": 1}},
    )
    assert order == ["high"] * 8 + ["low"] * 8


def test_vllm_priority_field_orders_service(engines: dict[str, RunningEngine]) -> None:
    order = _first_token_order(engines["burst"], high={"priority": -1}, low={"priority": 3})
    assert order == ["high"] * 8 + ["low"] * 8


@pytest.fixture
def submitted(main: RunningEngine, monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """The core requests the main engine is given from now on, in order."""
    captured: list[Request] = []
    engine = main.sim.engine
    original = engine.submit

    def recording(request: Request, finish_reason: str) -> Any:
        captured.append(request)
        return original(request, finish_reason)

    monkeypatch.setattr(engine, "submit", recording)
    return captured


def test_vllm_xargs_reach_the_engine(main: RunningEngine, submitted: list[Request]) -> None:
    gateway_arrival = time.time() - 2.0
    xargs = {
        "tiergate_deadline_ms": 30000,
        "tiergate_weight": 3.5,
        "tiergate_tier": "gold",
        "tiergate_tenant": "acme",
        "tiergate_arrival_unix_s": gateway_arrival,
        "other": [1, 2],
    }
    before = scrape(main)
    client(main).chat.completions.create(
        model="qwen-test",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=2,
        extra_body={"vllm_xargs": xargs},
    )
    client(main).chat.completions.create(
        model="qwen-test",
        messages=[{"role": "user", "content": "q"}],
        max_tokens=2,
        extra_body={"priority": 2},
    )
    deadline_only, plain = submitted
    assert deadline_only.slo == SLO(deadline_s=30.0)
    assert (deadline_only.weight, deadline_only.tier, deadline_only.tenant) == (3.5, "gold", "acme")
    zero_load = main.sim.profile.zero_load_ttft_s(plain.prompt_tokens)
    assert plain.slo == SLO(ttft_s=max(5 * zero_load, 0.2), tpot_s=0.1)  # the plugins' defaults
    assert plain.weight == 0.25 and plain.tier == "default"
    # deadlines count from the gateway's arrival: the TTFT the engine reports includes the 2 s
    assert deadline_only.token_times[0] - deadline_only.arrival_s >= 2.0
    ttft_sum = metric(scrape(main), "vllm:time_to_first_token_seconds_sum") - metric(
        before, "vllm:time_to_first_token_seconds_sum"
    )
    assert ttft_sum >= 2.0


# ---- aborts ------------------------------------------------------------------------------


def test_stream_disconnect_aborts_and_frees_kv(engines: dict[str, RunningEngine]) -> None:
    engine = engines["abort"]
    assert wait_until(lambda: idle(engine))
    before = scrape(engine)
    stream = client(engine).chat.completions.create(
        model="abort",
        messages=[{"role": "user", "content": "w" * 400}],
        max_tokens=3000,
        stream=True,
    )
    for received, _chunk in enumerate(stream, start=1):
        if received == 3:
            break
    assert metric(scrape(engine), "vllm:kv_cache_usage_perc") > 0
    stream.close()
    assert wait_until(lambda: idle(engine))
    after = scrape(engine)
    assert metric(after, "vllm:request_success_total") == metric(
        before, "vllm:request_success_total"
    )
    assert not engine.sim.engine.streams


def test_non_streaming_disconnect_aborts(engines: dict[str, RunningEngine]) -> None:
    engine = engines["abort"]
    assert wait_until(lambda: idle(engine))
    body = {"model": "abort", "prompt": "v" * 100, "max_tokens": 3000}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{engine.base_url}/completions", json=body, timeout=httpx.Timeout(5, read=0.3))
    assert wait_until(lambda: idle(engine))
    assert not engine.sim.engine.streams


# ---- load --------------------------------------------------------------------------------


def test_many_concurrent_streams_all_complete(engines: dict[str, RunningEngine]) -> None:
    engine = engines["load"]
    n = 120

    async def run() -> list[tuple[int, str]]:
        async with openai.AsyncOpenAI(base_url=engine.base_url, api_key="x", max_retries=0) as c:

            async def one(k: int) -> tuple[int, str]:
                stream = await c.chat.completions.create(
                    model="load",
                    messages=[{"role": "user", "content": "hello " * k}],
                    max_tokens=20 + k % 7,
                    stream=True,
                )
                text = "".join([ch.choices[0].delta.content or "" async for ch in stream])
                return k, text

            return await asyncio.gather(*(one(k) for k in range(n)))

    for k, text in asyncio.run(run()):
        assert text == filler_text(0, 20 + k % 7)
    assert wait_until(lambda: idle(engine))


# ---- the wall-clock loop, driven directly ------------------------------------------------


def _request(rid: str, now: float, prompt: int, tokens: int) -> Request:
    meta = RequestMeta(SLO(ttft_s=1.0, tpot_s=0.1), 1.0, "t", "t")
    output = plan_output(prompt, tokens, 0, max_model_len=10**6, sampler=OutputLengthSampler(0))
    return build_request(
        rid, meta=meta, now_s=now, now_unix_s=0.0, prompt_tokens=prompt, output=output
    )


def test_token_times_follow_the_profile_and_never_run_ahead() -> None:
    profile = tiny_profile()
    c = profile.coefficients

    async def run() -> tuple[Request, float, float]:
        core = EngineCore(profile, make_policy("vllm-v1-priority", profile.estimator()))
        engine = WallClockEngine(core)
        request = _request("a", engine.now(), 64, 40)
        started = time.monotonic()
        stream = engine.submit(request, "length")
        while not stream.done:
            await stream.next_tokens()
        elapsed = time.monotonic() - started
        await engine.stop()
        return request, elapsed, started

    request, elapsed, _ = asyncio.run(run())
    times = np.asarray(request.token_times)
    assert times.size == 40
    # decode step j (0-based) sees l_kv = prompt + j: t_c + a_d * l_kv + b_d
    expected = c.t_c + c.a_d * (64 + np.arange(39)) + c.b_d
    gaps = np.diff(times)
    assert np.all(gaps >= expected - 1e-9)  # never faster than the profile
    # exactly the profile's step times (a rare restart after event-loop lag only lengthens one)
    assert np.median(gaps - expected) == pytest.approx(0.0, abs=1e-9)
    assert elapsed >= times[-1] - request.arrival_s - 1e-3  # wall clock kept up, not ahead


def test_arrival_interrupts_a_fast_forwarded_run() -> None:
    profile = tiny_profile()

    async def run() -> tuple[Request, Request, int]:
        core = EngineCore(profile, make_policy("vllm-v1-priority", profile.estimator()))
        engine = WallClockEngine(core)
        long = _request("long", engine.now(), 32, 400)  # ~3.3 s of decode steps
        long_stream = engine.submit(long, "length")
        while long_stream.delivered < 5:
            await long_stream.next_tokens()
        step = core.in_flight
        assert step is not None and step.num_steps > 10  # fast-forwarding the decode run
        await asyncio.sleep(0.05)
        delivered_mid_run = long_stream.delivered
        late = _request("late", engine.now(), 32, 3)
        late_stream = engine.submit(late, "length")
        while not late_stream.done:
            await late_stream.next_tokens()
        await engine.stop()
        return long, late, delivered_mid_run

    long, late, delivered_mid_run = asyncio.run(run())
    assert 5 < delivered_mid_run < 400  # tokens of the run arrive step by step
    # the newcomer is admitted at the next step boundary, not after the ~3 s run
    assert late.token_times[0] - late.arrival_s < 0.1
    assert long.num_output_tokens < 400


class _BrokenPolicy(SchedulingPolicy):
    name: ClassVar[str] = "broken"

    def schedule(self, inp: SchedulerInput) -> StepPlan:
        raise RuntimeError("policy bug")


def test_a_failing_policy_ends_streams_instead_of_hanging(caplog: pytest.LogCaptureFixture) -> None:
    profile = tiny_profile()

    async def run() -> tuple[bool, bool, bool]:
        engine = WallClockEngine(EngineCore(profile, _BrokenPolicy(profile.estimator())))
        stream = engine.submit(_request("x", engine.now(), 8, 4), "length")
        await asyncio.wait_for(stream.next_tokens(), WAIT_S)
        alive = engine.running
        await engine.stop()
        return stream.aborted, alive, engine.core.has_work

    aborted, alive, has_work = asyncio.run(run())
    assert aborted and alive and not has_work
    assert "policy bug" in caplog.text


def test_cli_validates_profile_and_policy() -> None:
    app = typer.Typer()
    app.command()(engine_sim_command)
    runner = CliRunner()
    result = runner.invoke(app, ["--profile", "no-such-profile", "--policy", "slide"])
    assert result.exit_code == 2 and "no-such-profile" in result.output
    result = runner.invoke(app, ["--profile", "a100-qwen2-7b", "--policy", "lifo"])
    assert result.exit_code == 2 and "lifo" in result.output
    help_text = runner.invoke(app, ["--help"]).output
    for option in ("--profile", "--policy", "--port", "--host", "--model", "--seed", "--noise"):
        assert option in help_text


# ---- request mapping ---------------------------------------------------------------------


def test_token_counting_stand_in() -> None:
    assert count_text_tokens("") == 1
    assert count_text_tokens("abcd") == 1
    assert count_text_tokens("abcde") == 2
    assert count_chat_tokens(["abcd"]) == 3 + 4 + 1
    assert count_chat_tokens(["abcd", ""]) == 3 + 4 + 1 + 4


def test_read_meta_defaults_partial_streaming_and_the_gateways_arrival() -> None:
    def read(xargs: dict[str, Any] | None, now_unix_s: float = 100.0) -> RequestMeta:
        return read_meta(xargs, 0, zero_load_ttft_s=0.1, now_unix_s=now_unix_s)

    best_effort = read(None)
    assert best_effort.slo == SLO(ttft_s=0.5, tpot_s=0.1)  # 5 x zero-load TTFT, 100 ms TPOT
    assert best_effort.weight == 1.0 and best_effort.arrival_s is None
    assert read({"tiergate_ttft_ms": "250"}).slo == SLO(ttft_s=0.25, tpot_s=0.1)
    both = read({"tiergate_ttft_ms": 500, "tiergate_tpot_ms": 50, "tiergate_deadline_ms": 9000})
    assert both.slo == SLO(ttft_s=0.5, tpot_s=0.05, deadline_s=9.0)
    output = plan_output(10, 5, 0, max_model_len=100, sampler=OutputLengthSampler(0))

    def arrival(meta: RequestMeta, time_scale: float = 1.0) -> float:
        request = build_request(
            "r",
            meta=meta,
            now_s=50.0,
            now_unix_s=100.0,
            prompt_tokens=10,
            output=output,
            time_scale=time_scale,
        )
        return request.arrival_s

    assert arrival(best_effort) == 50.0  # no gateway arrival: now on the engine's clock
    assert arrival(read({"tiergate_arrival_unix_s": 200.0})) == 50.0  # the future counts as now
    assert arrival(read({"tiergate_arrival_unix_s": 97.5})) == pytest.approx(47.5)
    assert arrival(read({"tiergate_arrival_unix_s": 97.5}), time_scale=2.0) == pytest.approx(45.0)
    for bad in ({"tiergate_deadline_ms": 0}, {"tiergate_weight": True}, {"tiergate_tpot_ms": "x"}):
        meta = read(bad)  # ignored, as in vLLM
        assert dataclasses.replace(meta, ignored=()) == best_effort and meta.ignored


def test_malformed_xargs_are_served_with_defaults(
    main: RunningEngine, submitted: list[Request]
) -> None:
    xargs = {
        "tiergate_ttft_ms": -5,
        "tiergate_tpot_ms": 40,
        "tiergate_weight": "heavy",
        "tiergate_tier": 7,
    }
    response = httpx.post(
        f"{main.base_url}/chat/completions",
        json={
            "model": "qwen-test",
            "messages": [{"role": "user", "content": "q"}],
            "max_tokens": 1,
            "vllm_xargs": xargs,
        },
    )
    assert response.status_code == 200
    (request,) = submitted
    zero_load = main.sim.profile.zero_load_ttft_s(request.prompt_tokens)
    assert request.slo == SLO(ttft_s=max(5 * zero_load, 0.2), tpot_s=0.04)
    assert (request.weight, request.tier) == (1.0, "default")


@given(st.integers(-1000, 1000), st.integers(-1000, 1000))
def test_priority_to_weight_keeps_vllm_order(a: int, b: int) -> None:
    wa, wb = weight_from_priority(a), weight_from_priority(b)
    assert wa > 0 and math.isfinite(wa)
    if a < b:
        assert wa >= wb  # lower vLLM priority = served first = larger weight
    assert weight_from_priority(0) == 1.0


@given(st.integers(1, 5000), st.integers(0, 50), st.integers(0, 2**32 - 1))
def test_drawn_lengths_respect_context_and_min_tokens(
    prompt: int, min_tokens: int, seed: int
) -> None:
    max_model_len = 4096
    sampler = OutputLengthSampler(seed)
    if prompt >= max_model_len:
        with pytest.raises(RequestMappingError):
            plan_output(prompt, None, min_tokens, max_model_len=max_model_len, sampler=sampler)
        return
    plan = plan_output(prompt, None, min_tokens, max_model_len=max_model_len, sampler=sampler)
    assert 1 <= plan.tokens <= max_model_len - prompt == plan.max_tokens
    assert plan.tokens >= min(min_tokens, max_model_len - prompt)
