"""The gateway→engine protocol (:mod:`engine_common.protocol`): one writer, one reader, one rule.

One metadata type (:class:`~priority.request.RequestMeta`) goes through both: ``parse(encode(m))``
is ``m`` for every field, and the bytes on the wire are those the gateway always sent. The writer
is strict (a value the engine would ignore is a ``ValueError`` in the gateway), the
reader lenient (a malformed or out-of-range value takes its default and is counted), and the
emulated engine reads a body exactly as the vLLM plugins do. The same comparison against the real
vLLM schedulers is ``tests/engines/test_protocol_agreement.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine_common import protocol as p
from engine_common.scheduler import engine_view
from engine_common.settings import EngineSettings
from engine_common.slo import ignored_counts, parse_meta
from engine_emulated.app import build_engine_sim, core_request
from engine_emulated.schemas import ChatCompletionRequest
from gateway.app.slo import engine_priority, resolve_slo
from gateway.db.identity import EffectivePolicy
from priority.lengths.distribution import LengthDistribution
from priority.profiles import load_profile
from priority.request import REQUEST_KINDS, SLO, Request, RequestMeta
from priority.sim.workload import SloPolicy

DEFAULTS = p.BestEffortDefaults()
PROFILE = "a100-qwen2-7b"
NUMBER_KEYS = (p.WEIGHT, p.TTFT_MS, p.TPOT_MS, p.DEADLINE_MS, p.ARRIVAL_UNIX_S, p.SUB_DEADLINE_MS)
LABEL_KEYS = (p.TIER, p.TENANT, p.WORKFLOW_ID)


def read(xargs: dict[str, Any] | None, priority: Any = 0, **kw: Any) -> p.RequestMeta:
    return p.parse(xargs, priority, defaults=DEFAULTS, zero_load_ttft_s=0.1, **kw)


# ---- the keys ---------------------------------------------------------------------------------


def test_every_key_is_ours_and_documented() -> None:
    assert len(set(p.XARG_KEYS)) == len(p.XARG_KEYS) == 12
    assert all(key.startswith(p.KEY_PREFIX) for key in p.XARG_KEYS)
    source = Path(p.__file__).read_text(encoding="utf-8")
    for key in p.XARG_KEYS:
        name = next(n for n in dir(p) if getattr(p, n) == key and n.isupper())
        assert f'{name} = "{key}"\n"""' in source  # each key has its who-writes/who-reads note


def test_without_protocol_keys_keeps_only_the_clients_own() -> None:
    client = {"tiergate_deadline_ms": 1, "tiergate_future": "x", "session_id": "s", "k": [1]}
    assert p.without_protocol_keys(client) == {"session_id": "s", "k": [1]}
    assert p.without_protocol_keys(None) == {}


# ---- the writer -------------------------------------------------------------------------------

weights = st.floats(1e-6, 1e6)
millis = st.floats(1e-3, 1e9)


@given(
    weight=weights,
    ttft=millis,
    tpot=millis,
    deadline=st.none() | millis,
    arrival=st.floats(0, 2e9),
    tier=st.text(min_size=1).filter(str.strip),
    tenant=st.text(min_size=1).filter(str.strip),
)
def test_what_the_gateway_writes_the_engine_reads_back(
    weight: float,
    ttft: float,
    tpot: float,
    deadline: float | None,
    arrival: float,
    tier: str,
    tenant: str,
) -> None:
    slo = SLO(ttft / 1e3, tpot / 1e3, None if deadline is None else deadline / 1e3)
    meta = RequestMeta(slo, weight=weight, tier=tier, tenant=tenant, arrival_s=arrival)
    xargs = p.encode(meta)
    back = read(xargs, engine_priority(weight), now_unix_s=2e9)
    assert back == dataclasses.replace(meta, tier=tier.strip(), tenant=tenant.strip())
    assert back.slo == slo  # to the last bit: the engine schedules for the gateway's seconds
    assert (p.DEADLINE_MS in xargs) == (deadline is not None)


def _gateway_meta(**change: Any) -> RequestMeta:
    return dataclasses.replace(
        RequestMeta(SLO(0.4, 0.04, 20.0), weight=4.0, tier="gold", tenant="acme", arrival_s=7.5),
        **change,
    )


