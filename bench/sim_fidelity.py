"""Is the simulator's gain true inside real vLLM? The same requests through both, compared.

    VLLM_TARGET_DEVICE=cpu .ci/venvs/vllm-0.33/bin/python bench/sim_fidelity.py \\
        --trace azure_conv --requests 1000 --rate-scale 1.0,1.5 \\
        --kv-blocks 67659,12288,8192 --policy vllm-v1,vllm-v1-priority,sarathi-priority,slide \\
        [--profile a100-qwen2-7b] [--seed 0] [--jobs 2] [--json]
        [--cluster a100-qwen2-7b,910b-qwen2-7b,... [--router R,...] [--pd-prefill N]]

**Workload.** The first ``--requests`` requests of the trace with the project's default tiers
and SLOs (``priority.sim.workload``, from ``--seed``), arriving at ``rate-scale x capacity``.
**Capacity** is the profile's, measured by ``priority.sim.capacity`` as for the policy sweep
(SLOs-Serve's serving capacity: the highest rate at which the default engine keeps SLO
attainment >= 90% of its near-idle attainment, bisected in the simulator on the profile's own
engine), with ``vllm-v1`` as the default engine: it is what stock vLLM schedules.

**Replays.** Every (rate, KV pool, policy) cell replays the same arrivals (``vllm_xargs`` SLOs,
``priority`` = -log2 weight) through the real vLLM scheduler of the running interpreter's vLLM
(``TiergateScheduler`` with the policy; for ``vllm-v1`` / ``vllm-v1-priority`` also stock vLLM
in ``fcfs`` / ``priority`` mode, rows ``stock-vllm`` / ``stock-vllm-priority``) and through the
simulator, both on a virtual clock where a step lasts the profile's prediction for the batch
that ran (block 16, budget 8,192 tokens, 256 sequences; ``engine_harness.replay``). Reported per
row: the share of requests with identical token times (1e-9 s), both TDG ratios, the p99 of
|TTFT real - TTFT sim|, preemptions on both sides, and vLLM's ``schedule()`` wall time per step
(mean and p99; CPU, this machine), and the requests the API server refused on each side. The
readable output adds, per cell, the policies' ranking on both sides.

**Context length.** vLLM runs with ``--max-model-len`` (default ``trace``: the trace's longest
request, capped by what the cell's KV pool holds of one sequence); each request first meets what
vLLM's OpenAI server does at that length (``engine_harness.sim_replay.api_max_tokens``: a prompt
that leaves no room for one output token is refused with 400, ``max_tokens`` is cut to the room
left), on both sides, so a long-context trace (``mooncake_conv``) replays instead of stalling.

**``--mix goodput``** re-runs ``bench/goodput.py``'s headline cells in the real scheduler:
JITServe's 1:1:1 mix of latency, deadline and compound (agent-workflow) requests built by that
bench's own ``build_mix`` from ``--trace`` (default ``azure_conv,azure_code``, ``--requests``
rows of each, default 300), its capacity measured the same way, ``--lengths`` bounds (default
``predicted``). Each request carries its kind, deadline, workflow id and stage, sub-deadline and
length distribution in ``vllm_xargs`` as the gateway sends them, and produces its true length
under the ``max_tokens`` cap; a later workflow stage arrives ``think`` after its previous stage
finished *in that replay*, on both sides (``engine_harness.sim_replay.ArrivalQueue``). Defaults:
``gmax,slide,vllm-v1`` (slide with the workload's gain weights, as in ``bench/goodput.py``) at
1.5x and 2x capacity, with the profile's KV pool and a KV-pressure pool (67,659 and 2,048
blocks). Each row adds the request goodput on both sides (``engine_harness.sim_replay.
request_goodput``: the simulator's scorer) and the output the ratios gmax / vllm-v1, gmax /
slide (and gmax / stock vLLM) per side. Not replayed: ``bench/goodput.py --workflow-history on``
(sub-deadlines here are the cold start).

**``--cluster P1,P2,...``** replays a fleet: one instance per profile (e.g. 2 x A100 + 2 x 910B),
each a real vLLM scheduler on the virtual clock, every ``--router`` in front (default
``goroute,min-load,power-of-two,least-predicted-ttft,round-robin``), co-located;
``engine_harness.fleet_replay`` on the real side, the cluster simulator
(``priority.sim.cluster``, step by step) on the other. Capacity is the fleet's (stock vLLM behind
Min-Load, as ``bench/fleet_gain.py`` measures it). Each row adds its router and the share of
requests the router placed on the same instance on both sides. Latency mix only (a workflow
stage's arrival depends on the run).

**``--pd-prefill N``** (with ``--cluster``) disaggregates the fleet as ``bench/policy_sweep.py``
and ``bench/fleet_gain.py --modes pd`` do: the first N instances prefill, the others decode, the
KV moves over their link model (Qwen2-7B's bf16 KV over 100 Gb/s, ``policy_sweep.kv_transfer``).
Real side: prefill and decode instances are real vLLM schedulers joined by vLLM's KV-connector
interface (``engine_harness.fleet_replay.HandoffConnector``): a prefill instance computes the
prompt and the first token, the router binds the decode instance, and after the transfer time
the decode instance's scheduler admits the request with the prompt's KV counted as computed
(``get_num_new_matched_tokens``). Capacity is the PD fleet's; "placed alike" counts a request
when both its prefill and its decode instance agree.

Needs vLLM (run it with a ``.ci/venvs/vllm-*`` interpreter); ``--sim-only`` runs the simulator
side alone (no vLLM) to check a configuration quickly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from engine_harness.sim_replay import (
    Arrival,
    FleetReplay,
    Replay,
    arrivals_from_workload,
    identical_share,
    model_len_for,
    placement_share,
    replay_fleet_simulator,
    replay_simulator,
    request_goodput,
    tdg_ratio,
    ttft_abs_p99_s,
)
from priority.gain import GainWeights
from priority.policies import POLICY_NAMES, policy_class
from priority.profiles import load_profile
from priority.routing import ROUTER_NAMES
from priority.sim import ClusterConfig, PdConfig, build_workload, load_trace
from priority.sim.capacity import (
    CAPACITY_POLICY,
    CAPACITY_ROUTER,
    find_capacity,
    single_instance_capacity,
    trace_first,
)
from priority.sim.compare import GAIN_AWARE_POLICIES
from priority.sim.workflows import LENGTH_MODES

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
import goodput as goodput_bench  # the mix of --mix goodput: that bench's own
from policy_sweep import kv_transfer  # --pd-prefill's link: that sweep's own

DEFAULT_PROFILE = "a100-qwen2-7b"
DEFAULT_KV_BLOCKS = (67_659, 12_288, 8_192)
DEFAULT_POLICIES = ("vllm-v1", "vllm-v1-priority", "sarathi-priority", "slide")
MIXES = ("latency", "goodput")
GOODPUT_TRACES = ("azure_conv", "azure_code")
GOODPUT_REQUESTS = 300
"""Rows of each trace in ``--mix goodput`` (600 requests with the two default traces)."""
GOODPUT_RATES = (1.5, 2.0)
"""bench/goodput.py's target loads (x capacity)."""
GOODPUT_KV_BLOCKS = (67_659, 2_048)
"""The profile's pool (never binds) and one that binds (gmax and vllm-v1 preempt at 1.5x)."""
GOODPUT_POLICIES = ("gmax", "slide", "vllm-v1")
STOCK = {"vllm-v1": ("stock-vllm", "fcfs"), "vllm-v1-priority": ("stock-vllm-priority", "priority")}
"""Policies with a stock vLLM counterpart: row name and vLLM's ``--scheduling-policy``."""
STOCK_ROWS = frozenset(name for name, _ in STOCK.values())
DEFAULT_ROUTERS = ("goroute", "min-load", "power-of-two", "least-predicted-ttft", "round-robin")
"""``--cluster``'s routers: GoRouting and the routers users run."""
VERSIONED = frozenset(STOCK)
"""Policies that take ``version`` (vLLM 0.23 and 0.33 differ)."""


