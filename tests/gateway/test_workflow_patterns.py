"""The gateway's workflow history (gateway.app.patterns): what it learns, when, and the
sub-deadlines it answers — on a hand clock, then through the app with the ``openai`` client."""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import SecretStr

from gateway.app import create_app
from gateway.app.kinds import WORKFLOW_DEADLINE_HEADER, WORKFLOW_ID_HEADER
from gateway.app.patterns import CallEnd, WorkflowPatterns
from gateway.app.server import GatewayThread
from gateway.app.workflows import WorkflowCall
from gateway.db import crud
from gateway.db.models import Base
from gateway.db.seed import seed_defaults
from gateway.db.session import make_engine, make_session_factory
from gateway.settings import Settings
from priority.patterns import PatternHistory
from priority.request import SLO
from priority.request import Request as CoreRequest
from priority.sim.history import SimWorkflowHistory
from priority.sim.workflows import WorkflowCall as SimCall
from tests.gateway.engine_spy import spied_engine
from tests.gateway.seeded_app import create_agents_tier

MODEL = "qwen2-7b"
SECRET = "patterns-test-secret"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _call(key: str, stage: int, deadline_ms: float, elapsed_ms: float) -> WorkflowCall:
    return WorkflowCall(key, stage, deadline_ms, deadline_ms - elapsed_ms, stage == 0, key)


def _run(patterns: WorkflowPatterns, clock: Clock, key: str, ends: list[float]) -> None:
    """A workflow starting now with D = 10 s whose stage k ends at start + ends[k]."""
    start = clock.t
    for k, end in enumerate(ends):
        elapsed = (ends[k - 1] if k else 0.0) + 0.5 * (k > 0)
        clock.t = start + elapsed
        patterns.sub_deadline(_call(key, k, 10_000.0, elapsed * 1e3))
        clock.t = start + end
        patterns.call_ended(
            CallEnd(key, k, model="m", prompt_tokens=100, output_tokens=10, end_s=clock.t, ok=True)
        )


def test_a_finished_workflow_is_learned_after_its_deadline_and_sets_phi() -> None:
    clock = Clock()
    patterns = WorkflowPatterns(clock=clock)
    assert patterns.sub_deadline(_call("1:cold", 0, 10_000.0, 0.0)) is None  # no history
    # stages end 1 s, 2 s (0.5 s think + 0.5 s) and 4 s after the start: shares 1/4, 1/2, 1
    _run(patterns, clock, "1:a", [1.0, 2.0, 4.0])
    assert len(patterns.history) == 0  # its deadline has not passed: maybe more calls come
    clock.t = 100.0
    patterns.call_ended(
        CallEnd("1:nobody", 0, model="m", prompt_tokens=1, output_tokens=1, end_s=0, ok=True)
    )
    assert patterns.learned == 1
    (graph,) = patterns.history.graphs
    assert graph.shares == pytest.approx((0.25, 0.5, 1.0))
    assert [s.time_s for s in graph.stages] == pytest.approx([1.0, 1.0, 2.0])
    # a new workflow: stage 0 gets φ(0)·D = 2.5 s
    assert patterns.sub_deadline(_call("1:b", 0, 10_000.0, 0.0)) == pytest.approx(2_500.0)
    clock.t += 1.0
    patterns.call_ended(
        CallEnd("1:b", 0, model="m", prompt_tokens=100, output_tokens=10, end_s=clock.t, ok=True)
    )
    # on schedule: stage 1 due at φ(1)·D = 5 s from the start, 3 s after 2 s elapsed
    assert patterns.sub_deadline(_call("1:b", 1, 10_000.0, 2_000.0)) == pytest.approx(3_000.0)


def test_behind_schedule_a_call_gets_its_stages_share_of_what_is_left() -> None:
    clock = Clock()
    patterns = WorkflowPatterns(clock=clock)
    _run(patterns, clock, "1:a", [1.0, 2.0, 4.0])
    clock.t = 100.0
    patterns.sub_deadline(_call("1:late", 0, 10_000.0, 0.0))
    patterns.call_ended(
        CallEnd("1:late", 0, model="m", prompt_tokens=100, output_tokens=10, end_s=105.0, ok=True)
    )
    clock.t = 106.0
    # 6 s elapsed, φ(1)·D = 5 s is past: (0.5 - 0.25) / (1 - 0.25) of the 4 s left
    got = patterns.sub_deadline(_call("1:late", 1, 10_000.0, 6_000.0))
    assert got == pytest.approx(4_000.0 / 3)


