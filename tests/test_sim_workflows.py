"""The simulator's issue-14 contract: kinds, workflows in stage order, sub-deadlines, per-kind
metrics, Jain's index, and the ``--lengths`` modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_sim_engine import make_profile  # the shared test profile

from priority.lengths.distribution import DEFAULT_LEVELS
from priority.sim import ClusterConfig, build_workload, simulate, summarize
from priority.sim.length_error import load_measured
from priority.sim.workflows import DEFAULT_MAX_TOKENS, cold_start_offsets

TRACE = """arrival_s,prompt_tokens,output_tokens,kind,workflow_id,stage,think_ms,deadline_ms,tenant
0.0,100,10,compound,w1,0,,60000,t1
0.0,50,5,latency,,,,,t2
0.5,80,10,compound,w1,1,250,60000,t1
1.0,40,20,deadline,,,,20000,t2
1.0,40,20,best-effort,,,,,t3
"""


def _workload(tmp_path: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    path = tmp_path / "kinds.csv"
    path.write_text(TRACE)
    return build_workload(path, reference_profile=make_profile(), **kwargs)  # type: ignore[arg-type]


def test_cold_start_offsets_split_the_deadline_by_token_share() -> None:
    # 60 s, think 0.25 s before stage 1: 59.75 s of compute split 110 : 90 tokens
    offsets = cold_start_offsets([110.0, 90.0], [0.0, 0.25], 60.0)
    assert offsets == pytest.approx([59.75 * 110 / 200, 0.25 + 59.75])


def test_workflow_calls_run_in_stage_order_with_think_time(tmp_path: Path) -> None:
    workload = _workload(tmp_path)
    config = ClusterConfig(profiles=[make_profile()], policy="gmax", router="round-robin")
    result = simulate(workload, config)
    by_id = {r.request_id: r for r in result.requests}
    first, second = by_id["kinds-0"], by_id["kinds-2"]
    assert first.is_finished and second.is_finished
    # stage 1 arrives 250 ms after stage 0 finished (its trace arrival 0.5 s is ignored)
    assert second.arrival_s == pytest.approx(first.finished_s + 0.25)
    # its sub-deadline: the workflow's start + offset, relative to its own arrival
    call = workload.workflow_calls["kinds-2"]
    assert second.slo.deadline_s == pytest.approx(call.offset_s - second.arrival_s)
    assert first.slo.deadline_s == pytest.approx(workload.workflow_calls["kinds-0"].offset_s)
    assert by_id["kinds-4"].slo.deadline_s == 120.0  # best-effort default deadline
    summary = summarize(result, workload)
    per_kind = summary["per_kind"]
    assert set(per_kind) == {"latency", "deadline", "compound", "best-effort"}
    assert per_kind["compound"]["submitted"] == 2
    assert per_kind["compound"]["goodput_requests"] == 2  # both calls, idle engine, 60 s
    assert per_kind["compound"]["goodput_tokens"] == 20.0
    assert per_kind["deadline"]["goodput_tokens"] == 20.0
    assert summary["jain_tenant"] == pytest.approx(1.0)


def test_a_missed_workflow_deadline_loses_every_call(tmp_path: Path) -> None:
    path = tmp_path / "tight.csv"
    path.write_text(TRACE.replace("60000", "1"))  # 1 ms: no workflow can make it
    workload = build_workload(path, reference_profile=make_profile())
    config = ClusterConfig(profiles=[make_profile()], policy="vllm-v1", router="round-robin")
    summary = summarize(simulate(workload, config), workload)
    assert summary["per_kind"]["compound"]["goodput_requests"] == 0
    assert summary["per_kind"]["compound"]["goodput_tokens"] == 0.0
    # tenant t1 got nothing, t2 and t3 everything: (0 + 1 + 1)^2 / (3 * 2) = 2/3
    assert summary["jain_tenant"] == pytest.approx(2 / 3)


def test_bad_kind_rows_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,kind\n0,10,10,urgent\n")
    with pytest.raises(ValueError, match="not one of"):
        build_workload(path, reference_profile=make_profile())
    path.write_text("arrival_s,prompt_tokens,output_tokens,kind\n0,10,10,deadline\n")
    with pytest.raises(ValueError, match="needs deadline_ms"):
        build_workload(path, reference_profile=make_profile())


def test_length_modes() -> None:
    profile = make_profile()
    oracle = build_workload("azure_conv_20min", reference_profile=profile, lengths="oracle")
    predicted = build_workload("azure_conv_20min", reference_profile=profile, lengths="predicted")
    capped = build_workload("azure_conv_20min", reference_profile=profile, lengths="max-tokens")
    for spec in oracle.specs[:50]:
        assert spec.to_request().length_bound(0.95) == spec.output_tokens
    for spec in capped.specs[:50]:
        request = spec.to_request()
        assert request.length is None
        assert request.length_bound(0.95) == max(DEFAULT_MAX_TOKENS, spec.output_tokens)
    # the measured error: the 0.95 bound covers as often as the real forest's did held-out
    covered = [s.to_request().length_bound(0.95) >= s.output_tokens for s in predicted.specs]
    target = load_measured().coverage[DEFAULT_LEVELS.index(0.95)]
    assert abs(float(np.mean(covered)) - target) < 0.02
    # and it is not the oracle
    assert any(s.to_request().length_bound(0.5) != s.output_tokens for s in predicted.specs[:50])


HISTORY_TRACE = """arrival_s,prompt_tokens,output_tokens,kind,workflow_id,stage,think_ms,deadline_ms
0.0,100,10,compound,w1,0,,60000
0.0,80,30,compound,w1,1,500,60000
100.0,100,10,compound,w2,0,,60000
100.0,80,30,compound,w2,1,500,60000
"""


@pytest.mark.parametrize("history", [False, True])
def test_workflow_history_gives_later_workflows_the_learned_share(
    tmp_path: Path, history: bool
) -> None:
    path = tmp_path / "history.csv"
    path.write_text(HISTORY_TRACE)
    workload = build_workload(path, reference_profile=make_profile())
    config = ClusterConfig(
        profiles=[make_profile()], policy="gmax", router="round-robin", workflow_history=history
    )
    by_id = {r.request_id: r for r in simulate(workload, config).requests}
    w1 = [by_id["history-0"], by_id["history-1"]]
    w2 = by_id["history-2"]
    assert all(r.is_finished for r in by_id.values())
    cold = workload.workflow_calls["history-2"].offset_s  # token shares: 110 / 220
    assert w1[0].slo.deadline_s == pytest.approx(workload.workflow_calls["history-0"].offset_s)
    if not history:
        assert w2.slo.deadline_s == pytest.approx(cold)
        return
    # w1's timeline (think time included, as the gateway learns it) gives φ(0) for w2
    start, (end0, end1) = w1[0].arrival_s, [r.finished_s for r in w1]
    assert end0 is not None and end1 is not None
    phi = (end0 - start) / (end1 - start)
    assert end1 - end0 > 0.5  # the 0.5 s think is in stage 1's time
    assert w2.slo.deadline_s == pytest.approx(phi * 60.0)
    assert w2.slo.deadline_s != pytest.approx(cold)