console = Console(stderr=True)


# ---- workload and capacity ----------------------------------------------------------------------


# ---- one cell ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One (rate, KV pool, policy) replay, picklable for worker processes."""

    trace: str
    rate_scale: float
    rps: float
    kv_blocks: int
    policy: str
    profile: str
    arrivals: tuple[Arrival, ...]
    gain_weights: GainWeights
    mix: str = "latency"
    max_model_len: int | None = None
    """vLLM's ``max_model_len`` (None: from the trace and the KV pool)."""
    fleet: tuple[str, ...] = ()
    """``--cluster``: one profile per instance (empty: one instance of ``profile``)."""
    router: str | None = None
    """``--cluster``: the router in front."""
    pd_prefill: int = 0
    """``--pd-prefill``: the fleet's first N instances prefill, the rest decode (0: co-located)."""

    def pd(self) -> PdConfig | None:
        """The cell's PD-disaggregation (None: co-located)."""
        return pd_config(self.pd_prefill)


def pd_config(pd_prefill: int) -> PdConfig | None:
    """``--pd-prefill N``'s disaggregation: N prefill instances, the sweeps' KV link (0: none)."""
    return PdConfig(num_prefill=pd_prefill, transfer=kv_transfer()) if pd_prefill else None


def policy_params(
    policy: str, vllm_version: str | None, gain_weights: GainWeights | None = None
) -> dict[str, Any]:
    """The policy's parameters for the vLLM version replayed (the V1 transcriptions follow it);
    with ``gain_weights``, a gain-aware policy gets them (as ``bench/goodput.py`` wires it)."""
    params: dict[str, Any] = {}
    if policy in VERSIONED and vllm_version is not None and vllm_version.startswith("0.23"):
        params["version"] = "0.23"
    if gain_weights is not None and policy in GAIN_AWARE_POLICIES:
        params["gain_weights"] = asdict(gain_weights)  # JSON, as TIERGATE_POLICY_PARAMS holds it
    return params