LENGTH = LengthDistribution(levels=(0.5, 0.95), values=(40.0, 160.0))
ROUND_TRIPS: dict[str, RequestMeta] = {
    "gateway": _gateway_meta(),
    "no-deadline": _gateway_meta(slo=SLO(0.25, 0.1)),
    "deadline-only": _gateway_meta(slo=SLO(deadline_s=1.5), kind="deadline", tenant="beta"),
    "arrival-at-zero": _gateway_meta(arrival_s=0.0),
    "no-arrival": _gateway_meta(arrival_s=None),
    "best-effort-kind": _gateway_meta(kind="best-effort", weight=2.0**-10),
    "workflow-call": _gateway_meta(
        slo=SLO(0.4, 0.04, 15.0),
        kind="compound",
        workflow_id="agent-1",
        stage=2,
        workflow_deadline_s=60.0,
        length=LENGTH,
    ),
    "workflow-without-share": _gateway_meta(kind="compound", workflow_id="w", stage=0),
    "conversation-stage": _gateway_meta(slo=SLO(0.4, 0.04), workflow_id="conv-ab", stage=3),
    "best-effort-meta": read({}),  # no objective: the engine's defaults, which it fills in again
    "best-effort-meta-with-a-weight": read({}, priority=2),
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_encode_then_parse_gives_the_same_meta(name: str) -> None:
    meta = ROUND_TRIPS[name]
    assert read(p.encode(meta), p.priority_from_weight(meta.weight), now_unix_s=2e9) == meta


seconds_st = st.floats(1e-3, 1e8).map(lambda ms: ms / 1e3)
"""Seconds as the gateway makes them: from milliseconds (a header's, a tier's, a workflow's)."""
metas_st = st.builds(
    lambda slo, weight, tier, tenant, arrival, kind, workflow, share, length: RequestMeta(
        dataclasses.replace(slo, deadline_s=share[0]) if share and slo.deadline_s else slo,
        weight=weight,
        tier=tier,
        tenant=tenant,
        arrival_s=arrival,
        kind=kind,
        workflow_id=workflow[0] if workflow else None,
        stage=workflow[1] if workflow else 0,
        workflow_deadline_s=share[1] if share and slo.deadline_s else None,
        length=length,
    ),
    st.one_of(
        st.builds(SLO, seconds_st, seconds_st, st.none() | seconds_st),
        st.builds(SLO, deadline_s=seconds_st),
    ),
    weights,
    st.text(min_size=1).map(str.strip).filter(bool),
    st.text(min_size=1).map(str.strip).filter(bool),
    st.none() | st.floats(0, 2e9),
    st.sampled_from(REQUEST_KINDS),
    st.none()
    | st.tuples(st.text(min_size=1).map(str.strip).filter(bool), st.integers(0, 2**31 - 1)),
    st.none() | st.tuples(seconds_st, seconds_st).map(sorted),
    st.none() | st.just(LENGTH),
)


@given(metas_st)
def test_every_field_survives_encode_then_parse(meta: RequestMeta) -> None:
    assert read(p.encode(meta), None, now_unix_s=2e9) == meta


def test_the_wire_is_byte_for_byte_what_the_gateway_always_sent() -> None:
    """Pinned from the keyword-per-field writer this encoder replaced (same keys, same order,
    the milliseconds as they were written)."""
    gateway = _gateway_meta(arrival_s=1_700_000_000.25)
    workflow = _gateway_meta(
        slo=SLO(7 / 1e3, 33.3 / 1e3, 15.0),  # from headers' milliseconds, as the gateway does
        weight=1.0,
        arrival_s=1_700_000_001.5,
        kind="compound",
        workflow_id="agent-1",
        stage=2,
        workflow_deadline_s=60.0,
        length=LENGTH,
    )
    free = RequestMeta(
        SLO(250.5 / 1e3, 0.001 / 1e3), 0.5, "free", "t", arrival_s=0.0, kind="best-effort"
    )
    wire = [json.dumps(p.encode(m), separators=(",", ":")) for m in (gateway, workflow, free)]
    assert wire == [
        '{"tiergate_weight":4.0,"tiergate_ttft_ms":400.0,"tiergate_tpot_ms":40.0,'
        '"tiergate_arrival_unix_s":1700000000.25,"tiergate_tier":"gold","tiergate_tenant":"acme",'
        '"tiergate_kind":"latency","tiergate_deadline_ms":20000.0}',
        '{"tiergate_weight":1.0,"tiergate_ttft_ms":7.0,"tiergate_tpot_ms":33.3,'
        '"tiergate_arrival_unix_s":1700000001.5,"tiergate_tier":"gold","tiergate_tenant":"acme",'
        '"tiergate_kind":"compound","tiergate_deadline_ms":60000.0,"tiergate_workflow_id":"agent-1",'
        '"tiergate_stage":2,"tiergate_sub_deadline_ms":15000.0,'
        '"tiergate_length":[0.5,40.0,0.95,160.0]}',
        '{"tiergate_weight":0.5,"tiergate_ttft_ms":250.5,"tiergate_tpot_ms":0.001,'
        '"tiergate_arrival_unix_s":0.0,"tiergate_tier":"free","tiergate_tenant":"t",'
        '"tiergate_kind":"best-effort"}',
    ]


@given(
    st.decimals(
        min_value="0.001", max_value="86400000", places=6, allow_nan=False, allow_infinity=False
    )
)
def test_milliseconds_come_back_as_they_were_written(written: Any) -> None:
    """A header's milliseconds (up to 15 significant digits) leave as they came, though the
    meta holds seconds; and any seconds come back exactly in the engine."""
    ms = float(written)
    assert p.milliseconds(ms / 1e3) == ms
    assert p.milliseconds(ms / 1e3) / 1e3 == ms / 1e3


@given(st.floats(1e-6, 1e12))
def test_the_engine_reads_back_exactly_the_gateways_seconds(ms: float) -> None:
    seconds = ms / 1e3  # any milliseconds, as the gateway turns them into seconds
    assert p.milliseconds(seconds) / 1e3 == seconds


@given(st.floats(1e-9, 1e9))
def test_other_seconds_come_back_within_a_unit_in_the_last_place(seconds: float) -> None:
    """Not every double of seconds is some double of milliseconds / 1e3 (the division skips a
    few): those come back as the nearest there is."""
    assert abs(p.milliseconds(seconds) / 1e3 - seconds) <= math.ulp(seconds)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"weight": 0.0}, p.WEIGHT),
        ({"weight": -1.0}, p.WEIGHT),
        ({"weight": math.inf}, p.WEIGHT),
        ({"arrival_s": -1.0}, p.ARRIVAL_UNIX_S),
        ({"arrival_s": math.nan}, p.ARRIVAL_UNIX_S),
        ({"tier": "  "}, p.TIER),
        ({"tenant": ""}, p.TENANT),
    ],
)
def test_the_writer_refuses_what_the_reader_would_ignore(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        p.encode(_gateway_meta(**change))


def test_an_slo_out_of_range_is_refused_before_it_is_a_meta() -> None:
    for bad in (
        {"ttft_s": 0.0, "tpot_s": 0.1},
        {"ttft_s": 0.1, "tpot_s": math.nan},
        {"deadline_s": -5.0},
    ):
        with pytest.raises(ValueError):
            SLO(**bad)


@given(st.integers(-p.PRIORITY_CLIP, p.PRIORITY_CLIP))
def test_priority_and_weight_are_inverse_within_the_clip(priority: int) -> None:
    assert p.priority_from_weight(p.weight_from_priority(priority)) == priority


def test_priority_is_clipped_at_ten_both_ways() -> None:
    assert p.priority_from_weight(2.0**20) == -10 and p.priority_from_weight(2.0**-20) == 10
    assert p.weight_from_priority(1000) == 2.0**-10 and p.weight_from_priority(-1000) == 2.0**10
    assert p.weight_from_priority(-1, 3.0) == 6.0  # relative to TIERGATE_DEFAULT_WEIGHT
    with pytest.raises(ValueError):
        p.priority_from_weight(0.0)


# ---- the reader -------------------------------------------------------------------------------


def test_absent_metadata_is_best_effort_with_profile_relative_ttft() -> None:
    meta = read(None)
    assert meta.slo == SLO(ttft_s=0.5, tpot_s=0.1)  # 5 x the 100 ms zero-load TTFT; 100 ms
    assert (meta.weight, meta.tier, meta.tenant, meta.arrival_s) == (
        1.0,
        "default",
        "default",
        None,
    )
    assert not meta.has_slo and meta.ignored == ()
    short = p.parse({}, 0, defaults=DEFAULTS, zero_load_ttft_s=0.001)
    assert short.slo.ttft_s == 0.2  # the floor
    fixed = p.BestEffortDefaults(tier="free", weight=0.5, ttft_s=3.0, tpot_s=0.2)
    meta = p.parse({}, -1, defaults=fixed, zero_load_ttft_s=9.0)
    assert (meta.slo, meta.weight, meta.tier) == (SLO(ttft_s=3.0, tpot_s=0.2), 1.0, "free")


def test_best_effort_defaults_are_the_simulators_default_slos() -> None:
    """Results from the simulator (priority.sim) assume the SLOs engines give by default."""
    sim = SloPolicy()
    assert (DEFAULTS.ttft_scale, DEFAULTS.ttft_floor_s, DEFAULTS.tpot_s) == (
        sim.ttft_scale,
        sim.ttft_floor_s,
        sim.tpot_s,
    )
    assert all(DEFAULTS.ttft_for(z) == sim.ttft_for(z) for z in (0.0, 0.01, 0.5, 3.0))


def test_partial_slos_fill_in_the_missing_half() -> None:
    assert read({p.DEADLINE_MS: 2000}).slo == SLO(deadline_s=2.0)
    assert read({p.TPOT_MS: 30}).slo == SLO(ttft_s=0.5, tpot_s=0.03)
    assert read({p.TTFT_MS: "250"}).slo == SLO(ttft_s=0.25, tpot_s=0.1)  # numbers as text
    assert read({p.TTFT_MS: 250, p.DEADLINE_MS: 9000}).slo == SLO(0.25, 0.1, 9.0)


def test_arrival_in_the_future_counts_as_now() -> None:
    assert read({p.ARRIVAL_UNIX_S: 200.0}, now_unix_s=100.0).arrival_s == 100.0
    assert read({p.ARRIVAL_UNIX_S: 97.5}, now_unix_s=100.0).arrival_s == 97.5
    assert read({p.ARRIVAL_UNIX_S: 0}).arrival_s == 0.0


malformed_numbers = st.one_of(
    st.booleans(),
    st.text(max_size=6).filter(lambda s: _not_a_number(s)),
    st.sampled_from([0, -1, -0.5, math.inf, -math.inf, math.nan, "inf", "nan", "-3", 10**400]),
    st.lists(st.integers(), max_size=2),
    st.just({"a": 1}),
)
malformed_labels = st.one_of(
    st.booleans(), st.integers(), st.floats(), st.just("   "), st.just(""), st.lists(st.text())
)


def _not_a_number(text: str) -> bool:
    try:
        return not float(text) > 0
    except ValueError:
        return True


@settings(deadline=None)
@given(
    key=st.sampled_from(NUMBER_KEYS + LABEL_KEYS),
    data=st.data(),
    priority=st.integers(-50, 50),
)
def test_a_malformed_value_reads_as_if_absent_and_is_named(
    key: str, data: st.DataObject, priority: int
) -> None:
    value = data.draw(malformed_labels if key in LABEL_KEYS else malformed_numbers)
    assume(not (key == p.ARRIVAL_UNIX_S and _is_zero(value)))  # time 0 is a valid arrival
    meta = read({key: value}, priority, now_unix_s=1e9)
    assert meta == dataclasses.replace(read({}, priority), ignored=(key,))


def _is_zero(value: object) -> bool:
    try:
        return not isinstance(value, bool) and float(value) == 0  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return False


def test_a_bool_is_no_number_and_priority_must_be_an_integer() -> None:
    assert read({p.ARRIVAL_UNIX_S: False}).ignored == (p.ARRIVAL_UNIX_S,)
    assert read({}, priority="high").ignored == (p.PRIORITY,)
    assert read({}, priority=True).weight == 1.0
    assert read({}, priority=None).ignored == ()
    assert read({p.WEIGHT: 2.0}, priority="high").ignored == ()  # priority unused


@settings(deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*p.XARG_KEYS, "tiergate_other", "other"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=5),
            st.lists(st.integers(), max_size=2),
        ),
    ),
    st.one_of(st.integers(-(2**70), 2**70), st.none(), st.floats(), st.text(max_size=2)),
)
def test_any_metadata_yields_a_valid_request(args: dict[str, object], priority: Any) -> None:
    meta = read(args, priority, now_unix_s=time.time())
    assert meta.weight > 0 and math.isfinite(meta.weight)
    assert meta.tier.strip() == meta.tier != "" and meta.tenant.strip() == meta.tenant != ""
    assert set(meta.ignored) <= {*p.XARG_KEYS, p.PRIORITY}
    request = Request.from_meta(meta, "r", arrival_s=0.0, prompt_tokens=1, max_output_tokens=9)
    assert (request.slo, request.weight, request.kind, request.stage) == (
        meta.slo,
        meta.weight,
        meta.kind,
        meta.stage,
    )
    assert request.length is None or request.length.max_tokens == 9  # capped by the request


