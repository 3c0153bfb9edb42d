"""One request body, one view: the emulated engine and the REAL vLLM scheduler read the gateway's
protocol (:mod:`engine_common.protocol`) the same way.

Each body of :func:`bodies` goes through vLLM's own OpenAI request model and
``to_sampling_params`` (so ``vllm_xargs`` becomes ``SamplingParams.extra_args`` exactly as in
``vllm serve``), then ``add_request`` on a ``TiergateScheduler``; the policy's view of it after
one ``schedule()`` must equal the core request the emulated engine builds from the same body.
A body vLLM's API server refuses must be refused by the emulated engine's body model too. Run by
``.ci/engines.sh`` in each vLLM environment; skipped where vLLM is not installed.
"""

from __future__ import annotations

import importlib
import time
import types
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")
vllm_harness = pytest.importorskip("vllm_harness")

from pydantic import ValidationError  # noqa: E402

from engine_common import protocol as p  # noqa: E402
from priority.lengths.distribution import LengthDistribution  # noqa: E402
from priority.profiles import load_profile  # noqa: E402
from priority.request import SLO, Request, RequestMeta  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

H = vllm_harness
PROFILE = "a100-qwen2-7b"
MAX_TOKENS = 7
ARRIVAL_TOLERANCE_S = 0.5
"""Wall-clock slack between the two readings of 'now' (both engines read ``time.time()``)."""


def bodies(now: float) -> dict[str, dict[str, Any]]:
    """Body fields by case: valid, missing, malformed, out of range (``now``: Unix seconds)."""
    gateway = p.encode(
        RequestMeta(
            SLO(0.4, 0.04, 20.0), weight=4.0, tier="gold", tenant="acme", arrival_s=now - 2.0
        )
    )
    workflow = p.encode(
        RequestMeta(
            SLO(0.4, 0.04, 15.0),  # the call's share of its workflow's deadline
            weight=1.0,
            tier="gold",
            tenant="acme",
            arrival_s=now - 1.0,
            kind="compound",
            workflow_id="agent-1",
            stage=2,
            workflow_deadline_s=60.0,
            length=LengthDistribution(levels=(0.5, 0.95), values=(40.0, 160.0)),
        )
    )
    return {
        # valid
        "gateway": {"priority": p.priority_from_weight(4.0), "vllm_xargs": gateway},
        "ttft-only": {"vllm_xargs": {p.TTFT_MS: 300}},
        "tpot-only-as-text": {"vllm_xargs": {p.TPOT_MS: "25.5"}},
        "deadline-only": {"vllm_xargs": {p.DEADLINE_MS: 1500, p.TENANT: "  beta "}},
        "future-arrival": {"vllm_xargs": {p.ARRIVAL_UNIX_S: now + 3600}},
        "not-ours": {"vllm_xargs": {"session_id": "s1", "tiergate_unknown": 3, "k": [1, "a"]}},
        "workflow-call": {"vllm_xargs": workflow},
        # missing
        "none": {},
        "priority-only": {"priority": 2},
        # malformed
        "malformed": {
            "priority": -1,
            "vllm_xargs": {
                p.WEIGHT: "heavy",
                p.TTFT_MS: "soon",
                p.TPOT_MS: [40],
                p.DEADLINE_MS: "",
                p.ARRIVAL_UNIX_S: "yesterday",
                p.TIER: 7,
                p.TENANT: ["a"],
            },
        },
        "json-true": {"vllm_xargs": {p.WEIGHT: True, p.TIER: "  "}},
        # out of range
        "out-of-range": {
            "priority": 1,
            "vllm_xargs": {
                p.WEIGHT: 0,
                p.TTFT_MS: -5,
                p.TPOT_MS: "inf",
                p.DEADLINE_MS: 0,
                p.ARRIVAL_UNIX_S: -1,
            },
        },
        "not-finite": {"vllm_xargs": {p.WEIGHT: float("nan"), p.TTFT_MS: float("inf")}},
        "huge-but-64-bit": {"vllm_xargs": {p.WEIGHT: 2**64 - 1, p.DEADLINE_MS: -(2**63)}},
        "priority-beyond-clip": {"priority": -1000},
    }


REFUSED: dict[str, dict[str, Any]] = {  # vLLM's API server answers 400: so must the emulated one
    "null-value": {"vllm_xargs": {p.TIER: None}},
    "object-value": {"vllm_xargs": {p.WEIGHT: {"value": 2}}},
    "fractional-priority": {"priority": 1.5},
    "integer-beyond-64-bit": {"vllm_xargs": {p.WEIGHT: 2**64}},  # vLLM >= 0.33 refuses it
}


def _body(fields: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Summarise the design of a gateway. " * 6}]
    return {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, **fields}


def _emulated_engine() -> types.ModuleType:
    """``engine_emulated.app`` (its package imports the uvicorn server lazily: the engine
    environments do not install uvicorn)."""
    return importlib.import_module("engine_emulated.app")


def _view(request: Request) -> dict[str, Any]:
    fields = (
        "slo",
        "weight",
        "tier",
        "tenant",
        "prompt_tokens",
        "max_output_tokens",
        "kind",
        "workflow_id",
        "stage",
        "length",
    )
    return {name: getattr(request, name) for name in fields}


def test_emulated_and_vllm_engines_see_the_same_request(tiny_model_dir: Path) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    app = _emulated_engine()
    sim = app.build_engine_sim(load_profile(PROFILE), "slide", model_name="tiny")
    clock = H.FakeClock()
    scheduler = H.build_scheduler(
        tiny_model_dir, num_blocks=1024, policy="slide", profile=PROFILE, clock=clock
    )
    now = clock.t = time.time()  # the bodies arrive now at both engines
    emulated: dict[str, tuple[Request, float]] = {}
    for name, fields in bodies(now).items():
        body = _body(fields)
        request, _ = app.core_request(sim, app.ChatCompletionRequest.model_validate(body), name)
        emulated[name] = (request, sim.engine.now() - request.arrival_s)
        vllm_body = ChatCompletionRequest.model_validate(body)
        params = vllm_body.to_sampling_params(MAX_TOKENS, {})
        scheduler.add_request(
            H.make_request(
                name,
                request.prompt_tokens,
                MAX_TOKENS,
                arrival_time=now,
                sampling_params=params,
                priority=vllm_body.priority,
            )
        )
    scheduler.schedule()
    for name, (request, emulated_wait_s) in emulated.items():
        view = scheduler.tiergate.view_of(name)
        assert view is not None, name
        assert _view(view) == _view(request), name
        vllm_wait_s = now - view.arrival_s  # time since the gateway's arrival, as each sees it
        assert vllm_wait_s == pytest.approx(emulated_wait_s, abs=ARRIVAL_TOLERANCE_S), name
    assert emulated["gateway"][1] == pytest.approx(2.0, abs=ARRIVAL_TOLERANCE_S)
    # a malformed value reads as if absent: only the priority (-1) sets the malformed one apart
    assert _view(emulated["malformed"][0]) == _view(emulated["none"][0]) | {"weight": 2.0}


@pytest.mark.parametrize("name", list(REFUSED))
def test_bodies_vllm_refuses_are_refused_by_the_emulated_engine(name: str) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMValidationError

    app = _emulated_engine()
    body = _body(REFUSED[name])
    try:
        ChatCompletionRequest.model_validate(body).to_sampling_params(MAX_TOKENS, {})
    except (ValidationError, VLLMValidationError):
        pass
    else:
        pytest.skip(f"this vLLM's API server accepts {name}")
    with pytest.raises(ValidationError):
        app.ChatCompletionRequest.model_validate(body)