def row(cell: Cell, name: str, real: Replay | None, sim: Replay) -> dict[str, Any]:
    arrivals = cell.arrivals
    out: dict[str, Any] = {
        "policy": name,
        "trace": cell.trace,
        "rate_scale": cell.rate_scale,
        "kv_blocks": cell.kv_blocks,
        "requests": len(arrivals),
        "identical_share": None,
        "tdg_real": None,
        "tdg_sim": tdg_ratio(sim, arrivals, cell.gain_weights),
        "ttft_abs_p99_s": None,
        "preemptions_real": None,
        "preemptions_sim": sim.preemptions,
        "decision_ms_per_step_real": None,
        "decision_ms_p99_real": None,
        "rps": cell.rps,
        **_goodput(sim, arrivals, "sim"),
        "goodput_real": None,
        "attainment_real": None,
        "max_model_len": sim_model_len(cell),
        "refused_sim": len(sim.refused),
        "refused_real": None,
        "router": cell.router,
        "pd_prefill": cell.pd_prefill or None,
        "placement_share": None,
    }
    if real is not None:
        steps = len(real.decision_s)
        out |= {
            "identical_share": identical_share(real, sim, arrivals),
            "tdg_real": tdg_ratio(real, arrivals, cell.gain_weights),
            "ttft_abs_p99_s": ttft_abs_p99_s(real, sim, arrivals),
            "preemptions_real": real.preemptions,
            "decision_ms_per_step_real": 1e3 * sum(real.decision_s) / steps if steps else 0.0,
            "decision_ms_p99_real": 1e3 * float(np.percentile(real.decision_s, 99))
            if steps
            else 0.0,
            **_goodput(real, arrivals, "real"),
            "refused_real": len(real.refused),
        }
    return out


def sim_model_len(cell: Cell) -> int:
    """The cell's ``max_model_len``, as both sides set it."""
    if cell.max_model_len is not None:
        return cell.max_model_len
    return model_len_for(cell.arrivals, cell.kv_blocks)


