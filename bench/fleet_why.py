"""Where a router's gain goes on the fleet: placement, predicted vs realised first tokens, losses.

    python bench/fleet_why.py --trace azure_conv --mode pd --capacity 9.704 --loads 3,7 \
        --router min-load,goroute,goroute:fallback=random [--policy slide] [--duration 300]

One line per (load, router), the same workload for every router at a load:

* ``TDG`` and, of the ideal gain, the share lost on first tokens and on decode tokens;
* per prefill-capable instance: requests sent there and the share that met their TTFT;
* ``pred/met``: for routers that predict (GoRouting's ``expected_gain`` = Delta_p), how many
  decisions were predicted to meet the TTFT somewhere (Delta_p > 0) and how many met it;
* decode instances (PD): requests transferred to each; the realised TPOT after the first token
  (mean, and the p99 of the gap between the first and the second token, which holds the KV
  transfer and any wait for a decode slot); the modelled KV transfer time.

A router spec is ``name`` or ``name:param=value`` (string values; GoRouting's ``fallback`` and
``decode_choice``).

``--predictions``: for GoRouting, every decision that took the fallback, its prediction at the
chosen instance against what happened: the wait from dispatch to the first token (median of
realised / predicted, per instance and for prompts up to / over one chunk), and its predicted
gain G_p against the request's own realised gain (first token and decode tokens on time; the
harm to others is not realised per request, so the two differ by that term), correlation and
means.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from priority.gain import token_deadlines
from priority.profiles import load_profile
from priority.request import Request
from priority.routing import GoRouter, InstanceView
from priority.sim import ClusterConfig, PdConfig, build_workload, load_trace
from priority.sim.capacity import trace_head
from priority.sim.cluster import simulate
from priority.sim.compare import configure
from priority.sim.metrics import summarize

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
from policy_sweep import DEFAULT_CLUSTER, kv_transfer
from sweep_args import csv, load_multiples


class _Recording(GoRouter):
    """GoRouting that keeps, per fallback decision, the candidates' predicted gains and first
    token times (``request_id -> (now, candidate indices, gains, first-token times)``)."""

    def __init__(self, instances: list[InstanceView], **params: object) -> None:
        super().__init__(instances, **params)  # type: ignore[arg-type]
        self.recorded: dict[str, tuple[float, list[int], np.ndarray, np.ndarray]] = {}

    def engine_order_terms(self, arrays, request: Request, now: float, decode):  # type: ignore[no-untyped-def]
        gains, first_s = super().engine_order_terms(arrays, request, now, decode)
        assert self._cols is not None
        self.recorded[request.request_id] = (now, list(self._cols.indices), gains, first_s)
        return gains, first_s

    def _fallback_gains_arrays(self, arrays, request: Request, now: float, decode):  # type: ignore[no-untyped-def]
        gains = super()._fallback_gains_arrays(arrays, request, now, decode)
        assert self._cols is not None
        self.recorded[request.request_id] = (now, list(self._cols.indices), gains, arrays.end_s)
        return gains


def predictions(run, workload, router: _Recording, chunk: int) -> str:  # type: ignore[no-untyped-def]
    """The fallback decisions' predicted against realised wait and gain (module docstring)."""
    weights = workload.gain_weights
    ratios: dict[str, list[float]] = {}
    predicted: list[float] = []
    realised: list[float] = []
    for r in run.requests:
        record = router.recorded.get(r.request_id)
        if record is None or not r.token_times:
            continue
        now, indices, gains, first_s = record
        decision = run.placement[r.request_id]
        k = indices.index(decision.instance)
        wait = r.token_times[0] - now
        want = float(first_s[k]) - now
        if want > 0:
            size = "long" if r.prompt_tokens > chunk else "short"
            for key in (f"i{decision.instance}", size, f"i{decision.instance}/{size}"):
                ratios.setdefault(key, []).append(wait / want)
        n = r.target_output_tokens
        due = token_deadlines(r.arrival_s, r.slo, n)
        times = np.asarray(r.token_times)
        on_time = times < due[: times.size]
        value = r.weight * (
            weights.first_token * on_time[0] + weights.decode_token * on_time[1:].sum()
        )
        predicted.append(float(gains[k]))
        realised.append(float(value))
    parts = [
        f"{key} n={len(v)} x{np.median(v):.2f}"
        for key, v in sorted(ratios.items())
        if "/" in key or key in ("long", "short")
    ]
    corr = np.corrcoef(predicted, realised)[0, 1] if len(predicted) > 2 else float("nan")
    return (
        f"  fallback decisions {len(predicted)}: wait realised/predicted (median) "
        + " ".join(parts)
        + f" | gain predicted mean {np.mean(predicted):.1f} realised own {np.mean(realised):.1f}"
        f" corr {corr:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trace", default="azure_conv")
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--mode", choices=("co-located", "pd"), default="pd")
    parser.add_argument("--capacity", type=float, required=True, help="the 1x rate (req/s)")
    parser.add_argument("--loads", type=load_multiples, default=(3.0,))
    parser.add_argument("--router", type=csv, default=("min-load", "goroute"))
    parser.add_argument("--policy", default="slide")
    parser.add_argument("--cluster", type=csv, default=DEFAULT_CLUSTER)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--predictions", action="store_true", help="GoRouting's fallback: predicted vs realised"
    )
    args = parser.parse_args(argv)

    profiles = [load_profile(name) for name in args.cluster]
    transfer = kv_transfer()
    pd = PdConfig(len(profiles) // 2, transfer) if args.mode == "pd" else None
    segment = trace_head(load_trace(args.trace), args.duration)
    prompts = np.asarray(segment.prompt_tokens, dtype=np.float64)
    if pd is not None:
        print(
            f"KV transfer (modelled): mean {transfer.per_token_s * prompts.mean() * 1e3:.1f} ms, "
            f"p99 {transfer.per_token_s * np.percentile(prompts, 99) * 1e3:.1f} ms"
        )
    base = ClusterConfig(profiles, args.policy, "min-load", seed=args.seed, pd=pd)
    for load in args.loads:
        workload = build_workload(
            segment, rps=load * args.capacity, reference_profile=profiles[0], seed=args.seed
        )
        weights = workload.gain_weights
        for spec in args.router:
            name, _, opt = spec.partition(":")
            params = dict(item.split("=", 1) for item in opt.split(";") if item)
            config = configure(
                replace(base, router=name, router_params=params), args.policy, workload
            )
            recorder: list[_Recording] = []
            if args.predictions and name == "goroute":

                def build(
                    views: list[InstanceView], kept: list[_Recording] = recorder, **kw: object
                ) -> _Recording:
                    kept.append(_Recording(views, **kw))
                    return kept[0]

                config = replace(config, router=build)
            run = simulate(workload, config)
            summary = summarize(run, workload)
            sent: Counter[int] = Counter()
            met: Counter[int] = Counter()
            calib: Counter[tuple[bool, bool]] = Counter()
            ideal = lost_first = lost_decode = 0.0
            tpots: list[float] = []
            gaps: list[float] = []
            for r in run.requests:
                decision = run.placement[r.request_id]
                n = r.target_output_tokens
                due = token_deadlines(r.arrival_s, r.slo, n)
                times = np.asarray(r.token_times)
                ideal += r.weight * (weights.first_token + (n - 1) * weights.decode_token)
                on_time = bool(times.size) and times[0] < due[0]
                sent[decision.instance] += 1
                met[decision.instance] += on_time
                if decision.expected_gain is not None:
                    calib[(decision.expected_gain > 0, on_time)] += 1
                if not on_time:
                    lost_first += r.weight * weights.first_token
                late_decodes = int((times[1:] >= due[1 : times.size]).sum()) + n - times.size
                lost_decode += r.weight * weights.decode_token * late_decodes
                if times.size > 2:
                    tpots.append((times[-1] - times[1]) / (times.size - 2))
                    gaps.append(times[1] - times[0])
            placement = " ".join(f"{i}:{sent[i]}/{met[i] / sent[i]:.2f}" for i in sorted(sent))
            decode = " ".join(
                f"{s.name}:{s.transfers_in}" for s in run.instances if s.role == "decode"
            )
            pred = " ".join(
                f"{'meet' if p else 'miss'}->{'met' if m else 'missed'} {calib[(p, m)]}"
                for p in (True, False)
                for m in (True, False)
                if calib[(p, m)]
            )
            print(
                f"{load:g}x {spec:32s} TDG {summary['tdg_ratio']:.3f} lost first "
                f"{lost_first / ideal:.3f} decode {lost_decode / ideal:.3f} | sent/met-TTFT "
                f"{placement} | pred {pred or '-'} | decode {decode or '-'} | TPOT "
                f"{np.mean(tpots) * 1e3:.0f} ms, 1st-2nd gap p99 "
                f"{np.percentile(gaps, 99) * 1e3:.0f} ms",
                flush=True,
            )
            if recorder:
                chunk = profiles[0].engine.max_num_batched_tokens
                print(predictions(run, workload, recorder[0], chunk), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