def test_ignored_values_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    before = ignored_counts().get(p.TTFT_MS, 0)
    with caplog.at_level(logging.WARNING, logger="engine_common.slo"):
        for _ in range(10):
            parse_meta({p.TTFT_MS: "soon"}, 0, defaults=DEFAULTS, zero_load_ttft_s=0.1)
    assert ignored_counts()[p.TTFT_MS] == before + 10
    assert all("tiergate_ttft_ms='soon'" in r.getMessage() for r in caplog.records)
    assert 1 <= len(caplog.records) <= 2  # the 1st and the 10th at most, not every request


# ---- the emulated engine reads as the plugin does --------------------------------------------

BODIES: dict[str, dict[str, Any]] = {
    "gateway": {
        "priority": -1,
        "vllm_xargs": {
            p.WEIGHT: 2.0,
            p.TTFT_MS: 400,
            p.TPOT_MS: 40,
            p.DEADLINE_MS: 20000,
            p.TIER: "gold",
            p.TENANT: "acme",
        },
    },
    "none": {},
    "priority-only": {"priority": 3},
    "priority-beyond-clip": {"priority": -40},
    "deadline-only": {"vllm_xargs": {p.DEADLINE_MS: "1500", p.TENANT: " beta "}},
    "malformed": {
        "vllm_xargs": {p.WEIGHT: "heavy", p.TTFT_MS: -5, p.TPOT_MS: [1], p.TIER: 7, "x": "y"},
        "priority": 2,
    },
    "out-of-range": {"vllm_xargs": {p.WEIGHT: 0, p.TTFT_MS: "inf", p.DEADLINE_MS: 1e-330}},
    "json-true": {"vllm_xargs": {p.WEIGHT: True}},  # vLLM's API server turns true into 1
    "workflow-call": {
        "vllm_xargs": {
            p.TTFT_MS: 400,
            p.TPOT_MS: 40,
            p.DEADLINE_MS: 60000,
            p.KIND: "compound",
            p.WORKFLOW_ID: "wf-1",
            p.STAGE: 2,
            p.SUB_DEADLINE_MS: 15000,
            p.LENGTH: [0.5, 40, 0.9, 120, 0.99, 300],
        }
    },
    "kinds-malformed": {
        "vllm_xargs": {p.KIND: "urgent", p.STAGE: -1, p.LENGTH: [0.9, 10, 0.5, 20]}
    },
}