def _goodput(replay: Replay, arrivals: Sequence[Arrival], side: str) -> dict[str, Any]:
    """Request goodput (share of submitted) and per-kind attainment of one side."""
    scored = request_goodput(replay, arrivals)
    return {
        f"goodput_{side}": scored["request_goodput_share"],
        f"attainment_{side}": {k: v["attained"] for k, v in scored["per_kind"].items()},
    }


def run_fleet_cell(cell: Cell, *, sim_only: bool = False) -> list[dict[str, Any]]:
    """A ``--cluster`` cell's rows: the fleet with the policy on every instance behind the
    router, in vLLM and in the cluster simulator; with a stock counterpart, stock vLLM too."""
    assert cell.router is not None
    version = None if sim_only else _vllm_version()
    params = policy_params(cell.policy, version)
    profiles = [load_profile(name) for name in cell.fleet]
    model_len = sim_model_len(cell)
    sim = replay_fleet_simulator(
        cell.arrivals,
        profiles,
        cell.policy,
        cell.router,
        num_blocks=cell.kv_blocks,
        params=params,
        max_model_len=model_len,
        pd=cell.pd(),
    )
    if sim_only:
        return [row(cell, cell.policy, None, sim.replay)]
    from engine_harness import fleet_replay, replay

    model_dir = replay.write_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-llama-")))
    runs: list[tuple[str, FleetReplay]] = []
    common: dict[str, Any] = {
        "num_blocks": cell.kv_blocks,
        "max_model_len": model_len,
        "pd": cell.pd(),
    }
    real = fleet_replay.replay_fleet_vllm(
        cell.arrivals,
        model_dir,
        profiles,
        cell.router,
        policy=cell.policy,
        params=params,
        **common,
    )
    runs.append((cell.policy, real))
    if cell.policy in STOCK:
        name, mode = STOCK[cell.policy]
        stock = fleet_replay.replay_fleet_vllm(
            cell.arrivals, model_dir, profiles, cell.router, stock_policy=mode, **common
        )
        runs.append((name, stock))
    rows = []
    for name, run in runs:
        out = row(cell, name, run.replay, sim.replay)
        out["placement_share"] = placement_share(run, sim)
        rows.append(out)
    return rows


def run_cell(cell: Cell, *, sim_only: bool = False) -> list[dict[str, Any]]:
    """The cell's rows: the policy in vLLM and, with a stock counterpart, stock vLLM too."""
    if cell.fleet:
        return run_fleet_cell(cell, sim_only=sim_only)
    version = None if sim_only else _vllm_version()
    weights = cell.gain_weights if cell.mix == "goodput" else None
    params = policy_params(cell.policy, version, weights)
    profile = load_profile(cell.profile)
    model_len = sim_model_len(cell)
    sim = replay_simulator(
        cell.arrivals,
        profile,
        cell.policy,
        num_blocks=cell.kv_blocks,
        params=params,
        max_model_len=model_len,
    )
    if sim_only:
        return [row(cell, cell.policy, None, sim)]
    from engine_harness import replay

    model_dir = replay.write_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-llama-")))
    real = replay.replay_vllm(
        cell.arrivals,
        model_dir,
        profile.coefficients,
        num_blocks=cell.kv_blocks,
        policy=cell.policy,
        params=params,
        profile=cell.profile,
        max_model_len=model_len,
    )
    rows = [row(cell, cell.policy, real, sim)]
    if cell.policy in STOCK:
        name, mode = STOCK[cell.policy]
        stock = replay.replay_vllm(
            cell.arrivals,
            model_dir,
            profile.coefficients,
            num_blocks=cell.kv_blocks,
            stock_policy=mode,
            max_model_len=model_len,
        )
        rows.append(row(cell, name, stock, sim))
    return rows


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _run_cell_real(cell: Cell) -> list[dict[str, Any]]:
    return run_cell(cell)


def _run_cell_sim(cell: Cell) -> list[dict[str, Any]]:
    return run_cell(cell, sim_only=True)