def test_a_workflow_with_a_failed_call_or_a_missing_stage_is_not_learned() -> None:
    clock = Clock()
    patterns = WorkflowPatterns(clock=clock)
    patterns.sub_deadline(_call("1:failed", 0, 1_000.0, 0.0))
    patterns.call_ended(
        CallEnd("1:failed", 0, model="m", prompt_tokens=1, output_tokens=0, end_s=0.1, ok=False)
    )
    clock.t = 0.5  # stage 1 only: stage 0 was served by another process
    patterns.sub_deadline(_call("1:partial", 1, 1_000.0, 200.0))
    patterns.call_ended(
        CallEnd("1:partial", 1, model="m", prompt_tokens=1, output_tokens=1, end_s=0.6, ok=True)
    )
    clock.t = 10.0
    patterns.sub_deadline(_call("1:next", 0, 1_000.0, 0.0))
    assert (patterns.learned, patterns.dropped, len(patterns.history)) == (0, 2, 0)


def test_a_call_running_past_the_deadline_is_waited_for() -> None:
    clock = Clock()
    patterns = WorkflowPatterns(clock=clock, grace_s=60.0)
    patterns.sub_deadline(_call("1:slow", 0, 1_000.0, 0.0))
    clock.t = 2.0  # past the 1 s deadline, the call still running
    patterns.sub_deadline(_call("1:other", 0, 1_000.0, 0.0))
    assert patterns.learned == 0 and len(patterns) == 2
    clock.t = 3.0
    patterns.call_ended(
        CallEnd("1:slow", 0, model="m", prompt_tokens=5, output_tokens=5, end_s=3.0, ok=True)
    )
    assert patterns.learned == 1  # closed as soon as its last call ended


# (arrival, end, prompt tokens, output tokens) of each stage, seconds from the workflow's start:
# think times of 0.5 s and 0.75 s between the stages
LEARNED = [(0.0, 1.0, 100, 10), (1.5, 2.25, 80, 30), (3.0, 4.5, 120, 5)]
# stage 1 arrives at 4 s, behind the learned schedule (φ(1)·D = 5 s): its share of what is left
LATER = [(0.0, 3.5, 90, 12), (4.0, 6.0, 70, 20), (6.5, 7.0, 110, 8)]


def test_the_simulator_and_the_gateway_learn_and_answer_the_same_numbers() -> None:
    """One call sequence through both sides: the same graph, and the same due time per call."""
    deadline_s = 10.0
    flows = [("w1", 5.0, LEARNED), ("w2", 40.0, LATER)]
    sim_calls = {
        f"{wf}-{k}": SimCall(wf, k, None, 0.0, math.inf, deadline_s)
        for wf, _, stages in flows
        for k in range(len(stages))
    }
    clock = Clock()
    sim = SimWorkflowHistory(sim_calls, PatternHistory(clock=clock))
    gateway = WorkflowPatterns(clock=clock)
    sim_due: list[float | None] = []
    gateway_due: list[float | None] = []
    for wf, start, stages in flows:
        for k, (arrival, end, prompt, output) in enumerate(stages):
            clock.t = start + arrival
            request = CoreRequest(f"{wf}-{k}", clock.t, prompt, SLO(deadline_s=deadline_s))
            offset = sim.offset_s(request)  # from the workflow's start
            sim_due.append(None if offset is None else offset - arrival)
            remaining_ms = (deadline_s - arrival) * 1e3
            call = WorkflowCall(wf, k, deadline_s * 1e3, remaining_ms, k == 0, f"1:{wf}")
            due_ms = gateway.sub_deadline(call)
            gateway_due.append(None if due_ms is None else due_ms / 1e3)
            clock.t = start + end
            request.num_output_tokens = output
            sim.finished(request, clock.t)
            end_s = clock.t
            gateway.call_ended(CallEnd(f"1:{wf}", k, "simulated", prompt, output, end_s, True))
        if wf == "w1":  # the gateway learns a workflow once its deadline has passed
            clock.t = start + deadline_s + 1.0
            gateway.call_ended(CallEnd("1:none", 0, "simulated", 1, 1, clock.t, True))
            (sim_graph,) = sim.history.graphs
            (gateway_graph,) = gateway.history.graphs
            fed = [(s.model, s.input_tokens, s.output_tokens) for s in sim_graph.stages]
            assert fed == [(s.model, s.input_tokens, s.output_tokens) for s in gateway_graph.stages]
            times = [s.time_s for s in sim_graph.stages]
            assert times == pytest.approx([s.time_s for s in gateway_graph.stages])
            # think time is in the stage that follows it: each stage ran from its end to the next
            ends = [0.0] + [end for _, end, _, _ in LEARNED]
            assert times == pytest.approx([b - a for a, b in itertools.pairwise(ends)])
    assert sim_due[:3] == [None, None, None] == gateway_due[:3]  # no history yet: cold start
    assert all(due is not None for due in sim_due[3:])
    assert sim_due[3:] == pytest.approx(gateway_due[3:])