def _body(case: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": "user", "content": "How long is a piece of string? " * 8}]
    return {"model": "m", "messages": messages, "max_tokens": 7, **case}


@pytest.mark.parametrize("name", list(BODIES))
def test_emulated_engine_sees_what_the_plugin_sees(name: str) -> None:
    """The emulated engine's core request against the plugin's own view-building code, fed a
    stand-in for vLLM's request (the real schedulers: tests/engines/test_protocol_agreement.py)."""
    sim = build_engine_sim(load_profile(PROFILE), "slide", model_name="m")
    body = ChatCompletionRequest.model_validate(_body(BODIES[name]))
    emulated, _ = core_request(sim, body, "r")
    vllm_request = SimpleNamespace(
        request_id="r",
        sampling_params=SimpleNamespace(extra_args=body.vllm_xargs),
        priority=body.priority,
        num_prompt_tokens=emulated.prompt_tokens,
        arrival_time=time.time(),
        max_tokens=7,
    )
    plugin, _ = engine_view(vllm_request, EngineSettings.from_env(PROFILE, env={}))
    assert _view(plugin) == _view(emulated)


def _view(request: Request) -> tuple[Any, ...]:
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
    return tuple(getattr(request, name) for name in fields)


def test_emulated_engine_counts_gateway_queueing_in_the_arrival() -> None:
    sim = build_engine_sim(load_profile(PROFILE), "slide", model_name="m")
    xargs = {p.ARRIVAL_UNIX_S: time.time() - 2.0, p.DEADLINE_MS: 5000}
    body = ChatCompletionRequest.model_validate(_body({"vllm_xargs": xargs}))
    request, _ = core_request(sim, body, "r")
    assert sim.engine.now() - request.arrival_s == pytest.approx(2.0, abs=0.5)
    future = ChatCompletionRequest.model_validate(
        _body({"vllm_xargs": {p.ARRIVAL_UNIX_S: time.time() + 3600}})
    )
    request, _ = core_request(sim, future, "f")
    assert sim.engine.now() - request.arrival_s == pytest.approx(0.0, abs=0.5)


@pytest.mark.parametrize(
    ("case", "param"),
    [
        ({"priority": 1.5}, "priority"),
        ({"priority": 2**63}, "priority"),
        ({"vllm_xargs": {p.TIER: None}}, "vllm_xargs.tiergate_tier.str"),
        ({"vllm_xargs": {p.WEIGHT: {"a": 1}}}, "vllm_xargs.tiergate_weight.str"),
    ],
)
def test_body_types_are_checked_as_vllms_api_server_does(case: dict[str, Any], param: str) -> None:
    from pydantic import ValidationError

    from engine_emulated.schemas import describe_validation_error

    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(_body(case))
    assert describe_validation_error(info.value)[1] == param


# ---- request kinds and workflows -------------------------------------------------------------


def test_a_workflow_call_reads_back_with_its_sub_deadline_as_its_deadline() -> None:
    meta = _gateway_meta(
        slo=SLO(0.5, 0.05, 12.0),  # D_s: the call's share
        kind="compound",
        workflow_id="agent-7",
        stage=3,
        workflow_deadline_s=60.0,  # the time left to the workflow's deadline
        length=LENGTH,
    )
    xargs = p.encode(meta)
    assert xargs[p.LENGTH] == [0.5, 40.0, 0.95, 160.0]  # a flat list: vLLM's xargs take it
    assert (xargs[p.DEADLINE_MS], xargs[p.SUB_DEADLINE_MS]) == (60_000.0, 12_000.0)
    back = read(xargs, 0, now_unix_s=8.0)
    assert back.ignored == ()
    assert (back.kind, back.workflow_id, back.stage) == ("compound", "agent-7", 3)
    assert back.slo.deadline_s == 12.0  # D_s, not the workflow's 60 s
    assert back.end_to_end_slo.deadline_s == 60.0  # what the gateway judges it by
    assert back.length == LENGTH


@pytest.mark.parametrize(
    ("xargs", "kind"),
    [
        ({}, "latency"),
        ({p.TTFT_MS: 300, p.DEADLINE_MS: 9000}, "latency"),
        ({p.DEADLINE_MS: 9000}, "deadline"),
        ({p.WORKFLOW_ID: "w", p.SUB_DEADLINE_MS: 900}, "compound"),
        ({p.KIND: "best-effort", p.DEADLINE_MS: 9000}, "best-effort"),
        ({p.KIND: " deadline "}, "deadline"),
    ],
)
def test_the_kind_of_a_request_that_names_none(xargs: dict[str, Any], kind: str) -> None:
    meta = read(xargs)
    assert meta.kind == kind and meta.ignored == ()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (p.KIND, "urgent"),
        (p.KIND, 3),
        (p.STAGE, -1),
        (p.STAGE, 1.5),
        (p.STAGE, "two"),
        (p.STAGE, True),
        (p.STAGE, 2**40),
        (p.LENGTH, "40"),
        (p.LENGTH, [0.5]),  # odd
        (p.LENGTH, [0.9, 10, 0.5, 20]),  # levels not increasing
        (p.LENGTH, [0.5, 0.2]),  # a value below one token
        (p.LENGTH, [0.5, "x"]),
        (p.LENGTH, [0.5, 10] * (p.MAX_LENGTH_LEVELS + 1)),
        (p.SUB_DEADLINE_MS, 0),
    ],
)
def test_a_malformed_kind_key_reads_as_if_absent_and_is_named(key: str, value: object) -> None:
    meta = read({p.TTFT_MS: 250, key: value})
    assert meta == dataclasses.replace(read({p.TTFT_MS: 250}), ignored=(key,))