# ---- the sweep --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    trace: str
    """One trace (``--mix latency``) or comma-separated traces (``--mix goodput``)."""
    requests: int
    rate_scales: tuple[float, ...]
    kv_blocks: tuple[int, ...]
    policies: tuple[str, ...]
    profile: str
    seed: int
    jobs: int
    sim_only: bool
    json: bool
    out: Path | None
    mix: str = "latency"
    lengths: str = "predicted"
    """``--mix goodput``'s length bounds (``priority.sim.workflows``)."""
    max_model_len: int | None = None
    """vLLM's ``--max-model-len`` (None: ``trace``, from the trace and each KV pool)."""
    fleet: tuple[str, ...] = ()
    """``--cluster``: one profile per instance (empty: single-instance replays)."""
    routers: tuple[str, ...] = ()
    """``--cluster``: the routers replayed."""
    pd_prefill: int = 0
    """``--pd-prefill``: prefill instances of the fleet (0: co-located)."""


def build_cells(cfg: Config) -> tuple[list[Cell], float]:
    """Every cell of the sweep, and the capacity (req/s) the rates are relative to."""
    profile = load_profile(cfg.profile)
    if cfg.mix == "goodput":
        traces = [load_trace(t) for t in cfg.trace.split(",")]
        segment, _ = goodput_bench.build_mix(traces, profile, cfg.requests, cfg.seed)
        config = ClusterConfig([profile], CAPACITY_POLICY, CAPACITY_ROUTER, seed=cfg.seed)
        capacity = find_capacity(segment, config, seed=cfg.seed).rps
    elif cfg.fleet:
        segment = trace_first(load_trace(cfg.trace), cfg.requests)
        profiles = [load_profile(name) for name in cfg.fleet]
        config = ClusterConfig(
            profiles, CAPACITY_POLICY, CAPACITY_ROUTER, seed=cfg.seed, pd=pd_config(cfg.pd_prefill)
        )
        capacity = find_capacity(segment, config, seed=cfg.seed).rps
    else:
        segment = trace_first(load_trace(cfg.trace), cfg.requests)
        capacity = single_instance_capacity(segment, profile, seed=cfg.seed).rps
    lengths = cfg.lengths if cfg.mix == "goodput" else None
    cells = []
    for scale in cfg.rate_scales:
        rps = scale * capacity
        workload = build_workload(
            segment, rps=rps, reference_profile=profile, seed=cfg.seed, lengths=lengths
        )
        arrivals = tuple(arrivals_from_workload(workload))
        for blocks in cfg.kv_blocks:
            for router in cfg.routers or (None,):
                for policy in cfg.policies:
                    cells.append(
                        Cell(
                            cfg.trace,
                            scale,
                            rps,
                            blocks,
                            policy,
                            cfg.profile,
                            arrivals,
                            workload.gain_weights,
                            cfg.mix,
                            cfg.max_model_len,
                            cfg.fleet,
                            router,
                            cfg.pd_prefill,
                        )
                    )
    return cells, capacity


def run(cfg: Config) -> list[dict[str, Any]]:
    cells, capacity = build_cells(cfg)
    size = len(cells[0].arrivals) if cells else 0
    split = f" (PD: {cfg.pd_prefill} prefill)" if cfg.pd_prefill else ""
    console.log(
        f"{cfg.mix} mix of {cfg.trace}: {size} requests, capacity {capacity:.3f} req/s on "
        f"{', '.join(cfg.fleet) or cfg.profile}{split}; {len(cells)} cells, {cfg.jobs} job(s)"
    )
    work = _run_cell_sim if cfg.sim_only else _run_cell_real
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    results: Iterator[list[dict[str, Any]]]
    if cfg.jobs <= 1:
        results = map(work, cells)
    else:
        pool = ProcessPoolExecutor(max_workers=cfg.jobs)
        results = pool.map(work, cells)
    for cell, cell_rows in zip(cells, results, strict=True):
        rows.extend(cell_rows)
        behind = f" · {cell.router}" if cell.router else ""
        console.log(
            f"  {cell.rate_scale:g}x · {cell.kv_blocks} blocks · {cell.policy}{behind}: "
            + ", ".join(_brief(r) for r in cell_rows)
            + f" ({time.perf_counter() - started:.0f} s)"
        )
    if cfg.jobs > 1:
        pool.shutdown()
    return rows


