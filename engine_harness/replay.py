"""Drive a real vLLM scheduler on a virtual clock, without a model or a GPU (imports vLLM).

A local model directory holds only a tiny Llama ``config.json`` (no weights, no tokenizer); the
KV cache is one full-attention group of ``num_blocks`` blocks. A step is ``schedule()`` → a
synthetic ``ModelRunnerOutput`` (token 7 for every request whose scheduled tokens complete it;
a request whose true length is below its ``max_tokens`` samples ``STOP``, one of its
``stop_token_ids``, as its last token) → ``update_from_output()``. Each step lasts the profile's
prediction (beta = 1, no noise) for the batch vLLM actually scheduled, on a fake clock, so a
trace runs in virtual time and the scheduler's own step-time measurement sees exactly those
times. The scheduler is stock vLLM's
(``fcfs`` / ``priority`` mode) or ours with any policy; :func:`replay_vllm` returns the same
:class:`Replay` as the simulator side (:mod:`engine_harness.sim_replay`), plus the wall time of
every ``schedule()``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request as VllmRequest
from vllm.v1.structured_output import StructuredOutputManager

from engine_harness.sim_replay import (
    BLOCK_SIZE,
    MAX_NUM_SEQS,
    TOKEN_BUDGET,
    Arrival,
    ArrivalQueue,
    Release,
    Replay,
    arrivals_from_workload,
    model_len_for,
    priority_of,
    replay_simulator,
)
from priority.estimator import LatencyCoefficients
from priority.sim.stall import DEFAULT_MAX_STALLED_STEPS, StallGuard

__all__ = [
    "STOP",
    "TINY_LLAMA",
    "TOKEN",
    "Arrival",
    "FakeClock",
    "Replay",
    "Trace",
    "arrivals_from_workload",
    "build_scheduler",
    "make_config",
    "make_request",
    "make_scheduler",
    "model_output",
    "priority_of",
    "replay_simulator",
    "replay_vllm",
    "run_trace",
    "step_time",
    "tiergate_settings",
    "write_tiny_model",
]

Trace = Replay
"""The harness's old name of a replay's result."""

TOKEN = 7
STOP = 8
"""The token a request samples last when it ends before ``max_tokens`` (its stop token)."""
MAX_MODEL_LEN = 8192
"""``make_config``'s default model length (a replay sets its own: ``replay_vllm``)."""
MAX_POSITIONS = 1 << 20
"""The tiny model's ``max_position_embeddings``: room for any ``max_model_len`` a replay sets."""
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": MAX_POSITIONS,
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
    max_model_len: int = MAX_MODEL_LEN,
    policy: str = "fcfs",
    kv_transfer: KVTransferConfig | None = None,
) -> VllmConfig:
    """A CPU ``VllmConfig`` with chunked prefill, no prefix caching; ``policy`` is vLLM's
    ``--scheduling-policy`` (only the stock scheduler reads it), ``kv_transfer`` vLLM's
    ``--kv-transfer-config`` (a KV connector: PD-disaggregation)."""
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
        policy=policy,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=False)
    config = VllmConfig(
        model_config=model,
        scheduler_config=scheduler,
        cache_config=cache,
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=kv_transfer,
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


@contextmanager
def tiergate_settings(
    policy: str, profile: str, params: Mapping[str, Any] | None = None
) -> Iterator[None]:
    """``TIERGATE_*`` set to exactly these settings (the plugin reads them at construction),
    restored afterwards."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("TIERGATE_")}
    for key in saved:
        del os.environ[key]
    os.environ["TIERGATE_POLICY"] = policy
    os.environ["TIERGATE_PROFILE"] = profile
    os.environ["TIERGATE_REFIT_EVERY"] = "0"  # the simulator's engines correct beta only
    if params:
        os.environ["TIERGATE_POLICY_PARAMS"] = json.dumps(dict(params))
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("TIERGATE_")]:
            del os.environ[key]
        os.environ.update(saved)


def build_scheduler(
    model_dir: Path,
    *,
    num_blocks: int,
    policy: str | None = None,
    params: Mapping[str, Any] | None = None,
    profile: str = "a100-qwen2-7b",
    stock_policy: str = "fcfs",
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
    clock: Callable[[], float] | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    kv_transfer: KVTransferConfig | None = None,
) -> Any:
    """Stock vLLM's scheduler in ``stock_policy`` mode (``policy`` None), or
    ``TiergateScheduler`` running ``policy`` with ``params`` and ``profile``; with
    ``kv_transfer``, the KV connector it names."""
    config = make_config(
        model_dir,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=token_budget,
        block_size=block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        policy=stock_policy if policy is None else "fcfs",
        kv_transfer=kv_transfer,
    )
    if policy is None:
        return make_scheduler(Scheduler, config)
    from engine_cuda.scheduler import TiergateScheduler

    with tiergate_settings(policy, profile, params):
        scheduler = make_scheduler(TiergateScheduler, config)
    if clock is not None:
        scheduler.tiergate.clock = clock
    return scheduler


def make_request(
    request_id: str,
    prompt_tokens: int,
    max_tokens: int,
    *,
    arrival_time: float,
    extra_args: Mapping[str, Any] | None = None,
    priority: int = 0,
    sampling_params: SamplingParams | None = None,
    stop_token_ids: list[int] | None = None,
) -> VllmRequest:
    params = sampling_params or SamplingParams(
        max_tokens=max_tokens,
        ignore_eos=True,
        stop_token_ids=stop_token_ids,
        extra_args=dict(extra_args or {}) or None,
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


def model_output(
    scheduler: Any, output: Any, lengths: Mapping[str, int] | None = None
) -> ModelRunnerOutput:
    """Sample ``TOKEN`` for every request whose scheduled tokens reach the end of its sequence;
    ``STOP`` instead for its ``lengths[request_id]``-th output token (its true length)."""
    ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    lengths = lengths or {}
    for request_id in ids:
        request = scheduler.requests[request_id]
        if request.num_computed_tokens < request.num_tokens:
            sampled.append([])
            continue
        last = request.num_output_tokens + 1 >= lengths.get(request_id, request.max_tokens + 1)
        sampled.append([STOP if last else TOKEN])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )


def run_trace(
    scheduler: Any,
    arrivals: Iterable[Arrival],
    coefficients: LatencyCoefficients,
    clock: FakeClock,
    *,
    max_steps: int | None = 10_000,
    on_step: Callable[[Any, Any], None] | None = None,
    label: str = "vllm",
    max_stalled_steps: int | None = DEFAULT_MAX_STALLED_STEPS,
    max_model_len: int | None = None,
) -> Replay:
    """Run ``arrivals`` to completion on a synchronous scheduler in virtual time; a later
    workflow stage arrives ``think_s`` after its previous stage finished here
    (:class:`~engine_harness.sim_replay.ArrivalQueue`, the simulator side's too). With
    ``max_model_len`` (the scheduler's), each arrival first meets the API server's
    context-length rule (:class:`~engine_harness.sim_replay.Release`; None: none).
    ``max_stalled_steps`` consecutive steps without a token raise
    :class:`~priority.sim.stall.LivelockError` naming ``label`` (the policy) and the queued
    requests, so a livelocked scheduler fails the replay instead of hanging it."""
    queue = ArrivalQueue(arrivals)
    trace = Replay()
    release = Release(queue, trace, max_model_len)
    lengths: dict[str, int] = {}
    steps = 0
    stall = StallGuard(label, max_stalled_steps)
    while max_steps is None or steps < max_steps:
        steps += 1
        for a in release.due(clock.t):
            stop = a.target_tokens < a.max_tokens
            if stop:
                lengths[a.request_id] = a.target_tokens
            scheduler.add_request(
                make_request(
                    a.request_id,
                    a.prompt_tokens,
                    a.max_tokens,
                    arrival_time=a.time,
                    extra_args=a.extra_args,
                    priority=a.priority,
                    stop_token_ids=[STOP] if stop else None,
                )
            )
            trace.token_times[a.request_id] = []
        if not scheduler.has_unfinished_requests():
            due = queue.next_time()
            if due is None:
                assert not queue.held, f"{queue.held} workflow stage(s) never released"
                trace.arrivals = queue.released
                return trace
            clock.t = due
            continue
        started = time.perf_counter()
        output = scheduler.schedule()
        decided = time.perf_counter() - started
        if output.total_num_scheduled_tokens == 0:
            scheduler.update_from_output(output, model_output(scheduler, output, lengths))
            due = queue.next_time()
            assert due is not None, "the scheduler stalled with work queued"
            clock.t = due
            continue
        if on_step is not None:
            on_step(scheduler, output)
        clock.t += step_time(coefficients, scheduler, output)
        runner_output = model_output(scheduler, output, lengths)
        trace.batches.append(dict(output.num_scheduled_tokens))
        trace.preempted.append(set(output.preempted_req_ids or ()))
        trace.decision_s.append(decided)
        emitted = []
        for request_id, sampled in zip(
            runner_output.req_ids, runner_output.sampled_token_ids, strict=True
        ):
            if sampled:
                trace.token_times[request_id].append(clock.t)
                emitted.append(scheduler.requests[request_id])
        scheduler.update_from_output(output, runner_output)
        for request in emitted:
            if request.is_finished():
                queue.finished(request.request_id, clock.t)
        stall.step(bool(emitted), lambda: _queued(scheduler))
    raise AssertionError(f"trace did not finish in {max_steps} steps")


def _queued(scheduler: Any) -> list[str]:
    """The scheduler's queued requests, most preempted first (the livelock guard's report)."""
    queued = sorted(
        [*scheduler.running, *scheduler.waiting],
        key=lambda r: -getattr(r, "num_preemptions", 0),
    )
    return [
        f"{r.request_id} ({r.num_computed_tokens}/{r.num_tokens} tokens computed, "
        f"{getattr(r, 'num_preemptions', '?')} preemptions)"
        for r in queued
    ]


def replay_vllm(
    arrivals: Iterable[Arrival],
    model_dir: Path,
    coefficients: LatencyCoefficients,
    *,
    num_blocks: int,
    policy: str | None = None,
    params: Mapping[str, Any] | None = None,
    profile: str = "a100-qwen2-7b",
    stock_policy: str = "fcfs",
    block_size: int = BLOCK_SIZE,
    token_budget: int = TOKEN_BUDGET,
    max_num_seqs: int = MAX_NUM_SEQS,
    on_step: Callable[[Any, Any], None] | None = None,
    max_model_len: int | None = None,
) -> Replay:
    """``arrivals`` through a fresh real scheduler (see :func:`build_scheduler`), steps timed by
    ``coefficients``; the clock starts at the first arrival. ``max_model_len`` is vLLM's (None:
    from the trace, :func:`~engine_harness.sim_replay.model_len_for`, as the simulator side sets
    it); what the API server refuses at that length never reaches the scheduler."""
    pending = list(arrivals)
    if max_model_len is None:
        max_model_len = model_len_for(pending, num_blocks, block_size)
    clock = FakeClock(min((a.time for a in pending), default=0.0))
    scheduler = build_scheduler(
        model_dir,
        num_blocks=num_blocks,
        policy=policy,
        params=params,
        profile=profile,
        stock_policy=stock_policy,
        block_size=block_size,
        token_budget=token_budget,
        max_num_seqs=max_num_seqs,
        clock=clock,
        max_model_len=max_model_len,
    )
    return run_trace(
        scheduler,
        pending,
        coefficients,
        clock,
        max_steps=None,
        on_step=on_step,
        label=policy or f"stock vLLM ({stock_policy})",
        max_model_len=max_model_len,
    )