def test_stage_and_length_accept_numbers_as_text() -> None:
    meta = read({p.WORKFLOW_ID: "w", p.STAGE: "4", p.LENGTH: ["0.5", "30"]})
    assert meta.stage == 4 and meta.length == LengthDistribution((0.5,), (30.0,))
    assert meta.ignored == ()


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"kind": "urgent"}, p.KIND),
        ({"workflow_id": " "}, p.WORKFLOW_ID),
        ({"workflow_id": "w", "stage": -1}, p.STAGE),
        ({"workflow_id": "w", "stage": True}, p.STAGE),
        ({"stage": 2}, p.STAGE),  # a stage belongs to a workflow
        ({"slo": SLO(0.5, 0.05), "workflow_deadline_s": 9.0}, p.SUB_DEADLINE_MS),
    ],
)
def test_the_writer_refuses_bad_kind_fields(change: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=key):
        p.encode(_gateway_meta(**change))


def test_the_gateway_writes_the_kind_of_every_request() -> None:
    policy = EffectivePolicy(
        weight=1.0,
        ttft_ms=500.0,
        tpot_ms=50.0,
        deadline_ms=None,
        min_ttft_ms=None,
        min_tpot_ms=None,
        min_deadline_ms=None,
        best_effort_allowed=False,
        rpm_limit=None,
        tpm_limit=None,
        max_concurrency=None,
    )
    meta = resolve_slo({}, policy, "t", tenant="a", arrival_unix_s=1.0)
    xargs = p.encode(meta)
    assert xargs[p.KIND] == "latency"
    assert not {p.WORKFLOW_ID, p.STAGE, p.SUB_DEADLINE_MS, p.LENGTH} & set(xargs)
    assert (xargs[p.TTFT_MS], xargs[p.TPOT_MS]) == (500.0, 50.0)