# ---- through the app ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, list[Any]]]:
    root: Path = tmp_path_factory.mktemp("patterns")
    url = f"sqlite:///{root / 'tiergate.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    factory = make_session_factory(engine)
    with factory.begin() as session:
        seed_defaults(session)
        create_agents_tier(session)
        crud.create_tenant(session, actor="test", name="t-agents", tier="agents")
        key = crud.create_key(session, actor="test", tenant="t-agents", secret=SECRET).plaintext
    settings = Settings(
        database_url=url,
        secret=SecretStr(SECRET),
        data_dir=root,
        redis_url=None,
        metrics_addr="127.0.0.1:0",
    )
    with (
        spied_engine(MODEL) as (backends, submitted),
        GatewayThread(create_app(settings, backends=backends)) as thread,
    ):
        yield thread, key, submitted
    engine.dispose()


def test_after_a_few_workflows_a_call_gets_the_learned_share(
    gateway: tuple[Any, str, list[CoreRequest]],
) -> None:
    thread, key, submitted = gateway
    client = openai.OpenAI(base_url=thread.base_url, api_key=key, max_retries=0)

    def chat(headers: dict[str, str]) -> None:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Next step?"}],
            max_tokens=2,
            extra_headers=headers,
        )

    for _ in range(3):  # two calls with a 0.3 s tool call between: stage 0 is a small share
        workflow = f"wf-{uuid.uuid4().hex[:12]}"
        chat({WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "1500"})
        time.sleep(0.3)
        chat({WORKFLOW_ID_HEADER: workflow})
    time.sleep(1.6)  # every deadline passed (waiting, not a timed assertion)
    workflow = f"wf-{uuid.uuid4().hex[:12]}"
    chat({WORKFLOW_ID_HEADER: workflow, WORKFLOW_DEADLINE_HEADER: "60000"})
    patterns = thread.app.state.gateway.kinds.patterns
    assert patterns.learned == 3
    # the hook knows no tokens of the new stage 0: every graph weighs the same
    phi = sum(g.shares[0] for g in patterns.history.graphs) / 3
    assert 0 < phi < 1
    first = submitted[-1]
    assert (first.kind, first.stage) == ("compound", 0)
    assert first.slo.deadline_s == pytest.approx(phi * 60.0, rel=1e-6)  # not the cold start's 60 s


def test_the_operator_sizes_the_history_or_turns_it_off(tmp_path: Path) -> None:
    from gateway.app.app import _workflow_patterns

    base = {"database_url": "sqlite://", "secret": SecretStr(SECRET), "data_dir": tmp_path}
    assert _workflow_patterns(Settings(**base, workflow_history=0)) is None  # cold start only
    patterns = _workflow_patterns(Settings(**base, workflow_history=7, workflow_ttl_s=90.0))
    assert patterns is not None
    assert patterns.history.capacity == 7 and patterns.grace_s == 90.0