def _brief(r: dict[str, Any]) -> str:
    if r["tdg_real"] is None:
        return f"{r['policy']} sim TDG {r['tdg_sim']:.3f} goodput {r['goodput_sim']:.3f}"
    placed = "" if r["placement_share"] is None else f", placed alike {r['placement_share']:.3f}"
    return (
        f"{r['policy']} real TDG {r['tdg_real']:.3f} sim {r['tdg_sim']:.3f}, goodput real "
        f"{r['goodput_real']:.3f} sim {r['goodput_sim']:.3f}, identical {r['identical_share']:.3f}"
        f"{placed}, refused real {r['refused_real']} sim {r['refused_sim']}"
    )


# ---- reporting -----------------------------------------------------------------------------------


def rankings(
    rows: Sequence[dict[str, Any]], policies: Sequence[str], metric: str = "tdg"
) -> list[dict[str, Any]]:
    """Per (trace, rate, KV pool): the policies ranked by ``metric`` (``tdg`` or ``goodput``)
    on each side, and whether the two rankings agree (stock rows left out: they duplicate their
    transcription's)."""
    cells: dict[tuple[str, float, int, str | None], list[dict[str, Any]]] = {}
    for r in rows:
        if r["policy"] in policies:
            key = (r["trace"], r["rate_scale"], r["kv_blocks"], r.get("router"))
            cells.setdefault(key, []).append(r)
    out = []
    for (trace, scale, blocks, router), members in cells.items():
        sim = _ranked(members, f"{metric}_sim")
        real = None
        if all(r[f"{metric}_real"] is not None for r in members):
            real = _ranked(members, f"{metric}_real")
        out.append(
            {
                "trace": trace,
                "rate_scale": scale,
                "kv_blocks": blocks,
                "router": router,
                "ranking_real": real,
                "ranking_sim": sim,
                "agree": None if real is None else real == sim,
            }
        )
    return out


GOODPUT_RATIOS = (("gmax", "vllm-v1"), ("gmax", "slide"), ("gmax", "stock-vllm"))
"""Request-goodput ratios reported per cell, on each side (stock vLLM: real side only, its
simulator side is ``vllm-v1``'s)."""


