"""The thin layer over vLLM scheduler internals that differ between the versions we support.

Supported: vLLM 0.33 (CUDA) and vLLM 0.23 (what vllm-ascend 0.23 runs on). Everything the
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
from collections.abc import Iterable, Iterator
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


def max_admitted(scheduler: Any) -> int:
    """Most requests that may hold a running slot (vLLM's admission check)."""
    return int(getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs))


def is_blocked(scheduler: Any, request: Any) -> bool:
    """A waiting request vLLM will skip this step (grammar, remote KV, streaming input)."""
    return bool(scheduler._is_blocked_waiting_status(request.status))


def holds_kv(scheduler: Any, request: Any) -> bool:
    """A waiting request that already holds KV blocks (async KV loads, 0.33's kv-holding queue)."""
    check = getattr(scheduler, "_holds_kv_blocks", None)
    if check is not None:
        return bool(check(request))
    return bool(request.num_computed_tokens > 0)


def other_waiting(scheduler: Any) -> Iterator[Any]:
    """Waiting requests outside ``scheduler.waiting`` (vLLM keeps some in side queues)."""
    for name in ("kv_holding_waiting", "skipped_waiting"):
        queue = getattr(scheduler, name, None)
        if queue:
            yield from queue


def num_kv_blocks(scheduler: Any, request_id: str) -> int:
    """KV blocks ``request_id`` holds in the first KV-cache group (full attention)."""
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    return len(managers[0].req_to_blocks.get(request_id, ()))


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


def admission_blocks(scheduler: Any, request: Any, tokens: int) -> int:
    """Free blocks vLLM requires to admit a waiting ``request`` with a first chunk of ``tokens``.

    Both versions check, by default (``scheduler_reserve_full_isl``), that the request's whole
    current sequence fits, not just the chunk; 0.33 adds a watermark for admissions.
    """
    block_size = int(scheduler.block_size)
    tokens_needed = tokens
    if getattr(scheduler, "scheduler_reserve_full_isl", False):
        tokens_needed = max(tokens, request.num_tokens)
    watermark = int(getattr(scheduler.kv_cache_manager, "watermark_blocks", 0))
    return -(-tokens_needed // block_size) + watermark


def admission_rule(scheduler: Any) -> AdmissionRule:
    """vLLM's rule for admitting a waiting request (see :func:`admission_blocks`)."""
    return AdmissionRule(
        full_sequence=bool(getattr(scheduler, "scheduler_reserve_full_isl", False)),
        watermark_blocks=int(getattr(scheduler.kv_cache_manager, "watermark_blocks", 0)),
    )


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