# ---- one constructor ---------------------------------------------------------------------------


def test_from_meta_builds_every_engines_request_the_same_way() -> None:
    """The plugins' subclass, the emulated engine's and the replays' core request and the
    gateway's all come from :meth:`Request.from_meta`: the engine schedules a workflow call for
    its share, the gateway judges it by its workflow's deadline; the length gets the cap."""
    from engine_common.scheduler import EngineRequest

    meta = ROUND_TRIPS["workflow-call"]
    engine = EngineRequest.from_meta(
        meta, "r", arrival_s=3.0, prompt_tokens=12, max_output_tokens=64, true_output_tokens=9
    )
    assert isinstance(engine, EngineRequest) and engine.step_tokens is None
    assert (engine.request_id, engine.arrival_s, engine.prompt_tokens) == ("r", 3.0, 12)
    assert (engine.max_output_tokens, engine.true_output_tokens) == (64, 9)
    assert (engine.slo, engine.weight, engine.tier, engine.tenant) == (
        meta.slo,
        meta.weight,
        meta.tier,
        meta.tenant,
    )
    assert (engine.kind, engine.workflow_id, engine.stage) == ("compound", "agent-1", 2)
    assert engine.length == dataclasses.replace(LENGTH, max_tokens=64)
    gateway = Request.from_meta(
        meta, "r", arrival_s=3.0, prompt_tokens=12, max_output_tokens=64, end_to_end=True
    )
    assert type(gateway) is Request
    assert (engine.slo.deadline_s, gateway.slo.deadline_s) == (15.0, 60.0)
    assert gateway.slo == dataclasses.replace(meta.slo, deadline_s=60.0)
    plain = ROUND_TRIPS["gateway"]
    assert plain.end_to_end_slo is plain.slo  # not a workflow call: one deadline
