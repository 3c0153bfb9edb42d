"""Multi-stage requests (:mod:`gateway.app.stages`): a tool response sent back for a new turn is
the next prefill stage of its conversation, with its own TTFT. The rule on bodies, then through
the gateway to an emulated engine with the ``openai`` client."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker

from gateway.app import create_app
from gateway.app.server import GatewayThread
from gateway.app.stages import StageAttainment, conversation_id, mark_stage, tool_stage
from gateway.db import crud
from gateway.settings import Settings
from priority.request import SLO, RequestMeta
from tests.gateway.engine_spy import spied_engine

MODEL = "stages-model"
SECRET = "stages-test-secret"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
OPENING: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


def _call(i: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }


def _result(i: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{i}", "content": f"{18 + i} C"}


def _turns(n: int) -> list[dict[str, Any]]:
    """The opening, then ``n`` rounds of a tool call and its result."""
    messages = list(OPENING)
    for i in range(n):
        messages += [_call(i), _result(i)]
    return messages


def test_a_tool_result_after_an_assistant_turn_is_the_next_stage() -> None:
    assert tool_stage(OPENING) is None  # a prompt offering no tools: nothing to mark
    assert tool_stage(OPENING, offers_tools=True) == 0  # the opening of a tool loop
    assert tool_stage(_turns(1)) == 1
    assert tool_stage(_turns(3)) == 3
    follow_up = [*_turns(1), {"role": "assistant", "content": "18 C."}]
    assert tool_stage([*follow_up, {"role": "user", "content": "And Rome?"}]) is None
    assert tool_stage([_result(0)]) is None  # a tool result with no assistant turn before it


def test_every_turn_of_a_conversation_has_its_id_and_others_differ() -> None:
    ids = {conversation_id(_turns(n), tenant="1", model="m") for n in range(4)}
    assert len(ids) == 1 and next(iter(ids)).startswith("conv-")
    assert conversation_id(_turns(1), tenant="2", model="m") not in ids  # per tenant
    other = [OPENING[0], {"role": "user", "content": "And in Rome?"}, _call(0), _result(0)]
    assert conversation_id(other, tenant="1", model="m") not in ids


def test_only_latency_requests_outside_a_workflow_are_marked() -> None:
    slo = RequestMeta(SLO(ttft_s=0.5, tpot_s=0.05), weight=1.0, tier="t", tenant="a")
    marked = mark_stage(slo, {"messages": _turns(2)}, tenant="1", model="m")
    assert marked.stage == 2 and marked.workflow_id == conversation_id(
        _turns(2), tenant="1", model="m"
    )
    assert (marked.kind, marked.slo) == ("latency", slo.slo)  # its own TTFT and TPOT
    workflow = dataclasses.replace(
        slo, slo=SLO(0.5, 0.05, 9.0), kind="compound", workflow_id="wf-1", stage=4
    )
    assert mark_stage(workflow, {"messages": _turns(2)}, tenant="1", model="m") is workflow
    assert mark_stage(slo, {"prompt": "text"}, tenant="1", model="m") is slo
    assert mark_stage(slo, {"messages": OPENING}, tenant="1", model="m") is slo
    opening = mark_stage(slo, {"messages": OPENING, "tools": TOOLS}, tenant="1", model="m")
    assert (opening.stage, opening.workflow_id) == (0, marked.workflow_id)


def test_a_conversation_is_attained_only_if_every_stage_is() -> None:
    tracker = StageAttainment(max_conversations=2)
    assert tracker.stage_ended("a", met=True) == (True, False)
    assert tracker.stage_ended("a", met=True) == (False, False)
    assert tracker.stage_ended("a", met=False) == (False, True)  # its first miss: counted
    assert tracker.stage_ended("a", met=False) == (False, False)  # once
    assert tracker.stage_ended("b", met=False) == (True, True)
    tracker.stage_ended("c", met=True)  # a third: the oldest is forgotten
    assert tracker.stage_ended("a", met=True) == (True, False)


@pytest.mark.slow
def test_the_engine_gets_each_stage_with_its_conversation_and_own_ttft(
    factory: sessionmaker[Session], tmp_path: Path
) -> None:
    with factory.begin() as session:
        crud.create_tier(session, actor="test", name="agents", weight=1.0, ttft_ms=2000.0,
                         tpot_ms=200.0)  # fmt: skip
        crud.create_tenant(session, actor="test", name="acme", tier="agents")
        key = crud.create_key(session, actor="test", tenant="acme", secret=SECRET).plaintext
    settings = Settings(
        database_url=str(factory.kw["bind"].url),
        secret=SecretStr(SECRET),
        data_dir=tmp_path,
        redis_url=None,
    )
    with (
        spied_engine(MODEL) as (backends, submitted),
        GatewayThread(create_app(settings, backends=backends)) as gateway,
    ):
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        for n in range(3):
            client.chat.completions.create(
                model=MODEL,
                messages=_turns(n),  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=2,
            )
        client.chat.completions.create(model=MODEL, messages=OPENING, max_tokens=2)  # type: ignore[arg-type]
        metrics = gateway.state.metrics.render().decode()
    *stages, plain = submitted
    assert [r.stage for r in stages] == [0, 1, 2]
    assert len({r.workflow_id for r in stages}) == 1  # one conversation, three stages
    assert stages[0].workflow_id is not None and stages[0].workflow_id.startswith("conv-")
    assert plain.workflow_id is None  # no tools offered: a request like any other
    assert 'tiergate_multistage_conversations_total{tier="agents"} 1.0' in metrics
    stage_lines = [
        x for x in metrics.splitlines() if x.startswith("tiergate_multistage_stages_total")
    ]
    assert sum(float(x.rsplit(" ", 1)[1]) for x in stage_lines) == 3.0
    for r in stages:  # each stage judged by its own TTFT and TPOT, from its own arrival
        assert r.kind == "latency"
        assert (r.slo.ttft_s, r.slo.tpot_s) == pytest.approx((2.0, 0.2))
