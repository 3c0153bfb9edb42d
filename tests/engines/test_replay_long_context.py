"""Long-context replays: what vLLM's API server refuses is refused on both sides, the rest
agrees token by token.

``mooncake_conv`` holds prompts past 8,192 tokens. With the replay's model length fixed at
8,192 the real scheduler never finished those prompts and the replay stopped with "the
scheduler stalled with work queued" for every policy. Now the model length comes from the trace
(capped by the KV pool), and the API server's rule (:func:`engine_harness.sim_replay.
api_max_tokens`) is checked here against vLLM's own validators.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

pytest.importorskip("vllm")
replay = pytest.importorskip("engine_harness.replay")

from engine_harness.sim_replay import (  # noqa: E402
    Arrival,
    api_max_tokens,
    arrivals_from_workload,
    first_divergence,
    model_len_for,
    replay_simulator,
)
from priority.profiles import load_profile  # noqa: E402
from priority.sim import build_workload, load_trace  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("tiergate_env")]

PROFILE = "a100-qwen2-7b"
REQUESTS = 24


@cache
def vllm_get_max_tokens() -> Callable[..., int]:
    """vLLM's own ``get_max_tokens``, compiled from its source file: its module imports the
    server's dependencies (orjson...), which the scheduler environment does not carry."""
    import vllm
    from vllm.platforms import current_platform

    path = Path(vllm.__file__).parent / "entrypoints/serve/utils/api_utils.py"
    tree = ast.parse(path.read_text())
    (node,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_max_tokens"
    ]
    namespace: dict[str, Any] = {"current_platform": current_platform}
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return cast(Callable[..., int], namespace["get_max_tokens"])


def vllm_verdict(prompt: int, max_tokens: int, max_model_len: int) -> int | None:
    """What vLLM 0.33's own code makes of a token-id completion request: the engine's
    ``max_tokens``, or None where one of its validators raises."""
    from vllm.exceptions import VLLMValidationError
    from vllm.renderers.params import TokenizeParams

    get_max_tokens = vllm_get_max_tokens()

    try:
        params = TokenizeParams(
            max_total_tokens=max_model_len,
            max_output_tokens=max_tokens,
            max_total_tokens_param="max_model_len",
            max_output_tokens_param="max_tokens",
        )
        params._token_len_check(None, list(range(prompt)))
        cap = get_max_tokens(max_model_len, max_tokens, prompt, {})
    except (ValueError, VLLMValidationError):
        return None
    if prompt >= max_model_len or cap < 1:  # the engine's _validate_prompt_len / SamplingParams
        return None
    return cap


def _vllm_release() -> tuple[int, ...]:
    import vllm

    return tuple(int(part) for part in vllm.__version__.split(".")[:2] if part.isdigit())


@pytest.mark.parametrize("max_model_len", [64, 8192])
def test_the_api_rule_is_vllms(max_model_len: int) -> None:
    if _vllm_release() < (0, 33):
        pytest.skip(
            "the rule is vLLM 0.33's (it cuts max_tokens to the room left; 0.23's server refused "
            "such a request): the replays follow 0.33"
        )
    lengths = sorted({1, 2, max_model_len // 2, max_model_len - 1, max_model_len})
    lengths += [max_model_len + 1, 2 * max_model_len]
    for prompt in lengths:
        for max_tokens in lengths:
            ours = api_max_tokens(prompt, max_tokens, max_model_len)
            assert ours == vllm_verdict(prompt, max_tokens, max_model_len), (prompt, max_tokens)


@cache
def long_arrivals() -> tuple[Arrival, ...]:
    """mooncake_conv's first requests (most prompts past 8,192 tokens), default tiers and SLOs,
    at a rate that queues them."""
    trace = load_trace("mooncake_conv")
    head = dataclasses.replace(
        trace,
        arrival_s=trace.arrival_s[:REQUESTS] if trace.arrival_s is not None else None,
        prompt_tokens=trace.prompt_tokens[:REQUESTS],
        output_tokens=trace.output_tokens[:REQUESTS] // 8 + 1,  # short answers: a quick test
    )
    workload = build_workload(head, rps=2.0, reference_profile=load_profile(PROFILE), seed=0)
    return tuple(arrivals_from_workload(workload))


@pytest.mark.parametrize(
    ("blocks", "refusals"),
    [(8_192, False), (1_024, True)],  # the model length from the trace; one the pool cuts
)
@pytest.mark.parametrize("policy", ["vllm-v1", "slide"])
def test_long_prompts_replay_and_agree(
    policy: str, blocks: int, refusals: bool, tiny_model_dir: Path
) -> None:
    cases = long_arrivals()
    assert sum(a.prompt_tokens > 8192 for a in cases) >= REQUESTS // 3
    profile = load_profile(PROFILE)
    model_len = model_len_for(cases, blocks)
    sim = replay_simulator(cases, profile, policy, num_blocks=blocks)
    real = replay.replay_vllm(
        cases, tiny_model_dir, profile.coefficients, num_blocks=blocks, policy=policy
    )
    k = first_divergence(real, sim)
    assert k is None, f"step {k}: vLLM ran {real.batches[k]}, the simulator {sim.batches[k]}"
    assert real.refused == sim.refused
    expected = [a.request_id for a in cases if a.prompt_tokens >= model_len]
    assert sorted(real.refused) == sorted(expected)
    assert bool(real.refused) is refusals
    for a in cases:
        sent = real.arrivals[a.request_id]
        want = (
            0 if a.request_id in real.refused else min(a.target_tokens, model_len - a.prompt_tokens)
        )
        assert len(real.token_times[a.request_id]) == want
        assert sent.max_tokens == min(a.max_tokens, max(0, model_len - a.prompt_tokens)) or not want
        np.testing.assert_allclose(
            real.token_times[a.request_id], sim.token_times[a.request_id], rtol=0, atol=1e-9
        )


def test_stock_vllm_replays_long_prompts(tiny_model_dir: Path) -> None:
    """Stock vLLM too: it stalled on the first prompt past 8,192 tokens before."""
    cases = long_arrivals()
    profile = load_profile(PROFILE)
    real = replay.replay_vllm(
        cases, tiny_model_dir, profile.coefficients, num_blocks=8_192, stock_policy="fcfs"
    )
    sim = replay_simulator(cases, profile, "vllm-v1", num_blocks=8_192)
    assert first_divergence(real, sim) is None and not real.refused
    assert all(len(real.token_times[a.request_id]) == a.target_tokens for a in cases)
