"""Unit checks of the adapter pieces that make vLLM's own scheduler tests pass with our scheduler
(``.ci/vllm_suite.py`` runs those tests; these pin the rules in isolation, without a model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from engine_common import compat  # noqa: E402
from engine_common.queue import PolicyOrderedQueue  # noqa: E402
from engine_common.scheduler import EngineRequest  # noqa: E402
from priority.request import SLO  # noqa: E402


@dataclass(order=True)
class Item:
    """Stands in for vLLM's Request: ordered like ``Request.__lt__`` (priority, arrival, id)."""

    priority: int
    arrival_time: float
    request_id: str = field(compare=True)


def ids(queue: PolicyOrderedQueue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_queue_returns_to_its_order_after_the_step() -> None:
    a, b, c, d = (Item(0, float(i), r) for i, r in enumerate("abcd"))
    queue = PolicyOrderedQueue([a, b, c, d])
    # the plan admits d then c; b is blocked (unseen): it keeps its place
    queue.reorder([d, c], movable=lambda rid: rid != "b")
    assert ids(queue) == ["d", "b", "c", "a"]
    queue.pop_request()  # vLLM admitted d only
    late = Item(0, 9.0, "late")
    queue.add_request(late)  # arrived during the step: at the back
    queue.prepend_request(Item(0, 0.5, "pre"))  # preempted during the step: in front
    queue.settle()
    assert ids(queue) == ["pre", "a", "b", "c", "late"]
    assert queue[0].request_id == "pre" and late in queue


def test_priority_queue_keeps_vllms_priority_order_between_steps() -> None:
    queue = PolicyOrderedQueue(ordered=True)
    for item in (Item(3, 1.0, "low"), Item(0, 3.0, "high"), Item(2, 2.0, "mid")):
        queue.add_request(item)
    assert ids(queue) == ["high", "mid", "low"]
    low = queue[2]
    queue.reorder([low], movable=lambda rid: True)
    assert ids(queue) == ["low", "high", "mid"]  # the step's plan
    queue.prepend_request(Item(1, 0.5, "pre"))  # vLLM put one back during the step
    queue.settle()
    assert ids(queue) == ["high", "pre", "mid", "low"]


def test_a_step_that_admits_nothing_leaves_the_queue_alone() -> None:
    a, b = Item(0, 0.0, "a"), Item(0, 1.0, "b")
    queue = PolicyOrderedQueue([a, b])
    queue.reorder([], movable=lambda rid: True)
    queue.pop_request()
    queue.prepend_request(b)  # vLLM's own moves stand: nothing to settle back to
    queue.settle()
    assert ids(queue) == ["b", "b"]


def _scheduler(**extra: Any) -> Any:
    config = SimpleNamespace(long_prefill_token_threshold=400, max_num_batched_tokens=1024)
    base = dict(
        scheduler_config=config,
        adaptive_long_prefill_threshold=False,
        max_model_len=4096,
        num_sampled_tokens_per_step=1,
        num_spec_tokens=0,
        dynamic_sd_lookup=None,
        get_request_counts=lambda: (2, 1),
    )
    base.update(extra)
    return SimpleNamespace(**base)


def test_threshold_follows_vllm_033() -> None:
    assert compat.long_prefill_threshold(_scheduler()) == 400
    lone = _scheduler(get_request_counts=lambda: (1, 0))
    assert compat.long_prefill_threshold(lone) == 0  # nobody to starve
    fair = _scheduler(adaptive_long_prefill_threshold=True, get_request_counts=lambda: (1, 1))
    assert compat.long_prefill_threshold(fair) == 512  # floored at a fair share of 1024


def test_step_tokens_count_drafts_placeholders_threshold_and_padding() -> None:
    s = _scheduler()
    decode = SimpleNamespace(
        num_computed_tokens=100, num_tokens_with_spec=104, num_output_placeholders=0
    )
    assert compat.step_tokens(s, 0).running(decode) == 4  # 1 + 3 drafts
    prompt = SimpleNamespace(num_computed_tokens=0, num_tokens=800)
    assert compat.step_tokens(s, 400).waiting(prompt) == 400
    assert compat.step_tokens(s, 0).waiting(prompt, cache_hit=784) == 16
    spec = _scheduler(num_spec_tokens=3)
    last = SimpleNamespace(num_computed_tokens=31, num_tokens=32)
    assert compat.step_tokens(spec, 0).waiting(last) == 4  # padded decode
    loaded = SimpleNamespace(num_computed_tokens=32, num_tokens=32)  # remote KV, all loaded
    assert compat.step_tokens(s, 0).waiting(loaded) == 1
    near_end = SimpleNamespace(
        num_computed_tokens=4090, num_tokens_with_spec=4099, num_output_placeholders=0
    )
    assert compat.step_tokens(s, 0).running(near_end) == 5  # cut at the model length


def test_engine_request_plans_on_vllms_step_tokens() -> None:
    view = EngineRequest(request_id="r", arrival_s=0.0, prompt_tokens=10, slo=SLO(1.0, 0.1))
    view.num_computed_tokens = 10
    view.num_output_tokens = 1
    assert view.num_uncomputed_tokens == 1
    view.step_tokens = 4  # three drafts to verify
    assert view.num_uncomputed_tokens == 4 and view.is_prefill


def test_left_to_vllm_is_vllms_own_blocked_or_holding_kv_check() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    left = compat.left_to_vllm(Scheduler)  # the checks are static methods
    holds = getattr(Scheduler, "_holds_kv_blocks", lambda r: r.num_computed_tokens > 0)
    for status in RequestStatus:
        for computed in (0, 7):
            request = SimpleNamespace(status=status, num_computed_tokens=computed)
            expected = Scheduler._is_blocked_waiting_status(status) or holds(request)
            assert left(request) == expected, (status, computed)
