"""Drive a real vLLM scheduler step by step without a model or a GPU (imports vLLM).

A local model directory holds only a tiny Llama ``config.json`` (no weights, no tokenizer); the
KV cache is one full-attention group of ``num_blocks`` blocks. A step is ``schedule()`` →
a synthetic ``ModelRunnerOutput`` (token 7 for every request whose scheduled tokens complete it)
→ ``update_from_output()``. Step times come from a latency profile on a fake clock, so a trace
runs in virtual time and the scheduler's step-time measurement sees exactly those times.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest
from vllm.v1.structured_output import StructuredOutputManager

from priority.estimator import LatencyCoefficients

TOKEN = 7
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_model(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def make_config(
    model_dir: Path,
    *,
    async_scheduling: bool = False,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 512,
    block_size: int = 16,
    num_blocks: int = 128,
    max_model_len: int = 8192,
) -> VllmConfig:
    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
    )
    scheduler = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=async_scheduling,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        device_config=DeviceConfig(device="cpu"),
    )
    config.cache_config.num_gpu_blocks = num_blocks
    # the CPU platform turns asynchronous scheduling off while validating; GPUs keep it on
    config.scheduler_config.async_scheduling = async_scheduling
    return config


def make_scheduler(factory: Callable[..., Any], config: VllmConfig) -> Any:
    block_size = config.cache_config.block_size
    num_blocks = config.cache_config.num_gpu_blocks
    assert num_blocks is not None
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=16, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn", "layers.1.attn"], spec)],
    )
    return factory(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        log_stats=True,
    )


def make_request(
    request_id: str,
    prompt_tokens: int,
    max_tokens: int,
    *,
    arrival_time: float,
    extra_args: Mapping[str, Any] | None = None,
    priority: int = 0,
    sampling_params: SamplingParams | None = None,
) -> VllmRequest:
    params = sampling_params or SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, extra_args=dict(extra_args or {}) or None
    )
    return VllmRequest(
        request_id=request_id,
        prompt_token_ids=[(i % 200) + 10 for i in range(prompt_tokens)],
        sampling_params=params,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
    )


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def step_time(coefficients: LatencyCoefficients, scheduler: Any, output: Any) -> float:
    """The profile's time (beta = 1) of the batch ``output`` scheduled, as the simulator times it.

    Call right after ``schedule()``: vLLM has already advanced ``num_computed_tokens``.
    """
    c = coefficients
    prefill = 0.0
    n_decode = 0
    decode_kv = 0
    for request_id, tokens in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        l_kv = request.num_computed_tokens - tokens
        if tokens == 1 and request.num_tokens - l_kv == 1:
            n_decode += 1
            decode_kv += l_kv
        else:
            prefill += tokens * (c.a_p * tokens + c.b_p * l_kv + c.c_p) + c.d_p * l_kv
    return (c.t_c + prefill) + (c.a_d * decode_kv + n_decode * c.b_d)


def model_output(scheduler: Any, output: Any) -> ModelRunnerOutput:
    """Sample ``TOKEN`` for every request whose scheduled tokens reach the end of its sequence."""
    ids = list(output.num_scheduled_tokens)
    sampled = []
    for request_id in ids:
        request = scheduler.requests[request_id]
        done = request.num_computed_tokens >= request.num_tokens
        sampled.append([TOKEN] if done else [])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )


@dataclass
class Arrival:
    time: float
    request_id: str
    prompt_tokens: int
    max_tokens: int
    extra_args: dict[str, Any] = field(default_factory=dict)
    priority: int = 0


@dataclass
class Trace:
    """What a run produced: per-request token times and per-step batches."""

    token_times: dict[str, list[float]] = field(default_factory=dict)
    batches: list[dict[str, int]] = field(default_factory=list)
    preempted: list[set[str]] = field(default_factory=list)


def run_trace(
    scheduler: Any,
    arrivals: Iterable[Arrival],
    coefficients: LatencyCoefficients,
    clock: FakeClock,
    *,
    max_steps: int = 10_000,
    on_step: Callable[[Any, Any], None] | None = None,
) -> Trace:
    """Run ``arrivals`` to completion on a synchronous scheduler in virtual time."""
    pending = sorted(arrivals, key=lambda a: a.time)
    trace = Trace()
    i = 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i].time <= clock.t:
            a = pending[i]
            scheduler.add_request(
                make_request(
                    a.request_id,
                    a.prompt_tokens,
                    a.max_tokens,
                    arrival_time=a.time,
                    extra_args=a.extra_args,
                    priority=a.priority,
                )
            )
            trace.token_times[a.request_id] = []
            i += 1
        if not scheduler.has_unfinished_requests():
            if i == len(pending):
                return trace
            clock.t = pending[i].time
            continue
        output = scheduler.schedule()
        if output.total_num_scheduled_tokens == 0:
            scheduler.update_from_output(output, model_output(scheduler, output))
            assert i < len(pending), "the scheduler stalled with work queued"
            clock.t = pending[i].time
            continue
        if on_step is not None:
            on_step(scheduler, output)
        clock.t += step_time(coefficients, scheduler, output)
        runner_output = model_output(scheduler, output)
        trace.batches.append(dict(output.num_scheduled_tokens))
        trace.preempted.append(set(output.preempted_req_ids or ()))
        for request_id, sampled in zip(runner_output.req_ids, runner_output.sampled_token_ids,
                                       strict=True):
            if sampled:
                trace.token_times[request_id].append(clock.t)
        scheduler.update_from_output(output, runner_output)
    raise AssertionError(f"trace did not finish in {max_steps} steps")