def goodput_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (trace, rate, KV pool): ``num/den`` request-goodput ratios on the real side and the
    simulator side, where both policies ran (None where a side is missing or den is 0)."""
    cells: dict[tuple[str, float, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["trace"], r["rate_scale"], r["kv_blocks"]), {})[r["policy"]] = r
    out = []
    for (trace, scale, blocks), members in cells.items():
        ratios: dict[str, Any] = {}
        for num, den in GOODPUT_RATIOS:
            if num in members and den in members:
                for side in ("real",) if den in STOCK_ROWS else ("real", "sim"):
                    a, b = members[num][f"goodput_{side}"], members[den][f"goodput_{side}"]
                    value = a / b if a is not None and b else None
                    ratios[f"{num}/{den} {side}"] = value
        out.append({"trace": trace, "rate_scale": scale, "kv_blocks": blocks, "ratios": ratios})
    return out


def _ranked(members: Sequence[dict[str, Any]], key: str) -> list[str]:
    """Policies by TDG, best first; values equal to 1e-9 tie and keep the command line's order
    (summation-order noise must not flip a ranking)."""
    return [r["policy"] for r in sorted(members, key=lambda r: -round(r[key], 9))]


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(
    rows: Sequence[dict[str, Any]], policies: Sequence[str], out: Console, *, goodput: bool = False
) -> None:
    table = Table(title="sim fidelity: real vLLM scheduler vs simulator (virtual clock)")
    fleet = any(r.get("router") for r in rows)
    headers = ["rate", "KV blocks", "policy"] + (["router", "placed alike"] if fleet else [])
    headers += ["identical", "TDG real", "TDG sim"]
    if goodput:
        headers += ["goodput real", "goodput sim"]
    headers += ["|ΔTTFT| p99 s", "preempt real", "preempt sim", "refused r/s"]
    headers += ["sched ms mean/p99"]
    for col in headers:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        extra = [_fmt(r["goodput_real"], ".3f"), _fmt(r["goodput_sim"], ".3f")] if goodput else []
        table.add_row(
            f"{r['rate_scale']:g}x",
            str(r["kv_blocks"]),
            r["policy"],
            *([r["router"], _fmt(r["placement_share"], ".3f")] if fleet else []),
            _fmt(r["identical_share"], ".3f"),
            _fmt(r["tdg_real"], ".3f"),
            _fmt(r["tdg_sim"], ".3f"),
            *extra,
            _fmt(r["ttft_abs_p99_s"], ".3g"),
            _fmt(r["preemptions_real"], "d"),
            _fmt(r["preemptions_sim"], "d"),
            _fmt(r["refused_real"], "d") + "/" + _fmt(r["refused_sim"], "d"),
            _fmt(r["decision_ms_per_step_real"], ".2f")
            + "/"
            + _fmt(r["decision_ms_p99_real"], ".2f"),
        )
    out.print(table)
    for metric in ("tdg", "goodput") if goodput else ("tdg",):
        for rank in rankings(rows, policies, metric):
            real = " > ".join(rank["ranking_real"]) if rank["ranking_real"] else "-"
            verdict = {True: "agree", False: "DIFFER", None: "-"}[rank["agree"]]
            behind = f" · {rank['router']}" if rank["router"] else ""
            out.print(
                f"{rank['rate_scale']:g}x · {rank['kv_blocks']} blocks{behind} · by {metric}: real "
                f"{real} | sim {' > '.join(rank['ranking_sim'])} | {verdict}"
            )
    if goodput:
        for cell in goodput_ratios(rows):
            text = ", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in cell["ratios"].items())
            out.print(f"{cell['rate_scale']:g}x · {cell['kv_blocks']} blocks: {text}")


# ---- command line ------------------------------------------------------------------------------


def _list(text: str, kind: type, option: str) -> tuple[Any, ...]:
    try:
        values = tuple(kind(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option}: expected comma-separated numbers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{option}: every value must be > 0")
    return values


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="sim_fidelity", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "--mix",
        choices=MIXES,
        default="latency",
        help="latency: one trace's latency requests; goodput: bench/goodput.py's JITServe mix",
    )
    parser.add_argument(
        "--trace",
        help="named trace or CSV path (--mix goodput: two or more, comma-separated, default "
        f"{','.join(GOODPUT_TRACES)})",
    )
    parser.add_argument(
        "--requests",
        type=int,
        help=f"first N requests (1000); --mix goodput: of each trace ({GOODPUT_REQUESTS})",
    )
    parser.add_argument(
        "--rate-scale", help="x capacity, comma-separated (1.0,1.5; --mix goodput 1.5,2)"
    )
    parser.add_argument(
        "--kv-blocks",
        help="vLLM KV pools in blocks, comma-separated "
        f"({','.join(map(str, DEFAULT_KV_BLOCKS))}; --mix goodput "
        f"{','.join(map(str, GOODPUT_KV_BLOCKS))})",
    )
    parser.add_argument(
        "--policy",
        help=f"comma-separated ({','.join(DEFAULT_POLICIES)}; --mix goodput "
        f"{','.join(GOODPUT_POLICIES)})",
    )
    parser.add_argument(
        "--lengths",
        choices=LENGTH_MODES,
        default="predicted",
        help="--mix goodput: length bounds sent with each request (predicted)",
    )
    parser.add_argument(
        "--max-model-len",
        default="trace",
        help="vLLM's max_model_len, or 'trace': the longest request, capped by the KV pool",
    )
    parser.add_argument(
        "--cluster",
        help="replay a fleet: one profile per instance, comma-separated (e.g. "
        "a100-qwen2-7b,910b-qwen2-7b,a100-qwen2-7b,910b-qwen2-7b)",
    )
    parser.add_argument(
        "--router", help=f"--cluster: routers, comma-separated ({','.join(DEFAULT_ROUTERS)})"
    )
    parser.add_argument(
        "--pd-prefill",
        type=int,
        default=0,
        help="--cluster: PD-disaggregated, the first N instances prefill (0: co-located)",
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--seed", type=int, default=0, help="workload seed (tiers, SLOs)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (cells in parallel)")
    parser.add_argument("--sim-only", action="store_true", help="simulator side only (no vLLM)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON rows here")
    args = parser.parse_args(argv)
    goodput = args.mix == "goodput"
    if args.trace is None and not goodput:
        parser.error("--trace is required with --mix latency")
    trace = args.trace or ",".join(GOODPUT_TRACES)
    if goodput and len(set(trace.split(","))) < 2:
        parser.error("--mix goodput needs two or more different traces")
    requests = args.requests or (GOODPUT_REQUESTS if goodput else 1000)
    rate_text = args.rate_scale or ",".join(map(str, GOODPUT_RATES if goodput else (1.0, 1.5)))
    blocks_text = args.kv_blocks or ",".join(
        map(str, GOODPUT_KV_BLOCKS if goodput else DEFAULT_KV_BLOCKS)
    )
    policy_text = args.policy or ",".join(GOODPUT_POLICIES if goodput else DEFAULT_POLICIES)
    try:
        rates = _list(rate_text, float, "--rate-scale")
        blocks = _list(blocks_text, int, "--kv-blocks")
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    policies = tuple(p.strip() for p in policy_text.split(",") if p.strip())
    for name in policies:
        if name not in POLICY_NAMES:
            parser.error(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")
        if policy_class(name).uses_oracle_length:
            parser.error(f"{name} needs true output lengths: it cannot run in vLLM")
    if not policies:
        parser.error("--policy: at least one policy")
    if requests < (3 if goodput else 2):
        parser.error("--requests must be >= 2 (--mix goodput: >= 3, one row of each kind)")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    model_len: int | None = None
    if args.max_model_len != "trace":
        try:
            model_len = int(args.max_model_len)
        except ValueError:
            parser.error("--max-model-len: a number of tokens or 'trace'")
        if model_len < 2:
            parser.error("--max-model-len must be >= 2")
    fleet: tuple[str, ...] = ()
    routers: tuple[str, ...] = ()
    if args.cluster:
        if goodput:
            parser.error("--cluster replays the latency mix only")
        fleet = tuple(p.strip() for p in args.cluster.split(",") if p.strip())
        for name in fleet:
            try:
                load_profile(name)
            except (KeyError, ValueError, OSError) as exc:
                parser.error(f"--cluster: {exc}")
        routers = tuple(r.strip() for r in (args.router or ",".join(DEFAULT_ROUTERS)).split(","))
        for name in routers:
            if name not in ROUTER_NAMES:
                parser.error(f"unknown router {name!r}; known: {', '.join(ROUTER_NAMES)}")
        if args.pd_prefill and not 0 < args.pd_prefill < len(fleet):
            parser.error("--pd-prefill must leave at least one decode instance")
    elif args.router or args.pd_prefill:
        parser.error("--router and --pd-prefill need --cluster")
    try:
        load_profile(args.profile)
    except (KeyError, ValueError, OSError) as exc:
        parser.error(f"--profile: {exc}")
    return Config(
        trace=trace,
        requests=requests,
        rate_scales=rates,
        kv_blocks=blocks,
        policies=policies,
        profile=args.profile,
        seed=args.seed,
        jobs=args.jobs,
        sim_only=args.sim_only,
        json=args.json,
        out=args.out,
        mix=args.mix,
        lengths=args.lengths,
        max_model_len=model_len,
        fleet=fleet,
        routers=routers,
        pd_prefill=args.pd_prefill,
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    started = time.perf_counter()
    rows = run(cfg)
    console.log(f"wall time {time.perf_counter() - started:.0f} s")
    if cfg.out is not None:
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.write_text(json.dumps(rows, indent=1) + "\n")
        console.log(f"wrote {cfg.out}")
    if cfg.json:
        print(json.dumps(rows, indent=1))
    else:
        width = max(Console().width, 160 if cfg.mix == "goodput" or cfg.fleet else 130)
        print_table(rows, cfg.policies, Console(width=width), goodput=cfg.mix == "goodput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
