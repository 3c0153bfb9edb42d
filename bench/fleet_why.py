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
from priority.sim import ClusterConfig, PdConfig, build_workload, load_trace
from priority.sim.capacity import trace_head
from priority.sim.cluster import simulate
from priority.sim.compare import configure
from priority.sim.metrics import summarize

sys.path.append(str(Path(__file__).resolve().parent))  # bench/ is no package
from policy_sweep import DEFAULT_CLUSTER, kv_transfer
from sweep_args import csv, load_multiples


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
